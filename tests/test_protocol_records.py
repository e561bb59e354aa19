"""What the effect protocol records and answers on each path, entry by entry.

``test_protocol.py`` drives each edge of the effect protocol and checks the outcome; this file pins
what an auditor and the next attempt read afterwards: the data of every journal entry, the
receipt, the error a caller gets (its code, reason and retry delay) and the ticket handed to the
send. The target here behaves like a ledger of refunds against an order: its facts are read per
order with this effect's own refund left out, its query finds a refund through the order it was
made against (so it needs the approved input), and its validator only minds facts that make the
refund wrong (so a harmless change is not a stale premise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from interlock_temporal.core.errors import (
    Ambiguous,
    Denied,
    InFlight,
    InvalidCall,
    NeedsApproval,
    Refused,
    UnstableEffectKey,
)
from interlock_temporal.core.identity import digest
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Change, Draft, Found, Kind
from interlock_temporal.core.policy import Limits, Policy, PolicyGuard, deny, deny_when, modify
from interlock_temporal.core.protocol import (
    IN_FLIGHT_RETRY_S,
    NOT_OWNER_RETRY_S,
    POINTS,
    Call,
    Delivery,
    Done,
    Gate,
    Measure,
    Ticket,
)
from interlock_temporal.core.protocol.admission import Admission
from interlock_temporal.core.protocol.recorder import Recorder
from interlock_temporal.core.protocol.recovery import Recovery
from interlock_temporal.core.receipts import fold, receipt_of
from interlock_temporal.core.review import record_resolution, reopen
from interlock_temporal.core.sealing import Values

from .test_protocol import (
    ACTIVITY,
    PRINCIPAL,
    MemTarget,
    Rejected,
    TimedOut,
    Unreachable,
    connect,
    journal,
    lease,
    make_call,
)

__all__ = ["connect", "journal", "lease"]

WORKER = f"{socket.gethostname()}:"
ORDER = "o-1"


class Ledger(MemTarget):
    """Refunds against orders (see the module's docstring). Tier 1 dedupes and is queryable,
    tier 2 is queryable, tier 3 is neither."""

    name = "ledger"

    def __init__(self, tier: int = 2, **kwargs: Any) -> None:
        super().__init__(tier, **kwargs)
        self.balance = {ORDER: 10_000, "o-2": 500}
        if tier <= 2:
            self.query = self._by_order
        self.queried_with: list[Any] = []

    async def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        self.captures += 1
        order = args["order"]
        others = sum(
            r["amount"] for e, r in self.landed.items() if e != effect_id and r["order"] == order
        )
        return {"order": order, "refundable_cents": self.balance[order] - others}

    def _by_order(self, effect_id: str, args: Any) -> Found | None:
        self.queried_with.append(args)
        got = self.landed.get(effect_id)
        if got is None or got["order"] != args["order"]:
            return None
        return Found(result=got, confirmation=got["ref"])

    def validate(
        self, recorded: dict[str, Any], current: dict[str, Any], payload: Any
    ) -> list[Change]:
        changes = []
        if current["order"] != recorded.get("order"):
            changes.append(Change(fact="order", recorded=recorded.get("order")))
        if current["refundable_cents"] < payload["amount"]:
            changes.append(
                Change(
                    fact="refundable_cents",
                    recorded=recorded.get("refundable_cents"),
                    current=current["refundable_cents"],
                )
            )
        return changes

    async def send(self, ticket: Ticket) -> dict[str, Any]:
        self.sends += 1
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        prior = self.landed.get(ticket.effect_id)
        if prior is not None and self.tier == 1:
            return prior
        order = ticket.input["order"]
        result = {"ref": f"ref-{self.sends}", "amount": ticket.input["amount"], "order": order}
        self.landed[ticket.effect_id] = result
        return result


def refund(lease_id: str | None, amount: int = 20, **changes: Any) -> Call:
    """The refund, measured from the arguments the body receives: its amount, and the order as
    the resource a lease may scope."""
    call = make_call(lease_id, amount)
    return dataclasses.replace(
        call,
        measure=lambda args: Measure(args[0]["amount"], f"order/{args[0]['order']}"),
        **changes,
    )


def in_workflow(call: Call, workflow_id: str, **changes: Any) -> Call:
    delivery = Delivery(workflow_id=workflow_id, run_id="run-1", activity_id="7", attempt=2)
    return dataclasses.replace(call, delivery=delivery, admission={}, **changes)


def delivered(call: Call) -> dict[str, Any]:
    d = call.delivery
    return {
        "namespace": call.namespace,
        "workflow_id": d.workflow_id,
        "run_id": d.run_id,
        "activity_id": d.activity_id,
        "attempt": d.attempt,
    }


def record(journal: Journal, eid: str) -> list[tuple[Kind, dict[str, Any]]]:
    """The effect's entries as (kind, data), without the worker's name and the gate's own time
    (checked apart)."""
    out = []
    for e in journal.read(eid):
        data = dict(e.data)
        worker = data.pop("worker", None)
        assert worker is None or str(worker).startswith(WORKER)
        data.pop("gate_ms", None)
        out.append((e.kind, data))
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refusal(
    code: str,
    reason: str,
    changes: list[dict[str, Any]] | None = None,
    configuration: str | None = None,
) -> dict[str, Any]:
    data = {"code": code, "reason": reason, "executed": False, "changes": changes or []}
    return data if configuration is None else {**data, "configuration": configuration}


#: a refund's refusal without act_as's lease (the caller's configuration: decided again)
NO_LEASE = (
    f"no lease: act_as named principal {PRINCIPAL!r} and no lease. Run {ACTIVITY} inside "
    f'`with act_as({PRINCIPAL!r}, lease="<lease id>"):`, with a lease issued to {PRINCIPAL} '
    f"(`interlock leases issue {PRINCIPAL} --activity {ACTIVITY}`)"
)


def ambiguity(
    code: str, reason: str, changes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"code": code, "reason": reason, "executed": "unknown", "changes": changes or []}


def snapshot(journal: Journal, lease_id: str) -> dict[str, Any]:
    found = journal.leases.get(lease_id)
    assert found is not None
    return found.snapshot()


async def dispatched(gate: Gate, call: Call, target: Ledger) -> Ticket:
    """An attempt that records its dispatch and dies before sending."""
    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket)
    ticket.release()
    return ticket


# -- 1. the first dispatch, and a commit --------------------------------------------------------


async def test_the_first_dispatch_and_its_commit_record_what_was_decided(
    journal: Journal,
) -> None:
    budget = journal.leases.issue(
        PRINCIPAL, activities=[ACTIVITY], budget_cents=1_000, resources=["order/*"]
    )
    target = Ledger()
    call = in_workflow(refund(budget), "wf-1", session="s-1", namespace="ns")
    eid, pdigest = Gate.identify(call)
    points: list[tuple[str, str]] = []
    gate = Gate(journal, on_point=lambda name, at: points.append((name, at)))
    held = snapshot(journal, budget)

    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket)
    assert (ticket.effect_id, ticket.via, ticket.dispatch_no) == (eid, "dispatch", 1)
    assert (ticket.args, ticket.input) == (call.args, call.input)
    assert ticket.target is target and ticket.call is call
    assert ticket.head == journal.read(eid)[-1].hash
    assert journal.is_claimed(eid) and not ticket.released
    assert 0 < ticket.gate_s < 5

    result = await target.send(ticket)
    done = await gate.commit(ticket, result)
    assert (done.effect_id, done.result, done.via, done.after) == (eid, result, "dispatch", None)
    assert done.gate_s is not None and ticket.gate_s <= done.gate_s < 5
    assert ticket.released and not journal.is_claimed(eid)
    steps = ("claimed", "before_dispatch_tx", "after_dispatch_tx", "after_send", "after_commit_tx")
    assert points == [(name, eid) for name in steps]
    assert {name for name, _ in points} <= set(POINTS)

    facts = {"order": ORDER, "refundable_cents": 10_000}
    assert record(journal, eid) == [
        (
            Kind.PROPOSED,
            {
                "effect_type": "refund",
                "activity": ACTIVITY,
                "payload_digest": pdigest,
                "principal": PRINCIPAL,
                "lease_id": budget,
                "session": "s-1",
                "premises": facts,
                "premises_source": "capture",
                "target": "ledger",
                "tier": 2,
                "delivery": delivered(call),
                "input_digest": call.input_digest,
            },
        ),
        (
            Kind.AUTHORIZED,
            {
                "lease": held,
                "approved_digest": sha(call.args_canonical),
                "decided_by": ["lease"],
                "checks": ["lease", "premises"],
            },
        ),
        (
            Kind.DISPATCHED,
            {
                "via": "dispatch",
                "delivery": delivered(call),
                "premises_now": facts,
                "budget": {
                    "lease_id": budget,
                    "cents": 20,
                    "budget_cents": 1_000,
                    "reserved_cents": 20,
                },
            },
        ),
        (
            Kind.COMMITTED,
            {
                "via": "dispatch",
                "result_digest": sha(b'{"amount":20,"order":"o-1","ref":"ref-1"}'),
                "confirmation": "ref-1",
            },
        ),
    ]
    assert journal.read(eid)[-1].data["gate_ms"] == round(done.gate_s * 1000, 3)
    assert journal.blob(eid, "approved") == [call.input]
    assert journal.blob(eid, "result") == result


async def test_a_commit_records_the_confirmation_it_is_given(journal: Journal, lease: str) -> None:
    target = Ledger()
    gate = Gate(journal)
    ticket = await gate.begin(refund(lease), target)
    assert isinstance(ticket, Ticket)
    await gate.commit(ticket, await target.send(ticket), confirmation="bank-77")
    assert journal.read(ticket.effect_id)[-1].data["confirmation"] == "bank-77"


@pytest.mark.parametrize(
    ("case", "code", "reason", "changes"),
    [
        ("no lease id", "lease", NO_LEASE, []),
        ("revoked", "lease", "lease revoked", []),
        ("other resource", "lease", "resource outside the lease's scope", []),
        ("over budget", "lease_budget", "the lease's budget does not cover this amount", []),
        (
            "stale",
            "stale_premise",
            "the facts it relied on changed: refundable_cents",
            [{"fact": "refundable_cents", "recorded": 10_000, "current": 10, "rule": "equal"}],
        ),
    ],
)
async def test_a_refusal_at_dispatch_records_the_proposal_and_why(
    journal: Journal, case: str, code: str, reason: str, changes: list[dict[str, Any]]
) -> None:
    target = Ledger()
    lease_id: str | None = journal.leases.issue(
        PRINCIPAL, activities=[ACTIVITY], resources=["order/o-1"], budget_cents=100
    )
    call = refund(lease_id)
    if case == "no lease id":
        call = refund(None)
    elif case == "revoked":
        assert lease_id is not None and journal.leases.revoke(lease_id)
    elif case == "other resource":
        target.balance["o-2"] = 10_000
        call = refund(lease_id, input={**call.input, "order": "o-2"})
        call = dataclasses.replace(call, args=(call.input,))
    elif case == "over budget":
        call = refund(lease_id, amount=101)
    elif case == "stale":
        call = refund(lease_id)
        call = dataclasses.replace(
            call,
            input={**call.input, "premises": {"order": ORDER, "refundable_cents": 10_000}},
        )
        call = dataclasses.replace(call, args=(call.input,))
        target.balance[ORDER] = 10
    eid = Gate.identify(call)[0]
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(call, target)
    assert (refused.value.code, refused.value.reason) == (code, reason)
    configuration = "no_lease" if case == "no lease id" else None
    assert refused.value.configuration == configuration
    assert [c.model_dump(mode="json") for c in refused.value.changes] == changes
    r = refused.value.receipt
    assert (r.final, r.code, r.reason, r.executed, r.authorized) == (
        "REFUSED",
        code,
        reason,
        False,
        False,
    )
    assert [k for k, _ in record(journal, eid)] == [Kind.PROPOSED, Kind.REFUSED]
    assert record(journal, eid)[-1][1] == refusal(code, reason, changes, configuration)
    assert target.sends == 0 and not journal.is_claimed(eid)
    if lease_id is not None:
        assert journal.leases.get(lease_id).reserved_cents == 0  # type: ignore[union-attr]


# -- 4. a person reopens a refused effect --------------------------------------------------------


async def refused_then_reopened(journal: Journal, target: Ledger, call: Call) -> str:
    """The effect is refused at its first dispatch (its lease was revoked), then reopened."""
    assert call.lease_id is not None and journal.leases.revoke(call.lease_id)
    with pytest.raises(Refused):
        await Gate(journal).begin(call, target)
    eid = Gate.identify(call)[0]
    reopen(journal, eid, operator="carol")
    return eid


async def test_a_reopened_effect_is_authorised_afresh_under_the_callers_lease_and_facts(
    journal: Journal, lease: str
) -> None:
    target = Ledger()
    decided = {"order": ORDER, "refundable_cents": 10_000}
    first = refund(lease, premises_field="premises")
    first = dataclasses.replace(first, input={**first.input, "premises": decided})
    first = dataclasses.replace(first, args=(first.input,))
    eid = await refused_then_reopened(journal, target, first)

    # meanwhile another refund took 1,000 of the order; the agent decides again on today's facts
    target.balance[ORDER] = 9_000
    fresh = journal.leases.issue(
        "refund-bot-2", activities=[ACTIVITY], budget_cents=1_000, resources=["order/*"]
    )
    now = {"order": ORDER, "refundable_cents": 9_000}
    again = in_workflow(
        refund(fresh, principal="refund-bot-2", input={**first.input, "premises": now}),
        "wf-2",
    )
    again = dataclasses.replace(again, args=(again.input,))
    assert Gate.identify(again)[0] == eid  # the same effect
    held = snapshot(journal, fresh)
    points: list[str] = []
    gate = Gate(journal, on_point=lambda name, at: points.append(name) if at == eid else None)

    ticket = await gate.begin(again, target)
    assert isinstance(ticket, Ticket)
    assert (ticket.effect_id, ticket.via, ticket.dispatch_no) == (eid, "reopened", 1)
    assert (ticket.args, ticket.input) == (again.args, again.input)
    assert ticket.target is target and ticket.call is again
    assert ticket.head == journal.read(eid)[-1].hash
    assert journal.is_claimed(eid)
    assert points == ["claimed", "after_dispatch_tx"]
    assert record(journal, eid)[-2:] == [
        (
            Kind.AUTHORIZED,
            {
                "lease": held,
                "lease_id": fresh,
                "principal": "refund-bot-2",
                "premises": now,
                "approved_digest": sha(again.args_canonical),
                "decided_by": ["lease", "reopened:carol"],
                "checks": ["lease", "premises"],
            },
        ),
        (
            Kind.DISPATCHED,
            {
                "via": "reopened",
                "delivery": delivered(again),
                "premises_now": now,
                "budget": {
                    "lease_id": fresh,
                    "cents": 20,
                    "budget_cents": 1_000,
                    "reserved_cents": 20,
                },
            },
        ),
    ]
    # the approved input recorded is the reopening call's, so recovery without it can resend it
    assert journal.blob(eid, "approved") == [again.input]
    ticket.release()
    closed = await Gate(journal).close_out(eid, target, owner_ended="abandoned")
    assert target.queried_with == [again.input]
    assert (closed.final, closed.code) == ("REFUSED", "abandoned")

    r = receipt_of(fold(eid, journal.read(eid)))
    assert (r.lease_id, r.principal, r.lease_budget_cents) == (fresh, "refund-bot-2", 1_000)
    assert r.decided_by == ["lease", "reopened:carol", "operator:carol"]


@pytest.mark.parametrize("case", ["no lease id", "revoked", "budget", "stale", "resource"])
async def test_a_reopened_effect_is_refused_by_what_is_true_now(
    journal: Journal, lease: str, case: str
) -> None:
    target = Ledger()
    eid = await refused_then_reopened(journal, target, refund(lease))
    fresh: str | None = journal.leases.issue(
        PRINCIPAL, activities=[ACTIVITY], budget_cents=100, resources=["order/o-1"]
    )
    again = refund(fresh)
    expected: tuple[str, str, list[dict[str, Any]]]
    if case == "no lease id":
        again = refund(None)
        expected = ("lease", NO_LEASE, [])
    elif case == "revoked":
        assert fresh is not None and journal.leases.revoke(fresh)
        expected = ("lease", "lease revoked", [])
    elif case == "budget":
        again = dataclasses.replace(again, measure=lambda args: Measure(101, "order/o-1"))
        expected = ("lease_budget", "the lease's budget does not cover this amount", [])
    elif case == "stale":
        again = dataclasses.replace(
            again, input={**again.input, "premises": {"order": ORDER, "refundable_cents": 1}}
        )
        again = dataclasses.replace(again, args=(again.input,))
        target.balance[ORDER] = 10
        expected = (
            "stale_premise",
            "the facts it relied on changed: refundable_cents",
            [{"fact": "refundable_cents", "recorded": 1, "current": 10, "rule": "equal"}],
        )
    else:
        again = dataclasses.replace(again, measure=lambda args: Measure(20, "order/o-9"))
        expected = ("lease", "resource outside the lease's scope", [])
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(again, target)
    code, reason, changes = expected
    assert (refused.value.code, refused.value.reason) == (code, reason)
    assert [c.model_dump(mode="json") for c in refused.value.changes] == changes
    assert refused.value.receipt.final == "REFUSED"
    configuration = "no_lease" if case == "no lease id" else None
    assert record(journal, eid)[-1] == (
        Kind.REFUSED,
        refusal(code, reason, changes, configuration),
    )
    assert [k for k, _ in record(journal, eid)][-3:] == [Kind.REFUSED, Kind.REOPENED, Kind.REFUSED]
    assert target.sends == 0 and not journal.is_claimed(eid)


async def test_a_reopened_effect_with_a_harmless_change_is_sent(
    journal: Journal, lease: str
) -> None:
    """The target's validator judges the facts: a smaller balance that still covers the refund
    is no reason to refuse."""
    target = Ledger()
    eid = await refused_then_reopened(journal, target, refund(lease))
    again = refund(journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], max_amount_cents=50))
    again = dataclasses.replace(
        again, input={**again.input, "premises": {"order": ORDER, "refundable_cents": 10_000}}
    )
    again = dataclasses.replace(again, args=(again.input,))
    target.balance[ORDER] = 30
    ticket = await Gate(journal).begin(again, target)
    assert isinstance(ticket, Ticket) and ticket.effect_id == eid and ticket.via == "reopened"
    ticket.release()


# -- 5. in doubt: what recovery records -----------------------------------------------------------


async def test_recovery_by_query_records_what_the_target_found(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease)
    ticket = await dispatched(Gate(journal), call, target)
    landed = await target.send(ticket)  # it landed; the attempt died before recording it
    eid = ticket.effect_id
    done = await Gate(journal).begin(call, target)
    assert isinstance(done, Done)
    assert (done.result, done.via) == (landed, "recovery-query")
    assert target.queried_with == [call.input]
    assert record(journal, eid)[-1] == (
        Kind.COMMITTED,
        {
            "via": "recovery-query",
            "result_digest": sha(b'{"amount":20,"order":"o-1","ref":"ref-1"}'),
            "confirmation": "ref-1",
        },
    )
    assert not journal.is_claimed(eid)


@pytest.mark.parametrize("tier", [1, 2])
async def test_a_resend_records_its_dispatch_with_the_lease_at_recovery(
    journal: Journal, tier: int
) -> None:
    budget = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], budget_cents=1_000)
    target = Ledger(tier=tier)
    call = refund(budget)
    first = await dispatched(Gate(journal), call, target)
    eid = first.effect_id
    # another refund of the order landed meanwhile: the facts moved, but still cover this one
    target.landed["other"] = {"ref": "x", "amount": 9_000, "order": ORDER}
    held = snapshot(journal, budget)
    points: list[str] = []
    retry = in_workflow(call, "wf-other")
    retry = dataclasses.replace(retry, delivery=call.delivery)  # the owner's own retry
    ticket = await Gate(journal, on_point=lambda name, _: points.append(name)).begin(retry, target)
    assert isinstance(ticket, Ticket)
    via = "retry-idempotent" if tier == 1 else "recovery-reapply"
    assert (ticket.via, ticket.dispatch_no, ticket.effect_id) == (via, 2, eid)
    assert (ticket.args, ticket.input) == (call.args, call.input)
    assert ticket.target is target and ticket.call is retry and journal.is_claimed(eid)
    assert ticket.head == journal.read(eid)[-1].hash != first.head
    assert points == ["claimed", "before_recovery_tx", "after_dispatch_tx"]
    assert record(journal, eid)[-1] == (
        Kind.DISPATCHED,
        {
            "via": via,
            "delivery": delivered(call),
            "premises_now": {"order": ORDER, "refundable_cents": 1_000},
            # the lease as the resend reads it: without this effect's own reservation, which
            # the resend keeps instead of taking again
            "lease": {**held, "reserved_cents": 0},
            "budget": {
                "lease_id": budget,
                "cents": 20,
                "budget_cents": 1_000,
                "reserved_cents": 20,
            },
        },
    )
    await Gate(journal).commit(ticket, await target.send(ticket))
    assert not journal.is_claimed(eid)
    assert journal.leases.get(budget).reserved_cents == 20  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("case", "code", "reason"),
    [
        ("revoked", "lease_at_recovery", "lease revoked"),
        ("budget", "lease_budget", "the lease's budget does not cover this amount"),
        ("stale", "stale_premise_at_recovery", "the facts it relied on changed: refundable_cents"),
    ],
)
async def test_a_stale_recovery_after_a_confirmed_absence_is_refused(
    journal: Journal, case: str, code: str, reason: str
) -> None:
    budget = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], budget_cents=1_000)
    target = Ledger(tier=2)
    call = refund(budget)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    if case == "revoked":
        assert journal.leases.revoke(budget)
    elif case == "budget":
        # another effect on the same lease took what was left
        # another effect on the same lease took all that was left, and this one's resend is
        # measured at a cent more than it reserved (its own reservation is not counted twice)
        other = refund(budget, amount=980, key={"case": "c-2"})
        ticket = await Gate(journal).begin(other, target)
        assert isinstance(ticket, Ticket)
        ticket.release()
        call = dataclasses.replace(call, measure=lambda args: Measure(21, None))
    else:
        target.balance[ORDER] = 10
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(call, target)
    assert (refused.value.code, refused.value.reason) == (code, reason)
    changes = (
        [{"fact": "refundable_cents", "recorded": 10_000, "current": 10, "rule": "equal"}]
        if case == "stale"
        else []
    )
    assert record(journal, eid)[-1] == (Kind.REFUSED, refusal(code, reason, changes))
    assert refused.value.receipt.executed is False
    assert target.sends == 0


async def test_a_stale_recovery_that_cannot_confirm_absence_is_ambiguous(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=3)
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    assert journal.leases.revoke(lease)
    with pytest.raises(Ambiguous) as ambiguous:
        await Gate(journal).begin(call, target)
    reason = "lease revoked, and the target cannot say whether the effect happened"
    assert ambiguous.value.receipt.reason == reason
    assert record(journal, eid)[-1] == (Kind.AMBIGUOUS, ambiguity("lease_at_recovery", reason))


async def test_a_resend_nobody_can_check_is_ambiguous(journal: Journal, lease: str) -> None:
    target = Ledger(tier=3)
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    with pytest.raises(Ambiguous) as ambiguous:
        await Gate(journal).begin(call, target)
    reason = "the target can neither dedupe a resend nor be asked whether the effect happened"
    assert ambiguous.value.receipt.reason == reason
    assert record(journal, eid)[-1] == (Kind.AMBIGUOUS, ambiguity("unknowable", reason))
    assert target.sends == 0


async def test_an_unsettled_target_is_in_flight_until_it_settles(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2, settle_time=timedelta(seconds=30))
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    head = journal.read(eid)[-1].hash
    with pytest.raises(InFlight) as early:
        await Gate(journal).begin(call, target)
    assert (early.value.effect_id, early.value.reason, early.value.retry_after) == (
        eid,
        "the target may still be executing it",
        IN_FLIGHT_RETRY_S,
    )
    assert journal.read(eid)[-1].hash == head  # nothing recorded
    # a stale resend inside settle_time waits too, rather than calling it ambiguous now
    assert journal.leases.revoke(lease)
    with pytest.raises(InFlight) as stale:
        await Gate(journal).begin(call, target)
    assert stale.value.reason == "the target may still be executing it"
    assert journal.read(eid)[-1].hash == head
    # exactly settle_time after the dispatch, "not found" confirms the absence
    dispatched_at = journal.read(eid)[-1].ts
    at_settle = Gate(journal, clock=lambda: dispatched_at + 30)
    with pytest.raises(Refused) as refused:
        await at_settle.begin(call, target)
    assert refused.value.code == "lease_at_recovery"
    assert target.sends == 0


async def test_an_unsettled_target_on_the_last_attempt_is_ambiguous(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2, settle_time=timedelta(seconds=30))
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(dataclasses.replace(call, last_attempt=True), target)
    reason = "the target may still be executing it"
    assert record(journal, eid)[-1] == (Kind.AMBIGUOUS, ambiguity("unsettled", reason))


async def test_a_dedupable_resend_inside_settle_time_goes_out_only_if_nothing_changed(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=1, settle_time=timedelta(seconds=30))
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    target.balance[ORDER] = 10  # the refund is no longer covered
    with pytest.raises(InFlight):
        await Gate(journal).begin(call, target)
    target.balance[ORDER] = 10_000
    ticket = await Gate(journal).begin(call, target)
    assert isinstance(ticket, Ticket) and ticket.via == "retry-idempotent"
    ticket.release()
    assert journal.read(eid)[-1].kind is Kind.DISPATCHED


async def test_recovery_resends_the_recorded_input_decoded_for_the_body(
    journal: Journal, lease: str
) -> None:
    """An attempt whose input is not the one approved (a policy rewrote it) resends the
    recorded approved input, decoded into the body's types."""
    target = Ledger(tier=2)
    call = refund(lease)
    ticket = await dispatched(Gate(journal), call, target)

    class Decoded(dict[str, Any]):
        pass

    later = dataclasses.replace(
        call,
        input={**call.input, "premises": {"x": 1}},
        decode_args=lambda blob: (Decoded(blob[0]),),
    )
    later = dataclasses.replace(later, args=(later.input,))
    again = await Gate(journal).begin(later, target)
    assert isinstance(again, Ticket) and again.effect_id == ticket.effect_id
    assert again.args == call.args and isinstance(again.args[0], Decoded)
    assert target.queried_with == [call.input]
    again.release()


def recovery_part(journal: Journal) -> Recovery:
    """The gate's recovery part as ``Gate(journal)`` builds it: plain values, no policy, no
    crash points."""
    values = Values(journal.keyring)

    def no_point(name: str, eid: str) -> None:
        pass

    recorder = Recorder(journal, values, no_point, WORKER)
    admission = Admission(journal, None, WORKER)
    return Recovery(journal, values, time.time, no_point, recorder=recorder, admission=admission)


async def test_a_recorded_input_that_does_not_match_its_digest_is_never_sent(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    recovery = recovery_part(journal)
    view = fold(eid, journal.read(eid))
    with pytest.raises(InvalidCall) as err:
        await recovery.recorded_args(dataclasses.replace(view, approved_digest="0" * 64), None)
    assert str(err.value) == (
        f"effect {eid[:16]}: the approved input in the journal is missing or does not match "
        "its recorded digest"
    )
    assert await recovery.recorded_args(view, None) == (call.input,)


async def test_the_gate_answers_stored_values_and_receipts_from_the_record(
    journal: Journal, lease: str
) -> None:
    """``Gate.stored`` reads the entries it is given (else the journal's); ``receipt`` and
    ``receipt_or_none`` fold the journal's record (None: the effect has none)."""
    target = Ledger()
    gate = Gate(journal)
    ticket = await dispatched(gate, refund(lease), target)
    result = await target.send(ticket)
    await gate.commit(ticket, result)
    eid = ticket.effect_id
    assert await gate.stored(eid, "result") == result
    assert await gate.stored(eid, "approved", journal.read(eid)) == [ticket.input]
    assert await gate.stored(eid, "result", []) is None  # the entries given, not a read
    assert gate.receipt(eid) == receipt_of(fold(eid, journal.read(eid)))
    assert gate.receipt_or_none(eid) == gate.receipt(eid)
    assert gate.receipt_or_none("0" * 64) is None


# -- another workflow's attempt, and the last attempt while another holds the claim --------------


async def test_another_workflows_attempt_learns_by_query_and_otherwise_waits(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    owner = in_workflow(refund(lease), "wf-owner")
    ticket = await dispatched(Gate(journal), owner, target)
    eid = ticket.effect_id
    other = in_workflow(refund(lease), "wf-other")
    with pytest.raises(InFlight) as waits:
        await Gate(journal).begin(other, target)
    assert (waits.value.reason, waits.value.retry_after) == (
        "only the workflow that owns it may send it again",
        NOT_OWNER_RETRY_S,
    )
    assert target.queried_with == [owner.input]
    landed = await target.send(ticket)
    done = await Gate(journal).begin(other, target)
    assert isinstance(done, Done) and (done.result, done.via) == (landed, "recovery-query")
    assert record(journal, eid)[-1][1]["confirmation"] == "ref-1"
    assert target.sends == 1


async def test_a_last_attempt_while_another_holds_the_claim_is_ambiguous(
    connect: Any, journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease)
    holder = await Gate(journal).begin(call, target)  # live, holding the claim
    assert isinstance(holder, Ticket)
    other = Gate(connect())
    with pytest.raises(InFlight) as waits:
        await other.begin(call, target)
    assert (waits.value.reason, waits.value.retry_after) == (
        "another live attempt holds it",
        IN_FLIGHT_RETRY_S,
    )
    with pytest.raises(Ambiguous):
        await other.begin(dataclasses.replace(call, last_attempt=True), target)
    reason = "still in flight in another attempt when the last attempt ran"
    assert record(journal, holder.effect_id)[-1] == (Kind.AMBIGUOUS, ambiguity("in_flight", reason))
    # a conflicting payload on the last attempt is refused, whoever holds the claim
    with pytest.raises(Refused) as conflict:
        await other.begin(refund(lease, amount=30, last_attempt=True), target)
    assert conflict.value.code == "conflicting_payload"
    holder.release()


async def test_an_attempt_without_the_claim_answers_a_recorded_outcome(
    connect: Any, journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease)
    gate = Gate(journal)
    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket)
    result = await target.send(ticket)
    await gate.commit(ticket, result)
    claim = journal.claim(ticket.effect_id)  # a live attempt holds it again
    assert claim is not None
    try:
        done = await Gate(connect()).begin(call, target)
        assert isinstance(done, Done) and (done.result, done.via) == (result, "duplicate")
    finally:
        claim.release()


# -- a conflicting payload ----------------------------------------------------------------------


async def test_a_conflicting_payload_is_recorded_and_refused_without_touching_the_effect(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    gate = Gate(journal)
    call = refund(lease)
    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket)
    await gate.commit(ticket, await target.send(ticket))
    eid = ticket.effect_id
    redecided = in_workflow(refund(lease, amount=30), "wf-9")
    pdigest = Gate.identify(redecided)[1]
    with pytest.raises(Refused) as refused:
        await gate.begin(redecided, target)
    entries = journal.read(eid)
    assert record(journal, eid)[-1] == (
        Kind.REJECTED_PROPOSAL,
        {
            "code": "conflicting_payload",
            "payload_digest": pdigest,
            "delivery": delivered(redecided),
        },
    )
    r = refused.value.receipt
    assert (refused.value.code, refused.value.reason) == (
        "conflicting_payload",
        "a different payload was proposed under an effect id already decided",
    )
    assert (r.final, r.via, r.code, r.reason, r.executed, r.recorded) == (
        "REFUSED",
        None,
        "conflicting_payload",
        refused.value.reason,
        False,
        True,
    )
    assert (r.payload_digest, r.approved_digest, r.result_digest, r.confirmation) == (
        pdigest,
        None,
        None,
        None,
    )
    assert (r.journal_seq, r.journal_hash, r.changed_facts) == (
        entries[-1].seq,
        entries[-1].hash,
        [],
    )
    assert receipt_of(fold(eid, entries)).final == "COMMITTED"  # the effect is untouched
    assert target.sends == 1


# -- after the send: what a failure means ------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "last", "kind", "data"),
    [
        (
            Rejected("no"),
            False,
            Kind.REFUSED,
            refusal("target_rejected", "the target rejected the request (Rejected)"),
        ),
        (Unreachable("down"), False, Kind.NOT_SENT, {"error": "Unreachable"}),
        (
            Unreachable("down"),
            True,
            Kind.REFUSED,
            refusal(
                "not_sent",
                "the request never reached the target (Unreachable) "
                "and Temporal will make no further attempt",
            ),
        ),
        (
            TimedOut("?"),
            True,
            Kind.AMBIGUOUS,
            ambiguity(
                "send_failed",
                "the send failed in doubt (TimedOut) on the last attempt Temporal will make",
            ),
        ),
    ],
)
async def test_a_failed_send_records_what_it_means(
    journal: Journal,
    lease: str,
    error: Exception,
    last: bool,
    kind: Kind,
    data: dict[str, Any],
) -> None:
    target = Ledger(tier=2)
    target.fail_next = error
    call = refund(lease, last_attempt=last)
    eid = Gate.identify(call)[0]
    expected: type[BaseException] = type(error)
    if kind is Kind.REFUSED:
        expected = Refused
    elif kind is Kind.AMBIGUOUS:
        expected = Ambiguous
    with pytest.raises(expected) as raised:
        await Gate(journal).run(call, target, target.send)
    assert record(journal, eid)[-1] == (kind, data)
    if isinstance(raised.value, Refused | Ambiguous):
        assert raised.value.receipt.reason == data["reason"]
        assert raised.value.receipt.final == kind.value
    assert not journal.is_claimed(eid)


async def test_a_send_rejected_because_the_facts_moved_is_a_stale_premise(
    journal: Journal, lease: str
) -> None:
    class Moved(Rejected):
        changes = [Change(fact="refundable_cents", recorded=10_000, current=5)]

    target = Ledger(tier=2)
    target.fail_next = Moved("compare-and-swap failed")
    call = refund(lease)
    with pytest.raises(Refused) as refused:
        await Gate(journal).run(call, target, target.send)
    reason = "the facts it relied on changed: refundable_cents"
    assert (refused.value.code, refused.value.reason) == ("stale_premise", reason)
    assert [c.fact for c in refused.value.changes] == ["refundable_cents"]
    changes = [{"fact": "refundable_cents", "recorded": 10_000, "current": 5, "rule": "equal"}]
    assert record(journal, Gate.identify(call)[0])[-1] == (
        Kind.REFUSED,
        refusal("stale_premise", reason, changes),
    )


async def test_an_in_doubt_send_before_the_last_attempt_records_nothing(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    target.fail_next = TimedOut("?")
    call = refund(lease)
    with pytest.raises(TimedOut):
        await Gate(journal).run(call, target, target.send)
    eid = Gate.identify(call)[0]
    assert [k for k, _ in record(journal, eid)][-1] is Kind.DISPATCHED
    assert not journal.is_claimed(eid)


async def test_an_interrupted_send_releases_the_claim_and_records_nothing(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease)

    async def cancelled(ticket: Ticket) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await Gate(journal).run(call, target, cancelled)
    eid = Gate.identify(call)[0]
    assert journal.read(eid)[-1].kind is Kind.DISPATCHED
    assert not journal.is_claimed(eid)


# -- settling an effect whose owner is gone ------------------------------------------------------


async def test_close_out_says_why_in_the_refusal_and_the_ambiguity(
    journal: Journal, lease: str
) -> None:
    queried = Ledger(tier=2)
    eid = (await dispatched(Gate(journal), in_workflow(refund(lease), "wf-a"), queried)).effect_id
    r = await Gate(journal).close_out(eid, queried, owner_ended="cancelled")
    reason = (
        "its workflow was cancelled or terminated, and it never happened; nobody else may send it"
    )
    assert (r.final, r.code, r.reason) == ("REFUSED", "cancelled", reason)
    assert record(journal, eid)[-1] == (Kind.REFUSED, refusal("cancelled", reason))
    assert queried.queried_with == [refund(lease).input]

    blind = Ledger(tier=3)
    other = refund(lease, key={"case": "c-2"})
    eid = (await dispatched(Gate(journal), other, blind)).effect_id
    r = await Gate(journal).close_out(eid, blind, owner_ended="abandoned")
    reason = (
        "its workflow ended or moved on without it while it was in doubt, and the target "
        "cannot say whether it happened"
    )
    assert (r.final, r.code, r.reason) == ("AMBIGUOUS", "unknowable", reason)
    assert record(journal, eid)[-1] == (Kind.AMBIGUOUS, ambiguity("unknowable", reason))

    third = refund(lease, key={"case": "c-3"})
    eid = (await dispatched(Gate(journal), third, queried)).effect_id
    r = await Gate(journal).close_out(eid, queried, owner_ended="abandoned", why="the agent quit")
    assert r.reason == "the agent quit, and it never happened; nobody else may send it"


async def test_close_out_commits_what_the_target_finds_with_its_result(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    ticket = await dispatched(Gate(journal), refund(lease), target)
    landed = await target.send(ticket)
    r = await Gate(journal).close_out(ticket.effect_id, target, owner_ended="abandoned")
    assert (r.final, r.via, r.confirmation) == ("COMMITTED", "recovery-query", "ref-1")
    assert journal.blob(ticket.effect_id, "result") == landed
    assert r.result_digest == sha(b'{"amount":20,"order":"o-1","ref":"ref-1"}')


async def test_close_out_decodes_the_recorded_input_for_the_query(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    ticket = await dispatched(Gate(journal), refund(lease), target)
    decoded: list[Any] = []

    def decode(blob: list[Any]) -> tuple[Any, ...]:
        decoded.append(blob)
        return ({**blob[0], "decoded": True},)

    await Gate(journal).close_out(
        ticket.effect_id, target, owner_ended="abandoned", decode_args=decode
    )
    assert decoded == [[refund(lease).input]]
    assert target.queried_with == [{**refund(lease).input, "decoded": True}]


async def test_close_out_confirms_absence_exactly_at_settle_time(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2, settle_time=timedelta(seconds=30))
    eid = (await dispatched(Gate(journal), refund(lease), target)).effect_id
    at = journal.read(eid)[-1].ts + 30
    r = await Gate(journal, clock=lambda: at).close_out(eid, target, owner_ended="abandoned")
    assert r.final == "REFUSED"


async def test_close_out_after_a_person_said_not_happened_refuses_without_asking(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=3)
    call = refund(lease, last_attempt=True)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(call, target)
    record_resolution(journal, eid, kind="ambiguous", decision="not_happened", operators=["ann"])
    r = await Gate(journal).close_out(eid, target, owner_ended="cancelled")
    assert (r.final, r.code) == ("REFUSED", "cancelled")
    # a person's happened is an outcome: close_out leaves it as it is
    other = refund(lease, key={"case": "c-2"}, last_attempt=True)
    eid = (await dispatched(Gate(journal), other, target)).effect_id
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(other, target)
    record_resolution(journal, eid, kind="ambiguous", decision="happened", operators=["ann"])
    head = journal.read(eid)[-1].hash
    r = await Gate(journal).close_out(eid, target, owner_ended="cancelled")
    assert r.final == "RESOLVED" and journal.read(eid)[-1].hash == head


async def test_close_out_refuses_bad_arguments_and_a_held_effect(
    connect: Any, journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    with pytest.raises(InvalidCall) as bad:
        await Gate(journal).close_out("f" * 64, target, owner_ended="gone")  # type: ignore[arg-type]
    assert str(bad.value) == "owner_ended must be one of cancelled, abandoned"
    with pytest.raises(InvalidCall) as unknown:
        await Gate(journal).close_out("f" * 64, target, owner_ended="abandoned")
    assert str(unknown.value) == f"effect {'f' * 16} is not in the journal"
    holder = await Gate(journal).begin(refund(lease), target)
    assert isinstance(holder, Ticket)
    with pytest.raises(InFlight) as held:
        await Gate(connect()).close_out(holder.effect_id, target, owner_ended="abandoned")
    assert (held.value.effect_id, held.value.reason, held.value.retry_after) == (
        holder.effect_id,
        "another live attempt holds it",
        IN_FLIGHT_RETRY_S,
    )
    holder.release()


# -- the journal's head keeps moving ------------------------------------------------------------


async def test_an_effect_whose_record_keeps_moving_is_in_flight(
    journal: Journal, lease: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three reads in a row each find the chain moved by another writer: the attempt stops and
    asks to be retried rather than deciding on a record it cannot pin."""
    from interlock_temporal.core.errors import HeadConflict

    target = Ledger(tier=2)
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    appends: list[int] = []

    async def always_moved(*args: Any, **kwargs: Any) -> Any:
        appends.append(1)
        raise HeadConflict(eid, "", "")

    monkeypatch.setattr(journal, "append_async", always_moved)
    with pytest.raises(InFlight) as moving:
        await Gate(journal).begin(call, target)
    assert (moving.value.reason, moving.value.retry_after) == (
        "the effect's record keeps moving",
        IN_FLIGHT_RETRY_S,
    )
    assert len(appends) == 3
    assert not journal.is_claimed(eid)
    appends.clear()
    target.settle_time = timedelta(0)
    with pytest.raises(InFlight) as settling:
        await Gate(journal).close_out(eid, Ledger(tier=3), owner_ended="abandoned")
    assert (settling.value.effect_id, settling.value.reason) == (
        eid,
        "the effect's record keeps moving",
    )
    assert len(appends) == 3
    assert target.sends == 0


# -- the policy on a reopened effect ------------------------------------------------------------


async def test_a_reopened_effect_is_policed_again(journal: Journal, lease: str) -> None:
    target = Ledger()
    eid = await refused_then_reopened(journal, target, refund(lease))
    fresh = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY])
    deny = deny_when(lambda e: True, code="NO_MORE_REFUNDS")
    strict = Gate(journal, policy=PolicyGuard(Policy(rules=[deny]), journal.policy))
    with pytest.raises(Denied) as denied:
        await strict.begin(refund(fresh), target)
    assert denied.value.code == "NO_MORE_REFUNDS"
    assert journal.read(eid)[-1].kind is Kind.REOPENED  # nothing recorded, nothing sent

    policy = Policy(policy_id="refunds")
    gate = Gate(journal, policy=PolicyGuard(policy, journal.policy))
    ticket = await gate.begin(refund(fresh), target)
    assert isinstance(ticket, Ticket) and ticket.via == "reopened"
    authorized = record(journal, eid)[-2][1]
    assert authorized["decided_by"] == ["lease", "reopened:carol", "policy:refunds"]
    assert authorized["checks"] == ["lease", "premises", "policy"]
    assert authorized["policy"] == {
        "verdict": "ALLOW",
        "code": None,
        "policy_id": "refunds",
        "epoch": policy.epoch,
        "observed": False,
    }
    ticket.release()
    assert target.sends == 0


# -- a conflicting payload against an effect that is not committed --------------------------------


async def test_a_conflict_with_an_effect_in_doubt_or_refused_says_only_what_was_rejected(
    journal: Journal, lease: str
) -> None:
    target = Ledger()
    in_doubt = (await dispatched(Gate(journal), refund(lease), target)).effect_id
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(refund(lease, amount=30), target)
    r = refused.value.receipt
    assert (r.effect_id, r.final, r.recorded, r.executed) == (in_doubt, "REFUSED", True, False)

    stale = refund(lease, key={"case": "c-2"})
    stale = dataclasses.replace(
        stale, input={**stale.input, "premises": {"order": "o-2", "refundable_cents": 500}}
    )
    stale = dataclasses.replace(stale, args=(stale.input,))
    with pytest.raises(Refused) as first:
        await Gate(journal).begin(stale, target)
    assert first.value.receipt.changed_facts == ["order"]
    redecided = refund(lease, amount=30, key={"case": "c-2"})
    with pytest.raises(Refused) as conflict:
        await Gate(journal).begin(redecided, target)
    assert conflict.value.code == "conflicting_payload"
    assert conflict.value.receipt.changed_facts == []
    assert target.sends == 0


# -- the last attempt while another holds the claim, and the holder finishes meanwhile ------------


async def test_a_last_attempt_answers_from_an_outcome_recorded_while_it_looked(
    connect: Any, journal: Journal, lease: str
) -> None:
    target = Ledger()
    call = refund(lease)
    holder_gate = Gate(journal)
    holder = await holder_gate.begin(call, target)
    assert isinstance(holder, Ticket)
    result = await target.send(holder)
    other = connect()
    original = other.append_async

    async def holder_commits_first(*args: Any, **kwargs: Any) -> Any:
        await holder_gate.commit(holder, result)  # the holder records its outcome meanwhile
        return await original(*args, **kwargs)

    other.append_async = holder_commits_first  # type: ignore[method-assign]
    done = await Gate(other).begin(dataclasses.replace(call, last_attempt=True), target)
    assert isinstance(done, Done) and (done.result, done.via) == (result, "duplicate")
    assert journal.read(holder.effect_id)[-1].kind is Kind.COMMITTED


# -- recovery: the policy, a record without a lease, a dedupable resend with a lease problem ----


@pytest.mark.parametrize("tier", [1, 2])
async def test_a_resend_is_policed_again(journal: Journal, lease: str, tier: int) -> None:
    target = Ledger(tier=tier)
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    deny = deny_when(lambda e: True, code="FROZEN")
    strict = Gate(journal, policy=PolicyGuard(Policy(rules=[deny]), journal.policy))
    with pytest.raises(Denied) as denied:
        await strict.begin(refund(lease), target)
    assert denied.value.code == "FROZEN"
    assert journal.read(eid)[-1].kind is Kind.DISPATCHED
    assert target.sends == 0 and not journal.is_claimed(eid)


async def test_an_in_doubt_effect_recorded_without_a_lease_is_never_resent(
    journal: Journal, lease: str
) -> None:
    """A record that names no lease (written by another tool, or an older release) gives a
    resend no authority: refused once the target confirms the absence."""
    target = Ledger(tier=2)
    call = refund(lease)
    eid, pdigest = Gate.identify(call)
    journal.append(
        eid,
        "",
        [
            Draft(
                kind=Kind.PROPOSED,
                data={"effect_type": "refund", "activity": ACTIVITY, "payload_digest": pdigest},
            ),
            Draft(kind=Kind.AUTHORIZED, data={"approved_digest": sha(call.args_canonical)}),
            Draft(kind=Kind.DISPATCHED, data={"via": "dispatch"}),
        ],
        effect_type="refund",
        blobs={"approved": call.args_canonical},
    )
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(call, target)
    assert (refused.value.code, refused.value.reason) == ("lease_at_recovery", "no lease")
    assert record(journal, eid)[-1] == (Kind.REFUSED, refusal("lease_at_recovery", "no lease"))
    assert target.sends == 0


async def test_a_dedupable_resend_with_a_lease_problem_waits_for_the_target_to_settle(
    journal: Journal, lease: str
) -> None:
    """Inside the dedupe window with the facts unchanged, a resend could go out before the
    target settles; a revoked lease stops it, and until the target settles nobody can tell
    whether the first send landed: wait, and on the last attempt say so."""
    target = Ledger(tier=1, settle_time=timedelta(seconds=30))
    call = refund(lease)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    head = journal.read(eid)[-1].hash
    assert journal.leases.revoke(lease)
    with pytest.raises(InFlight) as waits:
        await Gate(journal).begin(call, target)
    assert (waits.value.effect_id, waits.value.reason, waits.value.retry_after) == (
        eid,
        "the target may still be executing it",
        IN_FLIGHT_RETRY_S,
    )
    assert journal.read(eid)[-1].hash == head and not journal.is_claimed(eid)
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(dataclasses.replace(call, last_attempt=True), target)
    reason = "lease revoked, and the target cannot say whether the effect happened"
    assert record(journal, eid)[-1] == (Kind.AMBIGUOUS, ambiguity("lease_at_recovery", reason))
    assert target.sends == 0


# -- changes whose values are not plain JSON ------------------------------------------------------


class Deadline(Ledger):
    """A validator that reports changes with datetime values (the journal records JSON)."""

    def validate(
        self, recorded: dict[str, Any], current: dict[str, Any], payload: Any
    ) -> list[Change]:
        return [
            Change(
                fact="deadline",
                recorded=datetime(2026, 1, 1, tzinfo=UTC),
                current=datetime(2026, 1, 2, tzinfo=UTC),
                rule="before",
            )
        ]


async def test_changes_are_recorded_as_json(journal: Journal, lease: str) -> None:
    changes = [
        {
            "fact": "deadline",
            "recorded": "2026-01-01T00:00:00Z",
            "current": "2026-01-02T00:00:00Z",
            "rule": "before",
        }
    ]
    reason = "the facts it relied on changed: deadline"
    with pytest.raises(Refused):
        await Gate(journal).begin(refund(lease), Deadline())
    eid = Gate.identify(refund(lease))[0]
    assert record(journal, eid)[-1] == (Kind.REFUSED, refusal("stale_premise", reason, changes))

    blind = Ledger(tier=3)
    other = refund(lease, key={"case": "c-2"})
    eid = (await dispatched(Gate(journal), other, blind)).effect_id
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(other, Deadline(tier=3))
    ambiguous = f"{reason}, and the target cannot say whether the effect happened"
    assert record(journal, eid)[-1] == (
        Kind.AMBIGUOUS,
        ambiguity("stale_premise_at_recovery", ambiguous, changes),
    )


async def test_a_last_attempt_gives_up_on_a_record_that_keeps_moving(
    connect: Any, journal: Journal, lease: str
) -> None:
    from interlock_temporal.core.errors import HeadConflict

    target = Ledger()
    call = refund(lease)
    holder = await Gate(journal).begin(call, target)
    assert isinstance(holder, Ticket)
    other = connect()
    appends: list[int] = []

    async def always_moved(*args: Any, **kwargs: Any) -> Any:
        appends.append(1)
        raise HeadConflict(holder.effect_id, "", "")

    other.append_async = always_moved  # type: ignore[method-assign]
    with pytest.raises(InFlight) as waits:
        await Gate(other).begin(dataclasses.replace(call, last_attempt=True), target)
    assert waits.value.reason == "another live attempt holds it"
    assert len(appends) == 3
    holder.release()


# -- what the policy sees, once per attempt --------------------------------------------------------


async def test_the_policy_sees_the_call_as_delivered_once_per_attempt(
    journal: Journal, lease: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its rules see who calls, in which session, namespace, workflow and attempt, and which
    effect; an attempt that reads the record again (another writer moved it) is not decided,
    or charged, twice."""
    from interlock_temporal.core.errors import HeadConflict

    seen: list[Any] = []

    def watch(event: Any) -> None:
        seen.append(event)

    gate = Gate(journal, policy=PolicyGuard(Policy(rules=[watch]), journal.policy))
    call = in_workflow(refund(lease), "wf-p", session="s-9", namespace="ns-1", param_names=("r",))
    eid = Gate.identify(call)[0]
    original = journal.append_async
    moved: list[int] = []

    async def moved_once(*args: Any, **kwargs: Any) -> Any:
        if not moved:
            moved.append(1)
            raise HeadConflict(eid, "", "")
        return await original(*args, **kwargs)

    monkeypatch.setattr(journal, "append_async", moved_once)
    ticket = await gate.begin(call, Ledger())
    assert isinstance(ticket, Ticket) and moved == [1]
    assert len(seen) == 1
    (event,) = seen
    assert (event.activity, event.args, event.effect_id) == (ACTIVITY, call.args, eid)
    assert (event.principal, event.session, event.namespace) == (PRINCIPAL, "s-9", "ns-1")
    assert (event.workflow_id, event.attempt, event.param_names) == ("wf-p", 2, ("r",))
    assert event.argument("r") == call.input
    ticket.release()


async def test_a_rewrite_is_recorded_with_the_policys_note(journal: Journal, lease: str) -> None:
    def cap_at_10(event: Any) -> Any:
        return modify({**event.input, "amount": 10})

    policy = Policy(rules=[cap_at_10], policy_id="refunds")
    gate = Gate(journal, policy=PolicyGuard(policy, journal.policy))
    ticket = await gate.begin(refund(lease), Ledger())
    assert isinstance(ticket, Ticket) and ticket.args[0]["amount"] == 10
    authorized = record(journal, ticket.effect_id)[1][1]
    assert authorized["decided_by"] == ["lease", "policy:refunds"]
    assert authorized["checks"] == ["lease", "premises", "policy"]
    assert authorized["policy"] == {
        "verdict": "MODIFY",
        "code": "MODIFIED",
        "policy_id": "refunds",
        "epoch": policy.epoch,
        "observed": False,
    }
    ticket.release()


async def test_what_a_monitored_rule_would_have_done_is_recorded_under_its_name(
    journal: Journal, lease: str
) -> None:
    def no_refunds(event: Any) -> Any:
        return deny("NO_REFUNDS", "refunds are paused")

    policy = Policy(rules=[no_refunds], mode="monitor", policy_id="refunds")
    gate = Gate(journal, policy=PolicyGuard(policy, journal.policy))
    ticket = await gate.begin(refund(lease), Ledger())
    assert isinstance(ticket, Ticket)
    authorized = record(journal, ticket.effect_id)[1][1]
    assert authorized["decided_by"] == ["lease", "policy:no_refunds"]
    assert authorized["policy"] == {
        "verdict": "ALLOW",
        "code": "NO_REFUNDS",
        "policy_id": "no_refunds",
        "epoch": policy.epoch,
        "observed": True,
    }
    ticket.release()


# -- premises only from an object, inputs of several arguments ------------------------------------


@pytest.mark.parametrize("args", [(), ("just a string",)])
async def test_decision_premises_come_only_from_a_first_argument_that_is_an_object(
    journal: Journal, lease: str, args: tuple[Any, ...]
) -> None:
    target = MemTarget(tier=2)
    call = Call(
        effect_type="ping",
        activity=ACTIVITY,
        input=args[0] if args else (),
        args=args,
        premises_field="premises",
        principal=PRINCIPAL,
        lease_id=lease,
        measure=lambda _: Measure(1),
    )
    ticket = await Gate(journal).begin(call, target)
    assert isinstance(ticket, Ticket)
    assert record(journal, ticket.effect_id)[0][1]["premises_source"] == "capture"
    ticket.release()


async def test_a_resend_of_several_arguments_hands_the_target_all_of_them(
    journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=2)
    args = ({"order": ORDER, "amount": 20}, "note")
    call = Call(
        effect_type="refund",
        activity=ACTIVITY,
        input=args,
        args=args,
        principal=PRINCIPAL,
        lease_id=lease,
        measure=lambda a: Measure(a[0]["amount"]),
    )
    await dispatched(Gate(journal), call, target)  # type: ignore[arg-type]
    again = await Gate(journal).begin(call, target)
    assert isinstance(again, Ticket) and again.via == "recovery-reapply"
    assert again.input == args and again.args == args
    again.release()


# -- late outcomes: another attempt recorded one first --------------------------------------------


async def test_a_zombie_commit_after_recovery_committed_returns_what_was_recorded(
    connect: Any, journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease)
    zombie_gate = Gate(journal)
    zombie = await zombie_gate.begin(call, target)
    assert isinstance(zombie, Ticket)
    result = await target.send(zombie)
    zombie.release()  # it looks dead; it is only slow
    recovered = await Gate(connect()).begin(call, target)
    assert isinstance(recovered, Done) and recovered.via == "recovery-query"
    done = await zombie_gate.commit(zombie, result)
    assert (done.via, done.after, done.result) == ("recovery-query", Kind.COMMITTED, result)
    assert [k for k, _ in record(journal, zombie.effect_id)].count(Kind.COMMITTED) == 1


async def test_recovery_that_finds_the_effect_while_its_sender_commits_returns_the_record(
    connect: Any, journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease)
    sender_gate = Gate(journal)
    sender = await sender_gate.begin(call, target)
    assert isinstance(sender, Ticket)
    result = await target.send(sender)
    sender.release()
    recovering = connect()
    original = recovering.append_async

    async def sender_commits_first(*args: Any, **kwargs: Any) -> Any:
        await sender_gate.commit(sender, result)
        return await original(*args, **kwargs)

    recovering.append_async = sender_commits_first  # type: ignore[method-assign]
    done = await Gate(recovering).begin(call, target)
    assert isinstance(done, Done)
    assert (done.result, done.via, done.after) == (result, "dispatch", Kind.COMMITTED)


async def test_a_failed_last_send_after_another_attempt_called_it_ambiguous_adds_nothing(
    connect: Any, journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    call = refund(lease, last_attempt=True)
    holder_gate = Gate(journal)
    holder = await holder_gate.begin(call, target)
    assert isinstance(holder, Ticket)
    with pytest.raises(Ambiguous):  # another last attempt, while the holder's send hangs
        await Gate(connect()).begin(call, target)
    with pytest.raises(Ambiguous):
        await holder_gate.fail(holder, TimedOut("?"), last_attempt=True)
    assert [k for k, _ in record(journal, holder.effect_id)].count(Kind.AMBIGUOUS) == 1
    assert record(journal, holder.effect_id)[-1][1]["code"] == "in_flight"


async def test_a_commit_whose_record_keeps_moving_is_retried_later(
    journal: Journal, lease: str
) -> None:
    from interlock_temporal.core.errors import HeadConflict

    target = Ledger(tier=2)
    gate = Gate(journal)
    ticket = await gate.begin(refund(lease), target)
    assert isinstance(ticket, Ticket)
    result = await target.send(ticket)
    appends: list[int] = []

    async def always_moved(*args: Any, **kwargs: Any) -> Any:
        appends.append(1)
        raise HeadConflict(ticket.effect_id, "", "")

    journal.append_async = always_moved  # type: ignore[method-assign]
    with pytest.raises(InFlight) as later:
        await gate.commit(ticket, result)
    assert (later.value.reason, later.value.retry_after) == (
        "could not record the outcome: the record keeps moving",
        0.1,
    )
    assert len(appends) == 5 and ticket.released


async def test_a_reopened_effect_sends_what_the_policy_rewrote(
    journal: Journal, lease: str
) -> None:
    """A rewrite applies to a reopened effect as to a first dispatch: the body receives the
    rewritten input, and the journal records it as the approved input."""
    target = Ledger()
    eid = await refused_then_reopened(journal, target, refund(lease))

    def cap_at_10(event: Any) -> Any:
        return modify({**event.input, "amount": 10})

    gate = Gate(journal, policy=PolicyGuard(Policy(rules=[cap_at_10]), journal.policy))
    again = refund(journal.leases.issue(PRINCIPAL, activities=[ACTIVITY]))
    ticket = await gate.begin(again, target)
    assert isinstance(ticket, Ticket) and ticket.via == "reopened"
    rewritten = {**again.input, "amount": 10}
    assert (ticket.args, ticket.input) == ((rewritten,), rewritten)
    assert journal.blob(eid, "approved") == [rewritten]
    authorized = record(journal, eid)[-2][1]
    assert authorized["approved_digest"] == digest([rewritten])
    done = await gate.commit(ticket, await target.send(ticket))
    assert done.result["amount"] == 10


async def test_a_changed_key_closes_out_the_first_effect_querying_with_its_decoded_input(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=2)
    delivery = Delivery(workflow_id="wf-k", run_id="run-1", activity_id="3", attempt=1)
    first = refund(lease, key={"at": 1}, delivery=delivery)
    await dispatched(Gate(journal), first, target)
    retry = refund(
        lease,
        key={"at": 2},
        delivery=dataclasses.replace(delivery, attempt=2),
        decode_args=lambda blob: ({**blob[0], "decoded": True},),
    )
    with pytest.raises(UnstableEffectKey):
        await Gate(journal).begin(retry, target)
    assert target.queried_with == [{**first.input, "decoded": True}]
    assert target.sends == 0


async def test_a_rewrite_that_is_not_json_data_is_refused_naming_the_activity(
    journal: Journal, lease: str
) -> None:
    class Opaque:
        pass

    def opaque(event: Any) -> Any:
        return modify({**event.input, "note": Opaque()})

    gate = Gate(journal, policy=PolicyGuard(Policy(rules=[opaque]), journal.policy))
    call = refund(lease)
    with pytest.raises(InvalidCall) as bad:
        await gate.begin(call, Ledger())
    assert str(bad.value).startswith(
        f"a policy rule rewrote the input of {ACTIVITY} into one that is not JSON data: "
    )
    assert journal.read(Gate.identify(call)[0]) == []


@pytest.mark.parametrize(("session", "denied_in"), [("s-1", "s-1"), (None, "wf-d")])
async def test_a_denial_names_the_session_whose_circuit_it_trips(
    journal: Journal, lease: str, session: str | None, denied_in: str
) -> None:
    deny = deny_when(lambda e: True, code="FROZEN")
    gate = Gate(journal, policy=PolicyGuard(Policy(rules=[deny]), journal.policy))
    with pytest.raises(Denied) as denied:
        await gate.begin(in_workflow(refund(lease), "wf-d", session=session), Ledger())
    assert denied.value.session == denied_in


async def test_an_approval_is_bound_to_the_effect_and_names_its_approver(
    journal: Journal, lease: str
) -> None:
    policy = Policy(Limits(hitl_activities=(ACTIVITY,)), policy_id="refunds")
    gate = Gate(journal, policy=PolicyGuard(policy, journal.policy))
    call = in_workflow(refund(lease), "wf-a")
    eid = Gate.identify(call)[0]
    with pytest.raises(NeedsApproval) as asked:
        await gate.begin(call, Ledger())
    assert asked.value.binding == eid
    pending = journal.policy.approval(eid)
    assert pending is not None and pending.status == "pending"
    journal.policy.decide_approval(eid, approve=True, operators=["carol"])
    retry = dataclasses.replace(
        call, delivery=dataclasses.replace(call.delivery, attempt=3), admission={}
    )
    ticket = await gate.begin(retry, Ledger())
    assert isinstance(ticket, Ticket)
    assert record(journal, eid)[1][1]["decided_by"] == ["lease", "policy:refunds", "approver:carol"]
    ticket.release()


async def test_the_same_delivery_seen_again_is_a_replay(journal: Journal, lease: str) -> None:
    """A Temporal retry is a new attempt; the very same delivery (run, activity, attempt) seen
    again is a replay, and the policy denies its resend."""
    gate = Gate(journal, policy=PolicyGuard(Policy(), journal.policy))
    target = Ledger()
    call = in_workflow(refund(lease), "wf-r")
    await dispatched(gate, call, target)
    with pytest.raises(Denied):
        await gate.begin(dataclasses.replace(call, admission={}), target)
    assert target.sends == 0


async def test_a_call_with_no_temporal_delivery_is_never_taken_for_a_replay(
    journal: Journal, lease: str
) -> None:
    """Called outside an activity (no activity id), two attempts cannot be told apart by their
    delivery: neither is a replay of the other."""
    gate = Gate(journal, policy=PolicyGuard(Policy(), journal.policy))
    target = Ledger()
    call = refund(lease)
    assert call.delivery.activity_id is None
    await dispatched(gate, call, target)
    ticket = await gate.begin(dataclasses.replace(call, admission={}), target)
    assert isinstance(ticket, Ticket)
    ticket.release()


async def test_an_outcome_a_person_attested_is_returned_as_resolved(
    journal: Journal, lease: str
) -> None:
    target = Ledger(tier=3)
    call = refund(lease, last_attempt=True)
    eid = (await dispatched(Gate(journal), call, target)).effect_id
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(call, target)
    attested = {"ref": "bank-9", "amount": 20, "order": ORDER}
    record_resolution(
        journal, eid, kind="ambiguous", decision="happened", operators=["ann"], result=attested
    )
    done = await Gate(journal).begin(refund(lease), target)
    assert isinstance(done, Done) and (done.result, done.via) == (attested, "resolved")
    assert target.sends == 0


async def test_decision_premises_are_recorded_as_the_decisions(
    journal: Journal, lease: str
) -> None:
    decided = {"order": ORDER, "refundable_cents": 10_000}
    call = refund(lease)
    call = dataclasses.replace(call, input={**call.input, "premises": decided})
    call = dataclasses.replace(call, args=(call.input,))
    ticket = await Gate(journal).begin(call, Ledger())
    assert isinstance(ticket, Ticket)
    proposed = record(journal, ticket.effect_id)[0][1]
    assert (proposed["premises"], proposed["premises_source"]) == (decided, "decision")
    ticket.release()


def test_every_argument_after_the_first_is_part_of_the_payload() -> None:
    def call_with(second: str, third: str) -> Call:
        first = {"order": ORDER, "amount": 20, "premises": {"order": ORDER}}
        return Call(
            effect_type="refund",
            activity=ACTIVITY,
            input=(first, second, third),
            args=(first, second, third),
            premises_field="premises",
        )

    base = Gate.identify(call_with("b", "c"))
    assert Gate.identify(call_with("b", "x")) != base
    assert Gate.identify(call_with("x", "c")) != base


def test_a_key_that_is_not_valid_unicode_is_refused_naming_the_activity() -> None:
    call = refund(None, key={"name": "\ud800"})
    with pytest.raises(InvalidCall) as bad:
        Gate.identify(call)
    assert str(bad.value) == (
        f"the effect key or input of {ACTIVITY} is not JSON data: "
        "a string that is not valid Unicode (a lone surrogate)"
    )
