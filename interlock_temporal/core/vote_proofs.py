"""Proofs that an operator cast a vote: an Ed25519 signature by the operator's key (or by an
attester's key for them) over what is decided.

The problem: a vote arrives as a Temporal signal or update, and anyone with namespace access
can send one naming any operator. Checking the workflow that collected it cannot help either:
whoever polls the task queue can run a review's workflow tasks. Only something each vote carries
can show who cast it.

The mechanism: the person's tools sign a **statement**: a domain tag and version, the ballot
(the roster's id, the review's kind, what it binds, the episode, the proposed and approved
payload digests, the principal and the policy epoch: ``review_rules.Ballot``), the operator, the
decision, the digest of the attested result, an approval's scope and ttl, the key id and an
expiry, in canonical JSON. The worker that records the decision builds the ballot again from
the journal (``ballot_of``, never the review's copy), and counts the vote only if the signature
verifies under a key the roster holds for that operator, before its expiry. A vote for one
episode does not verify on the next (its entry hash differs); a signature is recorded with the
decision it made (``RESOLVED``'s ``proofs``, or an approval's or a circuit reset's policy note
with the ballot it signed) and refused if it is offered again, and ``interlock journal verify
--public-key`` re-checks the recorded ones offline.

Cost: one Ed25519 verification (about 0.18 ms on these machines) and one canonical JSON per
counted vote, plus the roster's and the ballot's journal reads (the effect's chain, or an
approval's row), once per decision: about 0.6 ms more per decision than without a roster
(``python -m benchmarks.decision_proofs``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from .identity import canonical, canonical_json, digest
from .journal import Journal
from .journal.signing import Ed25519Key
from .models import Entry, Kind
from .operators import ROSTER_CHAIN, Roster, fold_roster
from .receipts import fold
from .review_rules import Ballot, Vote, VoteProof
from .vote_codes import MAX_FAILURES, CodeUses, VoteCodes, code_digest

DOMAIN = "interlock-vote"
VERSION = 1


def statement(ballot: Ballot, vote: Vote, key_id: str, expires: int) -> bytes:
    """The bytes a vote's proof signs."""
    return statement_of(
        ballot,
        operator=vote.operator.strip(),
        decision=vote.decision,
        result=result_hash(vote.result),
        scope=vote.scope,
        ttl_s=vote.ttl_s,
        key_id=key_id,
        expires=expires,
    )


def statement_of(
    ballot: Ballot,
    *,
    operator: str,
    decision: str,
    result: str | None,
    scope: str | None,
    ttl_s: float | None,
    key_id: str,
    expires: int,
) -> bytes:
    """``statement`` from its parts, as a recorded proof keeps them (``recheck``)."""
    return canonical_json(
        {
            "domain": DOMAIN,
            "v": VERSION,
            **ballot.model_dump(mode="json"),
            "operator": operator,
            "decision": decision,
            "result": result,
            "scope": scope,
            "ttl_s": ttl_s,
            "key_id": key_id,
            "expires": expires,
        }
    )


def result_hash(result: Any) -> str | None:
    """What a statement signs of an attested result: the sha256 of its canonical JSON."""
    return None if result is None else hashlib.sha256(canonical(result)).hexdigest()


def sign_vote(ballot: Ballot, vote: Vote, key: Ed25519Key, expires: int) -> Vote:
    """``vote`` with its proof: signed by ``key`` (the operator's, or an attester's for them)."""
    signature = key.sign(statement(ballot, vote, key.key_id, expires))
    proof = VoteProof(key_id=key.key_id, expires=expires, signature=signature)
    return vote.model_copy(update={"proof": proof})


def proof_digest(proof: VoteProof) -> str:
    """What names a signature where it is recorded (and refused a second time)."""
    return hashlib.sha256(bytes.fromhex(proof.signature)).hexdigest()


def episode_of(entries: Iterable[Entry]) -> str | None:
    """The hash of the entry that left the effect AMBIGUOUS this time (None: it is not)."""
    episode: str | None = None
    for entry in entries:
        if entry.kind is Kind.AMBIGUOUS:
            episode = entry.hash
    return episode


def ballot_of(journal: Journal, roster: Roster, kind: str, subject: str) -> Ballot | None:
    """The ballot of the review of ``kind`` on ``subject`` as the journal records it now; None
    when nothing there awaits a decision (no AMBIGUOUS entry, no approval request, no open
    circuit)."""
    if kind == "ambiguous":
        return ballot_before(roster.id, subject, journal.read(subject))
    if kind == "approval":
        approval = journal.policy.approval(subject)
        if approval is None:
            return None
        asked = {
            "binding": approval.binding,
            "requested_at": approval.requested_at,
            "payload_digest": approval.payload_digest,
        }
        return Ballot(
            journal=roster.id,
            kind="approval",
            binding=subject,
            episode=digest(asked),
            proposed=approval.payload_digest,
            approved=approval.payload_digest,
            principal=approval.principal,
            epoch=approval.epoch,
        )
    if kind == "circuit":
        state = journal.policy.session(subject)
        circuit = None if state is None else state.circuit
        if circuit is None:
            return None
        opened = {"session": subject, "code": circuit.code, "at": circuit.at}
        return Ballot(journal=roster.id, kind="circuit", binding=subject, episode=digest(opened))
    return None


@dataclass(frozen=True)
class Question:
    """What the journal records of the question votes answer: who asked (never decides), the
    ballot a proof must sign (None without a roster, or when nothing awaits a decision), and
    the proofs already used on it."""

    principal: str | None
    ballot: Ballot | None
    used: frozenset[str]


def question_of(journal: Journal, roster: Roster, kind: str, subject: str) -> Question:
    """The question of the review of ``kind`` on ``subject``, from the journal: an effect's
    chain is read once."""
    if kind != "ambiguous":
        principal = None
        if kind == "approval":
            approval = journal.policy.approval(subject)
            principal = None if approval is None else approval.principal
        ballot = ballot_of(journal, roster, kind, subject) if roster.exists else None
        # an approval's or a circuit's episode ends with its decision
        return Question(principal, ballot, frozenset())
    entries = journal.read(subject)
    principal = fold(subject, entries).principal if entries else None
    if not roster.exists:
        return Question(principal, None, frozenset())
    used = frozenset(
        str(p.get("digest"))
        for e in entries
        if e.kind is Kind.RESOLVED
        for p in e.data.get("proofs") or []
        if isinstance(p, dict)
    )
    return Question(principal, ballot_before(roster.id, subject, entries), used)


def proof_problem(
    ballot: Ballot,
    vote: Vote,
    roster: Roster,
    now: float,
    used: set[str],
    codes: VoteCodes,
    uses: CodeUses,
) -> tuple[str | None, dict[str, Any] | None]:
    """Why ``vote``'s proof (a key's signature, or a one-time code) does not show that its
    operator cast it on ``ballot`` (None when it does), and the proof as recorded with the
    decision."""
    operator = vote.operator.strip()
    proof = vote.proof
    if proof is None and vote.code is not None:
        return _code_problem(ballot, vote, roster, codes, uses)
    if proof is None:
        return (
            f"{operator!r}: the journal has an operator roster, and this vote carries no proof "
            "(sign it: `interlock reviews resolve --key FILE`)",
            None,
        )
    signer = roster.by_key(proof.key_id)
    if signer is None:
        return f"{operator!r}: signed with key {proof.key_id}, which the roster does not hold", None
    if not roster.may_sign(signer, operator):
        return (
            f"{operator!r}: signed with {signer.name!r}'s key, which does not prove "
            f"{operator!r}'s vote",
            None,
        )
    if proof.expires <= now:
        return f"{operator!r}: the proof expired", None
    if not signer.key.verify(statement(ballot, vote, proof.key_id, proof.expires), proof.signature):
        return (
            f"{operator!r}: the signature does not match this vote on this review (signed for "
            "another decision, another episode of it, or another journal)",
            None,
        )
    recorded = proof_digest(proof)
    if recorded in used:
        return f"{operator!r}: this signature was already used", None
    return None, {
        "operator": operator,
        "key_id": proof.key_id,
        "signer": signer.name,
        "expires": proof.expires,
        "signature": proof.signature,
        "digest": recorded,
        "via": "key",
        # what the signature covers besides the ballot and the decision, for ``recheck``
        "result": result_hash(vote.result),
        "scope": vote.scope,
        "ttl_s": vote.ttl_s,
    }


def _code_problem(
    ballot: Ballot, vote: Vote, roster: Roster, codes: VoteCodes, uses: CodeUses
) -> tuple[str | None, dict[str, Any] | None]:
    """A one-time code's check: the operator on the roster, not locked out of this question, the
    code theirs for this decision and never used. A wrong one counts against them."""
    operator = vote.operator.strip()
    code = vote.code or ""
    if roster.operator(operator) is None:
        return f"{operator!r} is not an operator on the roster", None
    if uses.failures(ballot.episode, operator) >= MAX_FAILURES:
        return (
            f"{operator!r} offered {MAX_FAILURES} wrong codes on this question and is locked out "
            "of it: sign with a key instead",
            None,
        )
    if not codes.matches(ballot, operator, vote.decision, code):
        left = MAX_FAILURES - uses.fail(ballot.episode, operator)
        return (
            f"{operator!r}: that is not their code for {vote.decision!r} on this question "
            f"({max(left, 0)} more wrong code(s) lock them out of it)",
            None,
        )
    digest = code_digest(code)
    if uses.used(digest):
        return f"{operator!r}: this code was already used", None
    return None, {"operator": operator, "via": "code", "digest": digest, "episode": ballot.episode}


def spend_codes(journal: Journal, proofs: Sequence[dict[str, Any]]) -> None:
    """Consume the one-time codes among a recorded decision's proofs (after it is recorded: a
    crash between leaves a code unconsumed on a question its decision already closed)."""
    for proof in proofs:
        if proof.get("via") == "code":
            journal.code_uses.consume(
                str(proof["episode"]), str(proof["operator"]), str(proof["digest"])
            )


class ProofCheck(BaseModel):
    """What ``recheck`` found: how many recorded proofs verify again, and what does not."""

    checked: int = 0
    #: proofs by one-time code: recorded by digest, they cannot be checked again offline
    by_code: int = 0
    problems: list[str] = Field(default_factory=list)


def ballot_before(roster_id: str, effect_id: str, entries: Sequence[Entry]) -> Ballot | None:
    """The ballot of the AMBIGUOUS episode ``entries`` (an effect's, up to a decision) end in."""
    episode = episode_of(entries)
    if episode is None:
        return None
    view = fold(effect_id, list(entries))
    return Ballot(
        journal=roster_id,
        kind="ambiguous",
        binding=effect_id,
        episode=episode,
        proposed=view.payload_digest,
        approved=view.approved_digest,
        principal=view.principal,
        epoch=(view.policy or {}).get("epoch"),
    )


def recheck(journal: Journal) -> ProofCheck:
    """Check again every proof recorded with a decision against the roster as it stood when
    the decision was recorded, from the journal alone: what ``interlock journal verify`` adds to
    its check of the chains. Resolutions keep theirs in ``RESOLVED``'s ``proofs`` (their ballot
    is built again from the effect's chain); approvals and circuit resets in their policy note,
    beside the ballot they signed (an approval's request and a circuit live in rows, not in a
    chain). It needs no secret (operators' public keys are in the roster's signed entries). One
    read of each decided effect's chain and of the policy's notes."""
    roster_entries = journal.read(ROSTER_CHAIN)
    found = ProofCheck()
    if not roster_entries:
        return found
    roster_id = roster_entries[0].hash

    def check(where: str, ballot: Ballot | None, decided: _Decided, proofs: Any) -> None:
        roster = fold_roster([r for r in roster_entries if r.seq < decided.seq])
        for proof in proofs if isinstance(proofs, list) else []:
            if not isinstance(proof, dict) or proof.get("via") == "code":
                found.by_code += 1
                continue
            found.checked += 1
            problem = _recorded_problem(ballot, roster, decided, proof)
            if problem is not None:
                found.problems.append(f"{where}: {problem}")

    decided_ids = sorted({raw.effect_id for raw in journal.iter_raw() if raw.kind == Kind.RESOLVED})
    for effect_id in decided_ids:
        entries = journal.read(effect_id)
        for i, entry in enumerate(entries):
            if entry.kind is Kind.RESOLVED and entry.data.get("proofs"):
                check(
                    f"effect {effect_id[:16]} seq {entry.seq}",
                    ballot_before(roster_id, effect_id, entries[:i]),
                    _Decided.of(entry, str(entry.data.get("decision"))),
                    entry.data.get("proofs"),
                )
    for entry in journal.policy.events():
        event = entry.data.get("event")
        if event not in _POLICY_DECISIONS or not entry.data.get("proofs"):
            continue
        kind, decision = _POLICY_DECISIONS[str(event)]
        check(
            f"{event} seq {entry.seq}",
            _noted_ballot(roster_id, kind, entry),
            _Decided.of(entry, decision),
            entry.data.get("proofs"),
        )
    return found


#: the policy notes that record a person's decision: their review's kind and the decision
_POLICY_DECISIONS = {
    "approval_granted": ("approval", "approve"),
    "approval_rejected": ("approval", "reject"),
    "circuit_reset": ("circuit", "reset"),
}


@dataclass(frozen=True)
class _Decided:
    """A recorded decision as ``recheck`` reads it: when, what and who."""

    seq: int
    ts: float
    decision: str
    operators: tuple[str, ...]

    @classmethod
    def of(cls, entry: Entry, decision: str) -> _Decided:
        named = entry.data.get("operators") or [entry.data.get("operator")]
        return cls(entry.seq, entry.ts, decision, tuple(str(o) for o in named if o))


def _noted_ballot(roster_id: str, kind: str, entry: Entry) -> Ballot | None:
    """The ballot a policy note's proofs signed, as the note keeps it, if it is this roster's
    ballot for what the note decides (None otherwise: the proofs cannot be checked)."""
    try:
        ballot = Ballot.model_validate(entry.data.get("ballot"))
    except ValueError:
        return None
    subject = entry.data.get("binding") if kind == "approval" else entry.data.get("session")
    if (ballot.journal, ballot.kind, ballot.binding) != (roster_id, kind, subject):
        return None
    return ballot


def _recorded_problem(
    ballot: Ballot | None, roster: Roster, decided: _Decided, proof: dict[str, Any]
) -> str | None:
    if ballot is None:
        return (
            "no ballot for the decision (no AMBIGUOUS entry precedes it: its episode was "
            "archived?, or its note's ballot is not this roster's for what it decides)"
        )
    operator = str(proof.get("operator", ""))
    signer = roster.by_key(str(proof.get("key_id", "")))
    if signer is None:
        return f"{operator!r}: key {proof.get('key_id')} was not on the roster then"
    if not roster.may_sign(signer, operator):
        return f"{operator!r}: {signer.name!r}'s key did not prove {operator!r}'s vote"
    if operator not in decided.operators:
        return f"{operator!r} signed, but the decision does not name them"
    message = statement_of(
        ballot,
        operator=operator,
        decision=decided.decision,
        result=proof.get("result"),
        scope=proof.get("scope"),
        ttl_s=proof.get("ttl_s"),
        key_id=signer.key_id,
        expires=int(proof.get("expires") or 0),
    )
    if not signer.key.verify(message, str(proof.get("signature", ""))):
        return f"{operator!r}: the signature does not verify"
    if proof.get("expires") is None or float(proof["expires"]) < decided.ts:
        return f"{operator!r}: the proof had expired when the decision was recorded"
    return None
