"""The effect protocol's edges, driving ``Gate`` directly.

Each test uses a real SQLite journal in ``tmp_path`` (``verify()`` must pass when it is done) and
either ``MemTarget``, a minimal in-memory target configured to a tier, or the simulated payments
service. A "crash" is an attempt that releases its claim without writing its outcome, as a dead
process does; the "retry" is a fresh ``Gate``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal import open_journal, receipt
from interlock_temporal.core.errors import (
    Ambiguous,
    InFlight,
    InvalidCall,
    JournalUnavailable,
    Refused,
)
from interlock_temporal.core.identity import digest, effect_id
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import FINAL_STATES, Change, Entry, Found, Kind
from interlock_temporal.core.protocol import Call, Delivery, Done, Gate, Measure, Ticket
from interlock_temporal.core.review import record_resolution, reopen
from interlock_temporal.targets.payments import (
    RefundRequest,
    RefundResult,
    SimulatedCrash,
    SimulatedPayments,
)
from interlock_temporal.testing import throwaway_journal

KEY = "00" * 32
PRINCIPAL = "refund-bot"
ACTIVITY = "refund_order_zq9"
#: distinctive argument values: none may appear in a receipt or an error message
NOTE = "card 4242 pin=SECRET-PIN-8812"
AMOUNT = 1_234
LEASE_MAX = 5_000
WINDOW = timedelta(hours=24)


# -- a minimal target ---------------------------------------------------------------------------


class Rejected(Exception):
    """The target refused the request: nothing happened."""


class Unreachable(Exception):
    """The request never left: nothing happened."""


class TimedOut(Exception):
    """Nobody knows whether the request landed."""


class MemTarget:
    """Facts in a dict, landed effects in a dict keyed by the effect id (the idempotency key).

    Tier 1: dedupes a resend by key inside ``WINDOW`` and is queryable; tier 2: queryable;
    tier 3: neither (``query`` is absent, as an adapter without it would be).
    """

    name = "mem"

    def __init__(
        self,
        tier: int = 2,
        *,
        settle_time: timedelta = timedelta(0),
        validate: Callable[..., list[Change]] | None = None,
    ) -> None:
        self.tier = tier
        self.dedupe_window: timedelta | None = WINDOW if tier == 1 else None
        self.settle_time = settle_time
        if tier <= 2:
            self.query = self._query
        if validate is not None:
            self.validate = validate
        self.facts: dict[str, Any] = {"order": "o-1", "refundable_cents": 10_000}
        self.landed: dict[str, dict[str, Any]] = {}
        self.offset = 0.0
        self.sends = 0
        self.captures = 0
        self.capture_gate: asyncio.Event | None = None
        self.fail_next: BaseException | None = None

    async def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        self.captures += 1
        if self.capture_gate is not None:
            await self.capture_gate.wait()
        return dict(self.facts)

    def _query(self, effect_id: str, args: Any) -> Found | None:
        got = self.landed.get(effect_id)
        return None if got is None else Found(result=got, confirmation=got["ref"])

    def clock(self) -> float:
        return time.time() + self.offset

    def confirmation(self, result: Any) -> str | None:
        return result.get("ref") if isinstance(result, dict) else None

    def classify(self, error: BaseException) -> str:
        if isinstance(error, Rejected):
            return "rejected"
        if isinstance(error, Unreachable):
            return "not_sent"
        return "in_doubt"

    async def send(self, ticket: Ticket) -> dict[str, Any]:
        """The activity body: send the approved input with the effect id as the key."""
        self.sends += 1
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        prior = self.landed.get(ticket.effect_id)
        if prior is not None and self.tier == 1:
            return prior  # a real tier-1 service dedupes inside the window
        result = {"ref": f"ref-{self.sends}", "amount": ticket.input["amount"]}
        self.landed[ticket.effect_id] = result
        return result


# -- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(params=[False, True], ids=["separate", "combined"])
def connect(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Journal]]:
    """Journal connections to one file (``tmp_path/journal.db``); every chain verifies at the
    end of the test. Each test runs twice: with the dispatch transaction's entries written
    separately, and combined as one of format 3 (``SqlJournal.combine_dispatch``)."""
    opened: list[Journal] = []

    def open_(url_suffix: str = "") -> Journal:
        if url_suffix:
            j = open_journal(f"sqlite:///{tmp_path / 'journal.db'}{url_suffix}", signing_key=KEY)
        else:
            j = throwaway_journal(tmp_path)
        j.combine_dispatch = request.param or j.combine_dispatch  # type: ignore[attr-defined]
        opened.append(j)
        return j

    yield open_
    report = opened[0].verify() if opened else None
    for j in opened:
        j.close()
    if report is not None:
        assert report.ok, str(report)


@pytest.fixture
def journal(connect: Callable[..., Journal]) -> Journal:
    return connect()


@pytest.fixture
def lease(journal: Journal) -> str:
    return journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], max_amount_cents=LEASE_MAX)


def payload(amount: int = 20, *, premises: dict[str, Any] | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"case": "c-1", "order": "o-1", "amount": amount, "note": NOTE}
    if premises is not None:
        p["premises"] = premises
    return p


def make_call(
    lease_id: str | None,
    amount: int = 20,
    *,
    premises: dict[str, Any] | None = None,
    key: Any = "default",
    principal: str = PRINCIPAL,
    amount_cents: int | None = None,
    last_attempt: bool = False,
) -> Call:
    p = payload(amount, premises=premises)
    return Call(
        effect_type="refund",
        activity=ACTIVITY,
        input=p,
        args=(p,),
        key={"case": "c-1", "order": "o-1"} if key == "default" else key,
        premises_field="premises",
        principal=principal,
        lease_id=lease_id,
        measure=lambda _args, cents=amount if amount_cents is None else amount_cents: Measure(
            cents
        ),
        last_attempt=last_attempt,
    )


def eid_of(call: Call) -> str:
    return Gate.identify(call)[0]


def kinds(journal: Journal, eid: str) -> list[Kind]:
    return [e.kind for e in journal.read(eid)]


async def died_before_send(gate: Gate, call: Call, target: MemTarget) -> Ticket:
    """The first attempt records its dispatch, then dies before sending."""
    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket)
    ticket.release()
    return ticket


async def died_after_send(gate: Gate, call: Call, target: MemTarget) -> dict[str, Any]:
    """The first attempt's send lands at the target, then it dies before recording it."""
    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket)
    result = await target.send(ticket)
    ticket.release()
    return result


# -- 1. claim, then read, then decide -----------------------------------------------------------


async def test_two_concurrent_first_attempts_get_one_ticket(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=2)
    target.capture_gate = asyncio.Event()
    gates = [Gate(journal), Gate(connect())]  # two connections, two sets of claims: two workers
    call = make_call(lease)

    async def let_both_in() -> None:
        for _ in range(10):  # both attempts run as far as they can before the capture returns
            await asyncio.sleep(0.005)
        assert target.capture_gate is not None
        target.capture_gate.set()

    *outcomes, _ = await asyncio.gather(
        gates[0].begin(call, target),
        gates[1].begin(call, target),
        let_both_in(),
        return_exceptions=True,
    )
    tickets = [o for o in outcomes if isinstance(o, Ticket)]
    in_flight = [o for o in outcomes if isinstance(o, InFlight)]
    assert (len(tickets), len(in_flight)) == (1, 1), outcomes
    assert in_flight[0].retry_after > 0
    assert target.captures == 1  # the second attempt never got as far as deciding

    winner = gates[outcomes.index(tickets[0])]
    await winner.commit(tickets[0], await target.send(tickets[0]))
    eid = eid_of(call)
    assert kinds(journal, eid).count(Kind.DISPATCHED) == 1
    assert target.sends == 1
    assert journal.row(eid).status is Kind.COMMITTED  # type: ignore[union-attr]


# -- 1. nothing recorded: one dispatch transaction, the lease read inside it ----------------------


async def test_dispatch_writes_proposed_authorized_dispatched_in_one_commit(
    journal: Journal, lease: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    appends: list[list[Kind]] = []
    original = journal.append_async

    async def spy(*args: Any, **kwargs: Any) -> list[Entry]:
        written = await original(*args, **kwargs)
        appends.append([e.kind for e in written])
        return written

    monkeypatch.setattr(journal, "append_async", spy)
    target = MemTarget()
    ticket = await Gate(journal).begin(make_call(lease), target)
    assert isinstance(ticket, Ticket)
    assert ticket.via == "dispatch" and ticket.dispatch_no == 1
    ticket.release()

    assert appends == [[Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED]]
    entries = journal.read(ticket.effect_id)
    assert len({e.ts for e in entries}) == 1  # one transaction
    if journal.combine_dispatch:  # type: ignore[attr-defined]
        # one signed entry of format 3, read as the three it stands for
        assert len({(e.seq, e.hash, e.prev) for e in entries}) == 1
        assert entries[0].prev == ""
    else:  # three in a row, nothing between
        assert [e.seq for e in entries] == [entries[0].seq + i for i in range(3)]
        assert [e.prev for e in entries] == ["", entries[0].hash, entries[1].hash]
    assert ticket.head == entries[-1].hash
    authorized = entries[1].data
    assert authorized["lease"]["lease_id"] == lease
    assert authorized["lease"]["revoked_at"] is None
    assert set(authorized["checks"]) == {"lease", "premises"}
    assert target.sends == 0  # begin records the intent; the send is the caller's


async def test_a_revoke_just_before_the_dispatch_transaction_is_seen(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    operator = connect()  # the operator revokes from another connection

    def revoke_now(point: str, eid: str) -> None:
        if point == "before_dispatch_tx":
            assert operator.leases.revoke(lease)

    target = MemTarget()
    with pytest.raises(Refused) as err:
        await Gate(journal, on_point=revoke_now).run(make_call(lease), target, target.send)
    assert err.value.code == "lease"
    assert err.value.receipt.executed is False
    assert err.value.receipt.final == "REFUSED"
    eid = eid_of(make_call(lease))
    assert kinds(journal, eid) == [Kind.PROPOSED, Kind.REFUSED]
    assert target.sends == 0


async def test_a_revoke_after_the_dispatch_transaction_finds_the_send_authorised(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    operator = connect()

    def revoke_after(point: str, eid: str) -> None:
        if point == "after_dispatch_tx":
            assert operator.leases.revoke(lease)

    target = MemTarget()
    result = await Gate(journal, on_point=revoke_after).run(make_call(lease), target, target.send)
    assert result["ref"] == "ref-1"
    r = receipt(eid_of(make_call(lease)), journal=journal)
    assert (r.final, r.executed) == ("COMMITTED", True)
    assert r.authority_at_send is not None and r.authority_at_send["revoked_at"] is None


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("no_lease_id", "act_as"),
        ("another_principal", "another principal"),
        ("amount_over_max", "over the lease's maximum"),
    ],
)
async def test_lease_refusals_at_dispatch(journal: Journal, case: str, words: str) -> None:
    if case == "another_principal":
        lease_id: str | None = journal.leases.issue("someone-else", activities=[ACTIVITY])
    else:
        lease_id = journal.leases.issue(
            PRINCIPAL, activities=[ACTIVITY], max_amount_cents=LEASE_MAX
        )
    if case == "no_lease_id":
        lease_id = None
    call = make_call(lease_id, amount_cents=LEASE_MAX + 1 if case == "amount_over_max" else None)
    target = MemTarget()
    with pytest.raises(Refused) as err:
        await Gate(journal).run(call, target, target.send)
    assert err.value.code == "lease"
    assert words in err.value.reason
    assert err.value.receipt.executed is False
    assert kinds(journal, eid_of(call)) == [Kind.PROPOSED, Kind.REFUSED]
    assert target.sends == 0
    assert str(LEASE_MAX + 1) not in str(err.value)


# -- 2. committed: duplicates and conflicts -------------------------------------------------------


async def test_duplicate_returns_the_recorded_result_and_a_conflict_is_refused(
    journal: Journal, lease: str
) -> None:
    target = MemTarget()
    first = await Gate(journal).run(make_call(lease), target, target.send)
    eid = eid_of(make_call(lease))
    entries_after_first = len(journal.read(eid))

    again = await Gate(journal).begin(make_call(lease), target)
    assert isinstance(again, Done)
    assert (again.result, again.via) == (first, "duplicate")
    assert await Gate(journal).run(make_call(lease), target, target.send) == first
    assert target.sends == 1  # the body never ran again
    assert len(journal.read(eid)) == entries_after_first  # a duplicate writes nothing

    redecided = make_call(lease, amount=30)
    assert eid_of(redecided) == eid  # same case and order: the same effect
    with pytest.raises(Refused) as err:
        await Gate(journal).run(redecided, target, target.send)
    assert err.value.code == "conflicting_payload"
    assert err.value.receipt.final == "REFUSED"
    assert err.value.receipt.executed is False
    assert err.value.receipt.payload_digest == Gate.identify(redecided)[1]
    assert target.sends == 1

    entries = journal.read(eid)
    assert entries[-1].kind is Kind.REJECTED_PROPOSAL
    assert entries[-1].data["code"] == "conflicting_payload"
    assert entries[-1].data["payload_digest"] == Gate.identify(redecided)[1]
    assert journal.row(eid).status is Kind.COMMITTED  # type: ignore[union-attr]
    r = receipt(eid, journal=journal)
    assert (r.final, r.executed, r.result_digest) == ("COMMITTED", True, digest(first))
    # the committed effect still answers its own payload
    assert await Gate(journal).run(make_call(lease), target, target.send) == first
    assert target.sends == 1


async def test_premises_are_not_part_of_the_payload(journal: Journal, lease: str) -> None:
    target = MemTarget()
    decided = make_call(lease, premises=dict(target.facts))
    first = await Gate(journal).run(decided, target, target.send)

    # the same request carrying other decision-time premises: a duplicate, not a conflict
    other = make_call(lease, premises={"order": "o-1", "refundable_cents": 1})
    assert Gate.identify(other) == Gate.identify(decided)
    assert await Gate(journal).run(other, target, target.send) == first
    assert target.sends == 1
    assert kinds(journal, eid_of(decided))[-1] is Kind.COMMITTED

    # the digest covers the input as proposed, without its premises
    assert Gate.identify(decided)[1] == digest([payload()])


def test_the_default_key_is_the_whole_payload_without_premises() -> None:
    with_p = make_call("l", premises={"a": 1}, key=None)
    other_p = make_call("l", premises={"a": 2}, key=None)
    no_p = make_call("l", key=None)
    assert eid_of(with_p) == eid_of(other_p) == eid_of(no_p)
    assert eid_of(no_p) == effect_id("refund", [payload()])
    assert eid_of(make_call("l", amount=30, key=None)) != eid_of(no_p)
    # with a key, the amount is not part of the identity
    assert eid_of(make_call("l", amount=30)) == eid_of(make_call("l"))
    assert eid_of(make_call("l")) == effect_id("refund", {"case": "c-1", "order": "o-1"})


async def test_decision_premises_that_no_longer_hold_are_refused(
    journal: Journal, lease: str
) -> None:
    target = MemTarget()
    stale = make_call(lease, premises={"order": "o-1", "refundable_cents": 99})
    with pytest.raises(Refused) as err:
        await Gate(journal).run(stale, target, target.send)
    assert err.value.code == "stale_premise"
    assert err.value.receipt.changed_facts == ["refundable_cents"]
    assert [c.fact for c in err.value.changes] == ["refundable_cents"]
    assert target.sends == 0


# -- 3. refused / ambiguous: the same error again ------------------------------------------------


async def test_a_refused_effect_raises_the_same_refusal_again(journal: Journal) -> None:
    target = MemTarget()
    for _ in range(2):
        with pytest.raises(Refused) as err:
            await Gate(journal).run(make_call(None), target, target.send)
        assert err.value.code == "lease"
    assert kinds(journal, eid_of(make_call(None))) == [Kind.PROPOSED, Kind.REFUSED]
    assert target.sends == 0


# -- 5a. settle ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", [2, 3])
async def test_settle_time(journal: Journal, lease: str, tier: int) -> None:
    target = MemTarget(tier=tier, settle_time=timedelta(seconds=5))
    call = make_call(lease)
    await died_before_send(Gate(journal), call, target)

    with pytest.raises(InFlight):  # "not found" proves nothing yet
        await Gate(journal).begin(call, target)
    assert journal.row(eid_of(call)).status is Kind.DISPATCHED  # type: ignore[union-attr]

    later = Gate(journal, clock=lambda: time.time() + 6)
    if tier == 2:
        ticket = await later.begin(call, target)
        assert isinstance(ticket, Ticket) and ticket.via == "recovery-reapply"
        await later.commit(ticket, await target.send(ticket))
        assert target.sends == 1
    else:
        with pytest.raises(Ambiguous) as err:
            await later.begin(call, target)
        assert err.value.receipt.code == "unknowable"
        assert target.sends == 0


async def test_unsettled_on_the_last_attempt_is_ambiguous(journal: Journal, lease: str) -> None:
    target = MemTarget(tier=3, settle_time=timedelta(seconds=5))
    await died_before_send(Gate(journal), make_call(lease), target)
    with pytest.raises(Ambiguous) as err:
        await Gate(journal).begin(make_call(lease, last_attempt=True), target)
    assert err.value.receipt.code == "unsettled"
    assert err.value.receipt.executed == "unknown"


# -- 5b-d. recovery order, by tier ----------------------------------------------------------------


@pytest.mark.parametrize("tier", [1, 2])
async def test_found_by_query_is_committed_whatever_changed(
    journal: Journal, lease: str, tier: int
) -> None:
    target = MemTarget(tier=tier)
    call = make_call(lease)
    landed = await died_after_send(Gate(journal), call, target)
    # everything changed while the worker was down: it happened anyway
    target.facts["refundable_cents"] = 0
    journal.leases.revoke(lease)

    done = await Gate(journal).begin(call, target)
    assert isinstance(done, Done)
    assert (done.via, done.result) == ("recovery-query", landed)
    assert target.sends == 1
    r = receipt(eid_of(call), journal=journal)
    assert (r.final, r.via, r.executed, r.confirmation) == (
        "COMMITTED",
        "recovery-query",
        True,
        landed["ref"],
    )
    # and a later attempt is a plain duplicate
    assert await Gate(journal).run(call, target, target.send) == landed


RECOVERY = [
    # (tier, what changed while down) -> (outcome, via or code)
    (1, "nothing", "ticket", "retry-idempotent"),
    (2, "nothing", "ticket", "recovery-reapply"),
    (3, "nothing", "ambiguous", "unknowable"),
    (1, "window_passed", "ticket", "recovery-reapply"),
    (1, "lease_revoked", "refused", "lease_at_recovery"),
    (2, "lease_revoked", "refused", "lease_at_recovery"),
    (3, "lease_revoked", "ambiguous", "lease_at_recovery"),
    (1, "facts_changed", "refused", "stale_premise_at_recovery"),
    (2, "facts_changed", "refused", "stale_premise_at_recovery"),
    (3, "facts_changed", "ambiguous", "stale_premise_at_recovery"),
    # authority is re-checked before the premises
    (2, "lease_revoked+facts_changed", "refused", "lease_at_recovery"),
]


@pytest.mark.parametrize(("tier", "change", "outcome", "detail"), RECOVERY)
async def test_recovery_when_the_target_has_nothing(
    journal: Journal, lease: str, tier: int, change: str, outcome: str, detail: str
) -> None:
    target = MemTarget(tier=tier)
    call = make_call(lease)
    await died_before_send(Gate(journal), call, target)
    if "lease_revoked" in change:
        journal.leases.revoke(lease)
    if "facts_changed" in change:
        target.facts["refundable_cents"] = 0
    if change == "window_passed":
        target.offset = WINDOW.total_seconds() + 60

    gate = Gate(journal)
    eid = eid_of(call)
    if outcome == "ticket":
        ticket = await gate.begin(call, target)
        assert isinstance(ticket, Ticket)
        assert ticket.via == detail
        assert ticket.dispatch_no == 2
        assert ticket.args == call.args  # the recorded approved input
        done = await gate.commit(ticket, await target.send(ticket))
        assert done.via == detail
        r = receipt(eid, journal=journal)
        assert (r.final, r.via, r.executed, r.dispatches) == ("COMMITTED", detail, True, 2)
        assert target.sends == 1 and len(target.landed) == 1
        return
    expected = Refused if outcome == "refused" else Ambiguous
    with pytest.raises(expected) as err:
        await gate.begin(call, target)
    r = err.value.receipt
    assert r.code == detail
    assert r.executed == (False if outcome == "refused" else "unknown")
    assert r.executed is not True
    assert target.sends == 0
    assert kinds(journal, eid)[-1] is (Kind.REFUSED if outcome == "refused" else Kind.AMBIGUOUS)
    if "facts_changed" in change and "lease" not in change:
        assert r.changed_facts == ["refundable_cents"]


async def test_tier_one_without_query_resends_inside_the_window_only(
    journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=1)
    del target.query  # dedupe only
    call = make_call(lease)
    await died_before_send(Gate(journal), call, target)
    target.offset = WINDOW.total_seconds() + 60
    with pytest.raises(Ambiguous) as err:  # outside the window, and nobody can ask
        await Gate(journal).begin(call, target)
    assert err.value.receipt.code == "unknowable"


class SlowDedupe(MemTarget):
    """A dedupe-only target that processes a request up to ``settle_time`` after it was sent, and
    forgets a key ``dedupe_window`` after it first saw it: the worst case the window allows."""

    def __init__(self, settle_time: timedelta) -> None:
        super().__init__(tier=1, settle_time=settle_time)
        del self.query
        self.first_seen: dict[str, float] = {}
        self.landings = 0

    async def send(self, ticket: Ticket) -> dict[str, Any]:
        processed_at = self.clock() + self.settle_time.total_seconds()
        seen = self.first_seen.setdefault(ticket.effect_id, processed_at)
        if ticket.effect_id in self.landed and processed_at < seen + WINDOW.total_seconds():
            return self.landed[ticket.effect_id]
        self.landings += 1
        return await super().send(ticket)


async def test_a_tier_one_resend_near_the_window_end_is_not_sent(
    journal: Journal, lease: str
) -> None:
    """Inside the window by the clock, but processed after it closes: the resend would land a
    second time, so the gate does not rely on the window there."""
    settle = timedelta(minutes=2)
    target = SlowDedupe(settle)
    call = make_call(lease)
    target.offset = -settle.total_seconds()  # the first send is processed at once
    await died_after_send(Gate(journal), call, target)
    assert target.landings == 1
    target.offset = (WINDOW - settle / 2).total_seconds()
    with pytest.raises(Ambiguous) as err:
        await Gate(journal, clock=target.clock).begin(call, target)
    assert err.value.receipt.code == "unknowable"
    assert (target.landings, target.sends) == (1, 1)


@pytest.mark.parametrize(("beyond_s", "resent"), [(-1.0, True), (1.0, False)])
async def test_tier_one_resends_until_window_less_settle_time_less_margin(
    journal: Journal, lease: str, beyond_s: float, resent: bool
) -> None:
    settle, margin = timedelta(seconds=30), timedelta(minutes=7)
    target = MemTarget(tier=1, settle_time=settle)
    del target.query
    target.dedupe_margin = margin  # type: ignore[attr-defined]
    call = make_call(lease)
    await died_before_send(Gate(journal), call, target)
    first = journal.row(eid_of(call)).first_dispatch_ts  # type: ignore[union-attr]
    last_resend = first + (WINDOW - settle - margin).total_seconds()
    # the target's clock, injected: ``beyond_s`` seconds either side of the last safe resend
    target.offset = last_resend + beyond_s - time.time()
    gate = Gate(journal, clock=target.clock)
    if resent:
        ticket = await gate.begin(call, target)
        assert isinstance(ticket, Ticket) and ticket.via == "retry-idempotent"
        ticket.release()
    else:
        with pytest.raises(Ambiguous) as err:
            await gate.begin(call, target)
        assert err.value.receipt.code == "unknowable"


async def test_the_window_is_judged_again_as_the_resend_is_recorded(
    journal: Journal, lease: str
) -> None:
    """Inside the window when the recovery decides, past it (less margin) by the time its
    dispatch is recorded: the resend relies on the window no more. The model check found the
    window judged once, before the dispatch transaction."""
    target = MemTarget(tier=1)
    del target.query  # dedupe only: past the window nobody can know
    call = make_call(lease)
    await died_before_send(Gate(journal), call, target)

    def the_clock_moves(point: str, eid: str) -> None:
        if point == "before_recovery_tx":
            target.offset = (WINDOW - timedelta(minutes=2)).total_seconds()

    with pytest.raises(Ambiguous) as err:
        await Gate(journal, clock=target.clock, on_point=the_clock_moves).begin(call, target)
    assert err.value.receipt.code == "unknowable"
    dispatched = [e for e in journal.read(eid_of(call)) if e.kind is Kind.DISPATCHED]
    assert [e.data["via"] for e in dispatched] == ["dispatch"]


@pytest.mark.parametrize("last_attempt", [False, True])
async def test_a_window_that_closes_before_the_target_settled_waits_or_is_ambiguous(
    journal: Journal, lease: str, last_attempt: bool
) -> None:
    """Inside the window when the recovery decides, before the target settled; past the window
    by the time its dispatch is recorded. "Not found" does not yet prove absence: an attempt
    that will be retried waits for the target to settle (nothing recorded); the last one
    says AMBIGUOUS."""
    target = MemTarget(tier=1, settle_time=timedelta(minutes=1))
    del target.query
    call = make_call(lease)
    await died_before_send(Gate(journal), call, target)
    before = journal.read(eid_of(call))

    def the_clock_moves(point: str, eid: str) -> None:
        if point == "before_recovery_tx":
            target.offset = (WINDOW - timedelta(minutes=2)).total_seconds()

    retry = make_call(lease, last_attempt=last_attempt)
    gate = Gate(journal, clock=target.clock, on_point=the_clock_moves)
    if last_attempt:
        with pytest.raises(Ambiguous) as err:
            await gate.begin(retry, target)
        assert err.value.receipt.code == "unknowable"
    else:
        with pytest.raises(InFlight):
            await gate.begin(retry, target)
        assert journal.read(eid_of(call)) == before


def test_a_window_too_short_for_settle_time_and_margin_is_refused_when_gated() -> None:
    from interlock_temporal import gated
    from interlock_temporal.core.targets import TargetDeclarationError

    target = MemTarget(tier=1, settle_time=timedelta(minutes=1))
    target.dedupe_window = timedelta(minutes=6)  # 1 minute + the 5-minute default margin: too short

    async def body(p: dict[str, Any]) -> dict[str, Any]:
        return p

    with pytest.raises(TargetDeclarationError, match="dedupe_window must exceed"):
        gated(body, target=target)
    target.dedupe_margin = timedelta(minutes=4)  # type: ignore[attr-defined]
    gated(body, target=target)
    target.settle_time = 30  # type: ignore[assignment]
    with pytest.raises(TargetDeclarationError, match="settle_time must be"):
        gated(body, target=target)


async def test_recovery_resends_the_recorded_approved_input(journal: Journal, lease: str) -> None:
    target = MemTarget()
    first = make_call(lease, premises=dict(target.facts))
    await died_before_send(Gate(journal), first, target)
    # the retry carries other decision-time premises: the same effect, and the resend is the
    # input recorded at the first dispatch, not this one
    retry = make_call(lease, premises={"order": "o-1", "refundable_cents": 10_000, "extra": 1})
    ticket = await Gate(journal).begin(retry, target)
    assert isinstance(ticket, Ticket)
    assert ticket.args == first.args
    ticket.release()


# -- classify: what a failed send means ----------------------------------------------------------


async def test_a_rejected_send_is_refused_and_not_executed(journal: Journal, lease: str) -> None:
    target = MemTarget()
    target.fail_next = Rejected("already refunded")
    with pytest.raises(Refused) as err:
        await Gate(journal).run(make_call(lease), target, target.send)
    assert err.value.code == "target_rejected"
    assert err.value.receipt.executed is False
    assert "Rejected" in err.value.reason
    # REFUSED is terminal: the next attempt raises it again and sends nothing
    with pytest.raises(Refused) as again:
        await Gate(journal).run(make_call(lease), target, target.send)
    assert again.value.code == "target_rejected"
    assert target.sends == 1


async def test_not_sent_is_recorded_and_the_next_attempt_reapplies(
    journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=3)  # even a target that can neither dedupe nor be asked
    target.fail_next = Unreachable("connection refused")
    call = make_call(lease)
    with pytest.raises(Unreachable):
        await Gate(journal).run(call, target, target.send)
    eid = eid_of(call)
    assert kinds(journal, eid)[-1] is Kind.NOT_SENT
    assert journal.read(eid)[-1].data["error"] == "Unreachable"

    gate = Gate(journal)
    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket) and ticket.via == "recovery-reapply"
    await gate.commit(ticket, await target.send(ticket))
    r = receipt(eid, journal=journal)
    assert (r.final, r.via, r.executed) == ("COMMITTED", "recovery-reapply", True)
    assert len(target.landed) == 1


async def test_in_doubt_send_stays_dispatched_until_the_last_attempt(
    journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=3)
    call = make_call(lease)
    target.fail_next = TimedOut("read timeout")
    with pytest.raises(TimedOut):
        await Gate(journal).run(call, target, target.send)
    eid = eid_of(call)
    assert journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]
    assert eid in [row.effect_id for row in journal.in_doubt()]
    assert not journal.is_claimed(eid)  # the failed attempt let go of it


async def test_in_doubt_send_on_the_last_attempt_is_ambiguous(journal: Journal, lease: str) -> None:
    target = MemTarget(tier=2)
    target.fail_next = TimedOut("read timeout")
    call = make_call(lease, last_attempt=True)
    with pytest.raises(Ambiguous) as err:
        await Gate(journal).run(call, target, target.send)
    assert err.value.receipt.code == "send_failed"
    assert err.value.receipt.executed == "unknown"
    assert journal.row(eid_of(call)).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
    assert eid_of(call) not in [row.effect_id for row in journal.in_doubt()]


async def test_not_sent_on_the_last_attempt_does_not_strand_the_effect(
    journal: Journal, lease: str
) -> None:
    """Every effect ends COMMITTED, REFUSED, or in front of a person (the sweep's
    invariant: every non-COMMITTED, non-REFUSED effect is AMBIGUOUS). After a "not_sent" on the
    last attempt Temporal will make, nothing will retry the effect: it must end in a final state
    (nothing happened, so REFUSED with executed False fits), or at least be listed where the
    reconciler looks (``in_doubt()``)."""
    target = MemTarget(tier=2)
    target.fail_next = Unreachable("connection refused")
    call = make_call(lease, last_attempt=True)
    with pytest.raises((Unreachable, Refused, Ambiguous)):
        await Gate(journal).run(call, target, target.send)
    eid = eid_of(call)
    row = journal.row(eid)
    assert row is not None
    stranded = row.status not in FINAL_STATES and eid not in [
        r.effect_id for r in journal.in_doubt()
    ]
    assert not stranded, f"the effect ends {row.status.value}, final for nobody"
    assert receipt(eid, journal=journal).executed is not True


# -- only the owner sends ------------------------------------------------------


def in_workflow(call: Call, workflow_id: str, *, last_attempt: bool = False) -> Call:
    """The call as the attempt of workflow ``workflow_id`` (activity 2) delivers it."""
    return dataclasses.replace(
        call,
        delivery=Delivery(workflow_id=workflow_id, activity_id="2"),
        last_attempt=last_attempt,
        admission={},
    )


@pytest.mark.parametrize("tier", [1, 2, 3])
async def test_another_workflows_attempt_never_resends_the_owners_effect(
    journal: Journal, lease: str, tier: int
) -> None:
    """A duplicate submission finds the effect in doubt after its owner died before the send:
    whatever the tier, it waits for the owner and, on its last attempt, calls it AMBIGUOUS;
    it never sends. The owner itself still recovers it."""
    target = MemTarget(tier=tier)
    owner = in_workflow(make_call(lease), "wf-owner")
    await died_before_send(Gate(journal), owner, target)
    eid = eid_of(owner)

    with pytest.raises(InFlight) as waits:
        await Gate(journal).begin(in_workflow(owner, "wf-duplicate"), target)
    assert waits.value.retry_after >= 1.0  # each look may query the target: not in a tight loop
    assert target.sends == 0 and kinds(journal, eid)[-1] is Kind.DISPATCHED

    if tier == 3:
        with pytest.raises(Ambiguous) as err:  # the owner alone could have tried, and it cannot
            await Gate(journal).begin(owner, target)
        assert err.value.receipt.code == "unknowable"
        return
    gate = Gate(journal)
    ticket = await gate.begin(owner, target)
    assert isinstance(ticket, Ticket)
    assert ticket.via == ("retry-idempotent" if tier == 1 else "recovery-reapply")
    await gate.commit(ticket, await target.send(ticket))
    assert target.sends == 1
    done = await Gate(journal).begin(in_workflow(owner, "wf-duplicate"), target)
    assert isinstance(done, Done) and done.via == "duplicate"


@pytest.mark.parametrize("tier", [1, 2, 3])
async def test_another_workflows_last_attempt_makes_an_owners_effect_in_doubt_ambiguous(
    journal: Journal, lease: str, tier: int
) -> None:
    target = MemTarget(tier=tier)
    owner = in_workflow(make_call(lease), "wf-owner")
    await died_before_send(Gate(journal), owner, target)
    with pytest.raises(Ambiguous) as err:
        await Gate(journal).begin(in_workflow(owner, "wf-duplicate", last_attempt=True), target)
    r = err.value.receipt
    assert (r.final, r.code, r.executed) == ("AMBIGUOUS", "not_owner", "unknown")
    assert "wf-owner" in (r.reason or "")
    assert target.sends == 0


@pytest.mark.parametrize("tier", [1, 2])
async def test_another_workflows_attempt_commits_an_effect_that_landed_by_query(
    journal: Journal, lease: str, tier: int
) -> None:
    target = MemTarget(tier=tier)
    owner = in_workflow(make_call(lease), "wf-owner")
    landed = await died_after_send(Gate(journal), owner, target)
    done = await Gate(journal).begin(in_workflow(owner, "wf-duplicate"), target)
    assert isinstance(done, Done)
    assert (done.via, done.result) == ("recovery-query", landed)
    assert target.sends == 1


async def test_another_workflow_never_sends_after_a_confirmed_absence_either(
    journal: Journal, lease: str
) -> None:
    """The owner's send never left (NOT_SENT): the absence is confirmed, but the resend is the
    owner's alone. A duplicate's last attempt leaves it to the owner (or the reconciler) rather
    than calling a known absence AMBIGUOUS."""
    target = MemTarget(tier=2)
    owner = in_workflow(make_call(lease), "wf-owner")
    target.fail_next = Unreachable("connection refused")
    with pytest.raises(Unreachable):
        await Gate(journal).run(owner, target, target.send)
    eid = eid_of(owner)
    for last in (False, True):
        with pytest.raises(InFlight):
            await Gate(journal).begin(in_workflow(owner, "wf-duplicate", last_attempt=last), target)
    assert kinds(journal, eid)[-1] is Kind.NOT_SENT
    assert target.sends == 1  # the owner's one attempt, which never left
    ticket = await Gate(journal).begin(owner, target)
    assert isinstance(ticket, Ticket) and ticket.via == "recovery-reapply"
    ticket.release()


async def test_after_a_reopen_the_workflow_that_dispatches_owns_the_effect(
    journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=2)
    first = in_workflow(make_call(lease), "wf-first")
    await died_before_send(Gate(journal), first, target)
    eid = eid_of(first)
    refused = await Gate(journal).close_out(eid, target, owner_ended="cancelled")
    assert (refused.final, refused.code) == ("REFUSED", "cancelled")
    reopen(journal, eid, operator="carol")

    await died_before_send(Gate(journal), in_workflow(first, "wf-second"), target)
    with pytest.raises(InFlight):  # the first workflow no longer owns it
        await Gate(journal).begin(first, target)
    assert target.sends == 0
    ticket = await Gate(journal).begin(in_workflow(first, "wf-second"), target)
    assert isinstance(ticket, Ticket) and ticket.via == "recovery-reapply"
    ticket.release()


# -- closing out without a send: Gate.close_out ---------------------------------------------------


@pytest.mark.parametrize("owner_ended", ["cancelled", "abandoned"])
async def test_close_out_refuses_a_confirmed_absence_after_settle_time_and_never_sends(
    journal: Journal, lease: str, owner_ended: Any
) -> None:
    target = MemTarget(tier=2, settle_time=timedelta(seconds=5))
    call = in_workflow(make_call(lease), "wf-gone")
    await died_before_send(Gate(journal), call, target)
    eid = eid_of(call)

    early = await Gate(journal).close_out(eid, target, owner_ended=owner_ended)
    assert early.final == "DISPATCHED"  # "not found" proves nothing yet: left as it was
    assert kinds(journal, eid)[-1] is Kind.DISPATCHED

    later = Gate(journal, clock=lambda: time.time() + 6)
    r = await later.close_out(eid, target, owner_ended=owner_ended)
    assert (r.final, r.code, r.executed, r.via) == ("REFUSED", owner_ended, False, None)
    assert target.sends == 0 and target.landed == {}
    assert not journal.is_claimed(eid)
    # terminal: the owner's own late attempt is refused the same way
    with pytest.raises(Refused) as err:
        await later.begin(call, target)
    assert err.value.code == owner_ended


@pytest.mark.parametrize("tier", [1, 2])
async def test_close_out_commits_what_the_target_finds(
    journal: Journal, lease: str, tier: int
) -> None:
    target = MemTarget(tier=tier, settle_time=timedelta(seconds=5))  # found needs no settling
    call = in_workflow(make_call(lease), "wf-gone")
    landed = await died_after_send(Gate(journal), call, target)
    r = await Gate(journal).close_out(eid_of(call), target, owner_ended="cancelled")
    assert (r.final, r.via, r.executed, r.confirmation) == (
        "COMMITTED",
        "recovery-query",
        True,
        landed["ref"],
    )
    assert target.sends == 1


async def test_close_out_leaves_what_nobody_can_tell_to_a_person(
    journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=3)
    call = in_workflow(make_call(lease), "wf-gone")
    await died_before_send(Gate(journal), call, target)
    r = await Gate(journal).close_out(eid_of(call), target, owner_ended="cancelled")
    assert (r.final, r.code, r.executed) == ("AMBIGUOUS", "unknowable", "unknown")
    assert "cancelled" in (r.reason or "")
    assert target.sends == 0


@pytest.mark.parametrize("how", ["not_sent", "not_happened"])
async def test_close_out_refuses_an_absence_already_confirmed_even_at_tier_3(
    journal: Journal, lease: str, how: str
) -> None:
    target = MemTarget(tier=3)
    call = in_workflow(make_call(lease), "wf-gone")
    eid = eid_of(call)
    if how == "not_sent":
        target.fail_next = Unreachable("connection refused")
        with pytest.raises(Unreachable):
            await Gate(journal).run(call, target, target.send)
    else:
        await died_before_send(Gate(journal), call, target)
        with pytest.raises(Ambiguous):
            await Gate(journal).begin(in_workflow(call, "wf-gone", last_attempt=True), target)
        record_resolution(
            journal, eid, kind="ambiguous", decision="not_happened", operators=["carol"]
        )
    sends = target.sends
    r = await Gate(journal).close_out(eid, target, owner_ended="abandoned")
    assert (r.final, r.code, r.executed) == ("REFUSED", "abandoned", False)
    assert target.sends == sends


async def test_close_out_changes_nothing_ended_and_waits_for_a_live_attempt(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=2)
    call = make_call(lease)
    done = await Gate(journal).run(call, target, target.send)
    eid = eid_of(call)
    before = kinds(journal, eid)
    r = await Gate(journal).close_out(eid, target, owner_ended="cancelled")
    assert (r.final, r.via) == ("COMMITTED", "dispatch")
    assert kinds(journal, eid) == before
    assert done == journal.blob(eid, "result")

    other = in_workflow(make_call(lease, amount=30, key={"case": "c-2"}), "wf-live")
    ticket = await Gate(journal).begin(other, target)
    assert isinstance(ticket, Ticket)
    with pytest.raises(InFlight):  # a live attempt holds it: it finishes it itself
        await Gate(connect()).close_out(ticket.effect_id, target, owner_ended="cancelled")
    ticket.release()
    with pytest.raises(InvalidCall, match="owner_ended"):
        await Gate(journal).close_out(eid, target, owner_ended="gone")  # type: ignore[arg-type]
    with pytest.raises(InvalidCall, match="not in the journal"):
        await Gate(journal).close_out("ab" * 32, target, owner_ended="cancelled")


# -- late writers ---------------------------------------------------------------------------------


async def test_last_attempt_while_another_holds_it_then_the_holder_commits_late(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    target = MemTarget()
    holder = Gate(journal)
    ticket = await holder.begin(make_call(lease), target)
    assert isinstance(ticket, Ticket)

    other = Gate(connect())  # another worker, Temporal's last attempt
    with pytest.raises(Ambiguous) as err:
        await other.begin(make_call(lease, last_attempt=True), target)
    assert err.value.receipt.code == "in_flight"
    assert err.value.receipt.executed == "unknown"
    eid = ticket.effect_id
    assert journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]

    assert journal.is_claimed(eid)  # the holder still holds it, and is still sending

    result = await target.send(ticket)
    done = await holder.commit(ticket, result)
    assert done.result == result
    last = journal.read(eid)[-1]
    assert last.kind is Kind.COMMITTED
    assert last.data["late"] is True
    assert last.data["after"] == "AMBIGUOUS"
    assert "alarm" not in last.data
    r = receipt(eid, journal=journal)
    assert (r.final, r.executed, r.confirmation) == ("COMMITTED", True, result["ref"])
    assert not journal.is_claimed(eid)


async def test_a_non_last_attempt_while_another_holds_it_is_in_flight(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    target = MemTarget()
    ticket = await Gate(journal).begin(make_call(lease), target)
    assert isinstance(ticket, Ticket)
    with pytest.raises(InFlight):
        await Gate(connect()).begin(make_call(lease), target)
    assert journal.row(ticket.effect_id).status is Kind.DISPATCHED  # type: ignore[union-attr]
    await Gate(journal).commit(ticket, await target.send(ticket))


async def test_a_late_commit_after_refused_raises_the_alarm(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    target = MemTarget(tier=2)
    zombie = Gate(journal)
    ticket = await zombie.begin(make_call(lease), target)
    assert isinstance(ticket, Ticket)
    ticket.release()  # its claim is gone (its holder looked dead), but the send is still going

    journal.leases.revoke(lease)
    with pytest.raises(Refused) as err:  # recovery: not found, lease revoked
        await Gate(connect()).begin(make_call(lease), target)
    assert err.value.code == "lease_at_recovery"

    result = await target.send(ticket)  # the zombie's send lands after all
    await zombie.commit(ticket, result)
    eid = ticket.effect_id
    last = journal.read(eid)[-1]
    assert last.kind is Kind.COMMITTED
    assert last.data["late"] is True
    assert last.data["after"] == "REFUSED"
    assert last.data["alarm"] == "executed_after_refused"
    r = receipt(eid, journal=journal)
    assert (r.final, r.executed) == ("COMMITTED", True)


async def test_a_rejected_proposal_meanwhile_does_not_make_the_commit_late(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    """A REJECTED_PROPOSAL annotation is not an outcome: the holder's COMMITTED that follows it
    is on time (``late`` marks a commit that arrives after AMBIGUOUS or REFUSED)."""
    target = MemTarget()
    holder = Gate(journal)
    ticket = await holder.begin(make_call(lease), target)
    assert isinstance(ticket, Ticket)
    with pytest.raises(Refused) as err:  # a re-decided amount, on its last attempt
        await Gate(connect()).begin(make_call(lease, amount=30, last_attempt=True), target)
    assert err.value.code == "conflicting_payload"
    assert journal.row(ticket.effect_id).status is Kind.DISPATCHED  # type: ignore[union-attr]

    await holder.commit(ticket, await target.send(ticket))
    last = journal.read(ticket.effect_id)[-1]
    assert last.kind is Kind.COMMITTED
    assert not last.data.get("late"), last.data


async def test_a_rejected_send_after_a_last_attempt_ambiguity_is_recorded(
    connect: Callable[..., Journal], journal: Journal, lease: str
) -> None:
    """The holder's send is rejected by the target after another attempt (Temporal's last)
    recorded AMBIGUOUS: ``fail`` must not leak the journal's HeadConflict; the target's confirmed
    rejection is recorded, as a late COMMITTED would be (executed is known now: False)."""
    target = MemTarget()
    holder = Gate(journal)
    call = make_call(lease)
    ticket = await holder.begin(call, target)
    assert isinstance(ticket, Ticket)
    with pytest.raises(Ambiguous):
        await Gate(connect()).begin(make_call(lease, last_attempt=True), target)

    target.fail_next = Rejected("already refunded")
    with pytest.raises(Refused) as err:
        try:
            await target.send(ticket)
        except Exception as send_error:
            await holder.fail(ticket, send_error, last_attempt=False)
            raise
    assert err.value.code == "target_rejected"
    r = receipt(ticket.effect_id, journal=journal)
    assert (r.final, r.executed) == ("REFUSED", False)
    assert not journal.is_claimed(ticket.effect_id)


# -- premises: a validator that raises fails closed ----------------------------------------------


def _raising_validator(recorded: Any, current: Any, payload: Any) -> list[Change]:
    raise RuntimeError("validator bug")


@pytest.mark.parametrize("when", ["dispatch", "recovery"])
async def test_a_validator_that_raises_is_a_changed_premise(
    journal: Journal, lease: str, when: str
) -> None:
    call = make_call(lease)
    if when == "recovery":
        await died_before_send(Gate(journal), call, MemTarget(tier=2))
    target = MemTarget(tier=2, validate=_raising_validator)
    with pytest.raises(Refused) as err:
        await Gate(journal).run(call, target, target.send)
    assert err.value.code == (
        "stale_premise" if when == "dispatch" else "stale_premise_at_recovery"
    )
    assert err.value.receipt.changed_facts == ["<validate>"]
    assert err.value.receipt.executed is False
    assert target.sends == 0


# -- a journal that cannot be written sends nothing ----------------------------------------------


async def test_an_unwritable_journal_sends_nothing(
    connect: Callable[..., Journal], journal: Journal, lease: str, tmp_path: Path
) -> None:
    impatient = connect("?busy_timeout=0.2")
    target = MemTarget()
    call = make_call(lease)
    locker = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(JournalUnavailable):
            await Gate(impatient).run(call, target, target.send)
        assert target.sends == 0
        assert journal.read(eid_of(call)) == []
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert not journal.is_claimed(eid_of(call))

    result = await Gate(impatient).run(call, target, target.send)
    assert target.sends == 1 and result["ref"] == "ref-1"
    assert kinds(journal, eid_of(call)) == [
        Kind.PROPOSED,
        Kind.AUTHORIZED,
        Kind.DISPATCHED,
        Kind.COMMITTED,
    ]


# -- an input with no canonical JSON --------------------------------------------------------------


class Opaque:
    def __repr__(self) -> str:
        return NOTE


@pytest.mark.parametrize(
    ("key", "extra"),
    [
        ({"case": "c-1", "note": NOTE, "x": float("nan")}, None),  # the key
        ("default", float("nan")),  # the input (the key is fine)
        (None, float("inf")),  # the input as the default key
        ("default", 2**60),  # an integer outside the interoperable range
        ({"note": NOTE, "obj": Opaque()}, None),  # not JSON data at all
    ],
    ids=["nan-key", "nan-input", "inf-default-key", "big-int", "opaque"],
)
async def test_no_canonical_json_is_an_invalid_call(
    journal: Journal, lease: str, key: Any, extra: Any
) -> None:
    call = make_call(lease, key=key)
    if extra is not None:
        call.input["odd"] = extra  # input and args share the one dict
    target = MemTarget()
    before = journal.head()  # the lease's signed entry
    with pytest.raises(InvalidCall) as err:
        await Gate(journal).run(call, target, target.send)
    message = str(err.value)
    assert ACTIVITY in message
    assert NOTE not in message and "SECRET" not in message
    assert str(2**60) not in message
    assert target.sends == 0 and target.captures == 0
    assert journal.head() == before  # nothing written


# -- receipts -----------------------------------------------------------------------------------


def refund_call(req: RefundRequest, lease_id: str, **kw: Any) -> Call:
    return Call(
        effect_type="refund",
        activity="refund",
        input=req,
        args=(req,),
        key={"case": req.case_id, "order": req.order_id},
        premises_field="premises",
        principal=PRINCIPAL,
        lease_id=lease_id,
        measure=lambda args: Measure(args[0].amount_cents, f"order:{args[0].order_id}"),
        decode_args=lambda blob: (RefundRequest.model_validate(blob[0]),),
        **kw,
    )


def _values(doc: Any) -> Iterator[Any]:
    if isinstance(doc, dict):
        for v in doc.values():
            yield from _values(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _values(v)
    else:
        yield doc


def assert_no_argument_values(text: str) -> None:
    assert "SECRET-PIN" not in text and NOTE not in text
    assert AMOUNT not in list(_values(json.loads(text)))


async def test_receipts(tmp_path: Path, journal: Journal) -> None:
    lease_id = journal.leases.issue(PRINCIPAL, activities=["refund"], max_amount_cents=LEASE_MAX)
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    unknowable = SimulatedPayments(tmp_path / "payments-t3.db", tier=3)
    try:
        for p in (payments, unknowable):
            p.open_order("881", 10_000)
            p.open_order("882", 10_000)

        def request(p: SimulatedPayments, case: str, order: str) -> RefundRequest:
            return RefundRequest(
                case_id=case,
                order_id=order,
                amount_cents=AMOUNT,
                reason=NOTE,
                premises=p.order_facts(order),
            )

        def sender(p: SimulatedPayments) -> Callable[[Ticket], Any]:
            async def send(t: Ticket) -> RefundResult:
                r = t.input
                return await p.refund(r.order_id, r.amount_cents, idempotency_key=t.effect_id)

            return send

        # COMMITTED
        call = refund_call(request(payments, "c-ok", "881"), lease_id)
        result = await Gate(journal).run(call, payments, sender(payments))
        eid = eid_of(call)
        r = receipt(eid, journal=journal)
        [record] = payments.refund_records("881")
        assert (r.final, r.executed, r.recorded, r.via) == ("COMMITTED", True, True, "dispatch")
        assert r.confirmation == result.refund_id == record.refund_id
        assert r.journal_hash == journal.read(eid)[-1].hash == journal.head().hash  # type: ignore[union-attr]
        assert r.journal_seq == journal.read(eid)[-1].seq
        assert (r.proposed, r.authorized, r.dispatches, r.tier) == (True, True, 1, 2)
        assert (r.principal, r.lease_id) == (PRINCIPAL, lease_id)
        assert r.payload_digest == Gate.identify(call)[1]
        assert r.result_digest == digest(result)
        assert_no_argument_values(r.model_dump_json())

        # REFUSED: the order stops being eligible between the decision and the dispatch
        payments.arm("capture", "make_ineligible")
        refused = refund_call(request(payments, "c-stale", "882"), lease_id)
        with pytest.raises(Refused) as err:
            await Gate(journal).run(refused, payments, sender(payments))
        assert NOTE not in str(err.value)
        r = receipt(eid_of(refused), journal=journal)
        assert (r.final, r.executed, r.recorded, r.code) == (
            "REFUSED",
            False,
            True,
            "stale_premise",
        )
        assert "eligible" in r.changed_facts
        assert r.premises_held is False
        assert r.via is None and r.confirmation is None
        assert payments.refunded_cents("882") == 0
        assert_no_argument_values(r.model_dump_json())

        # AMBIGUOUS: tier 3, the refund landed and the worker died before recording it
        unknowable.arm("after_commit", "crash")
        ambiguous = refund_call(request(unknowable, "c-lost", "881"), lease_id)
        with pytest.raises(SimulatedCrash):
            await Gate(journal).run(ambiguous, unknowable, sender(unknowable))
        with pytest.raises(Ambiguous) as amb:
            await Gate(journal).run(ambiguous, unknowable, sender(unknowable))
        assert NOTE not in str(amb.value)
        r = receipt(eid_of(ambiguous), journal=journal)
        assert (r.final, r.executed, r.recorded) == ("AMBIGUOUS", "unknown", True)
        assert r.code is not None and r.reason
        assert unknowable.refunded_cents("881") == AMOUNT  # it did land, and nobody can tell
        assert_no_argument_values(r.model_dump_json())
        assert_no_argument_values(amb.value.receipt.model_dump_json())

        with pytest.raises(KeyError):
            receipt("0" * 64, journal=journal)
    finally:
        payments.close()
        unknowable.close()


# -- the core stands alone ----------------------------------------------------------------------


def test_the_core_imports_no_temporal_module() -> None:
    code = (
        "import interlock_temporal.core, interlock_temporal.core.protocol, "
        "interlock_temporal.targets.payments, sys; "
        "bad = sorted(m for m in sys.modules if m.startswith('temporalio')); "
        "assert not bad, bad"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_calls_derived_values_are_made_once_and_kept() -> None:
    """The input's JSON, its canonical bytes, digest and origin are made on first use and kept
    on the (frozen) call: every later read is the same object, and the values are what the
    input gives."""
    payload = {"order_id": "o-1", "amount_cents": 2_000}
    call = Call(
        effect_type="refund",
        activity="refund",
        input=payload,
        args=(payload,),
        delivery=Delivery(workflow_id="wf", run_id="r", activity_id="1"),
    )
    first = call.args_json
    assert call.args_json is first and first == [payload] and first[0] is not payload
    assert call.args_canonical is call.args_canonical
    assert call.args_canonical == b'[{"amount_cents":2000,"order_id":"o-1"}]'
    assert call.input_digest == digest([payload])
    assert call.origin is call.origin and call.origin is not None
    assert "args_json" in vars(call)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.key = "x"  # type: ignore[misc]


def test_facts_compared_with_themselves_change_only_where_they_equal_nothing() -> None:
    """A first attempt validates the facts it just captured against themselves (the same
    object): nothing changed, except a NaN, which equals nothing, as it is for a copy."""
    from interlock_temporal.core.targets import default_validate

    facts: dict[str, Any] = {"paid": 10_000, "eligible": True, "tags": ["a"], "note": None}
    assert default_validate(facts, facts) == [] == default_validate(facts, dict(facts))
    odd = {**facts, "ratio": float("nan")}
    assert [c.fact for c in default_validate(odd, odd)] == ["ratio"]
    assert default_validate(odd, odd) == default_validate(odd, dict(odd))
