"""After a crash, the workflow's next task goes to any live worker at once: a retried gated
attempt drops its workflow's sticky queue (``InterlockPlugin(release_sticky_on_retry=True)``,
the default), so the task its result schedules does not wait out the dead worker's
``sticky_queue_schedule_to_start_timeout``. Read from the workflow's history on a real server:
which queue kind that task was scheduled on, and whether a workflow task timed out."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.client import Client, WorkflowHandle

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.testing import DevServer
from workers.scenarios import run_in
from workers.server_world import ServerWorld
from workers.world import ORDER
from workflows.support_case import CaseFile, CaseOutcome

from .test_server import rig

pytestmark = pytest.mark.server


@dataclass(frozen=True)
class AfterEffect:
    """What the workflow did once the effect's activity completed."""

    attempt: int
    queue: str
    timed_out: bool


async def after_effect(handle: WorkflowHandle[Any, Any], activity: str = "refund") -> AfterEffect:
    scheduled: int | None = None
    attempt = 0
    completed = False
    queue = "-"
    timed_out = False
    async for ev in handle.fetch_history_events():
        kind = ev.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if ev.activity_task_scheduled_event_attributes.activity_type.name == activity:
                scheduled = ev.event_id
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if ev.activity_task_started_event_attributes.scheduled_event_id == scheduled:
                attempt = ev.activity_task_started_event_attributes.attempt
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            completed = ev.activity_task_completed_event_attributes.scheduled_event_id == scheduled
        elif completed and kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED and queue == "-":
            sticky = ev.workflow_task_scheduled_event_attributes.task_queue.kind
            queue = "sticky" if sticky == TaskQueueKind.TASK_QUEUE_KIND_STICKY else "normal"
        elif completed and kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timed_out = True
    return AfterEffect(attempt, queue, timed_out)


class _Recorded(ServerWorld):
    """A ``ServerWorld`` that keeps the handle of the workflow it started."""

    handle: WorkflowHandle[Any, CaseOutcome] | None = None

    async def start(self, case: CaseFile) -> WorkflowHandle[Any, CaseOutcome]:
        self.handle = await super().start(case)
        return self.handle


async def test_after_a_sigkill_the_next_workflow_task_goes_to_any_worker(
    client: Client, tmp_path: Path
) -> None:
    world = _Recorded(client, tmp_path, 2, "gated")
    result = await run_in(world, "crash_before_ack")
    assert result["ok"], result["problems"]
    assert result["kills"] == 1
    assert world.handle is not None
    seen = await after_effect(world.handle)
    # the replacement worker completed the effect on attempt 2; the workflow task its result
    # scheduled went to the normal queue, not to the dead worker's sticky queue
    assert seen == AfterEffect(attempt=2, queue="normal", timed_out=False)
    with open_journal(tmp_path / "journal.db", create=False) as journal:
        row = journal.row(world.effect_id)
    assert row is not None and row.status is Kind.COMMITTED


@pytest.mark.parametrize(("release", "queue"), [(True, "normal"), (False, "sticky")])
async def test_a_retried_attempt_releases_the_sticky_queue_unless_told_not_to(
    dev_server: DevServer, tmp_path: Path, release: bool, queue: str
) -> None:
    async with rig(dev_server, tmp_path, plugin_options={"release_sticky_on_retry": release}) as r:
        # attempt 1 is refused before the send (retryable); attempt 2 sends and commits on the
        # same live worker, which holds the workflow in its cache
        r.payments.arm("before_send", "unavailable")
        handle = await r.client.start_workflow(
            "SupportCase",
            CaseFile(case_id="4471", order_id=ORDER, amount_cents=2000, lease_id=r.lease_id),
            id=f"case-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
            result_type=CaseOutcome,
        )
        outcome = await handle.result()
        assert outcome.status == "REFUNDED"
        assert r.payments.refunded_cents(ORDER) == 2000
        assert await after_effect(handle) == AfterEffect(2, queue, timed_out=False)
