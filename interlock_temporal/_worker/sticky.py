"""After a crash, hand the workflow's next task to any worker at once (not the dead one's queue).

A workflow's tasks go to the sticky queue of the worker that last ran it, and wait there for
``sticky_queue_schedule_to_start_timeout`` before any worker may take them. When that worker
died, the task the retried attempt's result schedules waits out that timeout for nothing: the
workflow completes that much later. A retried gated attempt (attempt 2 or later: the one before
it failed or timed out, its worker maybe dead) asks Temporal to drop the workflow's stickiness
(``ResetStickyTaskQueue``) before it returns, so the next workflow task goes to the normal
queue and whichever worker polls it first replays the workflow. The cost: one call per retried
attempt, and one replay if the sticky worker was in fact alive. Correctness does not depend on
it: a call that fails is logged and the attempt's result stands.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import temporalio.activity
import temporalio.client
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest

log = logging.getLogger("interlock_temporal")

#: how long the call may take before the attempt returns without it
RELEASE_TIMEOUT = timedelta(seconds=2)


def needs_release(info: temporalio.activity.Info) -> bool:
    """Whether this attempt follows one that failed or timed out (its worker maybe dead)."""
    return info.attempt > 1 and not info.is_local and bool(info.workflow_id)


async def release_sticky(
    client: temporalio.client.Client | None, info: temporalio.activity.Info
) -> bool:
    """Drop the stickiness of the workflow that scheduled this attempt; True if Temporal did."""
    if client is None or not info.workflow_id:
        return False
    request = ResetStickyTaskQueueRequest(
        namespace=info.workflow_namespace or info.namespace,
        execution=WorkflowExecution(
            workflow_id=info.workflow_id, run_id=info.workflow_run_id or ""
        ),
    )
    try:
        await client.workflow_service.reset_sticky_task_queue(request, timeout=RELEASE_TIMEOUT)
    except Exception as err:
        log.info("could not release the sticky queue of %s: %s", info.workflow_id, err)
        return False
    return True


def start_release(
    client: temporalio.client.Client | None, info: temporalio.activity.Info
) -> asyncio.Task[bool] | None:
    """``release_sticky`` started beside the attempt (it must land before the attempt's
    result), or None when this attempt needs none."""
    if not needs_release(info):
        return None
    return asyncio.ensure_future(release_sticky(client, info))


async def finish_release(task: asyncio.Task[bool] | None) -> None:
    """Wait for the release started beside the attempt (bounded by its own timeout)."""
    if task is not None:
        # shielded: an attempt cancelled meanwhile leaves the release to finish by itself
        await asyncio.shield(task)
