"""A workflow written as the README shows one: ``interlock_temporal`` imported at module level,
with no passthrough block of its own. ``act_as`` then reaches activities only through the
sandbox passthrough the worker's setup adds (``InterlockPlugin``, or
``InterlockInterceptor.worker_options``): re-imported inside the sandbox, the workflow's
``act_as`` would set a copy of the context the interceptor never reads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

from interlock_temporal.workflow import act_as, execute_effect


@workflow.defn
class PlainRefund:
    """Runs one gated activity by name under ``act_as``, waiting for a person if it ends in
    doubt."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> Any:
        retry = RetryPolicy(
            initial_interval=timedelta(milliseconds=200),
            maximum_attempts=spec.get("maximum_attempts", 0),
        )
        with act_as(spec["principal"], lease=spec["lease"]):
            return await execute_effect(
                spec["activity"],
                spec["arg"],
                start_to_close_timeout=timedelta(seconds=10),
                heartbeat_timeout=timedelta(seconds=2),
                retry_policy=retry,
            )
