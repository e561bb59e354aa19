"""The gate on a real Temporal server: real worker processes killed with SIGKILL for one row per
tier, and in-process workers for the adapter's edges (no plugin, bad input, thread-pool
activities, act_as through child workflows, a journal that cannot be written, codecs)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.worker import Worker

from interlock_temporal import (
    InterlockInterceptor,
    InterlockPlugin,
    current_effect,
    gated,
    receipt,
)
from interlock_temporal._worker.plugin import _with_pydantic
from interlock_temporal.core.errors import LeaseOverGrant
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer
from workers.scenarios import SCENARIOS, run_in
from workers.server_world import ServerWorld
from workers.world import ORDER, the_effect_id
from workflows.activities import REFUND_EFFECT, support_activities
from workflows.support_case import CaseFile, CaseOutcome, SupportCase

from .server_workflows import ApprovedCall, CallActivity, ParentActsAs, PlannerDelegates, RunCalls

pytestmark = pytest.mark.server


# -- one real-kill row per tier, with worker processes ------------------------------------


@pytest.mark.parametrize(
    ("name", "tier"),
    [("crash_before_ack", 1), ("crash_before_send", 2), ("refund_during_outage", 3)],
)
async def test_real_kill_row(client: Client, tmp_path: Path, name: str, tier: int) -> None:
    world = await ServerWorld.create(client, tmp_path, tier, "gated")
    result = await run_in(world, name)
    assert result["ok"], result["problems"]
    assert result["kills"] == 1
    expected = SCENARIOS[name].expect[tier]
    # the money, read again from the service's own file, not from the gate or the runner
    payments = SimulatedPayments(tmp_path / "payments.db", tier=tier)
    assert payments.refunded_cents(ORDER) == expected.refunded_cents
    assert len(payments.refund_records(ORDER)) == expected.records
    with open_journal(tmp_path / "journal.db", create=False) as journal:
        assert journal.verify().ok
        assert receipt(result["effect_id"], journal=journal).final == expected.final


# -- in-process workers for the adapter's edges --------------------------------------------


@dataclass
class Rig:
    client: Client
    task_queue: str
    payments: SimulatedPayments
    journal: Journal
    lease_id: str

    def request(self, amount_cents: int = 2000) -> RefundRequest:
        return RefundRequest(
            case_id="4471",
            order_id=ORDER,
            amount_cents=amount_cents,
            premises=self.payments.order_facts(ORDER),
        )

    async def call(self, activity_name: str, arg: Any, **spec: Any) -> Any:
        return await self.client.execute_workflow(
            CallActivity.run,
            {"activity": activity_name, "arg": arg, **spec},
            id=f"call-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
        )


def sync_refund_activity(payments: SimulatedPayments) -> Any:
    @activity.defn(name="refund_sync")
    @gated(target=payments, **REFUND_EFFECT)
    def refund_sync(r: RefundRequest) -> RefundResult:
        return payments.refund_sync(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    return refund_sync


@asynccontextmanager
async def rig(
    dev_server: DevServer,
    tmp_path: Path,
    *,
    plugin: bool = True,
    journal_options: str = "",
    converter: DataConverter = pydantic_data_converter,
    extra: Sequence[Any] = (),
    tier: int = 2,
    plugin_options: dict[str, Any] | None = None,
) -> AsyncIterator[Rig]:
    db = tmp_path / "journal.db"
    journal = open_journal(db, signing_key="11" * 32)
    lease = journal.leases.issue(
        "refund-bot",
        activities=["refund", "refund_sync"],
        max_amount_cents=5000,
        resources=[f"order:{ORDER}"],
    )
    payments = SimulatedPayments(tmp_path / "payments.db", tier=tier)
    payments.open_order(ORDER, 10_000)
    plugins = (
        [
            InterlockPlugin(
                f"sqlite:///{db}{journal_options}",
                signing_key="11" * 32,
                **(plugin_options or {}),
            )
        ]
        if plugin
        else []
    )
    client = await Client.connect(dev_server.target, data_converter=converter, plugins=plugins)
    queue = f"rig-{uuid.uuid4().hex[:10]}"
    activities = [*support_activities(payments), sync_refund_activity(payments), *extra]
    with ThreadPoolExecutor(4) as executor:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[
                ApprovedCall,
                CallActivity,
                ParentActsAs,
                PlannerDelegates,
                RunCalls,
                SupportCase,
            ],
            activities=activities,
            activity_executor=executor,
        ):
            yield Rig(client, queue, payments, journal, lease)
    journal.close()
    payments.close()


def cause_of(err: BaseException) -> ApplicationError:
    """The gate's error a workflow's activity failed with (through a child workflow too)."""
    assert isinstance(err, WorkflowFailureError)
    activity_error = err.cause
    if isinstance(activity_error, ChildWorkflowError):
        activity_error = activity_error.cause
    assert isinstance(activity_error, ActivityError), activity_error
    assert isinstance(activity_error.cause, ApplicationError), activity_error.cause
    return activity_error.cause


def test_a_workers_journal_never_holds_the_workers_loop_for_a_flush(tmp_path: Path) -> None:
    opened = InterlockInterceptor(f"sqlite:///{tmp_path / 'a.db'}", signing_key="11" * 32)
    assert opened.journal.loop_shared
    given = open_journal(tmp_path / "b.db", signing_key="11" * 32)
    assert not given.loop_shared  # a script or a CLI may flush on its own loop
    assert InterlockInterceptor(given).journal is given
    assert given.loop_shared
    opened.journal.close()
    given.close()


async def test_each_worker_of_a_plugin_gets_its_own_runtime(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """One plugin on a client that builds two workers: each worker's interceptor, review desk
    and reconciler run on that worker's own runtime (its client, the gated activities it runs),
    and both workers share the plugin's one journal."""
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    plugin = InterlockPlugin(f"sqlite:///{tmp_path / 'journal.db'}", signing_key="11" * 32)
    client = await Client.connect(
        dev_server.target, data_converter=pydantic_data_converter, plugins=[plugin]
    )

    def interceptor_of(worker: Worker) -> InterlockInterceptor:
        config = worker.config(active_config=True)
        (interceptor,) = [
            i for i in config.get("interceptors", []) if isinstance(i, InterlockInterceptor)
        ]
        return interceptor

    def runtime_of(worker: Worker) -> Any:
        config = worker.config(active_config=True)
        (reconcile,) = [
            a for a in config["activities"] if getattr(a, "__name__", "") == "reconcile"
        ]
        assert reconcile.__self__.runtime is interceptor_of(worker).runtime
        return interceptor_of(worker).runtime

    with ThreadPoolExecutor(2) as executor:
        refunds = Worker(client, task_queue="a", activities=support_activities(payments))
        syncs = Worker(
            client,
            task_queue="b",
            activities=[sync_refund_activity(payments)],
            activity_executor=executor,
        )
    assert interceptor_of(refunds) is not interceptor_of(syncs)
    a, b = runtime_of(refunds), runtime_of(syncs)
    assert a is not b
    assert a.recoverable("refund") is not None and a.recoverable("refund_sync") is None
    assert b.recoverable("refund") is None and b.recoverable("refund_sync") is not None
    assert a.client is client and b.client is client
    assert a.gate is b.gate  # one journal for the plugin's workers
    a.gate.journal.close()
    payments.close()


async def test_gated_activity_without_the_plugin_never_runs_its_body(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, plugin=False) as r:
        with pytest.raises(WorkflowFailureError) as failure:
            await r.call("refund", r.request(), principal="refund-bot", lease=r.lease_id)
        cause = cause_of(failure.value)
        assert cause.type == "InterlockNotInstalled"
        assert cause.non_retryable
        assert r.payments.calls() == 0
        assert r.journal.effects() == []


async def test_invalid_input_fails_once_naming_the_field_not_the_value(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path) as r:
        bad = {"case_id": "4471", "order_id": ORDER, "amount_cents": "a-secret-amount"}
        with pytest.raises(WorkflowFailureError) as failure:
            await r.call("refund", bad, principal="refund-bot", lease=r.lease_id)
        cause = cause_of(failure.value)
        assert cause.type == "InvalidEffectInput" and cause.non_retryable
        assert "r.amount_cents" in cause.message
        assert "a-secret-amount" not in cause.message
        assert r.payments.calls() == 0
        assert r.journal.effects() == []


async def test_no_act_as_is_refused_with_a_receipt(dev_server: DevServer, tmp_path: Path) -> None:
    async with rig(dev_server, tmp_path) as r:
        with pytest.raises(WorkflowFailureError) as failure:
            await r.call("refund", r.request())
        cause = cause_of(failure.value)
        assert cause.type == "EffectRefused" and cause.non_retryable
        assert "act_as" in cause.message
        details = list(cause.details)
        assert details[0]["final"] == "REFUSED" and details[0]["executed"] is False
        assert r.payments.calls() == 0


async def test_thread_pool_gated_activity(dev_server: DevServer, tmp_path: Path) -> None:
    async with rig(dev_server, tmp_path) as r:
        result = await r.call("refund_sync", r.request(), principal="refund-bot", lease=r.lease_id)
        assert result["amount_cents"] == 2000
        again = await r.call("refund_sync", r.request(), principal="refund-bot", lease=r.lease_id)
        assert again["refund_id"] == result["refund_id"]
        assert r.payments.calls() == 1 and r.payments.refunded_cents(ORDER) == 2000
        (row,) = r.journal.effects()
        assert row.effect_type == "refund_sync" and row.status is Kind.COMMITTED


async def test_act_as_reaches_activities_of_child_workflows(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path) as r:
        workflow_id = f"parent-{uuid.uuid4().hex[:8]}"
        await r.client.execute_workflow(
            ParentActsAs.run,
            {
                "activity": "refund",
                "arg": r.request(),
                "principal": "refund-bot",
                "lease": r.lease_id,
            },
            id=workflow_id,
            task_queue=r.task_queue,
        )
        (row,) = r.journal.effects()
        proposed = r.journal.read(row.effect_id)[0]
        assert proposed.kind is Kind.PROPOSED
        assert proposed.data["principal"] == "refund-bot"
        assert proposed.data["lease_id"] == r.lease_id
        assert proposed.data["delivery"]["workflow_id"] == f"{workflow_id}-child"
        assert r.payments.refunded_cents(ORDER) == 2000


async def test_a_sub_agent_acts_under_a_lease_delegated_from_its_planners(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """A planner's child workflow acts as its sub-agent under a lease issued from the planner's
    (narrower: a $30 budget of the planner's $50): its refund is sent and its receipt shows the
    chain; one over what the planner's budget has left is refused at dispatch; once the
    planner's lease is revoked, the sub-agent's next refund is refused. Money read from the
    payments service."""
    async with rig(dev_server, tmp_path) as r:
        leases = r.journal.leases
        planner = leases.issue("planner", activities=["refund"], budget_cents=5000)
        with pytest.raises(LeaseOverGrant) as wider:
            leases.issue("sub-agent", parent=planner, budget_cents=6000)
        assert wider.value.field == "budget_cents" and "6000" not in str(wider.value)
        sub = leases.issue("sub-agent", parent=planner, budget_cents=3000)
        other = leases.issue("helper-agent", parent=planner, budget_cents=3000)

        async def sub_agent(lease: str, cents: int, case: str) -> Any:
            request = r.request(cents).model_copy(update={"case_id": case})
            return await r.client.execute_workflow(
                PlannerDelegates.run,
                {
                    "planner": "planner",
                    "planner_lease": planner,
                    "activity": "refund",
                    "arg": request,
                    "principal": "sub-agent" if lease == sub else "helper-agent",
                    "lease": lease,
                },
                id=f"planner-{uuid.uuid4().hex[:8]}",
                task_queue=r.task_queue,
            )

        first = await sub_agent(sub, 2500, "c1")
        assert r.payments.refunded_cents(ORDER) == 2500
        (row,) = r.journal.effects()
        assert receipt(row.effect_id, journal=r.journal).lease_chain == [planner, sub]
        assert first["amount_cents"] == 2500
        # the helper's own budget ($30) covers $30; the planner's has $25 left: refused
        with pytest.raises(WorkflowFailureError) as over:
            await sub_agent(other, 3000, "c2")
        assert f"the budget of ancestor lease {planner}" in str(cause_of(over.value))
        assert r.payments.refunded_cents(ORDER) == 2500
        leases.revoke(planner)
        with pytest.raises(WorkflowFailureError) as revoked:
            await sub_agent(sub, 100, "c3")
        assert f"ancestor lease {planner} revoked" in str(cause_of(revoked.value))
        assert r.payments.refunded_cents(ORDER) == 2500 and r.payments.calls() == 1
        assert r.journal.verify().ok


async def test_unwritable_journal_sends_nothing_until_it_can_record(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, journal_options="?busy_timeout=0.2") as r:
        blocker = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        handle = await r.client.start_workflow(
            SupportCase.run,
            CaseFile(case_id="4471", order_id=ORDER, amount_cents=2000, lease_id=r.lease_id),
            id=f"case-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        failures: set[str] = set()
        for _ in range(60):
            description = await handle.describe()
            for pending in description.raw_description.pending_activities:
                failures.add(pending.last_failure.application_failure_info.type)
            if "InterlockJournalUnavailable" in failures:
                break
            await asyncio.sleep(0.1)
        assert "InterlockJournalUnavailable" in failures
        assert r.payments.calls() == 0  # nothing was sent while the intent could not be written
        blocker.execute("ROLLBACK")
        blocker.close()
        outcome: CaseOutcome = await asyncio.wait_for(handle.result(), 30)
        assert outcome.status == "REFUNDED"
        assert r.payments.calls() == 1 and r.payments.refunded_cents(ORDER) == 2000


class MarkingCodec(PayloadCodec):
    """A stand-in for an encryption codec: wraps every payload so the history shows it."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(metadata={"encoding": b"binary/marked"}, data=p.SerializeToString())
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            inner = Payload()
            inner.ParseFromString(p.data)
            out.append(inner)
        return out


def test_plugin_keeps_a_codec_and_a_custom_converter() -> None:
    codec = MarkingCodec()
    combined = _with_pydantic(DataConverter(payload_codec=codec))
    assert combined.payload_codec is codec
    assert combined.payload_converter_class is PydanticPayloadConverter
    custom = DataConverter(payload_converter_class=PydanticPayloadConverter)
    assert _with_pydantic(custom) is custom
    assert _with_pydantic(None) is pydantic_data_converter


async def test_plugin_runs_with_a_user_codec(dev_server: DevServer, tmp_path: Path) -> None:
    converter = DataConverter(payload_codec=MarkingCodec())
    async with rig(dev_server, tmp_path, converter=converter) as r:
        assert r.client.data_converter.payload_codec is not None
        handle = await r.client.start_workflow(
            SupportCase.run,
            CaseFile(case_id="4471", order_id=ORDER, amount_cents=2000, lease_id=r.lease_id),
            id=f"case-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        outcome = await handle.result()
        assert outcome.status == "REFUNDED"
        history = await handle.fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        assert started.input.payloads[0].metadata["encoding"] == b"binary/marked"


@pytest.mark.parametrize(
    ("maximum_attempts", "final", "via"),
    [(1, "AMBIGUOUS", None), (0, "COMMITTED", "recovery-query")],
)
async def test_a_send_in_doubt_on_the_last_attempt_is_ambiguous(
    dev_server: DevServer, tmp_path: Path, maximum_attempts: int, final: str, via: str | None
) -> None:
    """The refund lands and the connection drops: with no attempt left the gate cannot ask
    again, so it says AMBIGUOUS; with retries left, the next attempt finds the refund."""
    async with rig(dev_server, tmp_path) as r:
        r.payments.arm("after_commit", "reset")
        outcome = await r.client.execute_workflow(
            SupportCase.run,
            CaseFile(
                case_id="4471",
                order_id=ORDER,
                amount_cents=2000,
                lease_id=r.lease_id,
                maximum_attempts=maximum_attempts,
            ),
            id=f"case-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        assert outcome.status == ("REFUNDED" if final == "COMMITTED" else final)
        shown = receipt(the_effect_id(), journal=r.journal)
        assert (shown.final, shown.via) == (final, via)
        assert shown.executed == (True if final == "COMMITTED" else "unknown")
        assert r.payments.refunded_cents(ORDER) == 2000
        assert len(r.payments.refund_records(ORDER)) == 1
