"""MCP tools through the gate: on a real dev server, with the real ``temporalio-mcp`` plugin
(``MCPPlugin`` on the worker, ``TemporalMCPClient`` wrapped by ``GatedMCPClient`` in the
workflow) and a real MCP server process (``workers.mcp_server``: the MCP SDK's ``MCPServer``
over streamable HTTP) whose ``refund`` tool refunds on the file-backed payments service.

The workflow is the model: a script of tool calls. What the model read is each call's
``CallToolResult``; the money is read from the payments service's file (never from the gate);
the effect's record from the journal.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from mcp.types import ToolAnnotations
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client, WorkflowExecutionStatus

from interlock_temporal import receipt
from interlock_temporal._tools.spans import (
    OPERATION,
    OPT_IN_VALUE,
    OPT_IN_VARIABLE,
    STATE,
    TOOL_CALL_ID,
    TOOL_NAME,
    TOOLSET,
)
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.mcp import GatedMCPClient, McpServer, McpTool, contradictions
from interlock_temporal.policy import CallEvent, Policy, deny_activity, deny_when
from interlock_temporal.review import review_id
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer, WorkerProcess, free_port
from workers.mcp_story import mcp_worker
from workflows.mcp_case import PRINCIPAL, McpCase, McpCaseFile, McpCaseOutcome, McpStep

from .doc_snippets import snippet, swap
from .waiting import review_open, until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
ORDER_PAID_CENTS = 10_000
REFUND_20 = McpStep(tool="refund", arguments={"amount_cents": 2000, "reason": "overcharged"})
REFUND_30 = McpStep(tool="refund", arguments={"amount_cents": 3000, "reason": "and more"})
REFUND = "interlock.mcp.{server}.refund"


@dataclass
class Story:
    """One case's world: a journal, the payments file with the order paid, a lease, and the
    MCP server process that refunds on that file."""

    dev_server: DevServer
    path: Path
    server: str
    journal: Journal
    payments: SimulatedPayments
    mcp: WorkerProcess
    mcp_url: str
    lease_id: str
    case_id: str
    order_id: str
    task_queue: str

    @property
    def journal_url(self) -> str:
        return f"sqlite:///{self.path / 'journal.db'}"

    def refunds(self) -> list[int]:
        """The money, as the payments service's file says."""
        return [r.amount_cents for r in self.payments.refund_records(self.order_id)]

    def effect_id(self) -> str:
        (row,) = self.journal.effects()
        return row.effect_id

    def case(self, *steps: McpStep, **changes: Any) -> McpCaseFile:
        return McpCaseFile(
            case_id=self.case_id,
            order_id=self.order_id,
            lease_id=self.lease_id,
            server=self.server,
            steps=list(steps),
            **changes,
        )

    async def start(self, client: Client, *steps: McpStep, **changes: Any) -> Any:
        return await client.start_workflow(
            McpCase.run,
            self.case(*steps, **changes),
            id=f"mcp-{self.case_id}",
            task_queue=self.task_queue,
            result_type=McpCaseOutcome,
        )

    def worker(self, **options: Any) -> Any:
        return mcp_worker(
            self.dev_server.target, self.task_queue, self.journal_url, self.mcp_url, **options
        )


async def make_story(
    dev_server: DevServer,
    path: Path,
    *,
    dedupe: bool,
    read_only_hint: bool = False,
    server: str | None = None,
    start: bool = True,
) -> Story:
    suffix = uuid.uuid4().hex[:8]
    server = server or ("payments" if dedupe else "payments-t3")
    journal = open_journal(f"sqlite:///{path / 'journal.db'}")
    payments = SimulatedPayments(path / "payments.db", tier=1 if dedupe else 3)
    order_id = payments.open_order(f"o-{suffix}", ORDER_PAID_CENTS)
    lease_id = journal.leases.issue(
        PRINCIPAL, activities=[REFUND.format(server=server)], max_amount_cents=5000
    )
    port = free_port()
    args = ["-m", "workers.mcp_server", "--payments", str(path / "payments.db")]
    args += ["--port", str(port)] + ["--dedupe"] * dedupe + ["--read-only-hint"] * read_only_hint
    mcp = WorkerProcess(args, cwd=ROOT)
    if start:
        await mcp.start()
        await _listening(port)
    return Story(
        dev_server,
        path,
        server,
        journal,
        payments,
        mcp,
        f"http://127.0.0.1:{port}/mcp",
        lease_id,
        case_id=f"c-{suffix}",
        order_id=order_id,
        task_queue=f"mcp-{suffix}",
    )


async def _listening(port: int) -> None:
    async def up() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    await until(up, "the MCP server to listen")


@pytest_asyncio.fixture(loop_scope="session")
async def tier1(dev_server: DevServer, tmp_path: Path) -> AsyncIterator[Story]:
    story = await make_story(dev_server, tmp_path, dedupe=True)
    yield story
    await story.mcp.stop()
    story.journal.close()


@pytest_asyncio.fixture(loop_scope="session")
async def tier3(dev_server: DevServer, tmp_path: Path) -> AsyncIterator[Story]:
    story = await make_story(dev_server, tmp_path, dedupe=False)
    yield story
    await story.mcp.stop()
    story.journal.close()


async def crash_once(story: Story) -> tuple[WorkerProcess, WorkerProcess]:
    """A worker process that SIGKILLs itself once, right after the MCP server answered a
    refund and before the gate recorded it (started), and the fresh one that takes over (not
    started: ``await fresh.start()``)."""
    args = ["-m", "workers.mcp_story", "--target", story.dev_server.target]
    args += ["--task-queue", story.task_queue, "--journal", story.journal_url]
    args += ["--mcp-url", story.mcp_url]
    marker = ["--kill-at", "after_send", "--kill-marker", str(story.path / "killed")]
    doomed = await WorkerProcess([*args, *marker], cwd=ROOT).start()
    return doomed, WorkerProcess(args, cwd=ROOT)


def text_of(result: dict[str, Any]) -> str:
    (content,) = result["content"]
    return str(content["text"])


async def test_a_declared_tool_refunds_once_through_the_gate(tier1: Story) -> None:
    async with tier1.worker() as client:
        handle = await tier1.start(client, REFUND_20)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier1.refunds() == [2000]
    (landed,) = tier1.payments.refund_records(tier1.order_id)
    eid = tier1.effect_id()
    assert landed.effect_id == eid  # the server deduped on the _meta effect id the gate sent
    shown = receipt(eid, journal=tier1.journal)
    assert (shown.final, shown.via, shown.principal) == ("COMMITTED", "dispatch", PRINCIPAL)
    (answer,) = done.results
    assert answer.get("isError") is not True
    assert answer["structuredContent"]["refund_id"] == landed.refund_id
    # find_refund is neither declared nor passthrough: not shown; the order is the workflow's,
    # so refund's schema does not ask the model for it (a passthrough tool's is as it was)
    assert done.tools == {
        "refund": ["amount_cents", "reason"],
        "order_status": ["order_id"],
    }


async def test_a_crash_after_the_send_sends_once(tier1: Story, client: Client) -> None:
    """The worker process SIGKILLs itself right after the MCP server answered the refund,
    before the gate recorded it; a fresh worker resends with the same ``_meta`` effect id
    inside the declared dedupe window, and the server's dedupe makes it the first refund's
    answer: one $20 refund in the payments file."""
    doomed, fresh = await crash_once(tier1)
    try:
        handle = await tier1.start(client, REFUND_20)
        await asyncio.wait_for(doomed.wait(), 60)
        assert doomed.killed, doomed.log
        assert tier1.refunds() == [2000]  # sent; the journal does not know its answer yet
        row = tier1.journal.row(tier1.effect_id())
        assert row is not None and row.status is Kind.DISPATCHED
        await fresh.start()
        done = await asyncio.wait_for(handle.result(), 60)
    finally:
        await doomed.stop()
        await fresh.stop()
    assert tier1.refunds() == [2000]
    (landed,) = tier1.payments.refund_records(tier1.order_id)
    shown = receipt(tier1.effect_id(), journal=tier1.journal)
    assert (shown.final, shown.via, shown.dispatches) == ("COMMITTED", "retry-idempotent", 2)
    (answer,) = done.results
    assert answer["structuredContent"]["refund_id"] == landed.refund_id
    assert answer["structuredContent"]["replayed"] is True  # the server's dedupe answered


async def test_a_crash_after_the_send_is_settled_by_the_query_tool(
    dev_server: DevServer, tmp_path: Path, client: Client
) -> None:
    """Tier 2 (declared ``query_tool``): after the same crash the fresh worker does not resend;
    it asks the server's ``find_refund`` with the effect id, finds the refund and records it
    (``recovery-query``). One refund in the file; the model reads the query's answer."""
    story = await make_story(dev_server, tmp_path, dedupe=True, server="payments-t2")
    doomed, fresh = await crash_once(story)
    try:
        handle = await story.start(client, REFUND_20)
        await asyncio.wait_for(doomed.wait(), 60)
        assert doomed.killed, doomed.log
        await fresh.start()
        done = await asyncio.wait_for(handle.result(), 60)
    finally:
        await doomed.stop()
        await fresh.stop()
        await story.mcp.stop()
    (landed,) = story.payments.refund_records(story.order_id)
    assert landed.amount_cents == 2000
    shown = receipt(story.effect_id(), journal=story.journal)
    assert (shown.final, shown.via, shown.dispatches) == ("COMMITTED", "recovery-query", 1)
    (answer,) = done.results
    assert answer["structuredContent"] == {"found": True, "refund_id": landed.refund_id}
    story.journal.close()


async def test_a_server_that_cannot_be_reached_is_not_sent_and_the_retry_lands_once(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """Tier 3, the MCP server not up yet: the connection fails before any call left, so the
    effect is NOT_SENT (not AMBIGUOUS) and Temporal's retry sends it once the server is up:
    one refund, a dispatch per attempt, committed. (The model is not shown the tools first: that
    would be MCPPlugin's list-tools activity, retrying until the server is up.)"""
    story = await make_story(dev_server, tmp_path, dedupe=False, start=False)
    port = int(story.mcp_url.split(":")[-1].split("/")[0])
    try:
        async with story.worker() as client:
            handle = await story.start(client, REFUND_20, list_tools=False)

            def not_sent() -> bool:
                rows = story.journal.effects()
                return bool(rows) and any(
                    e.kind is Kind.NOT_SENT for e in story.journal.read(rows[0].effect_id)
                )

            await until(not_sent, "the refund recorded as not sent")
            await story.mcp.start()
            await _listening(port)
            done = await asyncio.wait_for(handle.result(), 60)
    finally:
        await story.mcp.stop()
    assert story.refunds() == [2000]
    shown = receipt(story.effect_id(), journal=story.journal)
    assert shown.final == "COMMITTED" and shown.dispatches >= 2  # each failed one: NOT_SENT
    unsent = [e for e in story.journal.read(story.effect_id()) if e.kind is Kind.NOT_SENT]
    assert len(unsent) == shown.dispatches - 1
    (answer,) = done.results
    assert answer.get("isError") is not True
    story.journal.close()


async def test_an_ambiguous_call_opens_a_review_whose_decision_reaches_the_workflow(
    tier3: Story, client: Client
) -> None:
    """Tier 3 (the server promises nothing): a crash after the send leaves the refund in
    doubt; the fresh worker cannot know, so the effect is AMBIGUOUS and its review opens, the
    workflow waiting in it; a person's ``happened`` reaches the workflow, which goes on: the
    model is told, and one refund is in the file."""
    doomed, fresh = await crash_once(tier3)
    try:
        handle = await tier3.start(client, REFUND_20)
        await asyncio.wait_for(doomed.wait(), 60)
        assert doomed.killed, doomed.log
        await fresh.start()

        async def opened() -> bool:
            rows = tier3.journal.effects()
            return bool(rows) and await review_open(client, rows[0].effect_id)

        await until(opened, "the review of the refund in doubt", detail=lambda: fresh.log)
        eid = tier3.effect_id()
        assert receipt(eid, journal=tier3.journal).final == "AMBIGUOUS"
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        review = client.get_workflow_handle(review_id("ambiguous", eid))
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        done = await asyncio.wait_for(handle.result(), 60)
    finally:
        await doomed.stop()
        await fresh.stop()
    assert tier3.refunds() == [2000]
    (answer,) = done.results
    assert answer.get("isError") is not True
    assert text_of(answer) == "done: a person attested that it happened (no result was recorded)"
    resolved = receipt(eid, journal=tier3.journal)
    assert (resolved.final, resolved.operator, resolved.dispatches) == ("RESOLVED", "carol", 1)


async def test_a_re_decided_amount_is_refused_as_conflicting_payload(
    tier3: Story, client: Client
) -> None:
    """The $20 refund lands and the worker dies before recording it (tier 3: nobody can know);
    the workflow does not wait for the review, so the model reads "outcome unknown" and
    re-decides $30 for the same order: the same effect, another payload, refused as
    ``conflicting_payload`` and read by the model as the tool's error. Nothing more is sent."""
    doomed, fresh = await crash_once(tier3)
    try:
        handle = await tier3.start(client, REFUND_20, REFUND_30, wait_for_review=False)
        await asyncio.wait_for(doomed.wait(), 60)
        assert doomed.killed, doomed.log
        await fresh.start()
        done = await asyncio.wait_for(handle.result(), 60)
        eid = tier3.effect_id()
        await client.get_workflow_handle(review_id("ambiguous", eid)).terminate("test over")
    finally:
        await doomed.stop()
        await fresh.stop()
    assert tier3.refunds() == [2000]
    unknown, refused = done.results
    assert unknown["isError"] is True and refused["isError"] is True
    doubt = receipt(eid, journal=tier3.journal)
    assert text_of(unknown) == (
        f"error: refund outcome unknown ({doubt.code}): {doubt.reason}. A person decides "
        "whether it happened; do not ask for it again."
    )
    assert text_of(refused) == (
        "error: refund refused (conflicting_payload): conflicting_payload: a different "
        "payload was proposed under an effect id already decided."
    )
    assert doubt.final == "AMBIGUOUS"  # the $30 changed nothing: still the $20's, in doubt
    rejected = [e.data["code"] for e in tier3.journal.read(eid) if e.kind is Kind.REJECTED_PROPOSAL]
    assert rejected == ["conflicting_payload"]


async def test_a_policy_denial_reaches_the_model_as_the_tools_error(tier1: Story) -> None:
    policy = Policy(
        rules=[deny_activity(REFUND.format(server="payments"), code="REFUNDS_PAUSED", reason="x")]
    )
    async with tier1.worker(policy=policy) as client:
        handle = await tier1.start(client, REFUND_20)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier1.refunds() == []
    (answer,) = done.results
    assert answer["isError"] is True
    assert text_of(answer).startswith(
        "error: refund denied by policy (REFUNDS_PAUSED): REFUNDS_PAUSED: "
    )


async def test_a_read_only_hint_does_not_ungate_a_declared_tool(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server annotates ``refund`` ``readOnlyHint: true``: the client warns of the
    contradiction, and the refund is gated all the same (recorded in the journal, its second
    call with another amount refused as a conflicting payload, not sent)."""
    story = await make_story(dev_server, tmp_path, dedupe=True, read_only_hint=True)
    try:
        async with story.worker() as client:
            handle = await story.start(client, REFUND_20, REFUND_30)
            done = await asyncio.wait_for(handle.result(), 60)
    finally:
        await story.mcp.stop()
    assert story.refunds() == [2000]
    first, second = done.results
    assert first.get("isError") is not True
    assert text_of(second).startswith("error: refund refused (conflicting_payload)")
    shown = receipt(story.effect_id(), journal=story.journal)
    assert (shown.final, shown.principal) == ("COMMITTED", PRINCIPAL)
    warned = [r.getMessage() for r in caplog.records if "readOnlyHint" in r.getMessage()]
    assert warned and "'refund' is declared an effect" in warned[0]
    story.journal.close()


async def test_an_undeclared_tool_is_refused_and_a_passthrough_tool_is_not_gated(
    tier1: Story,
) -> None:
    steps = [McpStep(tool="find_refund", arguments={"effect_id": "x"})]
    steps.append(McpStep(tool="order_status", arguments={"order_id": tier1.order_id}))
    async with tier1.worker() as client:
        handle = await tier1.start(client, *steps)
        done = await asyncio.wait_for(handle.result(), 60)
    refused, status = done.results
    assert refused["isError"] is True
    assert text_of(refused) == (
        "error: find_refund refused: the tool is neither declared (McpServer) nor in "
        "passthrough, so it is not called."
    )
    assert status["structuredContent"] == {"order_id": tier1.order_id, "refunded_cents": 0}
    assert tier1.journal.effects() == []  # nothing gated ran


def test_annotations_that_contradict_a_declaration_are_named() -> None:
    tier3 = McpTool(key=("order_id",))
    deduped = McpTool(key=("order_id",), tier=1, dedupe_window="PT1H")  # type: ignore[arg-type]
    read_only = ToolAnnotations(read_only_hint=True)
    assert contradictions("refund", tier3, None) == []
    assert contradictions("refund", tier3, ToolAnnotations(destructive_hint=True)) == []
    assert contradictions("refund", tier3, read_only) == [
        "MCP tool 'refund' is declared an effect, and its server says readOnlyHint: it stays gated"
    ]
    assert (
        "idempotentHint: false"
        in contradictions("refund", deduped, ToolAnnotations(idempotent_hint=False))[0]
    )
    assert (
        "declared tier 3"
        in contradictions("refund", tier3, ToolAnnotations(idempotent_hint=True))[0]
    )


def test_a_declaration_says_what_its_tier_needs() -> None:
    with pytest.raises(ValueError, match="tier 1 needs dedupe_window"):
        McpTool(key=("order_id",), tier=1)
    with pytest.raises(ValueError, match="tier 2 needs query_tool"):
        McpTool(key=("order_id",), tier=2)
    with pytest.raises(ValueError, match="key"):
        McpTool(key=())
    assert McpTool(key=("order_id",), query_tool="find_refund").derived_tier == 2
    with pytest.raises(ValueError, match="a query must have no effect"):
        McpServer("p", {"a": McpTool(key=("k",), query_tool="b"), "b": McpTool(key=("k",))})
    server = McpServer("p", {"refund": McpTool(key=("order_id",))})
    assert server.activity_name("refund") == "interlock.mcp.p.refund"
    assert server.effect_type("refund") == "mcp:p/refund"
    with pytest.raises(ValueError, match="are declared tools and in passthrough"):
        GatedMCPClient(server, passthrough=["refund"])
    assert json.loads(McpTool(key=("a",)).model_dump_json())["key"] == ["a"]


async def test_the_docs_wiring_runs_as_written(
    dev_server: DevServer, client: Client, tmp_path: Path
) -> None:
    """docs/agents.md's MCP block run as a worker process of its own, against the MCP server
    process; the only glue: the server's and the MCP server's addresses, and a task queue of
    this test's own. One $20 refund, in the payments file, under the effect id the gate sent
    in ``_meta``."""
    port = free_port()
    payments = SimulatedPayments(tmp_path / "payments.db", tier=1)
    payments.open_order("o-1", ORDER_PAID_CENTS)
    args = ["-m", "workers.mcp_server", "--payments", str(tmp_path / "payments.db")]
    server = await WorkerProcess([*args, "--port", str(port), "--dedupe"], cwd=ROOT).start()
    await _listening(port)
    text = snippet("docs/agents.md#dad15b0368b1")
    queue = f"mcp-docs-{uuid.uuid4().hex[:8]}"
    text = swap(text, '"localhost:7233"', f'"{dev_server.target}"')
    text = swap(text, 'task_queue="mcp"', f'task_queue="{queue}"')
    text = swap(text, "http://127.0.0.1:8000/mcp", f"http://127.0.0.1:{port}/mcp")
    (tmp_path / "mcp_case.py").write_text(text)
    journal = open_journal(f"sqlite:///{tmp_path / 'interlock.db'}")
    lease_id = journal.leases.issue(
        "refund-bot", activities=["interlock.mcp.payments.refund"], max_amount_cents=5000
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "mcp_case.py", cwd=tmp_path, env=env
    )
    try:
        done = await asyncio.wait_for(
            client.execute_workflow(
                "McpCase",
                {"order_id": "o-1", "lease_id": lease_id},
                id=f"docs-mcp-{queue}",
                task_queue=queue,
            ),
            60,
        )
    finally:
        worker.terminate()
        await worker.wait()
        await server.stop()
    (landed,) = payments.refund_records("o-1")
    assert landed.amount_cents == 2000
    (row,) = journal.effects()
    assert landed.effect_id == row.effect_id  # the server read the gate's _meta effect id
    assert json.loads(done)["structuredContent"]["refund_id"] == landed.refund_id
    shown = receipt(row.effect_id, journal=journal)
    assert (shown.final, shown.principal) == ("COMMITTED", "refund-bot")
    journal.close()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The spans the gate makes, opted in to the GenAI conventions, exported here (a provider
    of this test's own, not the process's global one)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def get_tracer(name: str, version: str | None = None, **options: Any) -> Any:
        options.pop("tracer_provider", None)
        return provider.get_tracer(name, version, **options)

    monkeypatch.setattr(trace, "get_tracer", get_tracer)
    monkeypatch.setenv(OPT_IN_VARIABLE, OPT_IN_VALUE)
    yield exporter


async def test_each_gated_call_is_one_execute_tool_span_without_a_call_id(
    tier1: Story, spans: InMemorySpanExporter
) -> None:
    """MCP has no call id: the span carries none (never the effect id in its place). A denied
    call and a sent one are a span each; the passthrough read is no gated call, and none."""
    policy = Policy(rules=[deny_when(over_25_dollars, code="OVER_LIMIT", reason="x")])
    greedy = McpStep(tool="refund", arguments={"amount_cents": 5000, "reason": "more"})
    status = McpStep(tool="order_status", arguments={"order_id": tier1.order_id})
    async with tier1.worker(policy=policy) as client:
        handle = await tier1.start(client, greedy, REFUND_20, status)
        await asyncio.wait_for(handle.result(), 60)
    made = sorted(
        (s for s in spans.get_finished_spans() if (s.attributes or {}).get(OPERATION)),
        key=lambda s: s.start_time or 0,
    )
    assert [s.name for s in made] == ["execute_tool refund", "execute_tool refund"]
    denied, sent = (dict(s.attributes or {}) for s in made)
    assert all(TOOL_CALL_ID not in a and a[TOOL_NAME] == "refund" for a in (denied, sent))
    assert (denied[STATE], denied[TOOLSET], sent[STATE]) == ("DENIED", "payments", "DONE")
    assert tier1.refunds() == [2000]


def over_25_dollars(event: CallEvent) -> bool:
    return bool((event.argument("arguments") or {}).get("amount_cents", 0) > 2500)
