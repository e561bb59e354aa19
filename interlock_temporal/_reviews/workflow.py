"""The ``EffectReview`` workflow a person resolves from the Web UI (or the CLI), and the models
it exchanges with workers and waiting workflows. Sandbox-safe: it imports no journal, no
storage and no protocol, only what workflow code may import; the worker's side (opening
reviews, recording decisions) is the review desk, ``_reviews.desk``."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from temporalio import workflow
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from .._worker.errors import describe_invalid
from ..core.models import Receipt
from ..core.review_rules import (
    SENT_BY_CAVEAT,
    Ballot,
    Recorded,
    ReviewKind,
    ReviewRules,
    Vote,
    reached,
    sent_by_text,
    vote_problem,
)

RESOLUTION_SIGNAL = "interlock.resolution"
RECORD_ACTIVITY = "interlock.record_decision"
#: the worker's activity that reads from the journal whether an effect is COMMITTED
COMMITTED_ACTIVITY = "interlock.committed"
NOTIFY_ACTIVITY = "interlock.notify"
CHECK_ACTIVITY = "interlock.check_review"
#: guards what reviews do since requests are sealed: a review first asks a worker whether its
#: request carries the seal of the journal's keys (``core.review_seal``), and one that does not
#: ends at once, telling its waiters only to look again; the record activity is sent every vote.
#: Reviews started before replay as they ran.
SEAL_PATCH = "interlock-review-sealed"
#: guards what reviews do since notifications: tell people (opened, reminder, expired,
#: escalated, resolved), remind, and escalate an AMBIGUOUS review at its deadline instead of
#: expiring it. Reviews started before replay as they ran.
NOTIFY_PATCH = "interlock-review-notify"
ESCALATED = (
    "escalated: no decision before the review's deadline; it stays open, because nobody may "
    "guess whether the effect happened"
)
#: guards what a review believes since the journal decides it: the ``settled`` signal only wakes
#: the review, which asks the journal (``COMMITTED_ACTIVITY``) and closes only on a COMMITTED
#: the journal records, handing on the journal's receipt and result. Reviews that were open
#: before close on the signal's word, as they did
SETTLED_PATCH = "interlock-review-settled-reads-journal"
NOT_COMMITTED = (
    "a `settled` signal arrived, but the journal records no COMMITTED for this effect: the "
    "review stays open"
)
#: why a review closed without a person, shown to people as released (CLI, Web UI, the review's
#: details)
LATE_COMMIT_REASON = "a late COMMITTED from the attempt in doubt settled it"
#: a timer that fired is due even if the workflow's clock reads a hair before it
_DUE_SLACK = timedelta(milliseconds=50)

ReviewState = Literal["open", "recording", "resolved", "closed", "expired"]


class ReviewRequest(BaseModel):
    kind: ReviewKind
    effect_id: str
    activity: str
    principal: str | None = None
    rules: ReviewRules = Field(default_factory=ReviewRules)
    #: the explanation shown in the Web UI (markdown), prepared from the journal by the worker
    details: str = ""
    #: the notifiers (by name) each event is sent to, from the worker's ``notify`` activity
    notifiers: list[str] = Field(default_factory=list)
    #: send a ``reminder`` this often while the review is open (None: never)
    reminder_s: float | None = Field(default=None, gt=0)
    #: what a vote's proof signs besides the vote (``core.vote_proofs``), where the journal has
    #: an operator roster: shown in the status, for a person's tools to sign
    ballot: Ballot | None = None
    #: the journal that holds what the review is about (``core.journal_identity``): ``reviews
    #: list`` shows a journal's own reviews. None in a review opened before journals had ids
    #: (its request has no such field, and its seal was made without one)
    journal_id: str | None = None
    #: the opening worker's seal over everything above and the review's workflow id
    #: (``core.review_seal``): a request without a valid one is not a genuine review's
    seal: str | None = None


class Subscriber(BaseModel):
    """A workflow waiting on the review's outcome."""

    workflow_id: str


class Resolution(BaseModel):
    """What a waiting workflow is told when the review ends."""

    effect_id: str
    kind: ReviewKind
    state: ReviewState
    decision: str | None = None
    operators: list[str] = Field(default_factory=list)
    note: str = ""
    result: Any = None
    receipt: Receipt | None = None


class ReviewStatus(BaseModel):
    kind: ReviewKind
    effect_id: str
    state: ReviewState
    decision: str | None = None
    operators: list[str] = Field(default_factory=list)
    votes: list[dict[str, str]] = Field(default_factory=list)
    reported: list[str] = Field(default_factory=list)
    subscribers: int = 0
    reason: str = ""
    receipt: Receipt | None = None
    #: an AMBIGUOUS review past its deadline: people were told again; it stays open
    escalated: bool = False
    #: the review's deadline (unix seconds), if it has one
    deadline_at: float | None = None
    #: what a vote's proof signs besides the vote (None: the journal has no operator roster,
    #: and votes need no proof)
    ballot: Ballot | None = None
    #: the journal that holds what the review is about (None: a review opened before journals
    #: had ids)
    journal_id: str | None = None


class NotifyEvent(BaseModel):
    """What the notify activity is asked to send to one notifier: the review as it stands
    after the event (the worker adds what the journal knows)."""

    notifier: str = ""
    event: Literal["opened", "reminder", "expired", "escalated", "resolved"]
    review_id: str
    kind: ReviewKind
    effect_id: str
    activity: str
    principal: str | None = None
    state: str
    reason: str = ""
    decision: str | None = None
    operators: list[str] = Field(default_factory=list)
    opened_at: float
    deadline_at: float | None = None
    at: float


class LateCommit(BaseModel):
    """A late COMMITTED from the attempt that was in doubt: what it recorded. The ``settled``
    signal carries one (from the review desk), and the review's journal check returns one (the
    receipt and result the journal records). Since ``SETTLED_PATCH`` only the journal's closes
    the review: the signal's is a wake-up, whoever sent it."""

    receipt: Receipt
    result: Any = None


class ReviewCheck(BaseModel):
    """A worker's answer to a review asking whether it is genuine: its request carries the
    seal of the journal's keys, for its own workflow id."""

    genuine: bool
    reason: str = ""


class Arrival(BaseModel):
    """How a vote reached the review, as the review saw it: the ordinal (from 1) of its
    ``resolve`` signal among the ``resolve`` signals this run's handler received (signals are
    delivered in history order), or the id of its ``decide`` Update. Set by the review, never
    taken from what was sent; the recording worker finds the history event it names and reads
    the identity Temporal recorded there."""

    signal: int | None = Field(default=None, ge=1)
    update: str | None = None


class DecisionRecord(BaseModel):
    """What the record activity is asked to journal: the decision the votes reached, who
    reached it, and (since ``SEAL_PATCH``) every vote, which the activity counts again under
    the worker's own rules; the aggregate alone decides nothing."""

    kind: ReviewKind
    effect_id: str
    decision: str
    operators: list[str]
    note: str = ""
    result: Any = None
    #: an approval's extent (see ``Vote``)
    scope: Literal["once", "session"] | None = None
    ttl_s: float | None = None
    #: every vote the review counted, in order (None: a review from before ``SEAL_PATCH``)
    votes: list[Vote] | None = None
    #: how each of ``votes`` reached the review, in the same order (None: a review from before
    #: arrivals were kept). The recording worker reads from the review's history the client
    #: identity Temporal recorded for each (``Recorded.sent_by``). Beside the votes rather than
    #: in them: ``Vote`` forbids unknown fields, so a worker from before would refuse to decode
    #: a vote carrying one, while it ignores a field here
    arrivals: list[Arrival | None] | None = None


def _refusal(message: str) -> FailureError:
    """A refused decision, shown to the person as its message alone: a failure built whole, so
    no worker stack trace (file paths and all) lands in the Web UI's dialog."""
    return FailureError(
        message,
        failure=Failure(
            message=message,
            application_failure_info=ApplicationFailureInfo(
                type="InvalidDecision", non_retryable=True
            ),
        ),
    )


def _parse(value: Any) -> tuple[Vote | None, str | None]:
    try:
        return Vote.model_validate(value), None
    except ValidationError as err:
        return None, "the decision must be JSON like " + (
            '{"decision": "...", "operator": "...", "note": "..."}: '
            + describe_invalid(err, "decision").removeprefix("decision.")
        )


@workflow.defn(name="EffectReview")
class EffectReview:
    """One open question about one effect, answered by people.

    Signal ``resolve`` or Update ``decide`` with ``{"decision", "operator", "note"}``; query
    ``status``. The Web UI shows the review's explanation in its current details.
    """

    @workflow.init
    def __init__(self, req: ReviewRequest) -> None:
        self._req = req
        self._votes: list[Vote] = []
        #: how each of ``_votes`` arrived, in the same order
        self._arrivals: list[Arrival] = []
        #: ``resolve`` signals received so far (each counts, whether its vote counts or not)
        self._signals = 0
        #: for each operator whose vote a worker recorded: the client identity Temporal
        #: recorded for the signal or Update that carried it (evidence, never proof)
        self._sent_by: dict[str, str] = {}
        self._reported: list[str] = []
        self._subscribers: list[str] = []
        self._state: ReviewState = "open"
        self._pending: tuple[str, list[str], str, Any] | None = None
        self._closed_by: LateCommit | None = None
        self._outcome: Resolution | None = None
        self._receipt: Receipt | None = None
        self._reason = ""
        #: decisions whose recording ended (recorded, refused, or overtaken by a late COMMITTED)
        self._recordings = 0
        self._last_error: str | None = None
        self._decided: tuple[str, list[str], str, Any] | None = None
        #: an approval's extent, from the votes that approved
        self._extent: tuple[Literal["once", "session"] | None, float | None] = (None, None)
        #: since NOTIFY_PATCH: people are told, reminded, and an AMBIGUOUS review escalates
        self._telling = False
        self._escalated = False
        self._opened_at = 0.0
        self._deadline_at: float | None = None
        #: each notifier's deliveries, in order (the last one's task)
        self._deliveries: dict[str, asyncio.Task[None]] = {}
        #: since SEAL_PATCH: the request is checked first, and every vote goes to the record
        self._sealed = False
        #: a worker found the request not sealed: nothing here is recorded
        self._forged = False

    @workflow.run
    async def run(self, req: ReviewRequest) -> ReviewStatus:
        self._sealed = workflow.patched(SEAL_PATCH)
        # a review that is not genuine ends at once: nothing a person sends here is recorded
        genuine = not self._sealed or await self._genuine()
        if genuine and workflow.patched(NOTIFY_PATCH):
            await self._wait_telling(req)
        elif genuine:
            await self._wait(req)
        self._outcome = self._resolution()
        self._show()
        for subscriber in list(self._subscribers):
            await self._notify(subscriber)
        if self._telling:
            self._tell("expired" if self._state == "expired" else "resolved")
            # the review ends once every notification went (or its retries ran out)
            await asyncio.gather(*self._deliveries.values())
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _wait(self, req: ReviewRequest) -> None:
        """Until decided, closed or past the deadline: as reviews ran before NOTIFY_PATCH."""
        deadline = (
            workflow.now() + timedelta(seconds=req.rules.deadline_s)
            if req.rules.deadline_s
            else None
        )
        self._show()
        while self._state == "open":
            timeout = None
            if deadline is not None:
                timeout = max(0.0, (deadline - workflow.now()).total_seconds())
            try:
                await workflow.wait_condition(
                    lambda: self._pending is not None or self._closed_by is not None,
                    timeout=timeout,
                )
            except TimeoutError:
                self._state = "expired"
                self._reason = "no decision before the review's deadline"
                break
            if self._closed_by is not None:
                if await self._settled():
                    break
                continue
            await self._record()

    async def _wait_telling(self, req: ReviewRequest) -> None:
        """Until decided or closed, telling people: opened, a reminder every ``reminder_s``,
        and at the deadline an approval (or circuit) review expires while an AMBIGUOUS one
        escalates and stays open."""
        self._telling = True
        start = workflow.now()
        self._opened_at = start.timestamp()
        deadline = start + timedelta(seconds=req.rules.deadline_s) if req.rules.deadline_s else None
        self._deadline_at = deadline.timestamp() if deadline else None
        every = timedelta(seconds=req.reminder_s) if req.reminder_s else None
        reminder = start + every if every else None
        self._show()
        self._tell("opened")
        while self._state == "open":
            due = [t for t in (None if self._escalated else deadline, reminder) if t]
            timeout = None
            if due:
                timeout = max(0.001, (min(due) - workflow.now()).total_seconds())
            try:
                await workflow.wait_condition(
                    lambda: self._pending is not None or self._closed_by is not None,
                    timeout=timeout,
                )
            except TimeoutError:
                now = workflow.now() + _DUE_SLACK
                if deadline is not None and not self._escalated and now >= deadline:
                    if req.kind != "ambiguous":
                        self._state = "expired"
                        self._reason = "no decision before the review's deadline"
                        break
                    self._escalated, self._reason = True, ESCALATED
                    self._show()
                    self._tell("escalated")
                elif reminder is not None and now >= reminder:
                    self._tell("reminder")
                reminder = _next(reminder, every, now)
                continue
            if self._closed_by is not None:
                if await self._settled():
                    break
                continue
            await self._record()

    async def _genuine(self) -> bool:
        """Whether a worker finds this review's request sealed for its workflow id. One that is
        not ends closed, says why, and only wakes its waiters (their next attempt opens the
        genuine review); a vote waiting on a recording is refused."""
        check: ReviewCheck = await workflow.execute_activity(
            CHECK_ACTIVITY,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            result_type=ReviewCheck,
        )
        if check.genuine:
            return True
        self._state, self._forged = "closed", True
        self._reason = f"not a genuine review, nothing sent here is recorded: {check.reason}"
        self._last_error, self._pending = self._reason, None
        self._recordings += 1
        workflow.logger.warning("review %s: %s", workflow.info().workflow_id, self._reason)
        return False

    async def _settled(self) -> bool:
        """A ``settled`` signal arrived: whether the review closes. Since ``SETTLED_PATCH`` the
        signal is only a wake-up (anyone with namespace access can send it): the review asks the
        journal through the worker's ``COMMITTED_ACTIVITY`` and closes only if the journal
        records COMMITTED, with the journal's receipt and result; otherwise it stays open and
        says so. Costs one activity per ``settled`` signal. Reviews open before the patch close
        on the signal's word."""
        if not workflow.patched(SETTLED_PATCH):
            assert self._closed_by is not None
            self._finish_by_late_commit(self._closed_by)
            return True
        self._closed_by = None
        try:
            found: LateCommit | None = await workflow.execute_activity(
                COMMITTED_ACTIVITY,
                self._req.effect_id,
                result_type=LateCommit,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
        except ActivityError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(err)
            self._report(f"a `settled` signal could not be checked against the journal: {message}")
            return False
        if found is None:
            self._report(NOT_COMMITTED)
            return False
        self._closed_by = found
        self._finish_by_late_commit(found)
        if self._pending is not None:
            # a decision collected while the journal was read: overtaken by the COMMITTED, so
            # not recorded; the Update waiting on it returns the closed review
            self._pending = None
            self._recordings += 1
        return True

    def _finish_by_late_commit(self, commit: LateCommit) -> None:
        """The attempt in doubt committed after all: the review closes without a person."""
        self._state, self._receipt = "closed", commit.receipt
        self._reason = LATE_COMMIT_REASON

    async def _record(self) -> None:
        assert self._pending is not None
        decision, operators, note, result = self._pending
        self._pending = None
        self._state = "recording"
        self._show()
        try:
            recorded: Recorded = await workflow.execute_activity(
                RECORD_ACTIVITY,
                DecisionRecord(
                    kind=self._req.kind,
                    effect_id=self._req.effect_id,
                    decision=decision,
                    operators=operators,
                    note=note,
                    result=result,
                    scope=self._extent[0],
                    ttl_s=self._extent[1],
                    votes=list(self._votes) if self._sealed else None,
                    arrivals=list(self._arrivals) if self._sealed else None,
                ),
                result_type=Recorded,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
        except ActivityError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(err)
            self._last_error = message
            # the worker's refusals already say so ("not recorded: ...")
            said = message if message.startswith("not recorded") else f"not recorded: {message}"
            self._report(said)
            kept = [i for i, v in enumerate(self._votes) if v.decision != decision]
            self._votes = [self._votes[i] for i in kept]
            self._arrivals = [self._arrivals[i] for i in kept]
            self._state = "open"
        else:
            self._last_error = None
            self._sent_by.update(recorded.sent_by or {})
            self._receipt = recorded.receipt
            self._reason = recorded.reason
            self._state = "closed" if recorded.state == "closed" else "resolved"
            self._decided = (decision, operators, note, result)
        self._recordings += 1
        self._show()

    # -- what people send ------------------------------------------------------------------

    def _problem(self, d: Vote) -> str | None:
        if self._pending is not None:
            decision, operators, _, _ = self._pending
            return f"this review is already decided: {decision} by {', '.join(operators)}"
        if self._state != "open":
            return f"this review is already {self._state}" + (
                f": {self._outcome.decision} by {', '.join(self._outcome.operators)}"
                if self._outcome and self._outcome.decision
                else ""
            )
        return vote_problem(self._req.kind, d, self._req.rules, self._req.principal, self._votes)

    def _vote(self, d: Vote, arrival: Arrival) -> None:
        self._votes.append(d)
        self._arrivals.append(arrival)
        decided = reached(self._votes, self._req.rules.min_approvals)
        if decided is not None and self._pending is None:
            self._pending = (decided.decision, decided.operators, decided.note, decided.result)
            if decided.scope is not None or decided.ttl_s is not None:
                self._extent = (decided.scope, decided.ttl_s)
        self._show()

    @workflow.signal(
        name="resolve",
        description='Decide this review. Send {"decision": "happened" | "not_happened" (or '
        '"approve" | "reject" for an approval), "operator": "your name", "note": "why"}; where '
        'the journal has an operator roster, add "code": the one-time code sent to you.',
    )
    def resolve(self, payload: Any) -> None:
        # counted first, whatever it carries: the recording worker finds this signal's event
        # in the history by this ordinal
        self._signals += 1
        arrival = Arrival(signal=self._signals)
        d, problem = _parse(payload)
        if d is not None:
            problem = self._problem(d)
        if problem is not None:
            who = d.operator if d else "?"
            self._report(f"signal from {who!r} ignored: {problem}")
            workflow.logger.warning("review %s: %s", self._req.effect_id[:16], problem)
            return
        assert d is not None
        self._vote(d, arrival)

    @workflow.update(
        name="decide",
        description='Decide this review and see the outcome: {"decision": ..., "operator": ..., '
        '"note": ...}. Refused with a reason if the decision is not valid.',
    )
    async def decide(self, payload: Any) -> ReviewStatus:
        d, _ = _parse(payload)
        assert d is not None  # the validator parsed it
        seen = self._recordings
        update = workflow.current_update_info()
        self._vote(d, Arrival(update=update.id if update else None))
        if self._pending is not None or self._state == "recording":
            await workflow.wait_condition(lambda: self._recordings > seen)
            if self._state == "open" and self._last_error:
                raise _refusal(self._last_error)
        return self.status()

    @decide.validator
    def _validate_decide(self, payload: Any) -> None:
        d, problem = _parse(payload)
        if d is not None:
            problem = self._problem(d)
        if problem is not None:
            raise _refusal(problem)

    @workflow.signal(name="subscribe", description="Internal: a workflow waiting on this review.")
    async def subscribe(self, subscriber: Subscriber) -> None:
        if subscriber.workflow_id in self._subscribers:
            return
        self._subscribers.append(subscriber.workflow_id)
        if self._outcome is not None:  # it ended already: tell the newcomer at once
            await self._notify(subscriber.workflow_id)
        self._show()

    # the signal's name and description are fixed: a review started by an earlier release
    # still receives it under them
    @workflow.signal(
        name="settled", description="Internal: a late COMMITTED from the attempt settled it."
    )
    def late_commit(self, commit: LateCommit) -> None:
        """The attempt in doubt committed late (the review desk tells it): an open review asks
        the journal at its next turn, and closes if the journal records COMMITTED (before
        ``SETTLED_PATCH``: closes on the signal's word)."""
        if self._state == "open":
            self._closed_by = commit

    @workflow.query(name="status", description="The review's state, votes and outcome.")
    def status(self) -> ReviewStatus:
        outcome = self._outcome
        return ReviewStatus(
            kind=self._req.kind,
            effect_id=self._req.effect_id,
            state=self._state,
            decision=outcome.decision if outcome else None,
            operators=outcome.operators if outcome else [],
            votes=[self._vote_shown(v) for v in self._votes],
            reported=list(self._reported),
            subscribers=len(self._subscribers),
            reason=self._reason,
            receipt=self._receipt,
            escalated=self._escalated,
            deadline_at=self._deadline_at,
            ballot=self._req.ballot,
            journal_id=self._req.journal_id,
        )

    def _vote_shown(self, v: Vote) -> dict[str, str]:
        """A vote as the status shows it; with ``sent_by`` once a worker recorded it and found
        the identity Temporal recorded for its signal or Update."""
        shown = {"decision": v.decision, "operator": v.operator, "note": v.note}
        sent_by = self._sent_by.get(v.operator.strip())
        if sent_by is not None:
            shown["sent_by"] = sent_by
        return shown

    # -- telling people and workflows ------------------------------------------------------------

    def _resolution(self) -> Resolution:
        decided = self._decided
        if self._forged:  # a wake-up only: nothing was decided here
            return Resolution(
                effect_id=self._req.effect_id,
                kind=self._req.kind,
                state="closed",
                note=self._reason,
            )
        if self._state == "closed" and decided is None:
            return Resolution(
                effect_id=self._req.effect_id,
                kind=self._req.kind,
                state="closed",
                decision="happened",
                operators=["late-commit"],
                receipt=self._receipt,
                result=self._closed_by.result if self._closed_by else None,
            )
        if decided is None:
            return Resolution(effect_id=self._req.effect_id, kind=self._req.kind, state=self._state)
        decision, operators, note, result = decided
        return Resolution(
            effect_id=self._req.effect_id,
            kind=self._req.kind,
            state=self._state,
            decision="happened" if self._state == "closed" else decision,
            operators=operators,
            note=note,
            result=result,
            receipt=self._receipt,
        )

    async def _notify(self, workflow_id: str) -> None:
        assert self._outcome is not None
        try:
            await workflow.get_external_workflow_handle(workflow_id).signal(
                RESOLUTION_SIGNAL, self._outcome
            )
        except Exception as err:  # the waiter may be gone; that must not stop the others
            self._report(f"could not tell workflow {workflow_id}: {type(err).__name__}")

    def _tell(self, event: str) -> None:
        """Send ``event`` to every notifier, each in order after its previous one, without
        waiting: the review goes on while a receiver is down and Temporal retries."""
        if not self._req.notifiers:
            return
        outcome = self._outcome
        told = NotifyEvent.model_validate(
            {
                "event": event,
                "review_id": workflow.info().workflow_id,
                "kind": self._req.kind,
                "effect_id": self._req.effect_id,
                "activity": self._req.activity,
                "principal": self._req.principal,
                "state": "escalated" if self._escalated and self._state == "open" else self._state,
                "reason": self._reason,
                "decision": outcome.decision if outcome else None,
                "operators": outcome.operators if outcome else [],
                "opened_at": self._opened_at,
                "deadline_at": self._deadline_at,
                "at": workflow.now().timestamp(),
            }
        )
        for name in self._req.notifiers:
            after = self._deliveries.get(name)
            one = told.model_copy(update={"notifier": name})
            self._deliveries[name] = asyncio.create_task(self._deliver(one, after))

    async def _deliver(self, told: NotifyEvent, after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await after
        try:
            await workflow.execute_activity(
                NOTIFY_ACTIVITY,
                told,
                start_to_close_timeout=timedelta(seconds=60),
                schedule_to_close_timeout=timedelta(days=3),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(minutes=5),
                ),
            )
        except ActivityError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(err)
            self._report(f"{told.notifier} was not told of {told.event}: {message}")

    def _report(self, text: str) -> None:
        self._reported.append(text)
        del self._reported[:-20]
        self._show()

    def _show(self) -> None:
        state = self._state + (" (escalated)" if self._escalated else "")
        lines = [self._req.details, "", "---", "", f"**Review state: {state}**", ""]
        if self._outcome and self._outcome.decision:
            lines.append(
                f"- decided: `{self._outcome.decision}` by {', '.join(self._outcome.operators)}"
            )
        if self._reason:
            lines.append(f"- {self._reason}")
        for v in self._votes:
            sent_by = self._sent_by.get(v.operator.strip())
            lines.append(
                f"- vote: `{v.decision}` by {v.operator}"
                + ("" if sent_by is None else f" ({sent_by_text(sent_by)})")
                + (f" — {v.note}" if v.note else "")
            )
        if self._sent_by:
            lines.append(f"- {SENT_BY_CAVEAT}")
        for text in self._reported[-5:]:
            lines.append(f"- {text}")
        lines.append(f"- workflows waiting: {len(self._subscribers)}")
        workflow.set_current_details("\n".join(lines))


def _next(at: datetime | None, every: timedelta | None, now: datetime) -> datetime | None:
    """The first reminder time after ``now``."""
    if at is None or every is None:
        return None
    while at <= now:
        at += every
    return at
