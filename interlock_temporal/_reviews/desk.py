"""The review desk, a worker's side of reviews: opens ``EffectReview`` workflows (for the
interceptor and the reconciler), tells a review of a late COMMITTED, and records what people
decide (the ``interlock.record_decision`` activity). The workflow itself is ``_reviews.workflow``
(sandbox-safe); the reconciler is ``_reviews.reconciler``."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from .._worker.errors import JournalCorruptError, describe_invalid
from ..core.errors import JournalCorrupt
from ..core.identity import canonical
from ..core.models import Kind
from ..core.operators import roster_of
from ..core.policy import redact
from ..core.receipts import fold, receipt_of
from ..core.review import (
    NoDecision,
    Reached,
    Recorded,
    ReviewError,
    ReviewKind,
    approval_markdown,
    circuit_markdown,
    count_votes,
    record_approval,
    record_circuit_reset,
    record_resolution,
    review_id,
    review_markdown,
)
from ..core.review_seal import ReviewSeals
from ..core.sealing import ENCRYPTED
from ..core.vote_proofs import ballot_of, spend_codes
from .workflow import (
    CHECK_ACTIVITY,
    COMMITTED_ACTIVITY,
    RECORD_ACTIVITY,
    DecisionRecord,
    EffectReview,
    LateCommit,
    ReviewCheck,
    ReviewRequest,
    Subscriber,
)

if TYPE_CHECKING:
    from .._worker.runtime import WorkerRuntime

__all__ = ["ReviewDesk"]

log = logging.getLogger("interlock_temporal.review")

#: what a person deciding is told of who may decide, with and without an operator roster
PROVEN = (
    "**Who may decide.** A vote counts only with its operator's proof: sign it with "
    "`interlock reviews resolve --key FILE`, or paste the one-time code sent to you: send the "
    "signal `resolve` as above with your code for that decision, "
    '`{"decision": "...", "operator": "your name", "code": "..."}` (the message with your '
    "codes has each line to paste). A code is yours alone and works once."
)
UNPROVEN = (
    "**Who may decide.** This journal has no operator roster: operator names are not checked, "
    "and anyone with access to this Temporal namespace can decide this review under any name "
    "(`interlock operators add` sets one up)."
)

TITLES = {
    "ambiguous": "Effect in doubt",
    "approval": "Approval needed",
    "circuit": "Circuit open",
}


async def _shown_input(runtime: WorkerRuntime, stored: Any) -> list[Any]:
    """The approved input as a review shows it: secrets redacted, decoded where this worker
    can decode it, else the word "encrypted"."""
    guard = runtime.gate.policy
    secrets = guard.policy.secret_arguments if guard is not None else frozenset()
    shown = await runtime.gate.values.shown(stored)
    return [shown] if shown == ENCRYPTED else redact(shown or [], secrets)


class ReviewDesk:
    """A worker's side of reviews: opens them (for the interceptor and the reconciler), tells a
    review of a late COMMITTED, and records people's decisions (an activity). What it knows of
    the worker (its gate, its client, its gated activities) is the worker's runtime."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self._runtime = runtime
        self._seals: ReviewSeals | None = None

    @property
    def seals(self) -> ReviewSeals:
        """Seals the reviews this worker opens, and checks a review's (the journal's keys)."""
        if self._seals is None:
            self._seals = ReviewSeals(self._runtime.gate.journal.keyring)
        return self._seals

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
        runtime = self._runtime
        awaiting = await self._awaiting(kind, effect_id)
        if awaiting is None:
            return None
        activity_name, principal, details = awaiting
        journal = runtime.gate.journal
        roster = roster_of(journal)
        ballot = ballot_of(journal, roster, kind, effect_id) if roster.exists else None
        details += "\n\n" + (PROVEN if roster.exists else UNPROVEN)
        client = runtime.temporal_client()
        if client is None:
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
            details=details,
            ballot=ballot,
            **self._settings(),
        )
        workflow_id = review_id(kind, effect_id)
        req.seal = self.seals.seal(workflow_id, req.model_dump(mode="json"))
        waiting = await self._replace_unless_genuine(client, workflow_id)
        options: dict[str, Any] = {
            "id": workflow_id,
            "task_queue": runtime.review_task_queue or task_queue,
            # a finished review is not reopened by accident: the journal check above starts
            # a new one only while the effect awaits a person
            "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            "static_summary": f"{TITLES[kind]}: {req.activity} {effect_id[:12]}",
        }
        if subscriber:
            # signal-with-start: one review per effect, every waiting workflow subscribed
            options["start_signal"] = "subscribe"
            options["start_signal_args"] = [Subscriber(workflow_id=subscriber)]
        else:
            options["id_conflict_policy"] = WorkflowIDConflictPolicy.USE_EXISTING
        handle = await client.start_workflow(EffectReview.run, req, **options)
        for other in sorted(waiting - {subscriber or ""}):  # who waited on the one it replaced
            await handle.signal(EffectReview.subscribe, Subscriber(workflow_id=other))
        return workflow_id

    async def _replace_unless_genuine(self, client: Client, workflow_id: str) -> set[str]:
        """A running review of this id whose request does not carry this journal's seal (one a
        client started to shape or block the real one) is terminated, saying why, and the
        workflows it told it was waiting for them are returned, to wait on the genuine one.
        Cost: a describe, and when one runs, its start event (one history page)."""
        handle = client.get_workflow_handle(workflow_id)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                return set()
            raise
        if described.status is not WorkflowExecutionStatus.RUNNING:
            return set()
        request = await _start_of(client, workflow_id, described.run_id)
        problem = (
            "its start event could not be read"
            if request is None
            else self.seals.problem(workflow_id, request)
        )
        if problem is None:
            return set()
        log.warning("replacing review %s, which is not genuine: %s", workflow_id, problem)
        waiting = await _waiting_on(client, workflow_id, described.run_id)
        try:
            await client.get_workflow_handle(workflow_id, run_id=described.run_id).terminate(
                reason=f"not a genuine Interlock review ({problem}): replaced by the worker's"
            )
        except RPCError as err:
            if err.status is not RPCStatusCode.NOT_FOUND:
                raise
        return waiting

    async def _awaiting(
        self, kind: ReviewKind, effect_id: str
    ) -> tuple[str, str | None, str] | None:
        """What a person deciding is shown (the activity, who asked, the details), read from
        the journal; None unless it says the effect (or call, or session) awaits a person."""
        runtime = self._runtime
        journal = runtime.gate.journal
        if kind == "circuit":
            state = journal.policy.session(effect_id)
            if state is None or state.circuit is None:
                return None
            details = circuit_markdown(effect_id, state, runtime.review_rules)
            return state.circuit.activity, None, details
        if kind == "approval":
            approval = journal.policy.approval(effect_id)
            if approval is None or approval.status != "pending":
                return None
            details = approval_markdown(approval, runtime.review_rules)
            return approval.activity, approval.principal, details
        entries = journal.read(effect_id)
        view = fold(effect_id, entries)
        if view.status is not Kind.AMBIGUOUS:
            return None
        approved = await _shown_input(runtime, journal.blob(effect_id, "approved"))
        changes: list[dict[str, Any]] = next(
            (e.data.get("changes", []) for e in reversed(entries) if e.kind is Kind.AMBIGUOUS),
            [],
        )
        shown = approved[0] if len(approved) == 1 else approved
        details = review_markdown(kind, view, shown, runtime.review_rules, changes)
        return view.activity or view.effect_type or "", view.principal, details

    def _settings(self) -> dict[str, Any]:
        """A review's rules (its deadline included), and who is told of it and how often."""
        runtime = self._runtime
        return {
            "rules": runtime.review_rules,
            "notifiers": list(runtime.notifiers),
            "reminder_s": runtime.reminder_s if runtime.notifiers else None,
        }

    async def late_commit(self, effect_id: str) -> None:
        """A late COMMITTED closed an AMBIGUOUS effect: tell its review, if one is open. The
        signal wakes the review, which reads the COMMITTED from the journal itself
        (``committed``) before it closes."""
        client = self._runtime.temporal_client()
        if client is None:
            return
        commit = await self._committed(effect_id)
        if commit is None:
            return
        try:
            await client.get_workflow_handle(review_id("ambiguous", effect_id)).signal(
                EffectReview.late_commit, commit
            )
        except Exception as err:
            log.info("no open review to close for %s (%s)", effect_id[:16], type(err).__name__)

    async def _committed(self, effect_id: str) -> LateCommit | None:
        journal = self._runtime.gate.journal
        view = fold(effect_id, journal.read(effect_id))
        if view.status is not Kind.COMMITTED:
            return None
        result = await self._runtime.gate.values.shown(journal.blob(effect_id, "result"))
        return LateCommit(receipt=receipt_of(view), result=result)

    # -- the activities --------------------------------------------------------------------

    @activity.defn(name=CHECK_ACTIVITY)
    async def check_review(self) -> ReviewCheck:
        """Asked by a review as it starts: is its own request sealed by this journal's keys,
        for its own workflow id? A review that is not says so and ends; the record activity
        checks again, for itself, so a review that skips this asks in vain."""
        problem = await self._caller_problem()
        return ReviewCheck(genuine=problem is None, reason=problem or "")

    @activity.defn(name=COMMITTED_ACTIVITY)
    async def committed(self, effect_id: str) -> LateCommit | None:
        """The effect's COMMITTED as the journal records it (its receipt and result), or None
        when the journal records no COMMITTED: what a review woken by a ``settled`` signal
        believes, instead of the signal (anyone with namespace access can send one). An effect
        whose entries do not verify is refused (non-retryable ``JournalCorrupt``), and the
        review stays open. Answered only to the genuine review of that effect (anyone else is
        refused, as ``record_decision`` refuses them): the receipt and result are not for any
        workflow that asks. One read of the effect's chain, and of the caller's start event."""
        problem = await self._caller_problem("ambiguous", effect_id)
        if problem is not None:
            raise self._refused("not_genuine", f"not answered: not a genuine review: {problem}")
        try:
            return await self._committed(effect_id)
        except JournalCorrupt as err:
            raise JournalCorruptError(str(err), err.effect_id, err.seq) from None

    @activity.defn(name=RECORD_ACTIVITY)
    async def record_decision(self, rec: DecisionRecord) -> Recorded:
        """Record a person's decision, enforced here rather than where the votes were collected:
        only for the genuine review of this effect (the calling workflow is the canonical
        ``EffectReview`` of ``rec``, and its request, read from its history, carries the
        journal's seal), from the votes themselves counted under this worker's rules and the
        principal the journal recorded (never the review's copies of them). Anything else is
        refused, non-retryably, with nothing recorded; a refusal is logged with its caller and
        counted. One on an effect whose entries do not verify is refused (``JournalCorrupt``)."""
        problem = await self._caller_problem(rec.kind, rec.effect_id)
        if problem is None and rec.votes is None:
            problem = "it sent no votes, only their tally"
        if problem is not None:
            raise self._refused("not_genuine", f"not recorded: not a genuine review: {problem}")
        try:
            decided = self._counted(rec)
            recorded = await self._record(rec.kind, rec.effect_id, decided)
            if recorded.recorded:
                spend_codes(self._runtime.gate.journal, decided.proofs)
            return recorded
        except ReviewError as err:
            raise ApplicationError(str(err), type="InvalidDecision", non_retryable=True) from None
        except JournalCorrupt as err:
            raise JournalCorruptError(str(err), err.effect_id, err.seq) from None

    def _counted(self, rec: DecisionRecord) -> Reached:
        """The decision ``rec``'s votes reach under this worker's rules (``count_votes``);
        refused, and counted, if they reach none."""
        journal = self._runtime.gate.journal
        try:
            decided, left_out = count_votes(
                journal, rec.kind, rec.effect_id, rec.votes or [], self._runtime.review_rules
            )
        except NoDecision as err:
            raise self._refused("no_decision", str(err)) from None
        for problem in left_out:
            log.warning("review of %s: a vote not counted: %s", rec.effect_id[:16], problem)
        return decided

    async def _record(self, kind: ReviewKind, subject: str, decided: Reached) -> Recorded:
        journal = self._runtime.gate.journal
        values = self._runtime.gate.values
        result = decided.result
        if decided.decision == "happened" and result is not None:
            result = self._checked_result(subject, result)
        if kind == "circuit":
            return record_circuit_reset(
                journal, subject, operators=decided.operators, note=decided.note
            )
        if kind == "approval":
            return record_approval(
                journal,
                subject,
                decision=decided.decision,
                operators=decided.operators,
                note=decided.note,
                scope=decided.scope,
                ttl_s=decided.ttl_s,
            )
        return record_resolution(
            journal,
            subject,
            kind=kind,
            decision=decided.decision,
            operators=decided.operators,
            note=decided.note,
            result=result,
            values=values,
            stored_result=None if result is None else await values.store(canonical(result)),
            proofs=decided.proofs,
        )

    async def _caller_problem(
        self, kind: ReviewKind | None = None, subject: str | None = None
    ) -> str | None:
        """Why the workflow calling this activity is not the genuine review of ``kind`` and
        ``subject`` (by default: of what its own request names); None when it is. The type and
        id checks are defence in depth: the seal, over the request its history holds, is what
        holds against a client that started a review, or runs a review's workflow tasks."""
        info = activity.info()
        if not info.workflow_id or not info.workflow_run_id:
            return "it was started on its own, not by a review"
        if info.workflow_type != EffectReview.__name__:
            return f"its caller is a {info.workflow_type} workflow, not a review"
        client = self._runtime.temporal_client()
        if client is None:
            return "this worker has no Temporal client to read the review's history with"
        request = await _start_of(client, info.workflow_id, info.workflow_run_id)
        if request is None:
            return "the review's start event could not be read"
        named = (request.get("kind"), request.get("effect_id"))
        if kind is not None and named != (kind, subject):
            return "the review's request names another effect or kind than the decision"
        if not isinstance(named[0], str) or not isinstance(named[1], str):
            return "the review's request names no effect"
        if info.workflow_id != review_id(named[0], named[1]):
            return f"its workflow id {info.workflow_id!r} is not its effect's review's"
        return self.seals.problem(info.workflow_id, request)

    def _refused(self, code: str, message: str) -> ApplicationError:
        """A refusal of a caller that is not the genuine review (nothing recorded or answered),
        logged with who called and counted."""
        info = activity.info()
        log.warning(
            "%s (called by workflow %r of type %r, run %s)",
            message,
            info.workflow_id,
            info.workflow_type,
            info.workflow_run_id,
        )
        self._runtime.telemetry.refused_review(code)
        return ApplicationError(message, type="InvalidDecision", non_retryable=True)

    def _checked_result(self, effect_id: str, result: Any) -> Any:
        view = fold(effect_id, self._runtime.gate.journal.read(effect_id))
        gated = self._runtime.recoverable(view.activity or "")
        if gated is None or gated.return_type is None:
            return result
        adapter: TypeAdapter[Any] = TypeAdapter(gated.return_type)
        try:
            value = adapter.validate_python(result)
        except ValidationError as err:
            raise ApplicationError(
                f"the attested result does not match what {view.activity} returns: "
                f"{describe_invalid(err, 'result')}",
                type="InvalidDecision",
                non_retryable=True,
            ) from None
        return adapter.dump_python(value, mode="json")


async def _start_of(client: Client, workflow_id: str, run_id: str) -> dict[str, Any] | None:
    """The request a review run was started with, as JSON data (decoded by the client's codec,
    if it has one), read from its first history event; None when there is none to read."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=4):
        if not event.HasField("workflow_execution_started_event_attributes"):
            return None
        found = await _decoded(client, event.workflow_execution_started_event_attributes.input)
        return found if isinstance(found, dict) else None
    return None


async def _waiting_on(client: Client, workflow_id: str, run_id: str) -> set[str]:
    """The workflows a review run was told wait on it (its ``subscribe`` signals)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    waiting: set[str] = set()
    async for event in handle.fetch_history_events():
        if not event.HasField("workflow_execution_signaled_event_attributes"):
            continue
        signaled = event.workflow_execution_signaled_event_attributes
        if signaled.signal_name != "subscribe":
            continue
        found = await _decoded(client, signaled.input)
        if isinstance(found, dict) and isinstance(found.get("workflow_id"), str):
            waiting.add(found["workflow_id"])
    return waiting


async def _decoded(client: Client, payloads: Any) -> Any:
    """The first of ``payloads`` as JSON data, through the client's codec; None if not JSON."""
    found = list(payloads.payloads)
    codec = client.data_converter.payload_codec
    if codec is not None and found:
        found = list(await codec.decode(found))
    try:
        return json.loads(found[0].data) if found else None
    except ValueError:
        return None
