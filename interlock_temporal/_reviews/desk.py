"""The review desk, a worker's side of reviews: opens ``EffectReview`` workflows (for the
interceptor and the reconciler), tells a review of a late COMMITTED, and records what people
decide (the ``interlock.record_decision`` activity). The workflow itself is ``_reviews.workflow``
(sandbox-safe); the reconciler is ``_reviews.reconciler``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError
from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError

from .._worker.errors import JournalCorruptError, describe_invalid
from ..core.errors import JournalCorrupt
from ..core.identity import canonical
from ..core.models import Kind
from ..core.policy import redact
from ..core.receipts import fold, receipt_of
from ..core.review import (
    Recorded,
    ReviewError,
    ReviewKind,
    approval_markdown,
    circuit_markdown,
    record_approval,
    record_circuit_reset,
    record_resolution,
    review_id,
    review_markdown,
)
from ..core.sealing import ENCRYPTED
from .workflow import (
    COMMITTED_ACTIVITY,
    RECORD_ACTIVITY,
    DecisionRecord,
    EffectReview,
    LateCommit,
    ReviewRequest,
    Subscriber,
)

if TYPE_CHECKING:
    from .._worker.runtime import WorkerRuntime

__all__ = ["ReviewDesk"]

log = logging.getLogger("interlock_temporal.review")

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
        journal = runtime.gate.journal
        principal: str | None
        if kind == "circuit":
            state = journal.policy.session(effect_id)
            if state is None or state.circuit is None:
                return None
            activity_name, principal = state.circuit.activity, None
            details = circuit_markdown(effect_id, state, runtime.review_rules)
        elif kind == "approval":
            approval = journal.policy.approval(effect_id)
            if approval is None or approval.status != "pending":
                return None
            activity_name, principal = approval.activity, approval.principal
            details = approval_markdown(approval, runtime.review_rules)
        else:
            entries = journal.read(effect_id)
            view = fold(effect_id, entries)
            if view.status is not Kind.AMBIGUOUS:
                return None
            approved = await _shown_input(runtime, journal.blob(effect_id, "approved"))
            changes: list[dict[str, Any]] = next(
                (e.data.get("changes", []) for e in reversed(entries) if e.kind is Kind.AMBIGUOUS),
                [],
            )
            activity_name = view.activity or view.effect_type or ""
            principal = view.principal
            details = review_markdown(
                kind,
                view,
                approved[0] if len(approved) == 1 else approved,
                runtime.review_rules,
                changes,
            )
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
            **self._settings(),
        )
        workflow_id = review_id(kind, effect_id)
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
        await client.start_workflow(EffectReview.run, req, **options)
        return workflow_id

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

    @activity.defn(name=COMMITTED_ACTIVITY)
    async def committed(self, effect_id: str) -> LateCommit | None:
        """The effect's COMMITTED as the journal records it (its receipt and result), or None
        when the journal records no COMMITTED: what a review woken by a ``settled`` signal
        believes, instead of the signal (anyone with namespace access can send one). An effect
        whose entries do not verify is refused (non-retryable ``JournalCorrupt``), and the
        review stays open. One read of the effect's chain."""
        try:
            return await self._committed(effect_id)
        except JournalCorrupt as err:
            raise JournalCorruptError(str(err), err.effect_id, err.seq) from None

    @activity.defn(name=RECORD_ACTIVITY)
    async def record_decision(self, rec: DecisionRecord) -> Recorded:
        """Record a person's decision; one on an effect whose entries do not verify is refused
        (non-retryable ``JournalCorrupt``): nothing is recorded, and the review stays open."""
        journal = self._runtime.gate.journal
        values = self._runtime.gate.values
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
                values=values,
                stored_result=None if result is None else await values.store(canonical(result)),
            )
        except ReviewError as err:
            raise ApplicationError(str(err), type="InvalidDecision", non_retryable=True) from None
        except JournalCorrupt as err:
            raise JournalCorruptError(str(err), err.effect_id, err.seq) from None

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
