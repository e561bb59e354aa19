"""What each row of the fault table does to its world: the scripts. What a row must show,
gated and without the gate, is written down in ``scenarios.SCENARIOS``, where each row names
its script."""

from __future__ import annotations

from collections.abc import Callable

from workflows.support_case import CaseOutcome

from .world import REFUND_CENTS, Observed, World

REDECIDED_CENTS = 3_000
OPERATOR = "carol"


async def _crash_then(
    w: World, point: str, during_outage: Callable[[World], None] | None = None
) -> CaseOutcome:
    w.payments.arm(point, w.kill)  # type: ignore[arg-type]
    run = await w.start(w.case())
    await w.crashed(run)
    if during_outage is not None:
        during_outage(w)
    await w.restart()
    return await w.result(run)


async def happy_path(w: World) -> Observed:
    return Observed(await w.submit(w.case()))


async def crash_before_send(w: World) -> Observed:
    return Observed(await _crash_then(w, "before_send"))


async def crash_before_ack(w: World) -> Observed:
    return Observed(await _crash_then(w, "after_commit"))


async def duplicate_submit(w: World) -> Observed:
    first = await w.submit(w.case())
    calls_after_first = w.payments.calls(w.order_id)
    second = await w.submit(w.case())
    return Observed(
        second,
        {
            "first": first.model_dump(mode="json"),
            "body_ran_again": w.payments.calls(w.order_id) != calls_after_first,
            "same_result": first.refund == second.refund,
        },
    )


async def model_redecides(w: World) -> Observed:
    recovered = await _crash_then(w, "after_commit")
    redecided = await w.submit(w.case(amount_cents=REDECIDED_CENTS))
    return Observed(redecided, {"after_row_3": recovered.status})


async def lease_revoked(w: World) -> Observed:
    w.journal.leases.revoke(w.lease_id)
    return Observed(await w.submit(w.case()))


async def stale_premise(w: World) -> Observed:
    """The order stops being eligible after the agent decided, before the gate dispatches: at
    the gate's capture of the premises. A baseline captures nothing: there it happens at the
    same moment of the story, after the decision, as the send starts."""
    w.payments.arm("capture" if w.mode == "gated" else "before_send", "make_ineligible")
    return Observed(await w.submit(w.case()))


async def refund_during_outage(w: World) -> Observed:
    def support_refunds_by_hand(w: World) -> None:
        w.payments.manual_refund(w.order_id, REFUND_CENTS)

    return Observed(await _crash_then(w, "before_send", support_refunds_by_hand))


async def lease_revoked_during_outage(w: World) -> Observed:
    def revoke(w: World) -> None:
        w.journal.leases.revoke(w.lease_id)

    return Observed(await _crash_then(w, "before_send", revoke))


async def key_expired(w: World) -> Observed:
    def window_passes(w: World) -> None:
        w.payments.advance_clock(25 * 3600)

    return Observed(await _crash_then(w, "after_commit", window_passes))


async def in_flight_race(w: World) -> Observed:
    return await w.in_flight_race()


async def _resolved(w: World, point: str, decision: str) -> Observed:
    """The row's crash at tier 3 leaves the effect AMBIGUOUS; the workflow waits for a person,
    who decides the review; the workflow then completes."""
    w.payments.arm(point, w.kill)  # type: ignore[arg-type]
    run = await w.start(w.case(wait_for_review=True))
    await w.crashed(run)
    await w.restart()
    await w.resolve(decision, OPERATOR, "checked the payments dashboard")
    outcome = await w.result(run)
    return Observed(outcome, {"decision": decision, "operator": OPERATOR})


async def ambiguous_resolved_happened(w: World) -> Observed:
    return await _resolved(w, "after_commit", "happened")


async def ambiguous_resolved_not_happened(w: World) -> Observed:
    return await _resolved(w, "before_send", "not_happened")


async def concurrent_submit(w: World) -> Observed:
    outcomes = await w.concurrent_submit(8)
    refunds = {o.refund.refund_id if o.refund else None for o in outcomes}
    return Observed(
        outcomes[0],
        {
            "workflows": len(outcomes),
            "distinct_results": len(refunds),
            "statuses": sorted({o.status for o in outcomes}),
        },
    )
