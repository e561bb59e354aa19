"""The support case: an agent decides a refund; the refund is an effect behind the gate.

The agent is scripted (``decide_refund`` reads the order and approves what the case file says),
so the demo needs no model key; swap the decision activity for one that calls a model.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from interlock_temporal import Receipt
    from interlock_temporal.targets.payments import RefundRequest, RefundResult
    from interlock_temporal.workflow import act_as, execute_effect, receipt_from

Mode = Literal["gated", "naive", "activity_key"]

#: who refunds: fixed in workflow code, never taken from the input. Whoever can start this
#: workflow acts as this principal, within the lease the case names (lease ids are not secrets:
#: the lease's own limits, and revoking it, are what bound that authority)
PRINCIPAL = "refund-bot"


class CaseFile(BaseModel):
    """A support case as the workflow receives it."""

    case_id: str
    order_id: str
    #: what the (scripted) agent will decide to refund
    amount_cents: int
    #: the lease the refund runs under (the principal is the workflow's, not the input's)
    lease_id: str | None = None
    mode: Mode = "gated"
    #: when the effect is ambiguous: wait for a person's decision (True) or report it (False)
    wait_for_review: bool = False
    #: the agent: any activity that takes the case file and returns a RefundRequest
    decision_activity: str = "decide_refund"
    start_to_close_s: float = 10.0
    heartbeat_s: float | None = 2.0
    maximum_attempts: int = 0
    initial_interval_s: float = 0.5


class CaseOutcome(BaseModel):
    case_id: str
    status: str
    refund: RefundResult | None = None
    receipt: Receipt | None = None
    error: str | None = None


@workflow.defn
class SupportCase:
    @workflow.run
    async def run(self, case: CaseFile) -> CaseOutcome:
        decision: RefundRequest = await workflow.execute_activity(
            case.decision_activity,
            case,
            result_type=RefundRequest,
            start_to_close_timeout=timedelta(seconds=10),
        )
        options: dict[str, Any] = {
            "result_type": RefundResult,
            "start_to_close_timeout": timedelta(seconds=case.start_to_close_s),
            "heartbeat_timeout": (
                timedelta(seconds=case.heartbeat_s) if case.heartbeat_s else None
            ),
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=case.initial_interval_s),
                maximum_interval=timedelta(seconds=2),
                maximum_attempts=case.maximum_attempts,
            ),
        }
        try:
            if case.mode == "gated":
                with act_as(PRINCIPAL, lease=case.lease_id):
                    result = await execute_effect(
                        "refund", decision, wait_for_review=case.wait_for_review, **options
                    )
            else:
                name = "refund_naive" if case.mode == "naive" else "refund_activity_key"
                result = await workflow.execute_activity(name, decision, **options)
        except (ActivityError, ApplicationError) as err:
            receipt = receipt_from(err)
            if receipt is None:
                raise
            return CaseOutcome(
                case_id=case.case_id,
                status=receipt.final,
                receipt=receipt,
                error=f"{receipt.code or ''}: {receipt.reason or ''}",
            )
        # a person attested "happened" without a result: resolved, no refund object to show
        status = "REFUNDED" if result is not None else "RESOLVED"
        return CaseOutcome(case_id=case.case_id, status=status, refund=result)
