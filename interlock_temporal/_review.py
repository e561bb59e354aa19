"""People in the loop, inside Temporal: the ``EffectReview`` workflow a person resolves from the
Web UI (or the CLI), the activities that record what they decide, and the reconciler that finds
effects left in doubt so none stays unseen."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, ValidationError
from temporalio import activity, workflow
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import RetryPolicy, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.service import RPCError, RPCStatusCode

from ._errors import JournalCorruptError
from ._gated import GateSpec, describe_invalid
from .core.errors import InFlight, InterlockError, JournalCorrupt
from .core.models import Kind, Receipt
from .core.policy import redact
from .core.protocol import Gate, OwnerEnded
from .core.receipts import EffectView, fold, receipt_of
from .core.review import (
    Decision,
    Recorded,
    ReviewError,
    ReviewKind,
    ReviewRules,
    approval_markdown,
    circuit_markdown,
    decision_problem,
    record_approval,
    record_circuit_reset,
    record_resolution,
    review_id,
    review_markdown,
    tally,
)

if TYPE_CHECKING:
    import temporalio.client

log = logging.getLogger("interlock_temporal.review")

RESOLUTION_SIGNAL = "interlock.resolution"
RECORD_ACTIVITY = "interlock.record_decision"
RECONCILE_ACTIVITY = "interlock.reconcile"

ReviewState = Literal["open", "recording", "resolved", "closed", "expired"]


class ReviewRequest(BaseModel):
    kind: ReviewKind
    effect_id: str
    activity: str
    principal: str | None = None
    rules: ReviewRules = Field(default_factory=ReviewRules)
    #: the explanation shown in the Web UI (markdown), prepared from the journal by the worker
    details: str = ""


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


class Settlement(BaseModel):
    """A late COMMITTED from the attempt that was in doubt: what it recorded."""

    receipt: Receipt
    result: Any = None


class DecisionRecord(BaseModel):
    kind: ReviewKind
    effect_id: str
    decision: str
    operators: list[str]
    note: str = ""
    result: Any = None
    #: an approval's extent (see ``Decision``)
    scope: Literal["once", "session"] | None = None
    ttl_s: float | None = None


_TITLES = {
    "ambiguous": "Effect in doubt",
    "approval": "Approval needed",
    "circuit": "Circuit open",
}


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


def _parse(value: Any) -> tuple[Decision | None, str | None]:
    try:
        return Decision.model_validate(value), None
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
        self._votes: list[Decision] = []
        self._reported: list[str] = []
        self._subscribers: list[str] = []
        self._state: ReviewState = "open"
        self._pending: tuple[str, list[str], str, Any] | None = None
        self._settled_by: Settlement | None = None
        self._outcome: Resolution | None = None
        self._receipt: Receipt | None = None
        self._reason = ""
        self._recordings = 0
        self._last_error: str | None = None
        self._decided: tuple[str, list[str], str, Any] | None = None
        #: an approval's extent, from the votes that approved
        self._extent: tuple[Literal["once", "session"] | None, float | None] = (None, None)

    @workflow.run
    async def run(self, req: ReviewRequest) -> ReviewStatus:
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
                    lambda: self._pending is not None or self._settled_by is not None,
                    timeout=timeout,
                )
            except TimeoutError:
                self._state = "expired"
                self._reason = "no decision before the review's deadline"
                break
            if self._settled_by is not None:
                self._state, self._receipt = "closed", self._settled_by.receipt
                self._reason = "a late COMMITTED from the attempt in doubt settled it"
                break
            await self._record()
        self._outcome = self._resolution()
        self._show()
        for subscriber in list(self._subscribers):
            await self._notify(subscriber)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

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
                ),
                result_type=Recorded,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
        except ActivityError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(err)
            self._last_error = message
            self._report(f"not recorded: {message}")
            self._votes = [v for v in self._votes if v.decision != decision]
            self._state = "open"
        else:
            self._last_error = None
            self._receipt = recorded.receipt
            self._reason = recorded.reason
            self._state = "closed" if recorded.state == "closed" else "resolved"
            self._decided = (decision, operators, note, result)
        self._recordings += 1
        self._show()

    # -- what people send ------------------------------------------------------------------

    def _problem(self, d: Decision) -> str | None:
        if self._pending is not None:
            decision, operators, _, _ = self._pending
            return f"this review is already decided: {decision} by {', '.join(operators)}"
        if self._state != "open":
            return f"this review is already {self._state}" + (
                f": {self._outcome.decision} by {', '.join(self._outcome.operators)}"
                if self._outcome and self._outcome.decision
                else ""
            )
        return decision_problem(
            self._req.kind, d, self._req.rules, self._req.principal, self._votes
        )

    def _vote(self, d: Decision) -> None:
        self._votes.append(d)
        counted = tally(self._votes, self._req.rules.min_approvals)
        if counted is not None and self._pending is None:
            decision, operators = counted
            deciding = [v for v in self._votes if v.decision == decision]
            result = next((v.result for v in reversed(deciding) if v.result is not None), None)
            note = "; ".join(f"{v.operator.strip()}: {v.note}" for v in deciding if v.note)
            self._pending = (decision, operators, note, result)
            extent = [v for v in deciding if v.scope is not None or v.ttl_s is not None]
            if extent:
                self._extent = (extent[-1].scope, extent[-1].ttl_s)
        self._show()

    @workflow.signal(
        name="resolve",
        description='Decide this review. Send {"decision": "happened" | "not_happened" (or '
        '"approve" | "reject" for an approval), "operator": "your name", "note": "why"}.',
    )
    def resolve(self, payload: Any) -> None:
        d, problem = _parse(payload)
        if d is not None:
            problem = self._problem(d)
        if problem is not None:
            who = d.operator if d else "?"
            self._report(f"signal from {who!r} ignored: {problem}")
            workflow.logger.warning("review %s: %s", self._req.effect_id[:16], problem)
            return
        assert d is not None
        self._vote(d)

    @workflow.update(
        name="decide",
        description='Decide this review and see the outcome: {"decision": ..., "operator": ..., '
        '"note": ...}. Refused with a reason if the decision is not valid.',
    )
    async def decide(self, payload: Any) -> ReviewStatus:
        d, _ = _parse(payload)
        assert d is not None  # the validator parsed it
        seen = self._recordings
        self._vote(d)
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

    @workflow.signal(
        name="settled", description="Internal: a late COMMITTED from the attempt settled it."
    )
    def settled(self, settlement: Settlement) -> None:
        if self._state == "open":
            self._settled_by = settlement

    @workflow.query(name="status", description="The review's state, votes and outcome.")
    def status(self) -> ReviewStatus:
        outcome = self._outcome
        return ReviewStatus(
            kind=self._req.kind,
            effect_id=self._req.effect_id,
            state=self._state,
            decision=outcome.decision if outcome else None,
            operators=outcome.operators if outcome else [],
            votes=[
                {"decision": v.decision, "operator": v.operator, "note": v.note}
                for v in self._votes
            ],
            reported=list(self._reported),
            subscribers=len(self._subscribers),
            reason=self._reason,
            receipt=self._receipt,
        )

    # -- telling people and workflows ------------------------------------------------------------

    def _resolution(self) -> Resolution:
        decided = self._decided
        if self._state == "closed" and decided is None:
            return Resolution(
                effect_id=self._req.effect_id,
                kind=self._req.kind,
                state="closed",
                decision="happened",
                operators=["late-commit"],
                receipt=self._receipt,
                result=self._settled_by.result if self._settled_by else None,
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

    def _report(self, text: str) -> None:
        self._reported.append(text)
        del self._reported[:-20]
        self._show()

    def _show(self) -> None:
        lines = [self._req.details, "", "---", "", f"**Review state: {self._state}**", ""]
        if self._outcome and self._outcome.decision:
            lines.append(
                f"- decided: `{self._outcome.decision}` by {', '.join(self._outcome.operators)}"
            )
        if self._reason:
            lines.append(f"- {self._reason}")
        for v in self._votes:
            lines.append(
                f"- vote: `{v.decision}` by {v.operator} {('— ' + v.note) if v.note else ''}"
            )
        for text in self._reported[-5:]:
            lines.append(f"- {text}")
        lines.append(f"- workflows waiting: {len(self._subscribers)}")
        workflow.set_current_details("\n".join(lines))


# -- the reconciler ------------------------------------------------------------------------


class ReconcileRequest(BaseModel):
    """Find effects dispatched and never confirmed, with no live attempt, for ``older_than_s``."""

    older_than_s: float = 60.0
    limit: int = 200
    #: repeat every so many seconds (the scheduled reconciler); None: once
    every_s: float | None = None
    runs_before_continue_as_new: int = 100


#: why the reconciler left an effect: a live attempt holds it; no gated activity of this
#: worker knows its target; the workflow that owns it may still send it (it is left to the
#: owner); the owner's fate cannot be told; the target may still be executing it; its journal
#: entries do not verify (nothing is decided on it: a person restores the journal).
#: ("input_changed" is no longer reported: it stays so reports an earlier release recorded in
#: a running reconciler's history still decode.)
SkipReason = Literal[
    "live_attempt",
    "unknown_activity",
    "owner_alive",
    "owner_unknown",
    "unsettled",
    "input_changed",
    "journal_corrupt",
]


class ReconcileOutcome(BaseModel):
    effect_id: str
    activity: str | None = None
    final: str
    #: why the reconciler left it (``final`` is then "skipped")
    skipped: SkipReason | None = None
    via: str | None = None
    code: str | None = None
    review: str | None = None
    note: str = ""


class ReconcileReport(BaseModel):
    in_doubt: int
    #: effects whose absence is confirmed (NOT_SENT, or a person's not_happened) and that
    #: nobody sent again: settled once their owner is gone
    unsent: int = 0
    #: AMBIGUOUS effects checked for an open review (one is started where none runs)
    ambiguous: int = 0
    outcomes: list[ReconcileOutcome] = Field(default_factory=list)


@workflow.defn(name="InterlockReconciler")
class Reconciler:
    """Runs the reconcile activity once, or every ``every_s`` seconds."""

    @workflow.run
    async def run(self, req: ReconcileRequest) -> ReconcileReport:
        runs = 0
        while True:
            report: ReconcileReport = await workflow.execute_activity(
                RECONCILE_ACTIVITY,
                req,
                result_type=ReconcileReport,
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=timedelta(seconds=30),
            )
            if req.every_s is None:
                return report
            runs += 1
            if runs >= req.runs_before_continue_as_new:
                workflow.continue_as_new(req)
            await workflow.sleep(req.every_s)


# -- the worker's side: opening reviews, recording decisions, recovering -------------------


class ReviewDesk:
    """What the interceptor and the plugin's activities share: the gate, the client, and the
    gated activities this worker knows (to decode inputs and check attested results)."""

    def __init__(
        self,
        gate: Callable[[], Gate],
        client: Callable[[], temporalio.client.Client | None],
        rules: ReviewRules,
        task_queue: str | None = None,
    ) -> None:
        self._gate = gate
        self._client = client
        self.rules = rules
        self.task_queue = task_queue
        self.specs: dict[str, GateSpec] = {}

    def _the_client(self) -> temporalio.client.Client | None:
        """The plugin's client, else the running async activity's own (thread-pool activities
        have none: the plugin's reference is what reaches Temporal from them)."""
        client = self._client()
        if client is not None:
            return client
        try:
            return activity.client()
        except RuntimeError:
            return None

    # -- opening -----------------------------------------------------------------------------

    async def open(
        self,
        effect_id: str,
        *,
        task_queue: str,
        subscriber: str | None = None,
        kind: ReviewKind = "ambiguous",
    ) -> str | None:
        """Make sure the effect's review exists (and ``subscriber`` will hear its outcome).
        Starts one only while the journal says the effect awaits a person."""
        journal = self._gate().journal
        principal: str | None
        if kind == "circuit":
            state = journal.policy.session(effect_id)
            if state is None or state.circuit is None:
                return None
            activity_name, principal = state.circuit.activity, None
            details = circuit_markdown(effect_id, state, self.rules)
        elif kind == "approval":
            approval = journal.policy.approval(effect_id)
            if approval is None or approval.status != "pending":
                return None
            activity_name, principal = approval.activity, approval.principal
            details = approval_markdown(approval, self.rules)
        else:
            entries = journal.read(effect_id)
            view = fold(effect_id, entries)
            if view.status is not Kind.AMBIGUOUS:
                return None
            guard = self._gate().policy
            secrets = guard.policy.secret_arguments if guard is not None else frozenset()
            approved = redact(journal.blob(effect_id, "approved") or [], secrets)
            changes: list[dict[str, Any]] = next(
                (e.data.get("changes", []) for e in reversed(entries) if e.kind is Kind.AMBIGUOUS),
                [],
            )
            activity_name = view.activity or view.effect_type or ""
            principal = view.principal
            details = review_markdown(
                kind, view, approved[0] if len(approved) == 1 else approved, self.rules, changes
            )
        client = self._client()
        if client is None:
            try:
                client = activity.client()
            except RuntimeError:
                log.warning(
                    "no Temporal client to open the review of effect %s; the reconciler "
                    "or the next attempt will",
                    effect_id[:16],
                )
                return None
        req = ReviewRequest(
            kind=kind,
            effect_id=effect_id,
            activity=activity_name,
            principal=principal,
            rules=self.rules,
            details=details,
        )
        workflow_id = review_id(kind, effect_id)
        options: dict[str, Any] = {
            "id": workflow_id,
            "task_queue": self.task_queue or task_queue,
            # a finished review is not reopened by accident: the journal check above starts
            # a new one only while the effect awaits a person
            "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            "static_summary": f"{_TITLES[kind]}: {req.activity} {effect_id[:12]}",
        }
        if subscriber:
            # signal-with-start: one review per effect, every waiting workflow subscribed
            options["start_signal"] = "subscribe"
            options["start_signal_args"] = [Subscriber(workflow_id=subscriber)]
        else:
            options["id_conflict_policy"] = WorkflowIDConflictPolicy.USE_EXISTING
        await client.start_workflow(EffectReview.run, req, **options)
        return workflow_id

    async def settled(self, effect_id: str) -> None:
        """A late COMMITTED closed an AMBIGUOUS effect: tell its review, if one is open."""
        client = self._the_client()
        if client is None:
            return
        journal = self._gate().journal
        view = fold(effect_id, journal.read(effect_id))
        settlement = Settlement(receipt=receipt_of(view), result=journal.blob(effect_id, "result"))
        try:
            await client.get_workflow_handle(review_id("ambiguous", effect_id)).signal(
                EffectReview.settled, settlement
            )
        except Exception as err:
            log.info("no open review to settle for %s (%s)", effect_id[:16], type(err).__name__)

    # -- the activities --------------------------------------------------------------------

    @activity.defn(name=RECORD_ACTIVITY)
    async def record_decision(self, rec: DecisionRecord) -> Recorded:
        """Record a person's decision; one on an effect whose entries do not verify is refused
        (non-retryable ``JournalCorrupt``): nothing is recorded, and the review stays open."""
        journal = self._gate().journal
        result = rec.result
        try:
            if rec.decision == "happened" and result is not None:
                result = self._checked_result(rec.effect_id, result)
            if rec.kind == "circuit":
                return record_circuit_reset(
                    journal, rec.effect_id, operators=rec.operators, note=rec.note
                )
            if rec.kind == "approval":
                return record_approval(
                    journal,
                    rec.effect_id,
                    decision=rec.decision,
                    operators=rec.operators,
                    note=rec.note,
                    scope=rec.scope,
                    ttl_s=rec.ttl_s,
                )
            return record_resolution(
                journal,
                rec.effect_id,
                kind=rec.kind,
                decision=rec.decision,
                operators=rec.operators,
                note=rec.note,
                result=result,
            )
        except ReviewError as err:
            raise ApplicationError(str(err), type="InvalidDecision", non_retryable=True) from None
        except JournalCorrupt as err:
            raise JournalCorruptError(str(err), err.effect_id, err.seq) from None

    def _checked_result(self, effect_id: str, result: Any) -> Any:
        view = fold(effect_id, self._gate().journal.read(effect_id))
        spec = self.specs.get(view.activity or "")
        if spec is None or spec.return_type is None:
            return result
        from pydantic import TypeAdapter

        try:
            value = TypeAdapter(spec.return_type).validate_python(result)
        except ValidationError as err:
            raise ApplicationError(
                f"the attested result does not match what {view.activity} returns: "
                f"{describe_invalid(err, 'result')}",
                type="InvalidDecision",
                non_retryable=True,
            ) from None
        return TypeAdapter(spec.return_type).dump_python(value, mode="json")

    @activity.defn(name=RECONCILE_ACTIVITY)
    async def reconcile(self, req: ReconcileRequest) -> ReconcileReport:
        """Settle what no owner will: never by sending (only the workflow that owns an effect
        may send it), by asking the target, recording a confirmed absence as REFUSED, or
        putting the effect in front of a person."""
        gate = self._gate()
        journal = gate.journal
        rows = journal.in_doubt(older_than=req.older_than_s)
        report = ReconcileReport(in_doubt=len(rows))
        info = activity.info()
        for row in rows[: req.limit]:
            activity.heartbeat(row.effect_id)
            report.outcomes.append(await self._settle(gate, row.effect_id, info))
        # absence confirmed (a send that never left, a person's not_happened) and not sent
        # again: its owner's to send; once the owner is gone, nobody will
        unsent = journal.effects(status=Kind.NOT_SENT, older_than=req.older_than_s, limit=req.limit)
        for row in journal.effects(
            status=Kind.RESOLVED, older_than=req.older_than_s, limit=req.limit
        ):
            try:
                resolution = fold(row.effect_id, journal.read(row.effect_id)).resolution
            except JournalCorrupt as err:
                report.outcomes.append(_corrupt(row.effect_id, err))
                continue
            if resolution == "not_happened":
                unsent.append(row)
        report.unsent = len(unsent)
        for row in unsent:
            activity.heartbeat(row.effect_id)
            report.outcomes.append(await self._settle(gate, row.effect_id, info))
        # AMBIGUOUS effects whose review never opened, or expired: in front of a person again
        ambiguous = journal.effects(status=Kind.AMBIGUOUS, limit=req.limit)
        report.ambiguous = len(ambiguous)
        already = {o.effect_id for o in report.outcomes}
        for row in ambiguous:
            if row.effect_id in already:
                continue
            activity.heartbeat(row.effect_id)
            try:
                review = await self.open(row.effect_id, task_queue=info.task_queue)
                report.outcomes.append(self._outcome(gate, row.effect_id, "", review=review))
            except JournalCorrupt as err:
                report.outcomes.append(_corrupt(row.effect_id, err))
        return report

    async def _settle(self, gate: Gate, effect_id: str, info: activity.Info) -> ReconcileOutcome:
        def skipped(reason: SkipReason, note: str, name: str | None = None) -> ReconcileOutcome:
            return ReconcileOutcome(
                effect_id=effect_id, activity=name, final="skipped", skipped=reason, note=note
            )

        journal = gate.journal
        if journal.is_claimed(effect_id):
            return skipped("live_attempt", "a live attempt holds it")
        try:
            view = fold(effect_id, journal.read(effect_id))
            name = view.activity or ""
            spec = self.specs.get(name)
            if spec is None:
                return skipped(
                    "unknown_activity", f"no gated activity {name!r} on this worker", name
                )
            fate, why = await self._owner_fate(view)
            if fate is None:
                return skipped("owner_unknown", why, name)
            if fate == "alive":
                return skipped("owner_alive", why, name)
            r = await gate.settle(
                effect_id, spec.target, owner_ended=fate, why=why, decode_args=spec.decode_json
            )
        except InFlight as err:
            return skipped("live_attempt", str(err))
        except JournalCorrupt as err:
            return _corrupt(effect_id, err)
        except InterlockError as err:
            return self._outcome(gate, effect_id, "", note=str(err))
        if r.final == Kind.AMBIGUOUS.value:
            review = await self.open(effect_id, task_queue=info.task_queue)
            return self._outcome(gate, effect_id, name, review=review, note=why)
        if r.final in (Kind.DISPATCHED.value, Kind.NOT_SENT.value):
            return skipped(
                "unsettled", "the target may still be executing it: ask again later", name
            )
        return self._outcome(gate, effect_id, name, note=why)

    async def _owner_fate(
        self, view: EffectView
    ) -> tuple[OwnerEnded | Literal["alive"] | None, str]:
        """Whether the workflow that owns the effect may still send it ("alive"), or how it
        ended; None when that cannot be told. With a reason."""
        delivery = view.owner_delivery or {}
        workflow_id = delivery.get("workflow_id")
        if not workflow_id:
            return "abandoned", "no workflow owns it"
        client = self._the_client()
        if client is None:
            return None, "no Temporal client to ask about its workflow"
        namespace = delivery.get("namespace")
        if namespace and namespace != client.namespace:
            return None, (
                f"its workflow runs in namespace {namespace}, not this reconciler's "
                f"{client.namespace}"
            )
        try:
            described = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return "abandoned", f"its workflow {workflow_id} is not found"
            return None, f"could not describe its workflow {workflow_id} ({err.status.name})"
        status = described.status
        if status in (WorkflowExecutionStatus.CANCELED, WorkflowExecutionStatus.TERMINATED):
            return "cancelled", f"its workflow {workflow_id} was {status.name.lower()}"
        if status is None:
            return None, f"its workflow {workflow_id} has no status"
        if status != WorkflowExecutionStatus.RUNNING:
            return "abandoned", f"its workflow {workflow_id} ended {status.name.lower()}"
        if view.status is Kind.RESOLVED:
            # a person answered its review: the open workflow re-executes the effect
            return "alive", f"its workflow {workflow_id} is open"
        activity_id = delivery.get("activity_id")
        for pending in described.raw_description.pending_activities:
            if pending.activity_id == activity_id and pending.activity_type.name == view.activity:
                return "alive", f"its workflow {workflow_id} still runs activity {activity_id}"
        return "abandoned", (
            f"its workflow {workflow_id} is open, but activity {activity_id} is no longer pending"
        )

    @staticmethod
    def _outcome(
        gate: Gate,
        effect_id: str,
        activity_name: str,
        *,
        review: str | None = None,
        note: str = "",
    ) -> ReconcileOutcome:
        view = fold(effect_id, gate.journal.read(effect_id))
        r = receipt_of(view)
        return ReconcileOutcome(
            effect_id=effect_id,
            activity=activity_name or view.activity,
            final=r.final,
            via=r.via,
            code=r.code,
            review=review,
            note=note,
        )


def _corrupt(effect_id: str, err: JournalCorrupt) -> ReconcileOutcome:
    """An effect whose entries do not verify: reported (with the entry's seq), never settled."""
    return ReconcileOutcome(
        effect_id=effect_id, final="skipped", skipped="journal_corrupt", note=str(err)
    )
