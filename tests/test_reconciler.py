"""No effect stays in doubt unseen: effects left DISPATCHED by a cancelled workflow or by
retries that ran out are recovered by the reconciler, ending COMMITTED where the target can say
so and in an open review where it cannot. Real worker processes, real SIGKILLs."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from interlock_temporal._review import Reconciler, ReconcileReport, ReconcileRequest
from interlock_temporal.core.errors import Ambiguous
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.receipts import receipt
from interlock_temporal.core.review import review_id
from interlock_temporal.testing import DevServer
from workers.inprocess_world import refund_call
from workers.scenarios import ORDER
from workers.server_world import ServerWorld
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


@pytest.mark.parametrize(
    ("tier", "point", "final", "via", "cents"),
    [
        (2, "after_commit", "COMMITTED", "recovery-query", 2000),
        (2, "before_send", "COMMITTED", "recovery-reapply", 2000),
        (3, "after_commit", "AMBIGUOUS", None, 2000),
    ],
)
async def test_a_workflow_cancelled_while_its_effect_is_in_doubt(
    client: Client,
    tmp_path: Path,
    tier: int,
    point: str,
    final: str,
    via: str | None,
    cents: int,
) -> None:
    world = await ServerWorld.create(client, tmp_path, tier, "gated")
    try:
        world.setup()
        world.payments.arm(point, "kill")  # type: ignore[arg-type]
        # a long heartbeat timeout: the server schedules no retry before the cancellation
        # lands, so what settles the effect is the reconciler, not a late retry
        run = await world.start(world.case(heartbeat_s=60.0, start_to_close_s=120.0))
        await world.crashed(run)
        await run.cancel()
        await world.restart()  # a worker must run the workflow's code for it to be cancelled
        with pytest.raises(WorkflowFailureError):
            await run.result()
        eid = world.effect_id
        assert world.journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]

        report = await reconcile(client, world.task_queue)
        (outcome,) = [o for o in report.outcomes if o.effect_id == eid]
        assert (outcome.final, outcome.via) == (final, via), outcome
        assert world.journal.in_doubt() == []
        assert world.payments.refunded_cents(ORDER) == cents
        assert len(world.payments.refund_records(ORDER)) == 1
        if final == "AMBIGUOUS":
            assert outcome.review == review_id("ambiguous", eid)
            review = client.get_workflow_handle(outcome.review)
            assert (await review.describe()).status == WorkflowExecutionStatus.RUNNING
            await review.terminate()  # the server outlives this test: leave no review behind
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

        # an effect dispatched by a worker that then vanished: recorded, claim released
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
        assert row.status is Kind.COMMITTED
        assert receipt(eid, journal=r.journal).via == "recovery-reapply"
        assert r.payments.refunded_cents(ORDER) == 2000
        await scheduled.terminate()


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
