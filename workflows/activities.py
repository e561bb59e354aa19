"""The support case's activities, bound to one payments service (the simulated one, or Stripe
through ``workers.stripe_harness``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from temporalio import activity

from interlock_temporal import EffectTarget, current_effect, gated
from interlock_temporal.targets.payments import RefundRequest, RefundResult

from .support_case import CaseFile


def refund_key(r: RefundRequest) -> dict[str, str]:
    """The approved decision: this case, this order (not the amount: a re-decided amount under
    the same case is a conflict, caught by identity)."""
    return {"case": r.case_id, "order": r.order_id}


def refund_amount(r: RefundRequest) -> int:
    return r.amount_cents


def refund_resource(r: RefundRequest) -> str:
    return f"order:{r.order_id}"


#: how a refund is gated: its identity, the premises it carries, what its lease checks
REFUND_EFFECT: dict[str, Any] = {
    "key": refund_key,
    "premises": "premises",
    "amount": refund_amount,
    "resource": refund_resource,
}


class RefundService(Protocol):
    """What the agent and the refund activity call: read an order's facts, refund it."""

    def order_facts(self, order_id: str) -> dict[str, Any]: ...

    async def refund(
        self, order_id: str, amount_cents: int, *, idempotency_key: str | None = None
    ) -> RefundResult: ...


def support_activities(
    payments: RefundService, target: EffectTarget | None = None
) -> list[Callable[..., Any]]:
    """``payments`` sends; ``target`` (default: ``payments`` itself, as for the simulated
    service) is what the gate asks about the effect."""
    gate_target: Any = target if target is not None else payments

    @activity.defn(name="decide_refund")
    async def decide_refund(case: CaseFile) -> RefundRequest:
        """The scripted agent: reads the order, approves what the case says, and records the
        facts it relied on."""
        return RefundRequest(
            case_id=case.case_id,
            order_id=case.order_id,
            amount_cents=case.amount_cents,
            reason=f"support case {case.case_id}",
            premises=payments.order_facts(case.order_id),
        )

    @activity.defn(name="refund")
    @gated(target=gate_target, **REFUND_EFFECT)
    async def refund(r: RefundRequest) -> RefundResult:
        return await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().idempotency_key
        )

    @activity.defn(name="refund_naive")
    async def refund_naive(r: RefundRequest) -> RefundResult:
        """Baseline: Temporal's retries and no key."""
        return await payments.refund(r.order_id, r.amount_cents)

    @activity.defn(name="refund_activity_key")
    async def refund_activity_key(r: RefundRequest) -> RefundResult:
        """Baseline: an idempotency key from the activity's delivery (changes on re-decision)."""
        info = activity.info()
        key = f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"
        return await payments.refund(r.order_id, r.amount_cents, idempotency_key=key)

    return [decide_refund, refund, refund_naive, refund_activity_key]
