"""Less re-reading: after its own append, the gate (and a person's decision) folds the entries it
wrote into the view it already holds instead of reading the whole chain again. Pinned here on a
real SQLite journal: the view so folded is the one a fresh read and fold of the chain gives,
after each kind of append, and the paths that used to read the chain back after appending no
longer do: they check the chain (hash it, decode nothing), so an edit made between the
decision's read and the outcome's append still ends in ``JournalCorrupt``, as the read did.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core.errors import Ambiguous, JournalCorrupt, Refused
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Draft, Kind, Receipt
from interlock_temporal.core.protocol import Delivery, Gate, Ticket
from interlock_temporal.core.receipts import EffectView, fold, fold_appended, receipt_of
from interlock_temporal.core.review import record_resolution, reopen
from interlock_temporal.testing import throwaway_journal

from .test_protocol import (
    ACTIVITY,
    LEASE_MAX,
    PRINCIPAL,
    MemTarget,
    Rejected,
    TimedOut,
    connect,
    eid_of,
    journal,
    lease,
    make_call,
)

__all__ = ["connect", "journal", "lease"]  # fixtures


def fresh(journal: Journal, eid: str) -> EffectView:
    return fold(eid, journal.read(eid))


def same(incremental: EffectView, eid: str, journal: Journal) -> None:
    """``incremental`` is exactly what a fresh read and fold gives: every field, and the JSON
    form of each value (``repr``: 2.0 and 2 differ there), and so the receipt."""
    again = fresh(journal, eid)
    assert incremental == again
    assert repr(incremental) == repr(again)
    assert receipt_of(incremental).model_dump_json() == receipt_of(again).model_dump_json()


@pytest.fixture
def reads(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What is done to ``journal``, in order: "read" (a chain read, a value's read included),
    "append" and "check" (the chain checked, nothing decoded)."""
    seen: list[str] = []
    real_read, real_append, real_async = journal.read, journal.append, journal.append_async
    real_check = journal.check

    def read(effect_id: str) -> Any:
        seen.append("read")
        return real_read(effect_id)

    def check(effect_id: str) -> None:
        seen.append("check")
        real_check(effect_id)

    def append(*args: Any, **kw: Any) -> Any:
        seen.append("append")
        return real_append(*args, **kw)

    async def append_async(*args: Any, **kw: Any) -> Any:
        before = len(seen)
        written = await real_async(*args, **kw)
        if "append" not in seen[before:]:  # one append, whether it went through append or not
            seen.insert(before, "append")
        return written

    monkeypatch.setattr(journal, "read", read)
    monkeypatch.setattr(journal, "check", check)
    monkeypatch.setattr(journal, "append", append)
    monkeypatch.setattr(journal, "append_async", append_async)
    yield seen


def append(journal: Journal, view: EffectView, *drafts: Draft, **kw: Any) -> EffectView:
    written = journal.append(view.effect_id, view.head, list(drafts), **kw)
    before = repr(view)
    folded = fold_appended(view, written)
    same(folded, view.effect_id, journal)
    assert repr(view) == before  # the view it started from is left as it was
    return folded


def test_a_folded_append_is_the_fresh_fold_after_every_kind_of_entry(
    journal: Journal, lease: str
) -> None:
    eid = "e" * 64
    view = EffectView(effect_id=eid)
    snapshot = journal.leases.get(lease).snapshot()  # type: ignore[union-attr]
    delivery = {"workflow_id": "wf-1", "run_id": "r", "activity_id": "1", "attempt": 1}
    proposed = {
        "effect_type": "refund",
        "activity": "refund",
        "payload_digest": "p" * 64,
        "principal": "bot",
        "lease_id": lease,
        "session": "s",
        # 2.0 reads back as 2: the folded view must hold what a read holds
        "premises": {"refundable_cents": 2.0, "eligible": True},
        "target": "mem",
        "tier": 2,
        "delivery": delivery,
    }
    authorized = {"lease": snapshot, "approved_digest": "a" * 64, "decided_by": ["lease"]}
    dispatched = {"via": "dispatch", "delivery": delivery, "premises_now": {"x": 1.5}}
    view = append(
        journal,
        view,
        Draft(kind=Kind.PROPOSED, data=proposed),
        Draft(kind=Kind.AUTHORIZED, data=authorized),
        Draft(kind=Kind.DISPATCHED, data=dispatched),
        effect_type="refund",
        blobs={"approved": [{"amount": 20}]},
    )
    assert repr(view.premises) == repr({"eligible": True, "refundable_cents": 2})  # sorted
    view = append(journal, view, Draft(kind=Kind.NOT_SENT, data={"error": "Unreachable"}))
    view = append(journal, view, Draft(kind=Kind.DISPATCHED, data={**dispatched, "via": "again"}))
    view = append(
        journal,
        view,
        Draft(kind=Kind.REJECTED_PROPOSAL, data={"code": "conflicting_payload"}),
    )
    changes = [{"fact": "refundable_cents", "recorded": 2, "current": 1, "rule": "equal"}]
    view = append(
        journal,
        view,
        Draft(kind=Kind.AMBIGUOUS, data={"code": "x", "reason": "y", "changes": changes}),
    )
    view = append(
        journal,
        view,
        Draft(kind=Kind.RESOLVED, data={"decision": "not_happened", "operator": "carol"}),
    )
    view = append(
        journal,
        view,
        Draft(kind=Kind.REFUSED, data={"code": "abandoned", "reason": "z", "executed": False}),
    )
    view = append(journal, view, Draft(kind=Kind.REOPENED, data={"operator": "dave"}))
    view = append(
        journal,
        view,
        Draft(kind=Kind.AUTHORIZED, data={**authorized, "premises": {"n": 3.0}}),
        Draft(kind=Kind.DISPATCHED, data={**dispatched, "via": "reopened"}),
    )
    view = append(
        journal,
        view,
        Draft(kind=Kind.COMMITTED, data={"via": "reopened", "result_digest": "r" * 64}),
        blobs={"result": {"ref": "ref-1", "amount": 20.0}},
    )
    assert view.status is Kind.COMMITTED and view.dispatches == 3
    assert journal.verify().ok


def test_entries_that_do_not_follow_the_view_are_never_folded(journal: Journal, lease: str) -> None:
    eid = "f" * 64
    data = {"effect_type": "refund", "payload_digest": "p"}
    first = journal.append(eid, "", [Draft(kind=Kind.PROPOSED, data=data)], effect_type="refund")
    view = fold(eid, first)
    second = journal.append(eid, view.head, [Draft(kind=Kind.NOT_SENT, data={})])
    with pytest.raises(ValueError, match="do not follow the view's head"):
        fold_appended(EffectView(effect_id=eid), second)  # skips the first entry
    with pytest.raises(ValueError, match="do not follow the view's head"):
        fold_appended(EffectView(effect_id="0" * 64), first)  # another effect's
    assert fold_appended(view, second) == fresh(journal, eid)


# -- the paths that appended, then read the chain back --------------------------------------


def check(raised: Refused | Ambiguous | Receipt, journal: Journal, eid: str) -> None:
    got = raised if isinstance(raised, Receipt) else raised.receipt
    assert got == receipt_of(fresh(journal, eid))


async def test_a_refusal_at_dispatch_reads_the_chain_once(
    journal: Journal, reads: list[str]
) -> None:
    call = make_call(None)  # no lease: refused in the dispatch transaction
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(call, MemTarget())
    eid = eid_of(call)
    assert reads == ["read", "append", "check"]  # the decision's read; none after the append
    check(refused.value, journal, eid)


async def test_a_refused_reopening_reads_the_chain_once(
    journal: Journal, lease: str, reads: list[str]
) -> None:
    with pytest.raises(Refused):
        await Gate(journal).begin(make_call(None), MemTarget())
    eid = eid_of(make_call(None))
    reopen(journal, eid, operator="carol")
    reads.clear()
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(make_call(None), MemTarget())  # still no lease
    assert reads == ["read", "append", "check"]
    assert refused.value.receipt.decided_by == ["operator:carol"]
    check(refused.value, journal, eid)


async def test_recovery_that_refuses_or_calls_it_ambiguous_reads_the_chain_once(
    journal: Journal, lease: str, reads: list[str]
) -> None:
    target = MemTarget(tier=2)  # asked, and it finds nothing: absent, so refused
    call = make_call(lease)
    ticket = await Gate(journal).begin(call, target)
    assert isinstance(ticket, Ticket)
    ticket.release()
    assert journal.leases.revoke(lease)
    reads.clear()
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(call, target)
    assert reads == ["read", "append", "check"]
    check(refused.value, journal, ticket.effect_id)

    blind = MemTarget(tier=3)  # nobody can say: ambiguous
    other = make_call(lease, key={"case": "c-2"})
    again = journal.leases.issue("refund-bot", activities=[other.activity], max_amount_cents=99)
    other = make_call(again, key={"case": "c-2"})
    ticket = await Gate(journal).begin(other, blind)
    assert isinstance(ticket, Ticket)
    ticket.release()
    reads.clear()
    with pytest.raises(Ambiguous) as ambiguous:
        await Gate(journal).begin(other, blind)
    assert reads == ["read", "append", "check"]
    assert ambiguous.value.receipt.code == "unknowable"
    check(ambiguous.value, journal, ticket.effect_id)


async def test_a_last_attempt_that_calls_it_ambiguous_reads_the_chain_once(
    journal: Journal, lease: str, reads: list[str]
) -> None:
    target = MemTarget(tier=2)
    owner = make_call(lease, last_attempt=True)
    ticket = await Gate(journal).begin(owner, target)
    assert isinstance(ticket, Ticket)
    ticket.release()
    duplicate = dataclasses.replace(owner, delivery=Delivery(workflow_id="wf-other"))
    reads.clear()
    with pytest.raises(Ambiguous) as ambiguous:
        await Gate(journal).begin(duplicate, target)
    assert reads == ["read", "append", "check"]
    assert ambiguous.value.receipt.code == "not_owner"
    check(ambiguous.value, journal, ticket.effect_id)


@pytest.mark.parametrize(
    ("error", "raised"), [(Rejected("no"), Refused), (TimedOut("?"), Ambiguous)]
)
async def test_a_failed_send_reads_no_chain_after_its_dispatch(
    journal: Journal,
    lease: str,
    reads: list[str],
    error: Exception,
    raised: type[Refused] | type[Ambiguous],
) -> None:
    target = MemTarget(tier=2)
    call = make_call(lease, last_attempt=True)
    gate = Gate(journal)
    ticket = await gate.begin(call, target)
    assert isinstance(ticket, Ticket)
    same(ticket.view() or EffectView(effect_id=""), ticket.effect_id, journal)
    reads.clear()
    with pytest.raises(raised) as outcome:
        await gate.fail(ticket, error, last_attempt=True)
    assert reads == ["append", "check"]
    assert isinstance(outcome.value, Refused | Ambiguous)
    check(outcome.value, journal, ticket.effect_id)


@pytest.mark.parametrize("case", ["absent", "found", "unknowable"])
async def test_close_out_reads_the_chain_once(
    journal: Journal, lease: str, reads: list[str], case: str
) -> None:
    target = MemTarget(tier=3 if case == "unknowable" else 2)
    ticket = await Gate(journal).begin(make_call(lease), target)
    assert isinstance(ticket, Ticket)
    if case == "found":
        await target.send(ticket)
    ticket.release()
    reads.clear()
    r = await Gate(journal).close_out(ticket.effect_id, target, owner_ended="abandoned")
    # the decision's read, and (but where nobody can be asked) the approved input's
    assert reads == (
        ["read", "append", "check"] if case == "unknowable" else ["read", "read", "append", "check"]
    )
    assert r.final == {"absent": "REFUSED", "found": "COMMITTED", "unknowable": "AMBIGUOUS"}[case]
    check(r, journal, ticket.effect_id)


async def test_a_persons_resolution_and_reopening_read_the_chain_once(
    journal: Journal, lease: str, reads: list[str]
) -> None:
    target = MemTarget(tier=3)
    ticket = await Gate(journal).begin(make_call(lease, last_attempt=True), target)
    assert isinstance(ticket, Ticket)
    with pytest.raises(Ambiguous):
        await Gate(journal).fail(ticket, TimedOut("?"), last_attempt=True)
    eid = ticket.effect_id
    reads.clear()
    done = record_resolution(
        journal,
        eid,
        kind="ambiguous",
        decision="happened",
        operators=["carol"],
        result={"ref": "r-1", "amount": 20.0},
    )
    assert reads == ["read", "append", "check"]
    assert done.receipt is not None and done.receipt.final == "RESOLVED"
    check(done.receipt, journal, eid)

    with pytest.raises(Refused):
        await Gate(journal).begin(make_call(None, key={"case": "c-9"}), MemTarget())
    refused = eid_of(make_call(None, key={"case": "c-9"}))
    reads.clear()
    reopened = reopen(journal, refused, operator="dave")
    assert reads == ["read", "append", "check"]
    assert reopened.receipt is not None and reopened.receipt.final == "REOPENED"
    check(reopened.receipt, journal, refused)


def test_a_ticket_that_does_not_hold_its_dispatch_has_no_view() -> None:
    call = make_call("lease")
    bare = Ticket("e" * 64, "h" * 64, "dispatch", call.args, call.input, 1, MemTarget(), call, None)
    assert bare.view() is None
    journal_less = EffectView(effect_id="e" * 64)
    assert dataclasses.replace(bare, prior=journal_less).view() is None


@pytest.mark.parametrize("other", ["ambiguous", "refused", "committed"])
async def test_an_outcome_that_arrives_after_another_reads_the_chain_once(
    journal: Journal, lease: str, reads: list[str], other: str
) -> None:
    """The append finds the chain moved: the gate reads it once, and answers from that read."""
    target = MemTarget(tier=2)
    gate = Gate(journal)
    ticket = await gate.begin(make_call(lease, last_attempt=True), target)
    assert isinstance(ticket, Ticket)
    code = {"code": "x", "reason": "elsewhere", "changes": []}
    if other == "ambiguous":
        draft = Draft(kind=Kind.AMBIGUOUS, data={**code, "executed": "unknown"})
    elif other == "refused":
        draft = Draft(kind=Kind.REFUSED, data={**code, "executed": False})
    else:
        draft = Draft(kind=Kind.COMMITTED, data={"via": "recovery-query"})
    journal.append(ticket.effect_id, ticket.head, [draft], blobs={"result": {"ref": "r-0"}})
    reads.clear()
    if other == "committed":
        done = await gate.commit(ticket, {"ref": "r-1"})
        assert (done.via, done.after) == ("recovery-query", Kind.COMMITTED)
        assert reads.count("read") == 2  # the chain, and the result recorded in it
        return
    raised = Ambiguous if other == "ambiguous" else Refused
    error = TimedOut("?") if other == "ambiguous" else Rejected("no")
    with pytest.raises(raised) as outcome:
        await gate.fail(ticket, error, last_attempt=True)
    assert reads.count("read") == 1
    assert isinstance(outcome.value, Refused | Ambiguous)
    assert outcome.value.receipt.reason == "elsewhere"
    check(outcome.value, journal, ticket.effect_id)


# -- an edit between the decision's read and the outcome's append ------------------------------


def edit_before_next_append(journal: Journal, mp: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Arm it with an effect id: the next append to the journal first edits that effect's first
    entry underneath it (an operator with write access, between the decision's read and the
    outcome's append)."""
    armed: list[str] = []
    real_append, real_async = journal.append, journal.append_async

    def edit() -> None:
        if not armed:
            return
        eid = armed.pop()
        with closing(sqlite3.connect(journal.url.removeprefix("sqlite:///"))) as db, db:
            seq, body = db.execute(
                "SELECT seq, body FROM entries WHERE effect_id = ? ORDER BY seq LIMIT 1", (eid,)
            ).fetchone()
            doc = json.loads(body)
            doc["data"]["principal"] = "mallory"
            db.execute("UPDATE entries SET body = ? WHERE seq = ?", (json.dumps(doc), seq))

    def append(*args: Any, **kw: Any) -> Any:
        edit()
        return real_append(*args, **kw)

    async def append_async(*args: Any, **kw: Any) -> Any:
        edit()
        return await real_async(*args, **kw)

    mp.setattr(journal, "append", append)
    mp.setattr(journal, "append_async", append_async)
    return armed.append


@pytest.fixture
def unverified(tmp_path: Path) -> Iterator[Journal]:
    """A journal the test edits: not checked at the end, as the ``journal`` fixture is."""
    j = throwaway_journal(tmp_path)
    yield j
    j.close()


OUTCOMES = [
    "refused at dispatch",
    "recovery refuses",
    "recovery calls it ambiguous",
    "a duplicate on the last attempt",
    "a failed send refused",
    "a failed send ambiguous",
    "close-out absent",
    "close-out found",
    "close-out unknowable",
    "a person's resolution",
    "a person's reopening",
]


async def _set_up(journal: Journal, outcome: str) -> tuple[str, Callable[[], Any]]:
    """The effect, brought to where ``outcome`` is decided next, and the step that decides it."""
    gate = Gate(journal)
    tier = 3 if outcome in ("recovery calls it ambiguous", "close-out unknowable") else 2
    target = MemTarget(tier=tier)
    if outcome in ("refused at dispatch", "a person's reopening"):
        refused = make_call(None)  # no lease: refused in the dispatch transaction
        with pytest.raises(Refused):
            await gate.begin(refused, target)
        eid = eid_of(refused)
        if outcome == "a person's reopening":
            return eid, lambda: reopen(journal, eid, operator="carol")
        reopen(journal, eid, operator="carol")
        return eid, lambda: gate.begin(refused, target)
    lease = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], max_amount_cents=LEASE_MAX)
    owner = make_call(lease, last_attempt=outcome == "a duplicate on the last attempt")
    ticket = await gate.begin(owner, target)
    assert isinstance(ticket, Ticket)
    eid = ticket.effect_id
    if outcome.startswith("a failed send"):
        error = Rejected("no") if outcome.endswith("refused") else TimedOut("?")
        return eid, lambda: gate.fail(ticket, error, last_attempt=True)
    if outcome == "a person's resolution":
        with pytest.raises(Ambiguous):
            await gate.fail(ticket, TimedOut("?"), last_attempt=True)
        return eid, lambda: record_resolution(
            journal, eid, kind="ambiguous", decision="happened", operators=["carol"]
        )
    if outcome == "close-out found":
        await target.send(ticket)
    ticket.release()
    if outcome.startswith("close-out"):
        return eid, lambda: Gate(journal).close_out(eid, target, owner_ended="abandoned")
    if outcome == "recovery refuses":
        assert journal.leases.revoke(lease)
    if outcome == "a duplicate on the last attempt":
        owner = dataclasses.replace(owner, delivery=Delivery(workflow_id="wf-other"))
    return eid, lambda: Gate(journal).begin(owner, target)


@pytest.mark.parametrize("outcome", OUTCOMES)
async def test_an_edit_between_the_read_and_the_outcome_ends_in_journal_corrupt(
    unverified: Journal, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """Every outcome that folds its append into the view it read: an edit made after that read
    is found, and the attempt, the reconciler or the person gets ``JournalCorrupt`` naming the
    edited entry, not a receipt or a review on an edited chain."""
    eid, decide = await _set_up(unverified, outcome)
    assert unverified.verify().ok
    first = unverified.read(eid)[0].seq
    edit_before_next_append(unverified, monkeypatch)(eid)
    with pytest.raises(JournalCorrupt) as corrupt:
        step = decide()
        if inspect.isawaitable(step):
            await step
    assert (corrupt.value.effect_id, corrupt.value.seq) == (eid, first)
