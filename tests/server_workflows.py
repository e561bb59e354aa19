"""Workflows the real-server tests run (module level, so the workflow sandbox can load them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from interlock_temporal.workflow import act_as


@workflow.defn
class CallActivity:
    """Runs one activity by name under act_as (when a principal is given)."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> Any:
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=10),
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=spec.get("retry_after_s", 0.2)),
                maximum_interval=timedelta(seconds=max(1.0, spec.get("retry_after_s", 0.2))),
                maximum_attempts=spec.get("maximum_attempts", 0),
            ),
        }
        if spec.get("heartbeat_s"):
            options["heartbeat_timeout"] = timedelta(seconds=spec["heartbeat_s"])
        if spec.get("schedule_to_close_s"):
            options["schedule_to_close_timeout"] = timedelta(seconds=spec["schedule_to_close_s"])
        if spec.get("principal"):
            with act_as(spec["principal"], lease=spec.get("lease")):
                return await workflow.execute_activity(spec["activity"], spec["arg"], **options)
        return await workflow.execute_activity(spec["activity"], spec["arg"], **options)


@workflow.defn
class ParentActsAs:
    """Starts a child workflow under act_as; the child runs the activity with no act_as of its
    own, so the authority must arrive through the child's headers."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> Any:
        child_spec = {**spec, "principal": None}
        with act_as(spec["principal"], lease=spec.get("lease")):
            return await workflow.execute_child_workflow(
                CallActivity.run, child_spec, id=f"{workflow.info().workflow_id}-child"
            )


@workflow.defn
class PlannerDelegates:
    """A planner agent under its own lease starts a sub-agent's child workflow, which acts as
    another principal under a lease delegated from the planner's (``CallActivity`` with the
    child's ``principal`` and ``lease``)."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> Any:
        with act_as(spec["planner"], lease=spec["planner_lease"]):
            return await workflow.execute_child_workflow(
                CallActivity.run,
                {**spec, "maximum_attempts": 1},
                id=f"{workflow.info().workflow_id}-sub-agent",
            )


@workflow.defn
class ContinuedActsAs:
    """Continues as new under act_as; the next run runs the activity with no act_as of its own,
    so the authority must arrive through the continue-as-new headers."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> Any:
        if spec.get("continued"):
            return await CallActivity().run({**spec, "principal": None})
        with act_as(spec["principal"], lease=spec.get("lease")):
            workflow.continue_as_new({**spec, "continued": True})


@workflow.defn
class RunCalls:
    """An agent's session: runs activities one after another under act_as and reports each
    outcome (a result, or the error type and the policy's reason code), never failing."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        from temporalio.exceptions import ActivityError, ApplicationError

        outcomes: list[dict[str, Any]] = []
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=10),
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=spec.get("retry_interval_s", 0.1)),
                maximum_interval=timedelta(seconds=max(0.5, spec.get("retry_interval_s", 0.1))),
                maximum_attempts=spec.get("maximum_attempts", 3),
            ),
        }
        with act_as(spec["principal"], lease=spec.get("lease"), session=spec.get("session")):
            for call in spec["calls"]:
                try:
                    result = await workflow.execute_activity(
                        call["activity"], call["arg"], **options
                    )
                    outcomes.append({"ok": result})
                except ActivityError as err:
                    cause = err.cause
                    if isinstance(cause, ApplicationError):
                        details = list(cause.details)
                        first = details[0] if details and isinstance(details[0], dict) else {}
                        outcomes.append(
                            {
                                "error": cause.type,
                                "code": first.get("code"),
                                "message": cause.message,
                            }
                        )
                    else:
                        outcomes.append({"error": type(cause).__name__, "message": str(cause)})
        return outcomes


@workflow.defn
class ApprovedCall:
    """Runs one activity with ``execute_effect`` under act_as: waits for a person when the
    policy escalates, and returns the result or the error's type."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        from temporalio.exceptions import ActivityError, ApplicationError

        from interlock_temporal.workflow import execute_effect

        try:
            with act_as(spec["principal"], lease=spec.get("lease"), session=spec.get("session")):
                result = await execute_effect(
                    spec["activity"],
                    spec["arg"],
                    start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=RetryPolicy(maximum_attempts=2),
                )
            return {"ok": result}
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) else err
            if isinstance(cause, ApplicationError):
                return {"error": cause.type, "message": cause.message}
            return {"error": type(cause).__name__}


@workflow.defn
class ReusedActivityId:
    """Runs one activity for each input in turn under one explicit activity id, as a loop in an
    agent's workflow might: after the first, each waits for the signal ``next``."""

    def __init__(self) -> None:
        self._go = 0

    @workflow.signal(name="next")
    def next(self) -> None:
        self._go += 1

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> list[Any]:
        results = []
        with act_as(spec["principal"], lease=spec.get("lease")):
            for i, arg in enumerate(spec["args"]):
                if i:
                    await workflow.wait_condition(lambda i=i: self._go >= i)  # type: ignore[misc]
                results.append(
                    await workflow.execute_activity(
                        spec["activity"],
                        arg,
                        activity_id=spec["activity_id"],
                        start_to_close_timeout=timedelta(seconds=10),
                        heartbeat_timeout=timedelta(seconds=2),
                        retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
                    )
                )
        return results
