"""The reconciler: finds effects left in doubt (or unsent, or AMBIGUOUS with no review) whose
owner will never finish them, and closes them out without a send: by asking the target, by
recording a confirmed absence as REFUSED, or by putting the effect in front of a person.

It has no send path: it sees each gated activity only as ``Recoverable`` (the target as its
protocol declares it, how the recorded input decodes), never the body nor a method that sends.
Only the owning workflow's attempt sends (through the interceptor)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field
from temporalio import activity, workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from ..core.errors import InFlight, InterlockError, JournalCorrupt
from ..core.models import Kind
from ..core.receipts import EffectView, fold, receipt_of

if TYPE_CHECKING:
    from .._worker.runtime import WorkerRuntime
    from ..core.protocol import Gate, OwnerEnded
    from .desk import ReviewDesk

RECONCILE_ACTIVITY = "interlock.reconcile"


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
#: ("unsettled": inside the target's ``settle_time``; the strings are the report's, as released.)
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
    #: nobody sent again: closed out once their owner is gone
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


class ReconcileActivity:
    """The reconcile activity of one worker: what it closes out is known through the worker's
    runtime (its gate, its client, its gated activities as ``Recoverable``); reviews open
    through the worker's review desk."""

    def __init__(self, runtime: WorkerRuntime, desk: ReviewDesk) -> None:
        self.runtime = runtime
        self._desk = desk

    @activity.defn(name=RECONCILE_ACTIVITY)
    async def reconcile(self, req: ReconcileRequest) -> ReconcileReport:
        """Close out what no owner will finish: never by sending (only the workflow that owns
        an effect may send it), by asking the target, recording a confirmed absence as REFUSED,
        or putting the effect in front of a person."""
        gate = self.runtime.gate
        journal = gate.journal
        rows = journal.in_doubt(older_than=req.older_than_s)
        report = ReconcileReport(in_doubt=len(rows))
        info = activity.info()
        for row in rows[: req.limit]:
            activity.heartbeat(row.effect_id)
            report.outcomes.append(await self._close_out(gate, row.effect_id, info))
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
            report.outcomes.append(await self._close_out(gate, row.effect_id, info))
        # AMBIGUOUS effects whose review never opened, or expired: in front of a person again
        ambiguous = journal.effects(status=Kind.AMBIGUOUS, limit=req.limit)
        report.ambiguous = len(ambiguous)
        already = {o.effect_id for o in report.outcomes}
        for row in ambiguous:
            if row.effect_id in already:
                continue
            activity.heartbeat(row.effect_id)
            try:
                review = await self._desk.open(row.effect_id, task_queue=info.task_queue)
                report.outcomes.append(self._outcome(gate, row.effect_id, "", review=review))
            except JournalCorrupt as err:
                report.outcomes.append(_corrupt(row.effect_id, err))
        return report

    async def _close_out(self, gate: Gate, effect_id: str, info: activity.Info) -> ReconcileOutcome:
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
            gated = self.runtime.recoverable(name)
            if gated is None:
                return skipped(
                    "unknown_activity", f"no gated activity {name!r} on this worker", name
                )
            fate, why = await self._owner_fate(view)
            if fate is None:
                return skipped("owner_unknown", why, name)
            if fate == "alive":
                return skipped("owner_alive", why, name)
            r = await gate.close_out(
                effect_id, gated.target, owner_ended=fate, why=why, decode_args=gated.decode_args
            )
        except InFlight as err:
            return skipped("live_attempt", str(err))
        except JournalCorrupt as err:
            return _corrupt(effect_id, err)
        except InterlockError as err:
            return self._outcome(gate, effect_id, "", note=str(err))
        if r.final == Kind.AMBIGUOUS.value:
            review = await self._desk.open(effect_id, task_queue=info.task_queue)
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
        client = self.runtime.temporal_client()
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
    """An effect whose entries do not verify: reported (with the entry's seq), never closed out."""
    return ReconcileOutcome(
        effect_id=effect_id, final="skipped", skipped="journal_corrupt", note=str(err)
    )
