"""Authority cannot be forged from outside a worker: on a real Temporal server, with real worker
processes, workflows started with the ``temporal`` CLI carrying a forged authority header, or a
signed one copied from another workflow's history, send nothing and say why; so do standalone
activities a client starts. ``act_as``, child workflows, continue-as-new and a journal key
rotation between two attempts still work. Money is read from the payments service."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import ActivityFailureError, Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Replayer

from interlock_temporal import InterlockPlugin, receipt
from interlock_temporal.core.authority import Authority, AuthorityKeys, ContinueAsNewBinding
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.journal.signing import HmacKey, Keyring
from interlock_temporal.core.models import Kind
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer, WorkerProcess, temporal_cli
from workers.scenarios import the_effect_id
from workflows.support_case import PRINCIPAL, CaseFile, CaseOutcome

from .server_workflows import CallActivity, ContinuedActsAs, ParentActsAs

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
HEADER = "interlock-authority"
KEY_A = "a1" * 32
KEY_B = "b2" * 32
WORKFLOWS = [
    f"tests.server_workflows:{name}" for name in ("CallActivity", "ParentActsAs", "ContinuedActsAs")
]
AMOUNT = 2000
RESULT_TIMEOUT_S = 90.0


@dataclass
class Site:
    """One journal, one payments service, worker processes polling one task queue."""

    server: DevServer
    client: Client
    workdir: Path
    task_queue: str = field(default_factory=lambda: f"authority-{uuid.uuid4().hex[:10]}")
    workers: list[WorkerProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.journal_path = self.workdir / "journal.db"
        self.journal: Journal = open_journal(self.journal_path, signing_key=KEY_A)
        self.payments = SimulatedPayments(self.workdir / "payments.db", tier=2)
        self.lease_id = self.journal.leases.issue(
            PRINCIPAL, activities=["refund"], max_amount_cents=5000
        )

    async def worker(self, key: str = KEY_A, older: tuple[str, ...] = (), *extra: str) -> Any:
        process = WorkerProcess(
            [
                "-m",
                "workers.worker",
                "--target",
                self.server.target,
                "--task-queue",
                self.task_queue,
                "--journal",
                f"sqlite:///{self.journal_path}",
                "--payments",
                str(self.workdir / "payments.db"),
                "--tier",
                "2",
                *[arg for name in WORKFLOWS for arg in ("--workflow", name)],
                *extra,
            ],
            cwd=ROOT,
            env={"INTERLOCK_SIGNING_KEY": key, "INTERLOCK_OLDER_SIGNING_KEYS": " ".join(older)},
        )
        self.workers.append(await process.start())
        return process

    def order(self) -> str:
        """A fresh paid order, so each case's money is its own."""
        return self.payments.open_order(f"order-{uuid.uuid4().hex[:8]}", 10_000)

    def refund(self, order: str, principal: str | None = None) -> dict[str, Any]:
        """A CallActivity spec: refund $20 of ``order``, under act_as only with a principal."""
        arg = {
            "case_id": f"case-{order}",
            "order_id": order,
            "amount_cents": AMOUNT,
            "premises": self.payments.order_facts(order),
        }
        spec: dict[str, Any] = {"activity": "refund", "arg": arg}
        if principal is not None:
            spec |= {"principal": principal, "lease": self.lease_id}
        return spec

    async def cli_start(
        self, workflow_type: str, spec: dict[str, Any], header: Any, workflow_id: str
    ) -> None:
        """``temporal workflow start --headers interlock-authority=JSON``, as anyone with access
        to the namespace can run it."""
        await cli(
            "workflow",
            "start",
            "--address",
            self.server.target,
            "--task-queue",
            self.task_queue,
            "--type",
            workflow_type,
            "--workflow-id",
            workflow_id,
            "--input",
            json.dumps(spec),
            "--headers",
            f"{HEADER}={json.dumps(header)}",
        )

    async def failure_of(self, workflow_id: str) -> ApplicationError:
        handle = self.client.get_workflow_handle(workflow_id)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), RESULT_TIMEOUT_S)
        activity_error = failure.value.cause
        assert isinstance(activity_error, ActivityError), activity_error
        cause = activity_error.cause
        assert isinstance(cause, ApplicationError), cause
        return cause

    def nothing_sent(self, order: str) -> None:
        """Read from the payments service: no request reached it, no money moved; and the gate
        journaled nothing for the refund."""
        assert self.payments.calls(order) == 0
        assert self.payments.refunded_cents(order) == 0
        assert self.journal.row(the_effect_id(f"case-{order}", order)) is None

    def refunded_once(self, order: str) -> None:
        assert self.payments.refunded_cents(order) == AMOUNT
        assert len(self.payments.refund_records(order)) == 1

    async def close(self) -> None:
        await asyncio.gather(*[w.stop() for w in self.workers])
        self.journal.close()
        self.payments.close()


async def cli(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        temporal_cli(),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, out.decode()
    return out.decode()


def rejected(cause: ApplicationError, code: str, *words: str) -> None:
    assert cause.type == "AuthorityRejected", (cause.type, cause.message)
    assert cause.non_retryable
    (details, *_) = cause.details
    assert details["code"] == code, cause.message
    for word in words:
        assert word in cause.message, cause.message


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def site(
    dev_server: DevServer, client: Client, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Site]:
    s = Site(dev_server, client, tmp_path_factory.mktemp("authority"))
    await s.worker()
    try:
        yield s
    finally:
        await s.close()


def header_of(attributes: Any) -> Any:
    """The authority header's JSON as history shows it (``temporal workflow show`` prints the
    same payload, base64): what anyone who can read history can copy."""
    payload: Payload = attributes.header.fields[HEADER]
    return json.loads(payload.data)


@dataclass
class Copied:
    """Signed headers harvested from the histories of legitimate runs."""

    activity: Any
    child: Any
    child_id: str
    continued: Any
    continued_id: str


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def copied(site: Site) -> Copied:
    """A child workflow and a continue-as-new chain that refund under act_as, legitimately
    (which also shows both still work), and the signed headers their histories hold."""
    parent_id = f"parent-{uuid.uuid4().hex[:8]}"
    order = site.order()
    await site.client.execute_workflow(
        "ParentActsAs",
        site.refund(order, PRINCIPAL),
        id=parent_id,
        task_queue=site.task_queue,
        execution_timeout=None,
    )
    site.refunded_once(order)
    child_id = f"{parent_id}-child"
    child = await site.client.get_workflow_handle(child_id).fetch_history()
    started = child.events[0].workflow_execution_started_event_attributes
    (scheduled,) = [
        e.activity_task_scheduled_event_attributes
        for e in child.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]

    continued_id = f"continued-{uuid.uuid4().hex[:8]}"
    order = site.order()
    await site.client.execute_workflow(
        "ContinuedActsAs",
        site.refund(order, PRINCIPAL),
        id=continued_id,
        task_queue=site.task_queue,
    )
    site.refunded_once(order)
    last_run = await site.client.get_workflow_handle(continued_id).fetch_history()
    next_start = last_run.events[0].workflow_execution_started_event_attributes
    assert next_start.continued_execution_run_id  # the run after continue-as-new
    return Copied(
        activity=header_of(scheduled),
        child=header_of(started),
        child_id=child_id,
        continued=header_of(next_start),
        continued_id=continued_id,
    )


# -- forged from outside ---------------------------------------------------------------------


def attacker_signed(workflow_id: str, lease_id: str) -> Any:
    """A well-formed header, signed with a key the attacker made up."""
    keys = AuthorityKeys.of(Keyring(HmacKey(b"an attacker's own key, 32 bytes!")))
    binding = ContinueAsNewBinding(workflow_id=workflow_id, first_execution_run_id="guessed")
    return keys.sign(Authority(principal=PRINCIPAL, lease_id=lease_id), binding)


def mis_signed(workflow_id: str, lease_id: str) -> Any:
    """A well-formed header naming the workers' real key id, with a MAC that is not its."""
    header = attacker_signed(workflow_id, lease_id)
    real = AuthorityKeys.of(Keyring(HmacKey(bytes.fromhex(KEY_A))))
    assert real.signing is not None
    return {**header, "key_id": real.signing.key_id, "mac": "0" * 64}


@pytest.mark.parametrize(
    ("forgery", "code", "says"),
    [
        ("plain", "unsigned", "not signed"),
        ("own_key", "unknown_key", "does not hold"),
        ("bad_mac", "bad_signature", "does not match"),
    ],
)
async def test_a_forged_start_header_sends_nothing_and_says_why(
    site: Site, forgery: str, code: str, says: str
) -> None:
    """The workflow calls the gated refund with no act_as of its own: the only authority it
    could have is the one the CLI's --headers claims. Today's release trusted it and refunded."""
    workflow_id = f"forged-{forgery}-{uuid.uuid4().hex[:8]}"
    header = {
        "plain": {"principal": PRINCIPAL, "lease_id": site.lease_id},
        "own_key": attacker_signed(workflow_id, site.lease_id),
        "bad_mac": mis_signed(workflow_id, site.lease_id),
    }[forgery]
    order = site.order()
    await site.cli_start("CallActivity", site.refund(order), header, workflow_id)
    rejected(await site.failure_of(workflow_id), code, says, "start header")
    site.nothing_sent(order)


# -- copied from another workflow's history -------------------------------------------------


@pytest.mark.parametrize("source", ["activity", "child", "continued"])
async def test_a_header_copied_from_history_sends_nothing_and_says_why(
    site: Site, copied: Copied, source: str
) -> None:
    """A signed header taken from a legitimate run's history, replayed by a client: on a new
    workflow (an activity's header), on a workflow reusing the child's id (the child's), on a
    fresh start of the continued workflow's id (the next run's). Each names a destination that
    is not this run."""
    header, workflow_id, says = {
        "activity": (copied.activity, f"copied-{uuid.uuid4().hex[:8]}", "not for a workflow's"),
        "child": (copied.child, copied.child_id, "has no parent"),
        "continued": (copied.continued, copied.continued_id, "the next run of workflow"),
    }[source]
    order = site.order()
    await site.cli_start("CallActivity", site.refund(order), header, workflow_id)
    rejected(await site.failure_of(workflow_id), "wrong_binding", says, "start header")
    site.nothing_sent(order)


async def test_a_policed_activity_refuses_a_forged_header(
    dev_server: DevServer, client: Client, tmp_path: Path
) -> None:
    """On a worker with a policy every activity is checked with the principal the header names:
    an ungated one (``refund_naive`` sends money with no gate) refuses a forged header before
    its body runs, instead of running as the forged principal."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("policy_id: refunds\nlimits:\n  max_repeat_calls: 3\n")
    site = Site(dev_server, client, tmp_path)
    try:
        await site.worker(KEY_A, (), "--policy", str(policy))
        order = site.order()
        workflow_id = f"policed-{uuid.uuid4().hex[:8]}"
        spec = {**site.refund(order), "activity": "refund_naive"}
        forged = {"principal": PRINCIPAL, "lease_id": site.lease_id}
        await site.cli_start("CallActivity", spec, forged, workflow_id)
        rejected(await site.failure_of(workflow_id), "unsigned", "not signed", "start header")
        assert site.payments.calls(order) == 0 and site.payments.refunded_cents(order) == 0
    finally:
        await site.close()


# -- standalone activities -------------------------------------------------------------------


@pytest.mark.parametrize("header", ["none", "forged", "copied"])
async def test_a_standalone_activity_carries_no_authority(
    site: Site, copied: Copied, header: str
) -> None:
    """``temporal activity start`` runs the gated refund with no workflow at all: a header it
    carries is refused (no workflow made it), and without one there is no principal."""
    order = site.order()
    activity_id = f"standalone-{header}-{uuid.uuid4().hex[:8]}"
    forged = {"principal": PRINCIPAL, "lease_id": site.lease_id}
    headers = {
        "none": [],
        "forged": ["--headers", f"{HEADER}={json.dumps(forged)}"],
        "copied": ["--headers", f"{HEADER}={json.dumps(copied.activity)}"],
    }[header]
    await cli(
        "activity",
        "start",
        "--address",
        site.server.target,
        "--task-queue",
        site.task_queue,
        "--type",
        "refund",
        "--activity-id",
        activity_id,
        "--start-to-close-timeout",
        "10s",
        "--input",
        json.dumps(site.refund(order)["arg"]),
        *headers,
    )
    handle = site.client.get_activity_handle(activity_id)
    with pytest.raises(ActivityFailureError) as failure:
        await asyncio.wait_for(handle.result(), RESULT_TIMEOUT_S)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError), cause
    if header == "none":
        assert cause.type == "EffectRefused" and "act_as" in cause.message, cause.message
        assert site.payments.calls(order) == 0 and site.payments.refunded_cents(order) == 0
    else:
        code = "unsigned" if header == "forged" else "wrong_binding"
        rejected(cause, code, "not started by a workflow" if header == "copied" else "not signed")
        site.nothing_sent(order)


# -- what must keep working ------------------------------------------------------------------


async def test_act_as_in_the_workflow_still_refunds(site: Site) -> None:
    order = site.order()
    workflow_id = f"acts-{uuid.uuid4().hex[:8]}"
    await site.client.execute_workflow(
        "CallActivity", site.refund(order, PRINCIPAL), id=workflow_id, task_queue=site.task_queue
    )
    site.refunded_once(order)
    (proposed, *_) = site.journal.read(the_effect_id(f"case-{order}", order))
    assert proposed.kind is Kind.PROPOSED
    assert (proposed.data["principal"], proposed.data["lease_id"]) == (PRINCIPAL, site.lease_id)


async def test_a_start_header_does_not_override_the_workflows_own_act_as(site: Site) -> None:
    """The trust boundary: whoever can start a workflow that calls act_as holds that principal's
    authority within the lease it names; a forged header neither adds nor takes away from it."""
    order = site.order()
    workflow_id = f"own-{uuid.uuid4().hex[:8]}"
    forged = {"principal": "someone-else", "lease_id": "lease-of-someone-else"}
    await site.cli_start("CallActivity", site.refund(order, PRINCIPAL), forged, workflow_id)
    await asyncio.wait_for(site.client.get_workflow_handle(workflow_id).result(), RESULT_TIMEOUT_S)
    site.refunded_once(order)


async def test_child_and_continue_as_new_inherit_the_authority(site: Site, copied: Copied) -> None:
    """The legitimate runs behind ``copied`` refunded (asserted there, from the payments
    service); their headers name their destinations and the worker's key."""
    real = AuthorityKeys.of(Keyring(HmacKey(bytes.fromhex(KEY_A))))
    assert real.signing is not None
    assert copied.child["claim"]["binding"]["kind"] == "child"
    assert copied.child["claim"]["binding"]["workflow_id"] == copied.child_id
    assert copied.continued["claim"]["binding"]["kind"] == "continue_as_new"
    assert copied.activity["claim"]["binding"]["kind"] == "activity"
    for header in (copied.child, copied.continued, copied.activity):
        assert header["key_id"] == real.signing.key_id
        assert header["claim"]["principal"] == PRINCIPAL


@pytest.mark.parametrize(
    "worker_keys", [(KEY_A,), (KEY_B, KEY_A), (KEY_B,)], ids=["same", "rotated", "dropped"]
)
async def test_replay_never_fails_over_a_header(
    site: Site, copied: Copied, tmp_path: Path, worker_keys: tuple[str, ...]
) -> None:
    """Workflow code never raises over a header: histories with inherited authority (a child,
    a continued run) and one started with a forged header replay under the same key, after a
    rotation, and even with the signing key dropped (then the run only loses its authority)."""
    forged_id = f"forged-replay-{uuid.uuid4().hex[:8]}"
    order = site.order()
    await site.cli_start("CallActivity", site.refund(order), {"principal": PRINCIPAL}, forged_id)
    await site.failure_of(forged_id)
    signing, *older = worker_keys
    replayer = Replayer(
        workflows=[CallActivity, ContinuedActsAs, ParentActsAs],
        plugins=[
            InterlockPlugin(
                f"sqlite:///{tmp_path / 'none.db'}", signing_key=signing, older_keys=older
            )
        ],
    )
    for workflow_id in (copied.child_id, copied.continued_id, forged_id):
        history = await site.client.get_workflow_handle(workflow_id).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, (workflow_id, result.replay_failure)
    assert list(tmp_path.iterdir()) == []  # a replay opens (and creates) no journal


async def test_a_key_rotation_between_two_attempts(
    dev_server: DevServer, client: Client, tmp_path: Path
) -> None:
    """Attempt 1 runs on a worker holding key A and is SIGKILLed after DISPATCHED, before the
    send; attempt 2 runs on a worker restarted with key B, A kept as an older key: the header
    signed under A still verifies, the journal's entries too, and the refund ends COMMITTED."""
    site = Site(dev_server, client, tmp_path)
    try:
        order = site.order()
        dying = await site.worker(KEY_A, (), "--kill-at", "after_dispatch_tx")
        handle = await site.client.start_workflow(
            "SupportCase",
            CaseFile(
                case_id="rotation", order_id=order, amount_cents=AMOUNT, lease_id=site.lease_id
            ),
            id=f"rotation-{uuid.uuid4().hex[:8]}",
            task_queue=site.task_queue,
            result_type=CaseOutcome,
        )
        await asyncio.wait_for(dying.wait(), RESULT_TIMEOUT_S)
        assert dying.killed, dying.log
        eid = the_effect_id("rotation", order)
        row = site.journal.row(eid)
        assert row is not None and row.status is Kind.DISPATCHED
        assert site.payments.calls(order) == 0  # killed before the send

        await site.worker(KEY_B, (KEY_A,))
        outcome = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT_S)
        assert outcome.status == "REFUNDED", outcome
        site.refunded_once(order)
        with open_journal(site.journal_path, signing_key=KEY_B, older_keys=[KEY_A]) as journal:
            assert receipt(eid, journal=journal).final == "COMMITTED"
            assert journal.verify().ok
        history = await handle.fetch_history()
        (scheduled,) = [
            e.activity_task_scheduled_event_attributes
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "refund"
        ]
        old = AuthorityKeys.of(Keyring(HmacKey(bytes.fromhex(KEY_A))))
        assert old.signing is not None
        assert header_of(scheduled)["key_id"] == old.signing.key_id  # signed before the rotation
    finally:
        await site.close()
