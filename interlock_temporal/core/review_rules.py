"""What a person may decide about an effect, and how their votes are counted: the rules the
review workflow's validator, the review desk and the CLI share. Imports no journal, so the review
workflow (which runs in Temporal's sandbox) can use it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .models import Receipt

ReviewKind = Literal["ambiguous", "approval", "circuit"]

DECISIONS: dict[str, tuple[str, ...]] = {
    "ambiguous": ("happened", "not_happened"),
    "approval": ("approve", "reject"),
    "circuit": ("reset",),
}


def review_id(kind: str, effect_id: str) -> str:
    """The review workflow's id: one open review per effect and kind."""
    return f"interlock-review-{kind}-{effect_id}"


class Ballot(BaseModel):
    """What a vote on one review is about, as the journal records it: what a vote's proof
    signs besides the vote itself (``vote_proofs``). ``journal`` is the roster's id (this
    journal's, so a signature counts in no other); ``episode`` names this question (the entry
    that left the effect AMBIGUOUS, the approval request, the circuit's opening), so a vote
    signed for one cannot be replayed onto the next after a reopen. A review shows its ballot
    so that a person's tools can sign it; the worker that records the vote builds it again from
    the journal and checks the signature against that one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    journal: str
    kind: ReviewKind
    binding: str
    episode: str
    proposed: str | None = None
    approved: str | None = None
    principal: str | None = None
    epoch: str | None = None


class VoteProof(BaseModel):
    """An Ed25519 signature, by an operator's key (or an attester's for them), over the
    ballot and the vote (``vote_proofs.statement``), valid until ``expires`` (unix seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: str = Field(max_length=64)
    expires: int = Field(gt=0)
    signature: str = Field(pattern=r"^[0-9a-f]{128}$")


class Vote(BaseModel):
    """A person's vote on a review, as sent from the Web UI, the CLI or code: ``decision`` names
    the decision voted for (one of ``DECISIONS[kind]``). Not the policy's verdict
    (``core.policy.Decision``). Where the journal has an operator roster, a vote counts only
    with a ``proof`` (``interlock reviews resolve --key``) that its operator's key signed it."""

    model_config = ConfigDict(extra="forbid")

    decision: str
    operator: str
    note: str = ""
    #: for ``happened``: what the effect returned, checked against the activity's return type
    result: Any = None
    #: for ``approve``: how long the approval lasts: one use (default), the whole session, or
    #: ``ttl_s`` seconds
    scope: Literal["once", "session"] | None = None
    ttl_s: float | None = Field(default=None, gt=0)
    #: a key's proof (``interlock reviews resolve --key``)
    proof: VoteProof | None = None
    #: or the one-time code sent to the operator's own channel (for the Web UI's forms)
    code: str | None = Field(default=None, max_length=64)


class ReviewRules(BaseModel):
    """Who may decide, and how many must agree."""

    model_config = ConfigDict(frozen=True)

    allowed_operators: list[str] | None = None
    min_approvals: int = Field(default=1, ge=1)
    deadline_s: float | None = Field(default=None, gt=0)


def vote_problem(
    kind: str,
    d: Vote,
    rules: ReviewRules,
    principal: str | None,
    already: Sequence[Vote] = (),
) -> str | None:
    """Why ``d`` may not be counted, or None. The text is what the Web UI displays."""
    valid = DECISIONS.get(kind, ())
    if d.decision not in valid:
        return (
            f"{d.decision!r} is not a decision for {kind} reviews: send one of {', '.join(valid)}"
        )
    operator = d.operator.strip()
    if not operator:
        return "operator must name the person deciding"
    if rules.allowed_operators is not None and operator not in rules.allowed_operators:
        return f"operator {operator!r} is not on this review's list of people who may decide"
    if principal is not None and operator == principal:
        return f"{operator!r} is the agent's own principal: no self-approval"
    if d.result is not None and d.decision != "happened":
        return "a result can be attested only with the decision happened"
    if d.code is not None and d.result is not None:
        return (
            "a one-time code cannot attest a result (it was issued before any result existed): "
            "sign the vote with a key (`interlock reviews resolve --key`)"
        )
    if d.code is not None and d.proof is not None:
        return "a vote carries one proof: a key's signature or a one-time code, not both"
    if (d.scope is not None or d.ttl_s is not None) and d.decision != "approve":
        return "scope and ttl_s belong to an approve decision only"
    if d.scope == "session" and d.ttl_s is not None:
        return "an approval lasts for the session or for ttl_s seconds, not both"
    if any(v.operator.strip() == operator for v in already):
        return f"operator {operator!r} has already decided this review"
    return None


def tally(votes: Sequence[Vote], min_approvals: int) -> tuple[str, list[str]] | None:
    """The first decision that enough distinct people agree on: (decision, operators)."""
    by_decision: dict[str, list[str]] = {}
    for v in votes:
        names = by_decision.setdefault(v.decision, [])
        if v.operator.strip() not in names:
            names.append(v.operator.strip())
        if len(names) >= min_approvals:
            return v.decision, names
    return None


class Reached(BaseModel):
    """What the votes decided: the decision enough distinct operators agree on, who they are,
    their notes, the result the last of them attested, and an approval's extent (from the last
    of them that gave one)."""

    decision: str
    operators: list[str]
    note: str = ""
    result: Any = None
    scope: Literal["once", "session"] | None = None
    ttl_s: float | None = None
    #: the deciding votes' proofs as checked where they were recorded (``vote_proofs``)
    proofs: list[dict[str, Any]] = Field(default_factory=list)
    #: the ballot those proofs signed (JSON data; None without proofs), recorded beside them
    ballot: dict[str, Any] | None = None


def reached(votes: Sequence[Vote], min_approvals: int) -> Reached | None:
    """The decision ``votes`` reach (``tally``), with what the deciding votes carry; None: no
    decision yet. The review workflow and the activity that records it count alike."""
    counted = tally(votes, min_approvals)
    if counted is None:
        return None
    decision, operators = counted
    deciding = [v for v in votes if v.decision == decision]
    extent = [v for v in deciding if v.scope is not None or v.ttl_s is not None]
    return Reached(
        decision=decision,
        operators=operators,
        note="; ".join(f"{v.operator.strip()}: {v.note}" for v in deciding if v.note),
        result=next((v.result for v in reversed(deciding) if v.result is not None), None),
        scope=extent[-1].scope if extent else None,
        ttl_s=extent[-1].ttl_s if extent else None,
    )


class Recorded(BaseModel):
    """The journal's answer to a decision that the votes reached."""

    recorded: bool
    state: Literal["resolved", "closed", "reopened"]
    reason: str = ""
    #: the effect's receipt (None for an approval: nothing has been proposed yet)
    receipt: Receipt | None = None
    #: for each vote's operator whose signal or Update the recording worker found in the
    #: review's history: the client identity Temporal recorded for it ("" when the client set
    #: none). Evidence, never proof: a client sets it (None: a worker from before, or nothing
    #: read)
    sent_by: dict[str, str] | None = None


#: what a client identity Temporal recorded is worth, in the words people read beside it
SENT_BY_CAVEAT = (
    "Temporal recorded this client identity; a client sets it, so it is evidence, not proof"
)


def sent_by_text(identity: str) -> str:
    """The client identity Temporal recorded for a vote, in words: ``sent by <identity>``."""
    return f"sent by {identity}" if identity else "sent by a client that gave no identity"
