"""Bugs planted in the gate, one at a time, to prove the evidence catches them: each is a
context manager that breaks one guarantee of the real code (through pytest's monkeypatch)
and says which sweep cases can show it."""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from interlock_temporal._reviews import desk
from interlock_temporal.core import premises, protocol, review
from interlock_temporal.core.journal import sql as sql_journal
from interlock_temporal.core.journal import sqlite as sqlite_journal
from interlock_temporal.core.journal.sql_leases import SqlLeases
from interlock_temporal.core.leases import check_lease, lease_from_doc
from interlock_temporal.core.models import Lease
from interlock_temporal.core.protocol import Call, Delivery, Measure, dispatch, recovery
from interlock_temporal.core.protocol.recorder import Recorder
from interlock_temporal.core.protocol.recovery import Recovery
from interlock_temporal.core.receipts import EffectView, fold
from interlock_temporal.core.review import NoDecision, Reached, ReviewRules, Vote, reached
from interlock_temporal.core.targets import Capabilities, capabilities
from workers import outsider
from workers.sweep_case import Case

Plant = Callable[[pytest.MonkeyPatch], None]

#: the protocol's rooms that call the helpers a planted bug replaces
ROOMS = (dispatch, recovery)
#: where a decision's votes are counted before it is recorded: the core (their home), the
#: record activity (``interlock.record_decision``), and the worlds' outsider
COUNTING = (review, desk, outsider)


def in_the_gate(mp: pytest.MonkeyPatch, name: str, value: Any) -> None:
    """Replace ``name`` wherever the protocol's rooms use it."""
    for room in ROOMS:
        if hasattr(room, name):
            mp.setattr(room, name, value)


@dataclass(frozen=True)
class Bug:
    name: str
    plant: Plant
    #: the sweep cases that can show it (the sweep's first 2,000 seeds hold such cases)
    shows_in: Callable[[Case], bool]
    #: the model check's scope that shows it: (tier, the second attempt, the world's events);
    #: None: the model's world has no such event (a lease's row put back), the sweep shows it
    model: tuple[int, str, tuple[str, ...]] | None = (2, "retry", ())


_recovering: contextvars.ContextVar[bool] = contextvars.ContextVar("recovering", default=False)


def _lease_ignored_at_recovery(mp: pytest.MonkeyPatch) -> None:
    real_recover, real_check = Recovery.recover, check_lease

    async def recover(self: Recovery, *args: Any) -> Any:
        token = _recovering.set(True)
        try:
            return await real_recover(self, *args)
        finally:
            _recovering.reset(token)

    def check(lease: Lease | None, demand: Any, now: float) -> Any:
        return None if _recovering.get() else real_check(lease, demand, now)

    mp.setattr(Recovery, "recover", recover)
    in_the_gate(mp, "check_lease", check)


def _premises_never_revalidated(mp: pytest.MonkeyPatch) -> None:
    async def validate(*args: Any) -> list[Any]:
        return []

    mp.setattr(premises, "validate", validate)


def _tier_3_resends(mp: pytest.MonkeyPatch) -> None:
    in_the_gate(mp, "capabilities", lambda t: dataclasses.replace(capabilities(t), queryable=True))


def _dedupe_margin_ignored(mp: pytest.MonkeyPatch) -> None:
    def resend_deduped(self: Capabilities, first: float | None, now: float) -> bool:
        window = self.dedupe_window
        return window is not None and first is not None and now < first + window.total_seconds()

    mp.setattr(Capabilities, "resend_deduped", resend_deduped)


def _a_duplicate_submitter_sends(mp: pytest.MonkeyPatch) -> None:
    real = Recovery.recover

    async def recover(self: Recovery, call: Call, target: Any, view: EffectView, claim: Any) -> Any:
        view.owner_delivery = {"workflow_id": call.delivery.workflow_id}  # anyone owns it
        return await real(self, call, target, view, claim)

    mp.setattr(Recovery, "recover", recover)


def _amount_of(arg: Any) -> int:
    amount = arg.get("amount", arg.get("amount_cents")) if isinstance(arg, dict) else None
    return int(amount if amount is not None else arg.amount_cents)


async def _send_to(target: Any, eid: str, ticket: Any) -> Any:
    """What the world's activity sends: the payments service's refund, or the model's send."""
    if hasattr(target, "refund"):
        r = ticket.input
        return await target.refund(r.order_id, r.amount_cents, idempotency_key=eid)
    return target.send(eid)


def _the_reconciler_sends(mp: pytest.MonkeyPatch) -> None:
    """The reconciler of old: it resends an effect in doubt as its owner would (in the gate's
    recovery part, where every close-out goes: the reconciler's and an unstable key's)."""

    async def close_out(self: Recovery, eid: str, target: Any, **kw: Any) -> Any:
        claim = self.journal.claim(eid)
        assert claim is not None
        try:
            view = fold(eid, self.journal.read(eid))
            decode = kw.get("decode_args") or tuple
            args = tuple(decode(self.journal.blob(eid, "approved")))
            call = Call(
                effect_type=view.effect_type or "refund",
                activity=view.activity or "refund",
                input=args[0],
                args=args,
                principal=view.principal,
                lease_id=view.lease_id,
                measure=lambda a: Measure(_amount_of(a[0])),
                delivery=Delivery(workflow_id=view.owner, activity_id="reconciler"),
                last_attempt=True,
                decode_args=decode,
            )
            step = await self.recover(call, target, view, claim)
        except BaseException:
            claim.release()
            raise
        if isinstance(step, protocol.Ticket):
            await self._recorder.commit(step, await _send_to(target, eid, step))
        else:
            claim.release()
        return self._recorder.receipt(eid)

    mp.setattr(Recovery, "close_out", close_out)


class _NoClaim:
    def release(self) -> None:
        pass


def _claim_skipped(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(sqlite_journal.SqliteJournal, "claim", lambda self, eid: _NoClaim())
    mp.setattr(sqlite_journal.SqliteJournal, "is_claimed", lambda self, eid: False)


def _conflicting_payload_skipped(mp: pytest.MonkeyPatch) -> None:
    async def accept(self: Recorder, view: Any, pdigest: str, call: Call) -> None:
        return None

    mp.setattr(Recorder, "reject_conflict", accept)


def _journal_read_unverified(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(sql_journal, "check_chain", lambda *args: None)


def _lease_budget_overspent(mp: pytest.MonkeyPatch) -> None:
    def check(lease: Lease | None, demand: Any, now: float) -> Any:
        if lease is not None and lease.budget_cents is not None:
            lease = lease.model_copy(update={"reserved_cents": 0})
        return check_lease(lease, demand, now)

    in_the_gate(mp, "check_lease", check)


def _lease_read_unsigned(mp: pytest.MonkeyPatch) -> None:
    """The dispatch transaction's lease read of old: the row taken as it stands, its seal and
    its chain's head never looked at. A revoked lease whose row was put back as it was before
    reads as live."""

    def lease_in(self: SqlLeases, found: Any, own: Any) -> Lease | None:
        doc, _, _, _, _, reserved, _ = found
        if doc is None:
            return None
        lease = lease_from_doc(doc)
        if lease.budget_cents is None:
            return lease
        others = int(reserved or 0) - (int(own) if own is not None else 0)
        return lease.model_copy(update={"reserved_cents": others})

    mp.setattr(SqlLeases, "lease_in", lease_in)


def _decision_without_the_workers_rules(mp: pytest.MonkeyPatch) -> None:
    """The record activity of old: it took the votes as the review counted them, under the
    review's own rules (``{}``: one vote, from anyone) and with no principal to refuse, instead
    of the worker's ``ReviewRules`` and the principal the journal recorded. A review an
    outsider started decides: the agent's principal approves itself, a name off the list
    counts. The replacement takes whatever ``count_votes`` is passed after the votes (the
    worker's rules) and ignores it."""

    def count(
        journal: Any, kind: str, subject: str, votes: Sequence[Vote], *ignored: Any, **kw: Any
    ) -> tuple[Reached, list[str]]:
        decided = reached(list(votes), ReviewRules().min_approvals)
        if decided is None:
            raise NoDecision("no votes")
        return decided, []

    for room in COUNTING:
        mp.setattr(room, "count_votes", count)


def _recovers(case: Case) -> bool:
    """The effect is left in doubt for a later attempt to recover."""
    return case.first_dies_at in ("after_dispatch_tx", "after_send") and not case.zombie


BUGS = [
    Bug(
        "the lease ignored at recovery",
        _lease_ignored_at_recovery,
        lambda c: _recovers(c) and c.event in ("revoke_lease", "expire_lease"),
        (2, "retry", ("revoke_lease", "expire_lease")),
    ),
    Bug(
        "premises never re-validated",
        _premises_never_revalidated,
        lambda c: _recovers(c) and c.event in ("ineligible", "manual_refund"),
        (2, "retry", ("ineligible", "manual_refund")),
    ),
    Bug(
        "tier 3 resends",
        _tier_3_resends,
        lambda c: _recovers(c) and c.tier == 3 and c.event == "none",
        (3, "retry", ()),
    ),
    Bug(
        "the dedupe margin ignored",
        _dedupe_margin_ignored,
        lambda c: _recovers(c) and c.tier == 1 and c.event == "near_window_end",
        (1, "retry", ("near_window_end",)),
    ),
    Bug(
        "a duplicate submitter sends",
        _a_duplicate_submitter_sends,
        lambda c: (
            c.first_dies_at == "after_dispatch_tx"
            and not c.zombie
            and c.event == "owner_cancelled"
            and c.then == "duplicate_other"
        ),
        (2, "other", ()),
    ),
    Bug(
        "the reconciler sends",
        _the_reconciler_sends,
        lambda c: (
            c.first_dies_at == "after_dispatch_tx" and not c.zombie and c.event == "owner_cancelled"
        ),
        (2, "retry", ("owner_cancelled",)),
    ),
    Bug(
        "the claim skipped",
        _claim_skipped,
        lambda c: c.zombie and c.stalled and c.tier == 2,
        (2, "retry", ()),
    ),
    Bug(
        "the conflicting-payload check skipped",
        _conflicting_payload_skipped,
        lambda c: c.then == "redecide" and c.first_dies_at is None,
        (2, "redecide", ()),
    ),
    Bug(
        "a journal read not verified",
        _journal_read_unverified,
        lambda c: _recovers(c) and c.event == "tamper" and c.tier <= 2 and not c.lease_rollback,
        (2, "retry", ("tamper",)),
    ),
    Bug(
        "a lease budget overspent",
        _lease_budget_overspent,
        lambda c: (
            c.first_dies_at in ("claimed", "before_dispatch_tx") and c.event == "budget_taken"
        ),
        (2, "retry", ("budget_taken",)),
    ),
    Bug(
        "an unsigned lease read",
        _lease_read_unsigned,
        lambda c: c.lease_rollback and c.first_dies_at in ("claimed", "before_dispatch_tx"),
        None,
    ),
    Bug(
        "a decision recorded without the worker's rules",
        _decision_without_the_workers_rules,
        lambda c: (
            c.outsider is not None
            and c.tier == 3
            and c.first_dies_at == "after_send"
            and not c.zombie
            and c.event not in ("owner_cancelled", "tamper")
        ),
        (3, "retry", ("outsider_decides",)),
    ),
]


def bug_named(name: str) -> Bug:
    return next(b for b in BUGS if b.name == name)


@contextmanager
def planted(bug: Bug) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        bug.plant(mp)
        yield
