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
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
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
    Vote,
    approval_markdown,
    circuit_markdown,
    count_votes,
    record_approval,
    record_circuit_reset,
    record_resolution,
    review_id,
    review_markdown,
)
from ..core.review_config import rules_in_force
from ..core.review_rules import ReviewRules
from ..core.review_seal import ReviewSeals
from ..core.sealing import ENCRYPTED
from ..core.vote_proofs import ballot_of, spend_codes
from .workflow import (
    CHECK_ACTIVITY,
    COMMITTED_ACTIVITY,
    RECORD_ACTIVITY,
    Arrival,
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
            journal_id=runtime.journal_id,
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
        request = await start_request(client, workflow_id, described.run_id)
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
            details = circuit_markdown(effect_id, state, self._rules())
            return state.circuit.activity, None, details
        if kind == "approval":
            approval = journal.policy.approval(effect_id)
            if approval is None or approval.status != "pending":
                return None
            details = approval_markdown(approval, self._rules())
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
        details = review_markdown(kind, view, shown, self._rules(), changes)
        return view.activity or view.effect_type or "", view.principal, details

    def _rules(self) -> ReviewRules:
        """The rules a decision is counted under: the journal's (``interlock operators rules``)
        where it sets them, else this worker's; the deadline is always this worker's."""
        return rules_in_force(self._runtime.gate.journal, self._runtime.review_rules)

    def _settings(self) -> dict[str, Any]:
        """A review's rules (its deadline included), and who is told of it and how often."""
        runtime = self._runtime
        return {
            "rules": self._rules(),
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
        counted. One on an effect whose entries do not verify is refused (``JournalCorrupt``).

        Beside each deciding operator the journal records the client identity Temporal recorded
        for the signal or Update that carried their vote, read from the review's history here
        (``_sent_by``), never from what the vote or the review claims: evidence, not proof (a
        client sets it). Costs one read of the review's history per decision."""
        problem = await self._caller_problem(rec.kind, rec.effect_id)
        if problem is None and rec.votes is None:
            problem = "it sent no votes, only their tally"
        if problem is not None:
            raise self._refused("not_genuine", f"not recorded: not a genuine review: {problem}")
        try:
            decided = self._counted(rec)
            sent_by = await self._sent_by(rec)
            deciding = {o: sent_by[o] for o in decided.operators if o in sent_by}
            recorded = await self._record(rec.kind, rec.effect_id, decided, deciding or None)
            if recorded.recorded:
                spend_codes(self._runtime.gate.journal, decided.proofs)
            return recorded.model_copy(update={"sent_by": sent_by})
        except ReviewError as err:
            log.warning("review of %s: decision not recorded: %s", rec.effect_id[:16], err)
            raise _invalid(str(err)) from None
        except JournalCorrupt as err:
            raise JournalCorruptError(str(err), err.effect_id, err.seq) from None

    def _counted(self, rec: DecisionRecord) -> Reached:
        """The decision ``rec``'s votes reach under this worker's rules (``count_votes``);
        refused, and counted, if they reach none."""
        journal = self._runtime.gate.journal
        try:
            decided, left_out = count_votes(
                journal, rec.kind, rec.effect_id, rec.votes or [], self._rules()
            )
        except NoDecision as err:
            raise self._refused("no_decision", str(err)) from None
        for problem in left_out:
            log.warning("review of %s: a vote not counted: %s", rec.effect_id[:16], problem)
        return decided

    async def _sent_by(self, rec: DecisionRecord) -> dict[str, str]:
        """For each operator of ``rec``'s votes (the first vote of each): the client identity
        Temporal recorded for the ``resolve`` signal or ``decide`` Update that carried it, read
        from the calling review's history (``_arrived``). A vote's arrival (its signal's
        ordinal, its Update's id) is only where to look: the event found there must carry that
        very vote, or the operator gets no identity. Nothing when the review sent no arrivals
        (one from before they were kept)."""
        votes, arrivals = rec.votes or [], rec.arrivals
        if not votes or arrivals is None:
            return {}
        if len(arrivals) != len(votes):
            log.warning(
                "review of %s: %d arrivals for %d votes, no identities read",
                rec.effect_id[:16],
                len(arrivals),
                len(votes),
            )
            return {}
        client = self._runtime.temporal_client()
        info = activity.info()
        if client is None or not info.workflow_id or not info.workflow_run_id:
            return {}
        signals, updates = await _arrived(client, info.workflow_id, info.workflow_run_id)
        found, unmatched = _matched(votes, arrivals, signals, updates)
        for operator in unmatched:
            log.warning(
                "review of %s: the event named as %r's vote's arrival does not carry it: "
                "no identity recorded for them",
                rec.effect_id[:16],
                operator,
            )
        return found

    async def _record(
        self,
        kind: ReviewKind,
        subject: str,
        decided: Reached,
        sent_by: dict[str, str] | None = None,
    ) -> Recorded:
        journal = self._runtime.gate.journal
        values = self._runtime.gate.values
        result = decided.result
        if decided.decision == "happened" and result is not None:
            result = self._checked_result(subject, result)
        if kind == "circuit":
            return record_circuit_reset(
                journal,
                subject,
                operators=decided.operators,
                note=decided.note,
                sent_by=sent_by,
                proofs=decided.proofs,
                ballot=decided.ballot,
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
                sent_by=sent_by,
                proofs=decided.proofs,
                ballot=decided.ballot,
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
            sent_by=sent_by,
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
        request = await start_request(client, info.workflow_id, info.workflow_run_id)
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
        return _invalid(message)

    def _checked_result(self, effect_id: str, result: Any) -> Any:
        view = fold(effect_id, self._runtime.gate.journal.read(effect_id))
        gated = self._runtime.recoverable(view.activity or "")
        if gated is None or gated.return_type is None:
            return result
        adapter: TypeAdapter[Any] = TypeAdapter(gated.return_type)
        try:
            value = adapter.validate_python(result)
        except ValidationError as err:
            raise ReviewError(
                f"the attested result does not match what {view.activity} returns: "
                f"{describe_invalid(err, 'result')}"
            ) from None
        return adapter.dump_python(value, mode="json")


def _invalid(message: str) -> ApplicationError:
    """A decision refused (nothing recorded): the review shows the person ``message``. BENIGN,
    so the worker's SDK logs it at DEBUG, without its traceback: the desk logs it in one line
    (an expected answer to a person, not a fault of the worker)."""
    return ApplicationError(
        message,
        type="InvalidDecision",
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )


async def start_request(client: Client, workflow_id: str, run_id: str) -> dict[str, Any] | None:
    """The request a review run was started with, as JSON data (decoded by the client's codec,
    if it has one), read from its first history event, in the form its seal was made over; None
    when there is none to read."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=4):
        if not event.HasField("workflow_execution_started_event_attributes"):
            return None
        found = await _decoded(client, event.workflow_execution_started_event_attributes.input)
        return _as_sealed(found) if isinstance(found, dict) else None
    return None


def _as_sealed(found: dict[str, Any]) -> dict[str, Any]:
    """The request as the worker that opened it dumped it to seal it: read into the model and
    dumped again, since the client's converter may have left out what was unset or default
    (a converter that dumps with ``exclude_unset``, as some plugins' do, writes ``rules`` as
    ``{"deadline_s": 86400}``). A request the model cannot read is kept as found: its seal then
    does not match."""
    try:
        return ReviewRequest.model_validate(found).model_dump(mode="json")
    except ValidationError:
        return found


#: a vote as its history event carried it, with the identity Temporal recorded there
_Carried = tuple[str, Vote | None]


async def _arrived(
    client: Client, workflow_id: str, run_id: str
) -> tuple[list[_Carried], dict[str, _Carried]]:
    """What a review run received, from its history: its ``resolve`` signals, in the order its
    handler received them (a signal whose input the workflow could not decode was dropped
    before the handler, so it is skipped here too), and its accepted ``decide`` Updates by id
    (an update-with-start's included); each with the identity Temporal recorded and the vote it
    carried (None: not a vote)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    signals: list[_Carried] = []
    updates: dict[str, _Carried] = {}
    admitted: dict[int, Any] = {}
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_signaled_event_attributes"):
            signaled = event.workflow_execution_signaled_event_attributes
            if signaled.signal_name != "resolve":
                continue
            delivered, vote = await _carried(client, signaled.input.payloads)
            if delivered:
                signals.append((signaled.identity, vote))
        elif event.HasField("workflow_execution_update_admitted_event_attributes"):
            admits = event.workflow_execution_update_admitted_event_attributes
            admitted[event.event_id] = admits.request
        elif event.HasField("workflow_execution_update_accepted_event_attributes"):
            accepted = event.workflow_execution_update_accepted_event_attributes
            request = accepted.accepted_request
            if not request.meta.update_id:  # the request was written when it was admitted
                request = admitted.get(accepted.accepted_request_sequencing_event_id, request)
            if request.input.name != "decide" or not request.meta.update_id:
                continue
            _, vote = await _carried(client, request.input.args.payloads)
            updates[request.meta.update_id] = (request.meta.identity, vote)
    return signals, updates


async def _carried(client: Client, payloads: Any) -> tuple[bool, Vote | None]:
    """Whether a signal's input reaches the review's handler (it decodes as the workflow
    decodes it: one argument of any type), and the vote it carries, if it is one."""
    found = list(payloads)
    if not found:
        return True, None
    try:
        values = await client.data_converter.decode(found, [Any] if len(found) == 1 else None)
    except Exception:  # the workflow drops a signal it cannot decode, before its handler
        return False, None
    try:
        return True, Vote.model_validate(values[0])
    except ValidationError:
        return True, None


def _matched(
    votes: list[Vote],
    arrivals: list[Arrival | None],
    signals: list[_Carried],
    updates: dict[str, _Carried],
) -> tuple[dict[str, str], list[str]]:
    """For the first vote of each operator: the identity on the history event its arrival
    names, if that event carries that very vote; and the operators whose arrival names an event
    that carries another (or none)."""
    found: dict[str, str] = {}
    unmatched: list[str] = []
    seen: set[str] = set()
    for vote, arrival in zip(votes, arrivals, strict=True):
        operator = vote.operator.strip()
        if operator in seen:
            continue
        seen.add(operator)
        event = _event_of(arrival, signals, updates)
        if event is None:
            continue
        identity, carried = event
        if carried != vote:
            unmatched.append(operator)
            continue
        found[operator] = identity
    return found, unmatched


def _event_of(
    arrival: Arrival | None, signals: list[_Carried], updates: dict[str, _Carried]
) -> _Carried | None:
    """The history event ``arrival`` names: the N-th ``resolve`` signal, or the Update."""
    if arrival is None:
        return None
    if arrival.signal is not None:
        return signals[arrival.signal - 1] if arrival.signal <= len(signals) else None
    if arrival.update is not None:
        return updates.get(arrival.update)
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
