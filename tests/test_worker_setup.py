"""Setting up a worker as the card shows it, on a real server: ``gated(refund)`` and bare
``@gated`` with the target bound by the plugin; the plain interceptor, refused bare and working
end to end through ``worker_options``; what the worker's logs say (the journal it uses, a
missing heartbeat timeout, refusals without a traceback, AMBIGUOUS as one line naming its
review); and a worker process that exits with nothing printed about OpenTelemetry contexts."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationErrorCategory
from temporalio.service import RPCError
from temporalio.worker import Worker

from interlock_temporal import (
    ApprovalRequired,
    EffectRefused,
    InterlockDenied,
    InterlockInterceptor,
    InterlockPlugin,
    current_effect,
    gated,
)
from interlock_temporal._worker.runtime import WorkerSetupError
from interlock_temporal.core.errors import Denied
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.review import review_id
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer

from .plain_workflows import PlainRefund
from .server_workflows import CallActivity
from .waiting import until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
KEY = "11" * 32
ORDER = "881"


def refund_activity(payments: SimulatedPayments) -> Any:
    """The refund as a newcomer writes it: a plain activity, no gate and no target."""

    @activity.defn(name="refund")
    async def refund(r: RefundRequest) -> RefundResult:
        return await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    return refund


def refund_key(r: RefundRequest) -> dict[str, str]:
    return {"case": r.case_id, "order": r.order_id}


@dataclass
class Setup:
    client: Client
    queue: str
    payments: SimulatedPayments
    journal: Journal
    lease: str
    case: str

    def request(self) -> RefundRequest:
        return RefundRequest(case_id=self.case, order_id=ORDER, amount_cents=2000)

    async def call(self, **spec: Any) -> Any:
        return await self.client.execute_workflow(
            CallActivity.run,
            {"activity": "refund", "arg": self.request(), **spec},
            id=f"call-{uuid.uuid4().hex[:8]}",
            task_queue=self.queue,
        )

    def committed_once(self) -> None:
        """The refund landed once: read from the service's own records and the journal."""
        assert self.payments.refunded_cents(ORDER) == 2000
        assert len(self.payments.refund_records(ORDER)) == 1
        (row,) = self.journal.effects()
        assert row.status is Kind.COMMITTED


def payments_in(tmp_path: Path, tier: int = 2) -> SimulatedPayments:
    payments = SimulatedPayments(tmp_path / "payments.db", tier=tier)
    payments.open_order(ORDER, 10_000)
    return payments


@asynccontextmanager
async def plugin_worker(
    dev_server: DevServer,
    tmp_path: Path,
    activities: list[Any],
    *,
    payments: SimulatedPayments,
    **plugin: Any,
) -> AsyncIterator[Setup]:
    journal = open_journal(tmp_path / "journal.db", signing_key=KEY)
    lease = journal.leases.issue("refund-bot", activities=["refund"])
    client = await Client.connect(
        dev_server.target,
        plugins=[
            InterlockPlugin(f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY, **plugin)
        ],
    )
    queue = f"setup-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[CallActivity], activities=activities):
        yield Setup(client, queue, payments, journal, lease, f"c-{uuid.uuid4().hex[:8]}")
    journal.close()
    payments.close()


# -- gated(refund) and bare @gated, the target bound by the plugin ---------------------------


def called_shape(payments: SimulatedPayments) -> Any:
    return gated(refund_activity(payments), key=refund_key, amount=lambda r: r.amount_cents)


def bare_shape(payments: SimulatedPayments) -> Any:
    @activity.defn(name="refund")
    @gated
    async def refund(r: RefundRequest) -> RefundResult:
        return await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    return refund


@pytest.mark.parametrize("shape", [called_shape, bare_shape], ids=["gated(refund)", "@gated"])
async def test_a_gated_activity_bound_through_the_plugin_lands_once(
    dev_server: DevServer, tmp_path: Path, shape: Callable[[SimulatedPayments], Any]
) -> None:
    payments = payments_in(tmp_path)
    refund = shape(payments)
    async with plugin_worker(
        dev_server, tmp_path, [refund], payments=payments, targets={"refund": payments}
    ) as s:
        first = await s.call(principal="refund-bot", lease=s.lease, heartbeat_s=2)
        again = await s.call(principal="refund-bot", lease=s.lease, heartbeat_s=2)
        assert first["amount_cents"] == 2000 and again["refund_id"] == first["refund_id"]
        s.committed_once()
        (row,) = s.journal.effects()
        proposed = s.journal.read(row.effect_id)[0]
        assert proposed.data["target"] == "payments"  # the target the plugin bound
        if shape is called_shape:  # the key declared in gated(refund, key=...) names it
            assert row.effect_id == effect_id("refund", refund_key(s.request()))


async def test_gated_refund_keeps_the_activity_and_its_name(tmp_path: Path) -> None:
    payments = payments_in(tmp_path)
    plain = refund_activity(payments)
    wrapped = gated(plain)
    assert activity_name(wrapped) == "refund"
    assert wrapped is not plain and activity_name(plain) == "refund"  # the original is untouched
    with pytest.raises(TypeError, match="'refund' is gated already"):
        gated(wrapped)
    payments.close()


def activity_name(fn: Any) -> str | None:
    from temporalio.activity import _Definition

    return _Definition.must_from_callable(fn).name


async def test_a_gated_activity_bound_nowhere_refuses_the_worker(
    client: Client, tmp_path: Path
) -> None:
    payments = payments_in(tmp_path)
    plugin = InterlockPlugin(f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY)
    with pytest.raises(WorkerSetupError) as refused:
        Worker(
            client,
            task_queue="never-runs",
            activities=[gated(refund_activity(payments))],
            plugins=[plugin],
        )
    assert str(refused.value) == (
        "gated activity 'refund' has no target: bind one on the worker, "
        "InterlockPlugin(targets={'refund': your_target}) (or InterlockInterceptor(targets=...)), "
        "or declare it where the activity is, @gated(target=your_target)"
    )
    payments.close()


async def test_a_target_declared_and_bound_to_another_refuses_the_worker(
    client: Client, tmp_path: Path
) -> None:
    payments = payments_in(tmp_path)
    other = SimulatedPayments(tmp_path / "other.db", tier=2)
    plugin = InterlockPlugin(
        f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY, targets={"refund": other}
    )
    declared = gated(refund_activity(payments), target=payments)
    with pytest.raises(WorkerSetupError, match=r"declares its target in @gated\(target=...\)"):
        Worker(client, task_queue="never-runs", activities=[declared], plugins=[plugin])
    # the same target in both places is no conflict
    same = InterlockPlugin(
        f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY, targets={"refund": payments}
    )
    Worker(client, task_queue="never-runs", activities=[declared], plugins=[same])
    payments.close()
    other.close()


# -- the plain interceptor -------------------------------------------------------------------


async def test_a_bare_interceptor_refuses_the_worker_saying_what_to_add(
    client: Client, tmp_path: Path
) -> None:
    payments = payments_in(tmp_path)
    interceptor = InterlockInterceptor(f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY)
    with pytest.raises(WorkerSetupError) as refused:
        Worker(
            client,
            task_queue="never-runs",
            workflows=[PlainRefund],
            activities=[gated(refund_activity(payments), target=payments)],
            interceptors=[interceptor],
        )
    message = str(refused.value)
    assert message.startswith("InterlockInterceptor alone does not install the gate")
    assert "EffectReview workflow and its activity" in message
    assert "plugins=[InterlockPlugin(...)]" in message
    assert "Worker(**interceptor.worker_options(client, task_queue=..." in message
    payments.close()


async def test_worker_options_needs_the_pydantic_converter(
    dev_server: DevServer, tmp_path: Path
) -> None:
    plain_client = await Client.connect(dev_server.target)
    interceptor = InterlockInterceptor(f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY)
    with pytest.raises(WorkerSetupError, match=r"data_converter=pydantic_data_converter"):
        interceptor.worker_options(plain_client, task_queue="never-runs")


async def test_the_interceptor_without_the_plugin_runs_end_to_end(
    client: Client, tmp_path: Path
) -> None:
    """No plugin anywhere: a worker built with ``worker_options`` carries act_as from a workflow
    that imports it without passthrough, opens the review of an effect in doubt, runs it, and
    records the person's decision; the workflow then completes."""
    payments = payments_in(tmp_path, tier=3)
    journal = open_journal(tmp_path / "journal.db", signing_key=KEY)
    lease = journal.leases.issue("refund-bot", activities=["refund"])
    interceptor = InterlockInterceptor(
        f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY, targets={"refund": payments}
    )
    refund = gated(refund_activity(payments), key=refund_key)
    queue = f"plain-{uuid.uuid4().hex[:8]}"
    case = f"c-{uuid.uuid4().hex[:8]}"
    request = RefundRequest(case_id=case, order_id=ORDER, amount_cents=2000)
    eid = effect_id("refund", refund_key(request))
    payments.arm("after_commit", "reset")  # the refund lands, the answer is lost: in doubt
    options = interceptor.worker_options(
        client, task_queue=queue, workflows=[PlainRefund], activities=[refund]
    )
    async with Worker(**options):
        handle = await client.start_workflow(
            PlainRefund.run,
            {
                "activity": "refund",
                "arg": request,
                "principal": "refund-bot",
                "lease": lease,
                "maximum_attempts": 1,
            },
            id=f"plain-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        review = client.get_workflow_handle(review_id("ambiguous", eid))

        async def running() -> bool:
            try:
                return (await review.describe()).status == WorkflowExecutionStatus.RUNNING
            except RPCError:
                return False

        await until(running)
        page = (await review.query("__temporal_workflow_metadata")).current_details
        # the lease limits nothing but the activity: the page says so in words
        assert f'lease `{lease}` held by `refund-bot`: activities `["refund"]`, no maximum ' in page
        assert "any resource" in page and "None" not in page
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        assert await asyncio.wait_for(handle.result(), 30) is None  # happened, no result given
    entries = journal.read(eid)
    assert entries[0].data["principal"] == "refund-bot"  # act_as reached the activity
    assert entries[-1].kind is Kind.RESOLVED and entries[-1].data["operator"] == "carol"
    assert payments.refunded_cents(ORDER) == 2000 and len(payments.refund_records(ORDER)) == 1
    journal.close()
    payments.close()


# -- what the worker's logs say ----------------------------------------------------------------


async def test_the_plugin_honours_interlock_journal_and_logs_it_once(
    dev_server: DevServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setenv("INTERLOCK_JOURNAL", f"sqlite:///{tmp_path / 'from-env.db'}")
    monkeypatch.setenv("INTERLOCK_SIGNING_KEY", KEY)
    caplog.set_level(logging.INFO, logger="interlock_temporal")
    plugin = InterlockPlugin()
    client = await Client.connect(dev_server.target, plugins=[plugin])
    for queue in ("env-a", "env-b"):  # two workers of one plugin: one line
        async with Worker(
            client, task_queue=f"{queue}-{uuid.uuid4().hex[:6]}", workflows=[CallActivity]
        ):
            pass
    lines = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("interlock: journal")
    ]
    assert lines == [
        f"interlock: journal sqlite:///{tmp_path / 'from-env.db'} (from INTERLOCK_JOURNAL)"
    ]
    assert (tmp_path / "from-env.db").exists()


async def test_the_default_journal_is_logged_with_its_full_path(
    dev_server: DevServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.delenv("INTERLOCK_JOURNAL", raising=False)
    monkeypatch.setenv("INTERLOCK_SIGNING_KEY", KEY)
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="interlock_temporal")
    client = await Client.connect(dev_server.target, plugins=[InterlockPlugin()])
    async with Worker(
        client, task_queue=f"default-{uuid.uuid4().hex[:6]}", workflows=[CallActivity]
    ):
        pass
    (line,) = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("interlock: journal")
    ]
    assert line.startswith(f"interlock: journal sqlite:///{tmp_path / 'interlock.db'} (the default")
    assert "INTERLOCK_JOURNAL" in line
    assert (tmp_path / "interlock.db").exists()


def gate_warnings(caplog: Any) -> list[str]:
    """The gate's warnings about how activities are scheduled (not the one a worker gives at
    start about a journal without an operator roster, which tests/test_vote_proofs.py checks)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "interlock_temporal"
        and r.levelno == logging.WARNING
        and "no operator roster" not in r.getMessage()
    ]


async def test_no_heartbeat_timeout_warns_once_per_activity_type(
    dev_server: DevServer, tmp_path: Path, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, logger="interlock_temporal")
    payments = payments_in(tmp_path)
    refund = gated(refund_activity(payments), target=payments, key=refund_key)
    async with plugin_worker(dev_server, tmp_path, [refund], payments=payments) as s:
        await s.call(principal="refund-bot", lease=s.lease)  # start_to_close 10 s, no heartbeat
        s.case = f"c-{uuid.uuid4().hex[:8]}"
        await s.call(principal="refund-bot", lease=s.lease)
        s.case = f"c-{uuid.uuid4().hex[:8]}"
        await s.call(principal="refund-bot", lease=s.lease, heartbeat_s=2)
        assert payments.refunded_cents(ORDER) == 6000  # three cases, three refunds
    assert gate_warnings(caplog) == [
        "gated activity 'refund' was scheduled without heartbeat_timeout: if its worker dies "
        "mid-send, the next attempt (and its recovery) waits for start_to_close_timeout (10s). "
        "Pass heartbeat_timeout=timedelta(seconds=2) (or a few seconds) where the workflow "
        "schedules it; the gate heartbeats on the body's behalf"
    ]


def test_expected_decisions_are_benign_application_errors() -> None:
    assert EffectRefused("lease_revoked: ...", None).category is ApplicationErrorCategory.BENIGN
    denied = InterlockDenied(Denied("DENY_RULE", "no", "p", None))
    assert denied.category is ApplicationErrorCategory.BENIGN
    assert ApprovalRequired("HITL", "ask", "b").category is ApplicationErrorCategory.BENIGN


def activity_failures(caplog: Any) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "temporalio.activity" and "Completing activity as failed" in r.getMessage()
    ]


async def test_a_refusal_logs_no_traceback_and_ambiguous_logs_one_line_with_its_review(
    dev_server: DevServer, tmp_path: Path, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, logger="temporalio.activity")
    payments = payments_in(tmp_path, tier=3)
    refund = gated(refund_activity(payments), target=payments, key=refund_key)
    async with plugin_worker(dev_server, tmp_path, [refund], payments=payments) as s:
        with pytest.raises(WorkflowFailureError):  # no act_as: refused
            await s.call(heartbeat_s=2)
        (refused,) = activity_failures(caplog)
        assert refused.levelno == logging.DEBUG  # the SDK's record, downgraded: no warning
        caplog.clear()
        payments.arm("after_commit", "reset")
        s.case = f"c-{uuid.uuid4().hex[:8]}"
        with pytest.raises(WorkflowFailureError):  # in doubt on the only attempt: AMBIGUOUS
            await s.call(principal="refund-bot", lease=s.lease, heartbeat_s=2, maximum_attempts=1)
        eid = effect_id("refund", refund_key(s.request()))
    (ambiguous,) = activity_failures(caplog)
    assert ambiguous.levelno == logging.WARNING  # still a failure a person must see
    assert ambiguous.exc_info is None
    text = ambiguous.getMessage()
    assert "AmbiguousEffect: " in text and f"review {review_id('ambiguous', eid)}" in text
    assert "Traceback" not in caplog.text and "\n" not in text


# -- a clean exit ------------------------------------------------------------------------------


#: the SDK's own crash at interpreter exit, now and then, when its Rust runtime's threads outlive
#: the interpreter (temporalio/sdk-python#300): a process that died of it did not finish its
#: exit, so it tells nothing about what that exit prints; such a run is made again. It shows as
#: an abort naming the GIL, or (seen once in CI, stderr empty) as a segmentation fault.
KNOWN_ABORT = "Fatal Python error: PyGILState_Release"


def died_of_the_sdk_exit_crash(done: subprocess.CompletedProcess[str]) -> bool:
    """True if a worker that printed STOPPED was killed on its way out by the SDK's exit crash."""
    aborted = done.returncode == -signal.SIGABRT and KNOWN_ABORT in done.stderr
    return aborted or done.returncode == -signal.SIGSEGV


def run_exit_worker(dev_server: DevServer, tmp_path: Path, *flags: str) -> str:
    """The stderr of a worker process that stopped and exited all the way."""
    for attempt in range(3):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.exit_worker",
                dev_server.target,
                str(tmp_path / f"j{attempt}.db"),
                *flags,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "STOPPED" in done.stdout, done.stderr
        if done.returncode == 0:
            return done.stderr
        assert died_of_the_sdk_exit_crash(done), (done.returncode, done.stderr)
    raise AssertionError("the worker process never exited all the way")


def test_a_worker_exits_without_failing_to_detach_an_opentelemetry_context(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """A workflow still cached when its worker stops (a review nobody decided) is closed by the
    plugin, in its own context; without the plugin the SDK leaves it to the garbage collector
    at exit, and OpenTelemetry prints "Failed to detach context" (the check has teeth)."""
    clean = run_exit_worker(dev_server, tmp_path / "with")
    assert "Failed to detach context" not in clean
    assert "Traceback" not in clean
    control = run_exit_worker(dev_server, tmp_path / "without", "--without-interlock")
    assert "Failed to detach context" in control
