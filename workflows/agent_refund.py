"""The agent's refund tool: a gated activity declared once, its target bound by the worker
(``InterlockPlugin(targets={"refund": payments})``), its payments service found by task queue.

The key reads only what the workflow decides (the case and the order); the model fills in the
amount and the reason. ``refund_unguarded`` is the same send with no gate, as an agent built with
``activity_as_tool`` alone has it: the demo's naive story."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from interlock_temporal import current_effect, gated
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments

from .activities import refund_amount, refund_key, refund_resource

#: the payments service each task queue's refunds go to (set by the worker that serves it)
SERVICES: dict[str, SimulatedPayments] = {}


@activity.defn(name="refund")
@gated(key=refund_key, amount=refund_amount, resource=refund_resource)
async def refund(r: RefundRequest) -> RefundResult:
    """Refund part of the customer's order: amount_cents (cents) and a short reason."""
    payments = SERVICES[activity.info().task_queue]
    return await payments.refund(
        r.order_id, r.amount_cents, idempotency_key=current_effect().idempotency_key
    )


class RefundAsked(BaseModel):
    """A refund as the model asks for it: the case, the order, the amount and the reason."""

    # the whole request is the model's: activity_as_tool needs a strict schema (no premises)

    case_id: str
    order_id: str
    amount_cents: int
    reason: str


@activity.defn(name="refund_unguarded")
async def refund_unguarded(r: RefundAsked) -> RefundResult:
    """Refund part of the customer's order: the case, the order, amount_cents (cents) and a
    short reason."""
    return await SERVICES[activity.info().task_queue].refund(r.order_id, r.amount_cents)
