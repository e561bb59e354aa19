"""An effect's state folded from its journal entries, and the receipt an auditor reads."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .journal import Journal
from .journal.entries import part_of
from .models import ANNOTATIONS, Entry, Executed, Kind, Receipt


@dataclass
class EffectView:
    """Everything recovery needs to know about one effect, derived from its entries only."""

    effect_id: str
    status: Kind | None = None
    head: str = ""
    head_seq: int = 0
    effect_type: str | None = None
    activity: str | None = None
    payload_digest: str | None = None
    approved_digest: str | None = None
    #: the effect's digest scheme: None for plain sha256, ``hmac-sha256:<key id>`` for keyed
    #: digests (its values are sealed by the user's codec; see ``core.sealing``)
    digests: str | None = None
    principal: str | None = None
    lease_id: str | None = None
    session: str | None = None
    premises: dict[str, Any] | None = None
    target: str | None = None
    tier: int | None = None
    authorized: bool = False
    authority: dict[str, Any] | None = None
    decided_by: list[str] = field(default_factory=list)
    dispatches: int = 0
    first_dispatch_ts: float | None = None
    last_dispatch_ts: float | None = None
    absence_confirmed: bool = False
    via: str | None = None
    result_digest: str | None = None
    confirmation: str | None = None
    code: str | None = None
    reason: str | None = None
    changed_facts: list[str] = field(default_factory=list)
    #: the last refusal was about the caller's own configuration, and which part (one of
    #: ``leases.CONFIGURATION``): the next attempt decides the effect again. None for every
    #: other refusal (it stays until a person reopens it), and for refusals recorded before
    #: configuration refusals were marked
    configuration: str | None = None
    resolution: str | None = None
    operator: str | None = None
    #: for the operators of a person's decision: the client identity Temporal recorded for the
    #: signal or Update that carried each one's vote (evidence, not proof: a client sets it)
    sent_by: dict[str, str] | None = None
    late: bool = False
    alarm: str | None = None
    proposed_ts: float | None = None
    finished_ts: float | None = None
    #: the policy's note on the authorisation (verdict, code, epoch, observed)
    policy: dict[str, Any] | None = None
    #: what the last dispatch reserved of its lease's budget
    budget: dict[str, Any] | None = None
    #: the Temporal delivery of the workflow that owns the effect, the only one that may send
    #: it: the delivery recorded on PROPOSED, then on each of the owner's own dispatches (after
    #: a person's REOPENED, the workflow whose attempt re-dispatches it becomes the owner)
    owner_delivery: dict[str, Any] | None = None

    @property
    def in_doubt(self) -> bool:
        return self.status is Kind.DISPATCHED

    @property
    def owner(self) -> str | None:
        """The workflow id of the effect's owner (None where the core ran without Temporal)."""
        return (self.owner_delivery or {}).get("workflow_id")


def fold(effect_id: str, entries: Sequence[Entry]) -> EffectView:
    """The effect's view from its entries, in order (as ``Journal.read`` returns them)."""
    return _fold_into(EffectView(effect_id=effect_id), entries)


def fold_appended(view: EffectView, written: Sequence[Entry]) -> EffectView:
    """``view`` with the entries an append after its head just wrote folded in: the view a
    ``fold`` of the whole chain read again would give, without reading it again.

    Safe without the read's verification: ``view`` was folded from a verified read (or is the
    empty view of an effect with no entries), and ``written`` are the entries this process
    encoded and signed itself, in the transaction that found the chain's head still at
    ``view.head`` (anything else raises ``HeadConflict`` and is not folded here). They are taken
    as a read would decode them, from their signed bytes, so a value whose JSON form differs
    (a float like 2.0 reads back as 2) reads as it will be read. ``view`` is not changed."""
    head = view.head
    for e in written:
        # the entries a format-3 entry stands for share its hash: each after the first
        # continues the chain from it
        if e.effect_id != view.effect_id or (e.prev != head and e.hash != head):
            raise ValueError(
                f"effect {view.effect_id[:16]}: the appended entries do not follow the view's head"
            )
        head = e.hash
    return _fold_into(copy.copy(view), [_as_read(e) for e in written])


def fold_checked(journal: Journal, view: EffectView, written: Sequence[Entry]) -> EffectView:
    """``fold_appended``, once ``journal`` has checked the chain the entries were appended to.

    For an outcome (a refusal, an ambiguity, a failure, a person's decision): the fold answers
    for the entries as they were read, but an edit made since that read must still stop the
    outcome with ``JournalCorrupt``, as the read of the chain this fold replaces did, instead of
    opening a review or handing out a receipt on an edited chain. The check hashes the stored
    entries; it decodes and folds nothing."""
    folded = fold_appended(view, written)
    journal.check(view.effect_id)
    return folded


def _as_read(entry: Entry) -> Entry:
    """An entry this process wrote, as a read decodes it from its stored bytes."""
    doc = json.loads(entry.body)
    return entry.model_copy(update={"ts": float(doc["ts"]), "data": part_of(entry.kind, doc)})


#: what a tombstone does not keep of an effect's view: where it is (the tombstone is its new
#: head) and the facts captured when it was proposed (nothing reads them once it is final)
_NOT_KEPT = frozenset({"effect_id", "status", "head", "head_seq", "premises"})


def final_view(v: EffectView) -> dict[str, Any]:
    """What a tombstone signs of the view of an effect in a final state (``Kind.ARCHIVED``):
    everything a later attempt, a receipt or a person's decision reads of it, so that the effect
    reads as it did before its entries moved to an archive."""
    return {
        f.name: copy.deepcopy(getattr(v, f.name))
        for f in dataclasses.fields(v)
        if f.name not in _NOT_KEPT
    }


def _restore(v: EffectView, d: dict[str, Any]) -> None:
    """A tombstone's view, folded in: the effect as its archived entries left it."""
    names = {f.name for f in dataclasses.fields(v)} - _NOT_KEPT
    for name, value in (d.get("view") or {}).items():
        if name in names:
            setattr(v, name, copy.deepcopy(value))
    v.status = Kind(d["final"])


def _fold_into(v: EffectView, entries: Sequence[Entry]) -> EffectView:
    for e in entries:
        d = e.data
        v.head, v.head_seq = e.hash, e.seq
        if e.kind is Kind.ARCHIVED:
            _restore(v, d)
            continue
        if e.kind in ANNOTATIONS:
            continue
        v.status = e.kind
        if e.kind is Kind.PROPOSED:
            v.proposed_ts = e.ts
            v.effect_type = d.get("effect_type")
            v.activity = d.get("activity")
            v.payload_digest = d.get("payload_digest")
            v.digests = d.get("digests")
            v.principal = d.get("principal")
            v.lease_id = d.get("lease_id")
            v.session = d.get("session")
            v.premises = d.get("premises")
            v.target = d.get("target")
            v.tier = d.get("tier")
            v.owner_delivery = d.get("delivery")
        elif e.kind is Kind.AUTHORIZED:
            v.authorized = True
            v.authority = d.get("lease")
            v.approved_digest = d.get("approved_digest")
            v.decided_by = list(d.get("decided_by", []))
            v.policy = d.get("policy", v.policy)
            # a reopened effect is authorised afresh: its new baseline replaces the proposal's
            v.premises = d.get("premises", v.premises)
            v.lease_id = d.get("lease_id", v.lease_id)
            v.principal = d.get("principal", v.principal)
        elif e.kind is Kind.DISPATCHED:
            v.dispatches += 1
            v.first_dispatch_ts = v.first_dispatch_ts or e.ts
            v.last_dispatch_ts = e.ts
            v.via = d.get("via")
            v.absence_confirmed = False
            if "lease" in d:
                v.authority = d["lease"]
            if "budget" in d:
                v.budget = d["budget"]
            delivery = d.get("delivery")
            if delivery is not None and (
                v.via == "reopened" or delivery.get("workflow_id") == v.owner
            ):
                v.owner_delivery = delivery
        elif e.kind is Kind.COMMITTED:
            v.via = d.get("via")
            v.result_digest = d.get("result_digest")
            v.confirmation = d.get("confirmation")
            v.late = bool(d.get("late"))
            v.alarm = d.get("alarm")
            v.finished_ts = e.ts
        elif e.kind in (Kind.REFUSED, Kind.AMBIGUOUS):
            v.code = d.get("code")
            v.reason = d.get("reason")
            v.changed_facts = [c["fact"] for c in d.get("changes", [])]
            v.configuration = d.get("configuration") if e.kind is Kind.REFUSED else None
            v.finished_ts = e.ts
        elif e.kind is Kind.NOT_SENT:
            v.absence_confirmed = True
        elif e.kind is Kind.RESOLVED:
            v.resolution = d.get("decision")
            v.operator = d.get("operator")
            v.sent_by = d.get("sent_by")
            v.absence_confirmed = v.resolution == "not_happened"
            v.result_digest = d.get("result_digest", v.result_digest)
            v.via = "resolved"
            v.finished_ts = e.ts
        elif e.kind is Kind.REOPENED:
            # by a person (``operator``), or by the gate for a refusal about the caller's
            # configuration (``redecided``: which part; no operator)
            v.operator = d.get("operator")
            v.sent_by = None  # reopened from the command line, not through Temporal
            v.absence_confirmed = True
            v.configuration = None
    return v


def _executed(v: EffectView) -> Executed:
    if v.status is Kind.COMMITTED:
        return True
    if v.status is Kind.RESOLVED:
        return v.resolution == "happened"
    if v.status in (Kind.REFUSED, Kind.NOT_SENT, Kind.REOPENED):
        return False
    return "unknown"


def _charged(v: EffectView) -> int | None:
    """What the effect holds reserved of its lease's budget: given back once it was refused
    (never executed), charged again by a late COMMITTED."""
    if v.budget is None:
        return None
    return 0 if v.status is Kind.REFUSED else int(v.budget.get("cents", 0))


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def receipt_of(v: EffectView) -> Receipt:
    return Receipt(
        effect_id=v.effect_id,
        effect_type=v.effect_type or "",
        final=v.status.value if v.status else "UNKNOWN",
        via=v.via if v.status in (Kind.COMMITTED, Kind.DISPATCHED, Kind.RESOLVED) else None,
        proposed=v.status is not None,
        authorized=v.authorized,
        executed=_executed(v),
        recorded=v.status in (Kind.COMMITTED, Kind.REFUSED, Kind.AMBIGUOUS, Kind.RESOLVED),
        code=v.code if v.status in (Kind.REFUSED, Kind.AMBIGUOUS) else None,
        reason=v.reason if v.status in (Kind.REFUSED, Kind.AMBIGUOUS) else None,
        changed_facts=v.changed_facts if v.status in (Kind.REFUSED, Kind.AMBIGUOUS) else [],
        premises_held=None
        if v.status is None
        else not (v.status in (Kind.REFUSED, Kind.AMBIGUOUS) and bool(v.changed_facts)),
        principal=v.principal,
        lease_id=v.lease_id,
        lease_chain=_lease_chain(v),
        authority_at_send=v.authority,
        decided_by=v.decided_by + ([f"operator:{v.operator}"] if v.operator else []),
        payload_digest=v.payload_digest,
        approved_digest=v.approved_digest,
        result_digest=v.result_digest,
        confirmation=v.confirmation,
        dispatches=v.dispatches,
        target=v.target,
        tier=v.tier,
        operator=v.operator,
        sent_by=dict(v.sent_by or {}),
        proposed_at=_ts(v.proposed_ts),
        finished_at=_ts(v.finished_ts),
        policy_code=(v.policy or {}).get("code"),
        policy_epoch=(v.policy or {}).get("epoch"),
        observed=bool((v.policy or {}).get("observed")),
        lease_budget_cents=None if v.budget is None else v.budget.get("budget_cents"),
        lease_charged_cents=_charged(v),
        journal_seq=v.head_seq,
        journal_hash=v.head,
    )


def _lease_chain(v: Any) -> list[str]:
    """The lease ids the effect acted under, root first: the ancestors its lease's signed
    snapshot names (in its AUTHORIZED, or a resend's DISPATCHED), then the lease."""
    if v.lease_id is None:
        return []
    ancestors = (v.authority or {}).get("ancestors") or []
    return [*reversed([str(a) for a in ancestors]), str(v.lease_id)]


def receipt(effect_id: str, *, journal: Journal | str | None = None) -> Receipt:
    """The receipt of ``effect_id`` as the journal records it now.

    ``journal``: an open journal or a URL; default ``$INTERLOCK_JOURNAL``, else
    ``sqlite:///interlock.db``.
    """
    if not isinstance(journal, Journal):
        from .journal import open_journal
        from .journal.opening import configured_journal

        url, _ = configured_journal(journal)
        with open_journal(url, create=False) as opened:
            return receipt(effect_id, journal=opened)
    from .journal_identity import journal_id_of  # the journal package imports this module

    entries = journal.read(effect_id)
    if not entries:
        raise KeyError(f"no effect {effect_id} in {journal.url}")
    found = receipt_of(fold(effect_id, entries))
    return found.model_copy(update={"journal_id": journal_id_of(journal, create=False)})
