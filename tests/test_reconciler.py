"""No effect stays in doubt unseen, and only the workflow that owns an effect ever sends it.
Effects left DISPATCHED by a cancelled workflow, or by retries that ran out, are closed out by the
reconciler without a send: COMMITTED where the target finds them, REFUSED where it confirms they
never happened, in an open review where it cannot say. A duplicate submission never resends a
cancelled owner's effect either; while the owner lives, the effect is left to it. Real worker
processes, real SIGKILLs, money read from the payments service.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from interlock_temporal import InterlockInterceptor, InterlockPlugin, current_effect, gated
from interlock_temporal._reviews.desk import ReviewDesk
from interlock_temporal._reviews.reconciler import (
    ReconcileActivity,
    Reconciler,
    ReconcileReport,
    ReconcileRequest,
)
from interlock_temporal._worker.runtime import DeclaredTarget
from interlock_temporal.core.errors import Ambiguous
from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Gate, Ticket
from interlock_temporal.core.receipts import fold, receipt
from interlock_temporal.core.review import record_resolution, review_id
from interlock_temporal.targets.payments import (
    PaymentsUnavailable,
    RefundRequest,
    RefundResult,
    SimulatedPayments,
)
from interlock_temporal.testing import DevServer
from workers.inprocess_world import refund_call
from workers.scenarios import ORDER
from workers.server_world import ServerWorld
from workflows.activities import REFUND_EFFECT
from workflows.support_case import CaseFile

from .test_server import rig

pytestmark = pytest.mark.server


async def reconcile(client: Client, task_queue: str) -> ReconcileReport:
    report: ReconcileReport = await client.execute_workflow(
        Reconciler.run,
        ReconcileRequest(older_than_s=0),
        id=f"interlock-reconcile-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
        result_type=ReconcileReport,
        execution_timeout=timedelta(seconds=60),
    )
    return report


async def cancelled_in_doubt(world: ServerWorld, point: str) -> str:
    """The worker is SIGKILLed at ``point``, its workflow is then cancelled (and the cancellation
    lands: a fresh worker runs the workflow's code); the effect is left DISPATCHED."""
    world.setup()
    world.payments.arm(point, "kill")  # type: ignore[arg-type]
    # a long heartbeat timeout: the server schedules no retry before the cancellation lands
    run = await world.start(world.case(heartbeat_s=60.0, start_to_close_s=120.0))
    await world.crashed(run)
    await run.cancel()
    await world.restart()
    with pytest.raises(WorkflowFailureError):
        await run.result()
    assert (await run.describe()).status == WorkflowExecutionStatus.CANCELED
    eid = world.effect_id
    assert world.journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]
    assert not world.journal.is_claimed(eid)
    return eid


async def close_review(client: Client, eid: str) -> None:
    """The server outlives the test: leave no review behind."""
    review = client.get_workflow_handle(review_id("ambiguous", eid))
    assert (await review.describe()).status == WorkflowExecutionStatus.RUNNING
    await review.terminate()


#: (tier, where the worker dies) -> what the reconciler ends it as, and the money
#: (make test runs one case of each outcome; make faults all of them)
CANCELLED = [
    pytest.param(1, "before_send", "REFUSED", None, "cancelled", 0, marks=pytest.mark.faults),
    (2, "before_send", "REFUSED", None, "cancelled", 0),
    pytest.param(3, "before_send", "AMBIGUOUS", None, "unknowable", 0, marks=pytest.mark.faults),
    (1, "after_commit", "COMMITTED", "recovery-query", None, 2000),
    pytest.param(
        2, "after_commit", "COMMITTED", "recovery-query", None, 2000, marks=pytest.mark.faults
    ),
    (3, "after_commit", "AMBIGUOUS", None, "unknowable", 2000),
]


@pytest.mark.parametrize(("tier", "point", "final", "via", "code", "cents"), CANCELLED)
async def test_the_reconciler_never_sends_a_cancelled_workflows_effect(
    client: Client,
    tmp_path: Path,
    tier: int,
    point: str,
    final: str,
    via: str | None,
    code: str | None,
    cents: int,
) -> None:
    """It asks the target (COMMITTED), records the absence it confirms as REFUSED ``cancelled``
    (tiers 1 and 2: the target settles at once), or opens a review (tier 3): a dedupe window
    (tier 1) or a confirmed absence (tier 2) would have let a resend through before."""
    world = await ServerWorld.create(client, tmp_path, tier, "gated")
    try:
        eid = await cancelled_in_doubt(world, point)

        report = await reconcile(client, world.task_queue)
        (outcome,) = [o for o in report.outcomes if o.effect_id == eid]
        assert (outcome.final, outcome.via, outcome.code) == (final, via, code), outcome
        assert "was canceled" in outcome.note
        assert world.journal.in_doubt() == []
        assert world.payments.refunded_cents(ORDER) == cents
        assert len(world.payments.refund_records(ORDER)) == (1 if cents else 0)
        found = receipt(eid, journal=world.journal)
        assert found.executed is {"COMMITTED": True, "REFUSED": False}.get(final, "unknown")
        if final == "AMBIGUOUS":
            assert outcome.review == review_id("ambiguous", eid)
            await close_review(client, eid)

        again = await reconcile(client, world.task_queue)  # nothing left to do, nothing sent
        assert [o.final for o in again.outcomes if o.effect_id == eid] in ([], ["AMBIGUOUS"])
        assert world.payments.refunded_cents(ORDER) == cents
        if final == "AMBIGUOUS":
            await close_review(client, eid)  # the sweep opened it again: nobody decided
    finally:
        await world.close()


@pytest.mark.parametrize(
    ("tier", "point", "final", "cents"),
    [
        (1, "before_send", "AMBIGUOUS", 0),
        pytest.param(2, "before_send", "AMBIGUOUS", 0, marks=pytest.mark.faults),
        pytest.param(3, "before_send", "AMBIGUOUS", 0, marks=pytest.mark.faults),
        pytest.param(1, "after_commit", "COMMITTED", 2000, marks=pytest.mark.faults),
        pytest.param(2, "after_commit", "COMMITTED", 2000, marks=pytest.mark.faults),
        (3, "after_commit", "AMBIGUOUS", 2000),
    ],
)
async def test_a_duplicate_submission_never_sends_a_cancelled_workflows_effect(
    client: Client, tmp_path: Path, tier: int, point: str, final: str, cents: int
) -> None:
    """Another workflow submits the same effect while the cancelled owner's is in doubt: it may
    learn from the target that it happened, but it never sends it; on its last attempt it
    leaves the effect to a person."""
    world = await ServerWorld.create(client, tmp_path, tier, "gated")
    try:
        eid = await cancelled_in_doubt(world, point)
        duplicate = await world.start(world.case(maximum_attempts=2))
        outcome = await world.result(duplicate)
        assert outcome.status == ("REFUNDED" if final == "COMMITTED" else "AMBIGUOUS"), outcome
        found = receipt(eid, journal=world.journal)
        assert found.final == final
        if final == "COMMITTED":
            assert found.via == "recovery-query"
        else:
            assert found.code == "not_owner"
        assert world.payments.refunded_cents(ORDER) == cents
        assert len(world.payments.refund_records(ORDER)) == (1 if cents else 0)
        assert world.payments.calls(ORDER) == (1 if cents else 0)
        if final == "AMBIGUOUS":
            await close_review(client, eid)
    finally:
        await world.close()


async def test_a_person_s_not_happened_for_a_cancelled_workflow_is_refused_not_sent(
    client: Client, tmp_path: Path
) -> None:
    """Tier 3 cannot be asked: the reconciler puts the cancelled workflow's effect in front of
    a person, who says it did not happen. Only the owner could send it now, and the owner is
    gone: the next run records REFUSED ``cancelled``, and nothing is sent."""
    world = await ServerWorld.create(client, tmp_path, 3, "gated")
    try:
        eid = await cancelled_in_doubt(world, "before_send")
        first = await reconcile(client, world.task_queue)
        assert [o.final for o in first.outcomes if o.effect_id == eid] == ["AMBIGUOUS"]
        await world.resolve("not_happened", "carol", "no refund in the dashboard")
        review = client.get_workflow_handle(review_id("ambiguous", eid))
        await review.result()
        assert receipt(eid, journal=world.journal).final == "RESOLVED"

        report = await reconcile(client, world.task_queue)
        (outcome,) = [o for o in report.outcomes if o.effect_id == eid]
        assert (outcome.final, outcome.code) == ("REFUSED", "cancelled"), outcome
        assert report.unsent == 1
        found = receipt(eid, journal=world.journal)
        assert (found.final, found.executed, found.operator) == ("REFUSED", False, "carol")
        assert world.payments.refunded_cents(ORDER) == 0
        assert world.payments.calls(ORDER) == 0
    finally:
        await world.close()


async def test_an_activity_whose_retries_ran_out_in_doubt(client: Client, tmp_path: Path) -> None:
    world = await ServerWorld.create(client, tmp_path, 2, "gated")
    try:
        world.setup()
        world.payments.arm("after_commit", "kill")
        run = await world.start(world.case(maximum_attempts=1))
        await world.crashed(run)
        await world.restart()
        with pytest.raises(WorkflowFailureError):  # its one attempt timed out: no retry left
            await run.result()
        eid = world.effect_id
        assert world.journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]

        report = await reconcile(client, world.task_queue)
        (outcome,) = [o for o in report.outcomes if o.effect_id == eid]
        assert (outcome.final, outcome.via) == ("COMMITTED", "recovery-query")
        assert world.journal.in_doubt() == []
        assert receipt(eid, journal=world.journal).executed is True
        assert world.payments.refunded_cents(ORDER) == 2000
        assert world.payments.calls(ORDER) == 1  # found, not sent again
    finally:
        await world.close()


async def test_the_plugin_runs_the_reconciler_on_a_schedule(
    dev_server: DevServer, tmp_path: Path
) -> None:
    options = {"reconcile_every": timedelta(seconds=1), "reconcile_older_than": timedelta(0)}
    async with rig(dev_server, tmp_path, tier=2, plugin_options=options) as r:
        scheduled = r.client.get_workflow_handle(f"interlock-reconciler-{r.task_queue}")

        async def running() -> bool:
            try:
                return (await scheduled.describe()).status == WorkflowExecutionStatus.RUNNING
            except RPCError:
                return False

        deadline = time.monotonic() + 30
        while not await running():
            assert time.monotonic() < deadline, "the scheduled reconciler did not start"
            await asyncio.sleep(0.1)

        # an effect dispatched by a worker that then vanished, for a workflow that no longer
        # exists: recorded, claim released, nothing sent; only a send could commit it now
        request = r.request()
        case = CaseFile(
            case_id=request.case_id, order_id=ORDER, amount_cents=2000, lease_id=r.lease_id
        )
        step = await Gate(r.journal).begin(refund_call(request, case, "wf-gone", 1), r.payments)
        assert isinstance(step, Ticket)
        step.release()
        eid = step.effect_id
        assert r.journal.in_doubt()[0].effect_id == eid

        deadline = time.monotonic() + 30
        while (row := r.journal.row(eid)) is None or row.status is Kind.DISPATCHED:
            assert time.monotonic() < deadline, "the scheduled reconciler did not recover it"
            await asyncio.sleep(0.2)
        assert row.status is Kind.REFUSED
        found = receipt(eid, journal=r.journal)
        assert (found.code, found.executed) == ("abandoned", False)
        assert found.reason == (
            "its workflow wf-gone is not found, and it never happened; nobody else may send it"
        )
        assert r.payments.refunded_cents(ORDER) == 0
        assert r.payments.calls(ORDER) == 0
        await scheduled.terminate()


def test_the_review_desk_has_no_send_path() -> None:
    """The reconciler closes out by asking, refusing or asking a person: neither it nor the desk
    keeps a way to run a gated activity's body."""
    for keeper in (ReviewDesk, ReconcileActivity):
        assert not hasattr(keeper, "_send")
        assert not any(name for name in vars(keeper) if "send" in name.lower())


async def reconciler_reports(client: Client, workflow_id: str) -> list[ReconcileReport]:
    """What each run of a scheduled reconciler reported, read from its history."""
    reports = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_completed_event_attributes"):
            payloads = event.activity_task_completed_event_attributes.result.payloads
            (report,) = await client.data_converter.decode(payloads, [ReconcileReport])
            reports.append(report)
    return reports


@pytest.mark.faults
async def test_an_owner_still_retrying_is_left_to_send_its_effect(
    client: Client, tmp_path: Path
) -> None:
    """``crash_before_send`` with no heartbeat timeout: the owner's next attempt comes only
    when the dead one's start-to-close timeout ends. Meanwhile the scheduled reconciler (every
    5 s, on the fresh worker) sees the owner's activity still pending and leaves the effect to
    it; the owner resends it: COMMITTED, $20, once."""
    world = await ServerWorld.create(client, tmp_path, 2, "gated")
    scheduled = client.get_workflow_handle(f"interlock-reconciler-{world.task_queue}")
    try:
        world.setup()
        world.payments.arm("before_send", "kill")
        run = await world.start(world.case(heartbeat_s=None, start_to_close_s=20.0))
        await world.crashed(run)
        # the scheduled reconciler starts with the fresh worker (a reconcile activity in
        # flight on the killed one would hold it up for its heartbeat timeout), and runs at once
        await world.spawn("--reconcile-every-s", "5", "--reconcile-older-than-s", "0")
        outcome = await world.result(run)
        assert outcome.status == "REFUNDED", outcome

        eid = world.effect_id
        found = receipt(eid, journal=world.journal)
        assert (found.final, found.via, found.executed) == ("COMMITTED", "recovery-reapply", True)
        resent = [e for e in world.journal.read(eid) if e.kind is Kind.DISPATCHED][-1]
        assert resent.data["delivery"]["workflow_id"] == run.id  # the owner sent it
        assert world.payments.refunded_cents(ORDER) == 2000
        assert len(world.payments.refund_records(ORDER)) == 1
        assert world.payments.calls(ORDER) == 1

        seen = [
            o
            for report in await reconciler_reports(client, scheduled.id)
            for o in report.outcomes
            if o.effect_id == eid
        ]
        assert seen, "the scheduled reconciler never ran while the effect was in doubt"
        assert {o.skipped for o in seen} == {"owner_alive"}, seen
    finally:
        with contextlib.suppress(RPCError):
            await scheduled.terminate()
        await world.close()


async def test_an_ambiguous_effect_with_no_review_gets_one(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """Its review never opened (or expired): the reconciler opens one, so nothing stays
    AMBIGUOUS where no person can see it."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        request = r.request().model_copy(update={"case_id": f"4471-{uuid.uuid4().hex[:6]}"})
        case = CaseFile(
            case_id=request.case_id, order_id=ORDER, amount_cents=2000, lease_id=r.lease_id
        )
        gate = Gate(r.journal)
        step = await gate.begin(refund_call(request, case, "wf-gone", 1), r.payments)
        assert isinstance(step, Ticket)
        with pytest.raises(Ambiguous):
            await gate.fail(step, ConnectionResetError(), last_attempt=True)
        eid = step.effect_id
        review = r.client.get_workflow_handle(review_id("ambiguous", eid))
        with pytest.raises(RPCError):
            await review.describe()  # nobody opened it

        report = await reconcile(r.client, r.task_queue)
        (outcome,) = [o for o in report.outcomes if o.effect_id == eid]
        assert (outcome.final, outcome.review) == ("AMBIGUOUS", review_id("ambiguous", eid))
        assert outcome.activity == "refund"
        assert (await review.describe()).status == WorkflowExecutionStatus.RUNNING
        again = await reconcile(r.client, r.task_queue)  # a running review is kept, not doubled
        assert [o.review for o in again.outcomes if o.effect_id == eid] == [outcome.review]
        listed = [
            w
            async for w in r.client.list_workflows(
                f"WorkflowId = '{outcome.review}' AND ExecutionStatus = 'Running'"
            )
        ]
        assert len(listed) == 1
        await review.terminate()


#: every state the reconciler handles, and what it ends each as on tiers 1, 2 and 3: (final,
#: via or code), or None when it leaves the effect as it is
STATES: dict[str, tuple[tuple[str, str | None] | None, ...]] = {
    # dispatched, never sent, its owner gone
    "in_doubt_unsent": (("REFUSED", "abandoned"),) * 2 + (("AMBIGUOUS", "unknowable"),),
    # dispatched and landed at the target, never recorded, its owner gone
    "in_doubt_landed": (("COMMITTED", "recovery-query"),) * 2 + (("AMBIGUOUS", "unknowable"),),
    "ambiguous": (("AMBIGUOUS", "send_failed"),) * 3,
    # AMBIGUOUS, then the attempt in doubt's late COMMITTED
    "committed_late": (None,) * 3,
    "not_sent": (("REFUSED", "abandoned"),) * 3,
    # AMBIGUOUS, then a person's not_happened
    "not_happened": (("REFUSED", "abandoned"),) * 3,
}


def tier_refund(tier: int, payments: SimulatedPayments, bodies: list[int]) -> Any:
    @activity.defn(name=f"refund_t{tier}")
    @gated(target=payments, **REFUND_EFFECT)
    async def refund(r: RefundRequest) -> RefundResult:
        bodies.append(tier)
        return await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    return refund


async def leave_in(state: str, gate: Gate, payments: SimulatedPayments, call: Call) -> str:
    """The effect of ``call`` left in ``state`` by its owner's attempts (which send, as the
    gate's attempt path does, straight to the payments service); its owner is gone."""
    step = await gate.begin(call, payments)
    assert isinstance(step, Ticket)
    eid = step.effect_id

    async def send() -> RefundResult:
        return await payments.refund(ORDER, 2000, idempotency_key=eid)

    if state in ("in_doubt_unsent", "in_doubt_landed"):
        if state == "in_doubt_landed":
            await send()
        step.release()
    elif state == "not_sent":
        await gate.fail(step, PaymentsUnavailable("down"), last_attempt=False)
    else:
        with pytest.raises(Ambiguous):
            await gate.fail(step, ConnectionResetError(), last_attempt=True)
        if state == "committed_late":
            await gate.commit(step, await send())
        elif state == "not_happened":
            view = fold(eid, gate.journal.read(eid))
            record_resolution(
                gate.journal, eid, kind="ambiguous", decision="not_happened", operators=["carol"]
            )
            assert view.status is Kind.AMBIGUOUS
    return eid


async def test_only_the_attempt_path_sends_never_the_reconciler(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """The real reconciler, over effects in every state it handles on tiers 1, 2 and 3, whose
    owners are gone: it closes out each (COMMITTED where the target finds it, REFUSED where the
    absence is confirmed, AMBIGUOUS with a review where nobody can know) and the payments
    service sees no refund call from it. It cannot: what its worker keeps of a gated activity
    is the target as declared, without the body or any method that sends."""
    db = tmp_path / "journal.db"
    journal = open_journal(db, signing_key="11" * 32)
    names = [f"refund_t{tier}" for tier in (1, 2, 3)]
    lease = journal.leases.issue(
        "refund-bot", activities=names, max_amount_cents=5000, resources=[f"order:{ORDER}"]
    )
    services = {t: SimulatedPayments(tmp_path / f"payments-{t}.db", tier=t) for t in (1, 2, 3)}
    bodies: list[int] = []
    plugin = InterlockPlugin(f"sqlite:///{db}", signing_key="11" * 32)
    client = await Client.connect(
        dev_server.target, data_converter=pydantic_data_converter, plugins=[plugin]
    )
    queue = f"never-sends-{uuid.uuid4().hex[:8]}"
    gate = Gate(journal)
    effects: dict[tuple[str, int], str] = {}
    for tier, payments in services.items():
        payments.open_order(ORDER, 100_000)
        for state in STATES:
            request = RefundRequest(
                case_id=f"{state}-{tier}",
                order_id=ORDER,
                amount_cents=2000,
                premises=payments.order_facts(ORDER),
            )
            case = CaseFile(
                case_id=request.case_id, order_id=ORDER, amount_cents=2000, lease_id=lease
            )
            call = dataclasses.replace(
                refund_call(request, case, f"wf-gone-{uuid.uuid4().hex[:8]}", 1),
                activity=f"refund_t{tier}",
                effect_type=f"refund_t{tier}",
            )
            effects[state, tier] = await leave_in(state, gate, payments, call)
    sent = {t: (p.calls(ORDER), p.refunded_cents(ORDER)) for t, p in services.items()}
    assert sent == {t: (2, 4000) for t in (1, 2, 3)}  # the owners' own sends: landed, late

    activities = [tier_refund(t, p, bodies) for t, p in services.items()]
    try:
        async with Worker(client, task_queue=queue, activities=activities) as worker:
            report = await reconcile(client, queue)
            config = worker.config(active_config=True)
            (interceptor,) = [
                i for i in config.get("interceptors", []) if isinstance(i, InterlockInterceptor)
            ]
            (reconciler,) = [
                a.__self__
                for a in config["activities"]
                if isinstance(getattr(a, "__self__", None), ReconcileActivity)
            ]
            assert reconciler.runtime is interceptor.runtime
            for tier, name in enumerate(names, start=1):
                kept = reconciler.runtime.recoverable(name)
                assert kept is not None and isinstance(kept.target, DeclaredTarget)
                payments = services[tier]
                sends = {
                    n
                    for n in dir(payments)
                    if not n.startswith("_") and callable(getattr(payments, n))
                } - {"capture", "query", "validate", "classify", "clock", "confirmation"}
                assert "refund" in sends
                assert not [n for n in sends if hasattr(kept.target, n)]
                held = [*vars(kept).values(), *vars(kept.target).values()]
                assert not [v for v in held if v is payments or v is activities[tier - 1]]
                assert not [v for v in held if getattr(v, "__wrapped__", None) is not None]

        outcomes = {o.effect_id: o for o in report.outcomes}
        for (state, tier), eid in effects.items():
            expected = STATES[state][tier - 1]
            if expected is None:
                assert eid not in outcomes, outcomes.get(eid)
                assert receipt(eid, journal=journal).final == "COMMITTED"
                continue
            outcome = outcomes[eid]
            assert (outcome.final, outcome.via or outcome.code) == expected, (state, tier)
            if outcome.final == "AMBIGUOUS":
                assert outcome.review == review_id("ambiguous", eid)
                await close_review(client, eid)

        # the money, read from each payments service: the reconciler sent nothing, and no
        # gated body ran
        assert {t: (p.calls(ORDER), p.refunded_cents(ORDER)) for t, p in services.items()} == sent
        assert {t: len(p.refund_records(ORDER)) for t, p in services.items()} == {
            t: 2 for t in (1, 2, 3)
        }
        assert bodies == []
    finally:
        journal.close()
        for payments in services.values():
            payments.close()
