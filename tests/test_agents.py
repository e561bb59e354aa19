"""An agent (OpenAI Agents SDK, run by ``temporalio.contrib.openai_agents``) whose refund tool is
a gated activity made a tool by ``effect_as_tool``: on a real dev server, with the real plugin
and the real ``Runner``, a scripted model, and offline (every proxy variable points at a
loopback trap that must see no connection, and the SDK's tracing export is off).

What the agent was told is read from what the scripted model was given (the tool outputs in its
input); the money is read from the payments service; the effect's record from the journal.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus

from interlock_temporal import gated, receipt
from interlock_temporal.agents import effect_as_tool
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.policy import Policy, deny_activity
from interlock_temporal.review import review_id
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer, WorkerProcess
from workers.agent_story import SCRIPTS, ScriptedModel, agent_worker
from workflows.agent_case import PRINCIPAL, AgentCase, AgentCaseFile, AgentCaseOutcome
from workflows.agent_refund import refund

from .agent_docs import refunds_once
from .doc_snippets import snippet, swap
from .waiting import review_open, until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
ORDER_PAID_CENTS = 10_000
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


class Trap:
    """A loopback listener that counts who connects (and hangs up on them): where every proxy
    variable points, so anything that tried to reach the network is seen."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[Trap]:
    trap = Trap()
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, trap.url)
        monkeypatch.setenv(name.lower(), trap.url)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    try:
        yield trap
    finally:
        trap.close()
    assert trap.connections == 0, "something tried to reach the network through the proxy"


@dataclass
class Case:
    """One case's world: its journal, its payments service with the order paid, its lease."""

    dev_server: DevServer
    path: Path
    tier: int
    journal: Journal
    payments: SimulatedPayments
    lease_id: str
    case_id: str
    order_id: str
    task_queue: str

    @property
    def journal_url(self) -> str:
        return f"sqlite:///{self.path / 'journal.db'}"

    def file(self, **changes: Any) -> AgentCaseFile:
        return AgentCaseFile(
            case_id=self.case_id, order_id=self.order_id, lease_id=self.lease_id, **changes
        )

    def refunds(self) -> list[int]:
        return [r.amount_cents for r in self.payments.refund_records(self.order_id)]

    def effect_id(self) -> str:
        (row,) = [r for r in self.journal.effects() if r.effect_type == "refund"]
        return row.effect_id

    async def start(self, client: Client, **changes: Any) -> Any:
        return await client.start_workflow(
            AgentCase.run,
            self.file(**changes),
            id=f"agent-{self.case_id}",
            task_queue=self.task_queue,
            result_type=AgentCaseOutcome,
        )


def make_case(dev_server: DevServer, path: Path, tier: int) -> Case:
    suffix = uuid.uuid4().hex[:8]
    journal = open_journal(f"sqlite:///{path / 'journal.db'}")
    payments = SimulatedPayments(path / "payments.db", tier=tier)
    order_id = payments.open_order(f"o-{suffix}", ORDER_PAID_CENTS)
    lease_id = journal.leases.issue(PRINCIPAL, activities=["refund"], max_amount_cents=5000)
    return Case(
        dev_server,
        path,
        tier,
        journal,
        payments,
        lease_id,
        case_id=f"c-{suffix}",
        order_id=order_id,
        task_queue=f"agent-{suffix}",
    )


@pytest_asyncio.fixture(loop_scope="session")
async def tier2(dev_server: DevServer, tmp_path: Path) -> AsyncIterator[Case]:
    case = make_case(dev_server, tmp_path, 2)
    yield case
    case.journal.close()


@pytest_asyncio.fixture(loop_scope="session")
async def tier3(dev_server: DevServer, tmp_path: Path) -> AsyncIterator[Case]:
    case = make_case(dev_server, tmp_path, 3)
    yield case
    case.journal.close()


async def test_the_agent_refunds_once_through_the_gate(tier2: Case, offline: Trap) -> None:
    model = ScriptedModel(SCRIPTS["refund"])
    async with agent_worker(
        tier2.dev_server.target, tier2.task_queue, model, tier2.journal_url, tier2.payments
    ) as client:
        handle = await tier2.start(client)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier2.refunds() == [2000]
    (landed,) = tier2.payments.refund_records(tier2.order_id)
    eid = tier2.effect_id()
    assert landed.effect_id == eid
    shown = receipt(eid, journal=tier2.journal)
    assert (shown.final, shown.via, shown.principal) == ("COMMITTED", "dispatch", PRINCIPAL)
    (told,) = done.tool_outputs
    assert f'"refund_id":"{landed.refund_id}"' in told
    assert model.seen[-1] == [told]  # the model was given the refund's result
    assert done.final_output == "Your refund is on its way."


async def test_a_re_decided_amount_after_an_error_is_refused_and_the_agent_is_told(
    tier3: Case, offline: Trap
) -> None:
    """The $20 refund lands and its answer is lost (tier 3: nobody can know); the tool does
    not wait for the review, so the agent is told the outcome is unknown, and re-decides: $30
    for the same case. The same effect, another payload: ``conflicting_payload``, returned to
    the agent as the tool's error; nothing more is sent, and the run completes."""
    tier3.payments.arm("after_commit", "reset")
    model = ScriptedModel(SCRIPTS["redecide"])
    async with agent_worker(
        tier3.dev_server.target, tier3.task_queue, model, tier3.journal_url, tier3.payments
    ) as client:
        handle = await tier3.start(client, wait_for_review=False)
        done = await asyncio.wait_for(handle.result(), 60)
        eid = tier3.effect_id()
        await client.get_workflow_handle(review_id("ambiguous", eid)).terminate("test over")
    assert tier3.refunds() == [2000]
    unknown, refused = done.tool_outputs
    doubt = receipt(eid, journal=tier3.journal)
    assert unknown == (
        f"error: refund outcome unknown ({doubt.code}): {doubt.reason}. A person decides "
        "whether it happened; do not ask for it again."
    )
    assert refused == (
        "error: refund refused (conflicting_payload): conflicting_payload: a different "
        "payload was proposed under an effect id already decided."
    )
    assert model.seen[-1] == [unknown, refused]  # what the agent was told, in order
    assert done.final_output == SCRIPTS["redecide"][-1].text  # type: ignore[union-attr]
    assert doubt.final == "AMBIGUOUS"  # the $30 changed nothing: still the $20's, in doubt
    rejected = [e.data["code"] for e in tier3.journal.read(eid) if e.kind is Kind.REJECTED_PROPOSAL]
    assert rejected == ["conflicting_payload"]


async def test_a_policy_rule_refuses_the_tool_call_and_the_agent_is_told(
    tier2: Case, offline: Trap
) -> None:
    model = ScriptedModel(SCRIPTS["refund"])
    policy = Policy(rules=[deny_activity("refund", code="REFUNDS_PAUSED", reason="paused")])
    async with agent_worker(
        tier2.dev_server.target,
        tier2.task_queue,
        model,
        tier2.journal_url,
        tier2.payments,
        policy=policy,
    ) as client:
        handle = await tier2.start(client)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier2.refunds() == []
    (told,) = done.tool_outputs
    assert told.startswith("error: refund denied by policy (REFUNDS_PAUSED): REFUNDS_PAUSED: ")
    assert model.seen[-1] == [told]
    assert done.final_output == "Your refund is on its way."  # the script goes on; the run ends


async def test_an_effect_in_doubt_waits_for_a_person_then_the_agent_goes_on(
    tier3: Case, offline: Trap
) -> None:
    """Tier 3, the refund's answer lost: AMBIGUOUS; the tool waits on the EffectReview, the
    workflow runs on; a person resolves it (``happened``) and the agent goes on to finish."""
    tier3.payments.arm("after_commit", "reset")
    model = ScriptedModel(SCRIPTS["refund"])
    async with agent_worker(
        tier3.dev_server.target, tier3.task_queue, model, tier3.journal_url, tier3.payments
    ) as client:
        handle = await tier3.start(client)

        async def opened() -> bool:
            rows = [r for r in tier3.journal.effects() if r.effect_type == "refund"]
            return bool(rows) and await review_open(client, rows[0].effect_id)

        await until(opened, "the review of the refund in doubt")
        eid = tier3.effect_id()
        assert receipt(eid, journal=tier3.journal).final == "AMBIGUOUS"
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert len(model.seen) == 1  # the agent has not been told anything yet
        review = client.get_workflow_handle(review_id("ambiguous", eid))
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier3.refunds() == [2000]
    (told,) = done.tool_outputs
    assert told == "done: a person attested that it happened (no result was recorded)"
    assert model.seen[-1] == [told]
    assert done.final_output == "Your refund is on its way."
    resolved = receipt(eid, journal=tier3.journal)
    assert (resolved.final, resolved.operator, resolved.dispatches) == ("RESOLVED", "carol", 1)


async def test_the_refund_tool_survives_a_worker_sigkill_and_lands_once(
    tier2: Case, client: Client, offline: Trap
) -> None:
    """Tier 2: a worker process SIGKILLs itself right after the refund was sent, before the
    gate recorded its result; a fresh worker process takes the run over, asks the service,
    finds the refund and records it: one $20 refund, and the agent is told its result."""
    args = [
        "-m",
        "workers.agent_story",
        "--target",
        tier2.dev_server.target,
        "--task-queue",
        tier2.task_queue,
        "--journal",
        tier2.journal_url,
        "--payments",
        str(tier2.path / "payments.db"),
    ]
    marker = ["--kill-at", "after_send", "--kill-marker", str(tier2.path / "killed")]
    doomed = await WorkerProcess([*args, *marker], cwd=ROOT).start()
    fresh: WorkerProcess | None = None
    try:
        handle = await tier2.start(client)
        await asyncio.wait_for(doomed.wait(), 60)
        assert doomed.killed, doomed.log
        assert tier2.refunds() == [2000]  # sent; the journal does not know its result yet
        row = tier2.journal.row(tier2.effect_id())
        assert row is not None and row.status is Kind.DISPATCHED
        fresh = await WorkerProcess(args, cwd=ROOT).start()
        done = await asyncio.wait_for(handle.result(), 60)
    finally:
        for process in (doomed, fresh):
            if process is not None:
                await process.stop()
    (landed,) = tier2.payments.refund_records(tier2.order_id)
    assert landed.amount_cents == 2000
    shown = receipt(tier2.effect_id(), journal=tier2.journal)
    assert (shown.final, shown.via, shown.dispatches) == ("COMMITTED", "recovery-query", 1)
    assert shown.confirmation == landed.refund_id
    (told,) = done.tool_outputs
    assert f'"refund_id":"{landed.refund_id}"' in told
    assert done.final_output == "Your refund is on its way."


async def test_the_docs_wiring_runs_as_written(
    dev_server: DevServer, client: Client, tmp_path: Path, offline: Trap
) -> None:
    """docs/agents.md's block, with the README's refunds.py beside it, run as a worker process
    of its own; the only glue: the server's address, a task queue of this test's own, and the
    scripted model given to the agents plugin in place of OpenAI's."""
    (tmp_path / "refunds.py").write_text(snippet("README.md#bf636f2c37e6"))
    text = snippet("docs/agents.md#5d6d382d8abd")
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    text = swap(text, '"localhost:7233"', f'"{dev_server.target}"')
    text = swap(text, 'task_queue="agents"', f'task_queue="{queue}"')
    text = swap(
        text,
        "OpenAIAgentsPlugin()",
        "OpenAIAgentsPlugin(model_provider=TestModelProvider(ScriptedModel(SCRIPTS['refund'])),"
        " model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=30)))",
    )
    glue = (
        "from temporalio.contrib.openai_agents import ModelActivityParameters\n"
        "from temporalio.contrib.openai_agents.testing import TestModelProvider\n"
        "from workers.agent_story import SCRIPTS, ScriptedModel\n"
    )
    (tmp_path / "agent_case.py").write_text(glue + text)
    await refunds_once(client, tmp_path, program="agent_case.py", workflow="AgentCase", queue=queue)


def test_the_trap_sees_a_client_that_honours_the_proxy_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The offline proof can fail: a client that goes to the network through the proxy
    variables (OpenAI's own, as a model provider would) is caught by the trap."""
    import openai

    trap = Trap()
    try:
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, trap.url)
        with pytest.raises(openai.APIConnectionError):
            openai.OpenAI(api_key="sk-offline", max_retries=0, timeout=5).models.list()
    finally:
        trap.close()
    assert trap.connections >= 1


def test_effect_as_tool_refuses_what_would_let_the_model_name_the_effect(tmp_path: Path) -> None:
    @activity.defn
    async def plain(r: RefundRequest) -> RefundResult:
        raise AssertionError("never run")

    with pytest.raises(TypeError, match="activity 'plain' is not gated"):
        effect_as_tool(plain, context={"case_id": "c"})
    keyless = gated(plain, target=SimulatedPayments(tmp_path / "payments.db", tier=3))
    with pytest.raises(TypeError, match="'plain' declares no key="):
        effect_as_tool(keyless, context={"case_id": "c"})
    with pytest.raises(TypeError, match="context names 'case', not a field of RefundRequest"):
        effect_as_tool(refund, context={"case": "c"})
    tool = effect_as_tool(refund, context={"case_id": "c", "order_id": "o", "premises": None})
    assert set(tool.params_json_schema["properties"]) == {"amount_cents", "reason"}
