"""The control plane checked again from the signed entries alone: what ``interlock journal
verify`` adds to its check of the chains for the rows the gate reads to allow something.

The problem: a worker checks a lease's row and its budget's by their seals when it reads them
(``row_seals``), and a seal cannot tell an older sealed row put back from the latest. An
auditor also holds no secret. So this check derives every such row again from the signed
entries, and compares:

- each lease's row with its chain (``lease:<id>``): the document the latest entry signs, the
  head the row was sealed with (and the seal, where the keyring can check it);
- each budget's row (``lease_spend``) with the charges the entries sign: a DISPATCHED that
  reserves (its ``budget`` note), a REFUSED that gives the reservation back, a late COMMITTED
  after a REFUSED that takes it again, in seq order; and each DISPATCHED's own note, which
  signs the total it was dispatched against, with the total the charges before it come to (a
  dispatch made while the row was lowered, then put back, is named);
- each DISPATCHED's lease head (the lease's chain head it signs) with the chain as it stood at
  that seq (a dispatch made against an older lease document is named);
- each session's row (its circuit, its counts) with its policy chain's head, and each
  approval's state with the last note on it (asked, granted, rejected, used);
- every such row's seal, where the keyring can check it (the policy's spend and admissions
  have nothing else to be compared with).

Whatever the gate reads only to refuse (a replay's nonce, a one-time code's failures) is not
checked here: the operator guide lists each table and why.

Cost: one read of each lease's chain and of each table, and no pass of its own: the verify
pass hands it every entry of the kinds it folds (``ChargeFold``), whose lease and budget it
reads from a dispatch's bytes by pattern (and parses only the policy's notes on approvals and
the tombstones). It was a second pass over the journal, a third of a verify's time.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models import ControlCheck, Entry, Kind, Lease
from ..row_seals import RowSeals
from .entries import COMBINED_VERSION, RawEntry

_DISPATCHED = Kind.DISPATCHED.value
_REFUSED = Kind.REFUSED.value
_COMMITTED = Kind.COMMITTED.value
_ARCHIVED = Kind.ARCHIVED.value
_AUTHORIZED = Kind.AUTHORIZED.value
_POLICY = Kind.POLICY.value
#: the policy notes that change an approval's state
_APPROVAL_EVENT = re.compile(
    rb'"event":"(?:escalate|approval_granted|approval_rejected|approval_used)"'
)
#: what an approval's row must say after each of them (``approval_used``: consumed if its
#: scope was once, else still approved)
_AFTER = {
    "escalate": "pending",
    "approval_granted": "approved",
    "approval_rejected": "rejected",
    "approval_used": "approved",
}


@dataclass(frozen=True)
class ControlRows:
    """The rows the gate reads to allow something, as stored: each lease's (``lease_id, doc,
    head_seq, head_hash, seal``) and each budget's (``lease_id, reserved_cents, seal``)."""

    leases: Sequence[Sequence[Any]]
    spends: Sequence[Sequence[Any]]
    #: each session's (``session, doc, head, seal``, its policy chain's head now)
    sessions: Sequence[Sequence[Any]] = ()
    #: each approval's (``binding, doc, seal``)
    approvals: Sequence[Sequence[Any]] = ()
    #: every other sealed row: (table, key, seal, the values its seal covers)
    sealed: Sequence[tuple[str, str, Any, tuple[Any, ...]]] = ()


@dataclass
class _Budgets:
    """The charges the entries sign, folded in seq order: each effect's reservation, and each
    lease's total; and the policy's last note on each approval (its event)."""

    held: dict[str, tuple[str, int, bool]] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    decided: dict[str, str] = field(default_factory=dict)
    #: each lease's chain (by lease id), for the ancestors its ``issued`` entry signs
    chains: Mapping[str, list[Entry]] = field(default_factory=dict)
    #: each lease's budgeted ancestors, as its chain and theirs sign them
    above: dict[str, list[str]] = field(default_factory=dict)

    def move(self, lease_id: str, cents: int) -> None:
        """A move of ``lease_id``'s budget, and of each budgeted ancestor's by the same cents,
        as the gate moves them (``sql_leases._Budget``)."""
        for each in (lease_id, *self.budgeted_above(lease_id)):
            self.totals[each] = self.totals.get(each, 0) + cents

    def budgeted_above(self, lease_id: str) -> list[str]:
        found = self.above.get(lease_id)
        if found is None:
            ancestors = [str(a) for a in self._signed(lease_id).get("ancestors") or []]
            found = [a for a in ancestors if self._signed(a).get("budget_cents") is not None]
            self.above[lease_id] = found
        return found

    def _signed(self, lease_id: str) -> dict[str, Any]:
        """The lease as the latest entry of its chain signs it ({}: no chain)."""
        chain = self.chains.get(lease_id)
        signed = chain[-1].data.get("lease") if chain else None
        return signed if isinstance(signed, dict) else {}


def check_control_plane(rows: ControlRows, fold: ChargeFold, seals: RowSeals) -> ControlCheck:
    """Compare the rows the gate reads to allow something (``rows``) with what the signed
    entries make of them: each lease's chain (``fold.chains``, by lease id, read and checked),
    and the charges ``fold`` was fed, in seq order, from entries already verified. ``seals``
    checks the rows' seals where the keyring can (an auditor's public key cannot: the
    derivation is what holds then)."""
    found = ControlCheck()
    for lease_id, doc, head_seq, head_hash, seal in rows.leases:
        found.leases += 1
        problem = _lease_problem(doc, head_seq, head_hash, fold.chains.get(lease_id, []))
        if problem is None and seals.can_check:
            problem = seals.problem("leases", lease_id, seal, doc, head_seq, head_hash)
        if problem is not None:
            found.problems.append(f"leases[{lease_id}]: {problem}")
    budgets = fold.finish(found)
    _check_policy(rows, budgets.decided, seals, found)
    for lease_id, reserved, seal in rows.spends:
        found.budgets += 1
        derived = budgets.totals.get(lease_id, 0)
        if int(reserved) != derived:
            found.problems.append(
                f"lease_spend[{lease_id}]: reserved_cents is {reserved}, the signed charges come "
                f"to {derived} (edited, or an older row put back)"
            )
        elif seals.can_check:
            problem = seals.problem("lease_spend", lease_id, seal, int(reserved))
            if problem is not None:
                found.problems.append(f"lease_spend[{lease_id}]: {problem}")
    return found


def _check_policy(
    rows: ControlRows, decided: Mapping[str, str], seals: RowSeals, found: ControlCheck
) -> None:
    """The policy's rows: each session's against its chain's head, each approval's state
    against the last note on it, and every row's seal where the keyring can check it."""
    for session, doc, head, seal, chain_head in rows.sessions:
        found.policy += 1
        problem = None
        if head != chain_head:
            problem = (
                "it is not the latest of its policy chain's notes (an older row put back, or "
                "a row written without the journal's keys)"
            )
        elif seals.can_check:
            problem = seals.problem("policy_sessions", session, seal, doc, head)
        if problem is not None:
            found.problems.append(f"policy_sessions[{session}]: {problem}")
    for binding, doc, seal in rows.approvals:
        found.policy += 1
        problem = seals.problem("policy_approvals", binding, seal, doc) if seals.can_check else None
        if problem is None:
            problem = _approval_problem(doc, decided.get(binding))
        if problem is not None:
            found.problems.append(f"policy_approvals[{binding}]: {problem}")
    for table, key, seal, values in rows.sealed:
        found.policy += 1
        problem = seals.problem(table, key, seal, *values) if seals.can_check else None
        if problem is not None:
            found.problems.append(f"{table}[{key}]: {problem}")


def _approval_problem(doc: str, event: str | None) -> str | None:
    if event is None:
        return "no policy note records this approval (written without the journal's keys)"
    try:
        approval = json.loads(doc)
    except ValueError:
        return "its document does not parse"
    expected = _AFTER.get(event, "")
    if event == "approval_used" and approval.get("scope") == "once":
        expected = "consumed"
    if approval.get("status") != expected:
        return (
            f"it says {approval.get('status')!r}, and the last note on it ({event}) leaves it "
            f"{expected!r} (edited, or an older row put back)"
        )
    return None


def _lease_problem(doc: str, head_seq: Any, head_hash: Any, chain: list[Entry]) -> str | None:
    if not chain:
        return "no signed entry records this lease (a row written without the journal's keys)"
    last = chain[-1]
    if (head_seq, head_hash) != (last.seq, last.hash):
        return (
            f"it was sealed at its chain's entry {head_seq}, and the chain's latest is "
            f"{last.seq} (an older row put back)"
        )
    signed = last.data.get("lease")
    try:
        same = Lease.model_validate_json(doc) == Lease.model_validate(signed)
    except ValueError:
        same = False
    if not same:
        return f"its document is not the one entry {last.seq} of its chain signs (edited)"
    return None


#: what one entry adds to the fold (``ChargeFold.scan``): its seq, its effect, its kind, and
#: what the kind carries (a dispatch's lease and budget note; a policy note's binding and event;
#: a tombstone's lease, cents and end). Plain values, so a pass in another process can send it.
Charge = tuple[int, str, str, Any, Any]
_FOLDED = frozenset({_DISPATCHED, _AUTHORIZED, _REFUSED, _COMMITTED, _POLICY, _ARCHIVED})


class ChargeFold:
    """The charges the entries sign, folded in seq order as a verify pass meets them, checking
    each DISPATCHED's note against the charges before it. An archived effect left only its
    tombstone (``ARCHIVED``: its lease, its reserved cents and how it ended), after the
    dispatches that followed its own: its charge is added at the end, and the dispatches' notes
    are judged only in a journal that never archived.

    Split in two so a pass over part of the journal in another process (``verify --jobs``)
    can do the reading: ``scan`` reads what an entry charges from its bytes (no state), and
    ``apply`` folds it, in seq order, in the process that holds the totals. Cost: one
    membership test per entry, a pattern search of each dispatch's bytes, a JSON parse of
    each tombstone and approval note."""

    kinds = _FOLDED

    def __init__(self, chains: Mapping[str, list[Entry]]) -> None:
        #: each lease's chain (by lease id), read and checked before the pass
        self.chains = chains
        #: each lease chain's seqs and heads as a dispatch signs them, worked out once
        self._heads: dict[str, tuple[list[int], list[str]]] = {}
        self.budgets = _Budgets(chains=chains)
        self._notes: list[str] = []
        self._archived = False
        self._checks = ControlCheck()

    @staticmethod
    def scan(seq: int, effect_id: str, kind: str, body: bytes) -> Charge | None:
        """What the entry at ``seq`` (of a kind in ``kinds``) adds to the fold, or None."""
        if kind in (_DISPATCHED, _AUTHORIZED):
            # a first dispatch's lease (and its head) is in the AUTHORIZED of its transaction;
            # a resend's in its DISPATCHED, with the budget's charge
            lease, note = _scanned(body)
            if kind == _AUTHORIZED:
                note = None
            return None if lease is None and note is None else (seq, effect_id, kind, lease, note)
        if kind == _REFUSED:
            return seq, effect_id, kind, None, None
        if kind == _COMMITTED:
            return (seq, effect_id, kind, None, None) if b'"after":"REFUSED"' in body else None
        if kind == _POLICY:
            if b'"binding":"' not in body or not _APPROVAL_EVENT.search(body):
                return None
            data = json.loads(body)["data"]
            binding = data.get("binding")
            return (seq, effect_id, kind, str(binding), str(data.get("event"))) if binding else None
        if kind == _ARCHIVED:
            tomb = json.loads(body)["data"]
            cents = tomb.get("amount_cents")
            return (
                seq,
                effect_id,
                kind,
                str(tomb["lease_id"]) if tomb.get("lease_id") else None,
                (None if cents is None else int(cents), tomb.get("final")),
            )
        return None

    def apply(self, charge: Charge) -> None:
        """Fold one entry's charge in (in seq order)."""
        seq, effect_id, kind, first, second = charge
        budgets = self.budgets
        if kind in (_DISPATCHED, _AUTHORIZED):
            if first is not None:
                _check_head(seq, effect_id, first, self._heads_of(first[0]), self._checks)
            if second is not None:
                _check_charge(seq, effect_id, second, budgets, self._notes)
        elif kind == _REFUSED:
            held = budgets.held.get(effect_id)
            if held is not None and held[2]:
                budgets.move(held[0], -held[1])
                budgets.held[effect_id] = (held[0], held[1], False)
        elif kind == _COMMITTED:
            held = budgets.held.get(effect_id)
            if held is not None and not held[2]:
                budgets.move(held[0], held[1])
                budgets.held[effect_id] = (held[0], held[1], True)
        elif kind == _POLICY:
            budgets.decided[first] = second
        elif kind == _ARCHIVED:
            self._archived = True
            cents, final = second
            if first is not None and cents is not None and final != _REFUSED:
                budgets.move(first, cents)

    def _heads_of(self, lease_id: str) -> tuple[list[int], list[str]]:
        found = self._heads.get(lease_id)
        if found is None:
            chain = self.chains.get(lease_id, [])
            found = [e.seq for e in chain], [f"{e.seq}:{e.hash}" for e in chain]
            self._heads[lease_id] = found
        return found

    def feed(self, seq: int, effect_id: str, kind: str, body: bytes) -> None:
        """``apply(scan(...))``: the entry at ``seq``, read in this process."""
        charge = self.scan(seq, effect_id, kind, body)
        if charge is not None:
            self.apply(charge)

    def finish(self, found: ControlCheck) -> _Budgets:
        """The totals once every entry was fed; the dispatches compared and what is wrong
        with them added to ``found``."""
        found.dispatches += self._checks.dispatches
        found.problems.extend(self._checks.problems)
        if not self._archived:
            found.problems.extend(self._notes)
        return self.budgets


def fold_entries(raws: Iterable[RawEntry], chains: Mapping[str, list[Entry]]) -> ChargeFold:
    """A ``ChargeFold`` fed every entry of ``raws`` (in seq order)."""
    fold = ChargeFold(chains)
    for raw in raws:
        if raw.kind in _FOLDED:
            fold.feed(raw.seq, raw.effect_id, raw.kind, raw.body)
    return fold


#: in an entry's canonical JSON (keys sorted), a lease's head and id, as every lease snapshot
#: since schema 10 holds them: ``"head":"SEQ:HASH","issued_at":...,"lease_id":"..."``
_LEASE_HEAD = re.compile(
    rb'"head":"([0-9]+:[0-9a-f]{64})","issued_at":[^,]*,"lease_id":"((?:[^"\\]|\\.)*)"'
)
#: a DISPATCHED's budget note: ``"budget":{"budget_cents":..,"cents":..,"lease_id":"..",
#: "reserved_cents":..}``
_BUDGET = re.compile(
    rb'"budget":\{"budget_cents":(-?[0-9]+),"cents":(-?[0-9]+),'
    rb'"lease_id":"((?:[^"\\]|\\.)*)","reserved_cents":(-?[0-9]+)\}'
)


def _scanned(body: bytes) -> tuple[tuple[str, str] | None, dict[str, Any] | None]:
    """A dispatch entry's lease (id, signed head) and budget note, read from its bytes: the
    common shapes by pattern (a JSON parse of every dispatch would double ``verify``'s time),
    anything else (an older note, a premise that happens to be named like them) by parsing."""
    lease: tuple[str, str] | None = None
    note: dict[str, Any] | None = None
    # each pattern starts with its key: tried where the key first is, searched on from there
    at_head, at_budget = body.find(b'"head":"'), body.find(b'"budget":{')
    has_head, has_budget = at_head >= 0, at_budget >= 0
    found_head = (
        _LEASE_HEAD.match(body, at_head) or _LEASE_HEAD.search(body, at_head + 1)
        if has_head
        else None
    )
    found_budget = (
        _BUDGET.match(body, at_budget) or _BUDGET.search(body, at_budget + 1)
        if has_budget
        else None
    )
    if (has_head and found_head is None) or (has_budget and found_budget is None):
        doc = json.loads(body)
        data = doc["data"]
        if doc.get("v") == COMBINED_VERSION:  # a combined dispatch: the lease is authorized
            data = {**data["dispatch"], "lease": data["authorization"].get("lease")}
        snapshot, budget = data.get("lease"), data.get("budget")
        if isinstance(snapshot, dict) and isinstance(snapshot.get("head"), str):
            lease = (str(snapshot.get("lease_id")), snapshot["head"])
        return lease, budget if isinstance(budget, dict) else None
    if found_head is not None:
        lease = (_text(found_head.group(2)), found_head.group(1).decode())
    if found_budget is not None:
        note = {
            "lease_id": _text(found_budget.group(3)),
            "cents": int(found_budget.group(2)),
            "reserved_cents": int(found_budget.group(4)),
        }
    return lease, note


def _text(escaped: bytes) -> str:
    """A JSON string's contents as text (parsed only when it holds an escape)."""
    return json.loads(b'"' + escaped + b'"') if b"\\" in escaped else escaped.decode()


def _check_head(
    seq: int,
    effect_id: str,
    lease: tuple[str, str],
    chain: tuple[list[int], list[str]],
    found: ControlCheck,
) -> None:
    """The lease head a dispatch transaction signs (with the lease, in its AUTHORIZED or a
    resend's DISPATCHED) against the lease's chain as it stood at that seq (``chain``: its
    entries' seqs and heads, ``SEQ:HASH``, in seq order)."""
    lease_id, head = lease
    found.dispatches += 1
    seqs, heads = chain
    at = bisect.bisect_left(seqs, seq)  # the entries of the chain before ``seq``
    then = heads[at - 1] if at else None
    if head != then:
        found.problems.append(
            f"effect {effect_id[:16]} seq {seq}: dispatched against lease {lease_id}'s "
            f"entry {head.partition(':')[0]}, and its chain's latest then was "
            f"{then.partition(':')[0] if then else 'none'} (an older lease row put back)"
        )


def _check_charge(
    seq: int, effect_id: str, note: dict[str, Any], budgets: _Budgets, notes: list[str]
) -> None:
    """A DISPATCHED's budget note: its charge folded in, and the total it signs (what the
    lease's budget held reserved with it, and each budgeted ancestor's: its ``ancestors``)
    against the charges before it."""
    lease_id, cents = str(note.get("lease_id")), int(note.get("cents") or 0)
    held = budgets.held.get(effect_id)
    own = held[1] if held is not None and held[2] else 0
    for each in (note, *(note.get("ancestors") or ())):
        each_id = str(each.get("lease_id"))
        derived = budgets.totals.get(each_id, 0) - own + cents
        if "reserved_cents" in each and each["reserved_cents"] != derived:
            notes.append(
                f"effect {effect_id[:16]} seq {seq}: dispatched against lease "
                f"{each_id}'s budget with {each['reserved_cents'] - cents} cents reserved, the "
                f"signed charges before it come to {derived - cents} (lease_spend was lowered)"
            )
    if held is None or not held[2]:
        budgets.move(lease_id, cents)
        budgets.held[effect_id] = (lease_id, cents, True)
