"""``ReviewClient``: what a web backend calls to show people the reviews that wait for them and
to decide one for the person it logged in.

The problem: a web application that lets people approve or resolve from its own pages has two
things to get right that Temporal does not give it. *What waits*: workflow visibility lists every
``EffectReview`` anyone with namespace access started, impostors included, so a page built on it
shows questions no worker asked. *Who decides*: where the journal has an operator roster, a vote
counts only with a proof, and a server that held each operator's private key would be one
breach away from deciding as all of them.

The mechanism: the list is read from the journal (AMBIGUOUS effects and pending approvals, the
only questions a worker opens reviews for), never from visibility. A decision is signed by the
backend's own key, registered on the roster as an **attester** for the operators it
authenticates (``interlock operators add review-app --public-key app.pub --attests-for
carol,dave``), over the ballot built from the journal (``vote_proofs.ballot_of``); it is sent to
the canonical review, after checking that the review running under that id carries the seal of
this journal's keys (``core.review_seal``), through ``send_vote``, the path ``interlock reviews
resolve`` takes too. The worker that records the vote checks everything again (the roster, the
ballot, the signature, the review's seal), so these checks are the client's courtesy of a clear
error; the worker's are what hold. The outcome is read back from the journal, not from what the
review answered.

Cost: ``waiting()``: one index query for AMBIGUOUS effects and one for pending approvals, plus
one read of each waiting effect's chain. ``decide()``: the roster's and the effect's chain reads,
a describe and one history page of the review (its seal), one Update round trip, and one chain
read for the outcome. Journal reads are synchronous (a few milliseconds on SQLite).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from ..core.errors import InterlockError
from ..core.journal import Journal
from ..core.journal.entries import value_of
from ..core.journal.signing import Ed25519Key, parse_key
from ..core.models import Kind
from ..core.operators import roster_of
from ..core.receipts import fold
from ..core.review_rules import DECISIONS, Ballot, ReviewKind, Vote, review_id
from ..core.review_seal import ReviewSeals
from ..core.sealing import Values
from ..core.vote_proofs import ballot_of
from ..notify import DEFAULT_REVIEW_DEADLINE
from .deciding import DEFAULT_TIMEOUT, NotDecided, is_not_found, send_vote
from .desk import start_request

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["Decided", "NotDecided", "ReviewClient", "Waiting"]

NOT_WAITING = "effect_id: nothing about this effect waits for a person"


class Waiting(BaseModel):
    """A question that waits for a person, as the journal records it."""

    #: the effect id (an approval of an ungated call: ``call:<digest>``)
    effect_id: str
    #: ``ambiguous``: did the effect happen? ``approval``: may it be sent?
    kind: Literal["ambiguous", "approval"]
    #: the decisions a person may send for this kind
    decisions: list[str]
    #: the activity that proposed it
    activity: str
    #: who asked (the agent's principal): never the one who decides
    principal: str | None = None
    #: what is proposed, as the review page shows it: the activity's argument (its field names
    #: and values; ``"encrypted"`` where the journal seals values this client cannot open)
    proposed: Any = None
    #: why a person is needed
    reason: str = ""
    opened_at: datetime
    #: when the review escalates (ambiguous) or expires (approval); None: never
    deadline: datetime | None = None


class Decided(BaseModel):
    """What a decision did, read back from the journal. ``state``: ``decided`` (recorded),
    ``open`` (the vote counted; the journal's rules need more people to agree) or ``closed``
    (a late COMMITTED settled the effect first: nothing was recorded)."""

    effect_id: str
    kind: Literal["ambiguous", "approval"]
    state: Literal["decided", "open", "closed"]
    #: the decision the journal records (None unless ``decided``)
    decision: str | None = None
    #: who decided, as the journal records them
    operators: list[str] = Field(default_factory=list)
    reason: str = ""


def _when(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


class ReviewClient:
    """Lists what waits for a person and decides it, for a web backend.

    ``client``: a Temporal client of the namespace the workers run in (with the data converter
    they use). ``journal``: the workers' journal, open, or its URL (opened here, with the key file
    beside it, and closed by ``close()``); its keys check the reviews' seals. ``attester``: the
    name this backend's key is registered under on the roster, attesting for the operators it
    authenticates; ``attester_key``: its Ed25519 private key (``ed25519:<seed hex>`` as
    ``interlock operators keygen`` writes it, or the key). ``review_deadline``: the one the
    workers run with (``InterlockPlugin(review_deadline=...)``), to show each question's
    deadline. ``timeout``: how long a decision waits for its review to answer.
    """

    def __init__(
        self,
        client: Client,
        journal: Journal | str | os.PathLike[str],
        *,
        attester: str,
        attester_key: str | Ed25519Key,
        review_deadline: timedelta | None = DEFAULT_REVIEW_DEADLINE,
        timeout: timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        try:
            key = parse_key(attester_key) if isinstance(attester_key, str) else attester_key
        except InterlockError:
            key = None
        if not isinstance(key, Ed25519Key) or not key.can_sign:
            raise ValueError(
                "attester_key must be the attester's Ed25519 private key (`interlock operators "
                "keygen` writes one as ed25519:<seed hex>)"
            )
        if not attester.strip():
            raise ValueError("attester must name the attester as the roster holds it")
        self._client = client
        self._owns = not isinstance(journal, Journal)
        if isinstance(journal, Journal):
            self._journal = journal
        else:
            from ..core.journal.opening import open_journal

            self._journal = open_journal(journal, create=False)
        self._attester = attester.strip()
        self._key = key
        self._deadline = review_deadline
        self._timeout = timeout
        self._values = Values(self._journal.keyring)
        self._seals = ReviewSeals(self._journal.keyring)

    def close(self) -> None:
        """Close the journal if this client opened it."""
        if self._owns:
            self._journal.close()

    # -- what waits --------------------------------------------------------------------------

    async def waiting(self) -> list[Waiting]:
        """Every question that waits for a person, oldest first: AMBIGUOUS effects and pending
        approvals, from the journal (a review someone started by hand is not among them)."""
        found = [
            await self._ambiguous(row.effect_id)
            for row in self._journal.effects(status=Kind.AMBIGUOUS)
        ]
        for approval in self._journal.policy.approvals(status="pending"):
            found.append(
                Waiting(
                    effect_id=approval.binding,
                    kind="approval",
                    decisions=list(DECISIONS["approval"]),
                    activity=approval.activity,
                    principal=approval.principal,
                    proposed=approval.proposal,
                    reason=approval.reason,
                    opened_at=_when(approval.requested_at),
                    deadline=self._deadline_after(approval.requested_at),
                )
            )
        return sorted(found, key=lambda w: w.opened_at)

    async def _ambiguous(self, effect_id: str) -> Waiting:
        entries = self._journal.read(effect_id)
        view = fold(effect_id, entries)
        opened = next(e.ts for e in reversed(entries) if e.kind is Kind.AMBIGUOUS)
        approved = await self._values.shown(value_of(entries, "approved"))
        if isinstance(approved, list) and len(approved) == 1:
            approved = approved[0]  # one argument: its fields, as the review page shows it
        return Waiting(
            effect_id=effect_id,
            kind="ambiguous",
            decisions=list(DECISIONS["ambiguous"]),
            activity=view.activity or view.effect_type or "",
            principal=view.principal,
            proposed=approved,
            reason=view.reason or "",
            opened_at=_when(opened),
            deadline=self._deadline_after(opened),
        )

    def _deadline_after(self, ts: float) -> datetime | None:
        return None if self._deadline is None else _when(ts) + self._deadline

    # -- deciding ----------------------------------------------------------------------------

    async def decide(
        self,
        effect_id: str,
        *,
        operator: str,
        decision: str,
        note: str = "",
        result: Any = None,
    ) -> Decided:
        """Decide the question waiting on ``effect_id`` as ``operator`` (the person this backend
        authenticated), with this backend's attester proof, and return what the journal then
        records. ``result``: with ``happened``, what the effect returned (checked by the worker
        against the activity's return type).

        Raises ``NotDecided`` with ``code``: ``unknown_effect`` (the journal has no such effect
        or approval), ``not_waiting`` (nothing about it waits for a person), ``invalid_decision``
        (not a decision for its kind), ``no_roster`` (the journal has no operator roster: an
        attester's proof proves nothing there), ``not_attester`` (the roster does not hold this
        attester with this key, or it does not attest for ``operator``), ``not_genuine`` (the
        review running under its id was not opened by this journal's workers), or those of
        ``send_vote`` (``refused``, ``no_review``, ``ended``, ``timeout``). Nothing is recorded
        then."""
        kind = self._kind_of(effect_id)
        if decision not in DECISIONS[kind]:
            raise NotDecided(
                "invalid_decision",
                f"decision: not one for {kind} reviews: send one of {', '.join(DECISIONS[kind])}",
            )
        ballot = self._ballot(kind, effect_id, operator.strip())
        await self._check_genuine(kind, effect_id)
        vote = Vote(decision=decision, operator=operator, note=note, result=result)
        status = await send_vote(
            self._client,
            kind,
            effect_id,
            vote,
            key=self._key,
            ballot=ballot,
            timeout=self._timeout,
        )
        if status.state in ("open", "closed"):
            return Decided(effect_id=effect_id, kind=kind, state=status.state, reason=status.reason)
        return self._recorded(kind, effect_id)

    def _kind_of(self, effect_id: str) -> Literal["ambiguous", "approval"]:
        """What waits on ``effect_id``, by the journal."""
        row = None if effect_id.startswith("call:") else self._journal.row(effect_id)
        if row is not None and row.status is Kind.AMBIGUOUS:
            return "ambiguous"
        approval = self._journal.policy.approval(effect_id)
        if approval is not None and approval.status == "pending":
            return "approval"
        if row is None and approval is None:
            raise NotDecided("unknown_effect", "effect_id: the journal has no such effect")
        raise NotDecided("not_waiting", NOT_WAITING)

    def _ballot(self, kind: ReviewKind, effect_id: str, operator: str) -> Ballot:
        """The ballot the attester signs, from the journal, once the roster shows this
        attester's key attests for ``operator``."""
        roster = roster_of(self._journal)
        if not roster.exists:
            raise NotDecided(
                "no_roster",
                "the journal has no operator roster: an attester's proof proves nothing there "
                "(`interlock operators add` sets one up)",
            )
        signer = roster.by_key(self._key.key_id)
        if signer is None or signer.name != self._attester or not signer.is_attester:
            raise NotDecided(
                "not_attester",
                "attester, attester_key: the roster holds no attester of that name with this key "
                "(`interlock operators add NAME --public-key FILE --attests-for OPERATORS`)",
            )
        if not roster.may_sign(signer, operator):
            raise NotDecided(
                "not_attester", "operator: not one this attester attests for on the roster"
            )
        ballot = ballot_of(self._journal, roster, kind, effect_id)
        if ballot is None:
            raise NotDecided("not_waiting", NOT_WAITING)
        return ballot

    async def _check_genuine(self, kind: ReviewKind, effect_id: str) -> None:
        """Refuse when the review running under the canonical id does not carry this journal's
        seal (someone started it by hand): a vote sent there would not be recorded."""
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError

        workflow_id = review_id(kind, effect_id)
        try:
            described = await self._client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if is_not_found(err):
                return  # send_vote says there is none
            raise
        if described.status is not WorkflowExecutionStatus.RUNNING:
            return  # send_vote says it has ended
        request = await start_request(self._client, workflow_id, described.run_id)
        problem = (
            "its start event could not be read"
            if request is None
            else self._seals.problem(workflow_id, request)
        )
        if problem is not None:
            raise NotDecided(
                "not_genuine",
                f"the review running for this effect was not opened by this journal's workers "
                f"({problem}); the next attempt or `interlock reconcile` replaces it",
            )

    def _recorded(self, kind: ReviewKind, effect_id: str) -> Decided:
        """The decision as the journal records it now."""
        if kind == "approval":
            approval = self._journal.policy.approval(effect_id)
            status = None if approval is None else approval.status
            if approval is None or status == "pending":
                return Decided(effect_id=effect_id, kind="approval", state="open")
            return Decided(
                effect_id=effect_id,
                kind="approval",
                state="decided",
                decision="reject" if status == "rejected" else "approve",
                operators=list(approval.operators),
            )
        entries = self._journal.read(effect_id)
        resolved = next((e for e in reversed(entries) if e.kind is Kind.RESOLVED), None)
        if resolved is None:
            view = fold(effect_id, entries)
            state: Literal["open", "closed"] = "closed" if view.status is Kind.COMMITTED else "open"
            return Decided(effect_id=effect_id, kind="ambiguous", state=state)
        return Decided(
            effect_id=effect_id,
            kind="ambiguous",
            state="decided",
            decision=str(resolved.data.get("decision")),
            operators=[str(o) for o in resolved.data.get("operators") or []],
        )
