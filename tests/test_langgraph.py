"""A LangGraph agent (``temporalio.langgraph.LangGraphPlugin``) whose refund tool is a gated
activity made a tool by ``interlock_temporal.langgraph.effect_as_tool``: on a real dev server,
with the real plugin and the real graph runtime (``StateGraph``, ``ToolNode``, ``interrupt()``),
a scripted chat model, offline (every proxy variable points at a loopback trap that must see
no connection).

What the agent was told is read from the ``ToolMessage``s the run ended with and from what the
scripted model was given; the money from the payments service; the effect's record from the
journal.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowExecutionStatus

from interlock_temporal import receipt
from interlock_temporal.core.models import Kind
from interlock_temporal.policy import Limits, Policy, deny_activity
from interlock_temporal.review import review_id
from interlock_temporal.testing import DevServer, WorkerProcess
from workers.agent_story import SCRIPTS
from workers.langgraph_story import ScriptedChatModel, langgraph_worker
from workers.world import ORDER
from workflows.agent_case import PRINCIPAL
from workflows.langgraph_case import (
    LangGraphCase,
    LangGraphCaseFile,
    LangGraphOutcome,
    LoopCase,
    LoopCaseFile,
    LoopOutcome,
)
from workflows.scripts import Call, Say

from .agent_docs import refunds_once
from .doc_snippets import snippet, swap
from .test_agents import Case, Trap, make_case, offline
from .test_tool_spans import SPANS, leaked, opted_in, plain_provider, tool_spans
from .waiting import review_open, until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["offline", "opted_in", "plain_provider"]  # fixtures, shared with other tests


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


async def start(case: Case, client: Client, **changes: Any) -> Any:
    return await client.start_workflow(
        LangGraphCase.run,
        LangGraphCaseFile(**{**case.file().model_dump(), **changes}),
        id=f"langgraph-{case.case_id}",
        task_queue=case.task_queue,
        result_type=LangGraphOutcome,
    )


def worker(case: Case, model: ScriptedChatModel, **options: Any) -> Any:
    return langgraph_worker(
        case.dev_server.target, case.task_queue, model, case.journal_url, case.payments, **options
    )


async def test_the_graph_refunds_once_through_the_gate(tier2: Case, offline: Trap) -> None:
    model = ScriptedChatModel(steps=SCRIPTS["refund"])
    async with worker(tier2, model) as client:
        handle = await start(tier2, client)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier2.refunds() == [2000]
    (landed,) = tier2.payments.refund_records(tier2.order_id)
    eid = tier2.effect_id()
    assert landed.effect_id == eid
    shown = receipt(eid, journal=tier2.journal)
    assert (shown.final, shown.via, shown.principal) == ("COMMITTED", "dispatch", PRINCIPAL)
    (told,) = done.tool_outputs
    assert f'"refund_id":"{landed.refund_id}"' in told
    assert model.seen[-1] == [told]
    assert done.final_output == "Your refund is on its way."


async def test_a_re_decided_amount_is_refused_and_the_model_reads_the_error(
    tier3: Case, offline: Trap
) -> None:
    """The $20 refund lands and its answer is lost (tier 3); the tool does not pause for the
    review (``review="tell"``), so the model reads that the outcome is unknown and re-decides
    $30 for the same case: the same effect, another payload, ``conflicting_payload``, as a
    ``ToolMessage`` with ``status="error"``; nothing more is sent."""
    tier3.payments.arm("after_commit", "reset")
    model = ScriptedChatModel(steps=SCRIPTS["redecide"])
    async with worker(tier3, model) as client:
        handle = await start(tier3, client, wait_for_review=False)
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
    assert model.seen[-1] == [unknown, refused]
    assert done.final_output == SCRIPTS["redecide"][-1].text  # type: ignore[union-attr]
    assert done.statuses == ["error", "error"]
    assert doubt.final == "AMBIGUOUS"
    rejected = [e.data["code"] for e in tier3.journal.read(eid) if e.kind is Kind.REJECTED_PROPOSAL]
    assert rejected == ["conflicting_payload"]


async def test_a_policy_denial_reaches_the_model_as_the_tools_error(
    tier2: Case, offline: Trap
) -> None:
    model = ScriptedChatModel(steps=SCRIPTS["refund"])
    policy = Policy(rules=[deny_activity("refund", code="REFUNDS_PAUSED", reason="paused")])
    async with worker(tier2, model, policy=policy) as client:
        handle = await start(tier2, client)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier2.refunds() == []
    (told,) = done.tool_outputs
    assert told.startswith("error: refund denied by policy (REFUNDS_PAUSED): REFUNDS_PAUSED: ")
    assert done.statuses == ["error"]
    assert model.seen[-1] == [told]


async def test_an_effect_in_doubt_interrupts_the_graph_and_the_decision_resumes_it(
    tier3: Case, offline: Trap
) -> None:
    """Tier 3, the answer lost: AMBIGUOUS. The tool calls ``interrupt()`` with the review to
    decide it in; the graph pauses (the model is told nothing); ``ainvoke`` waits in the
    workflow. A person resolves the review (``happened``): the graph resumes, the tool node
    runs again, the gate answers from the journal (nothing sent again), and the model reads
    the attested outcome."""
    tier3.payments.arm("after_commit", "reset")
    model = ScriptedChatModel(steps=SCRIPTS["refund"])
    async with worker(tier3, model) as client:
        handle = await start(tier3, client)

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
    assert done.statuses == ["success"]
    assert model.seen[-1] == [told]
    assert done.final_output == "Your refund is on its way."
    assert done.interrupts == [review_id("ambiguous", eid)]  # the graph paused on the review
    resolved = receipt(eid, journal=tier3.journal)
    assert (resolved.final, resolved.operator, resolved.dispatches) == ("RESOLVED", "carol", 1)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "naive"])
async def test_an_interrupt_in_a_loop_resumed_again_and_again_sends_once(
    tier2: Case, offline: Trap, gated: bool
) -> None:
    """langgraph #7780: a node refunds, then asks a person (``interrupt()``), in a loop; each
    answer resumes the graph and LangGraph runs the node again from its top, every refund
    before the interrupt it stopped at included: 1 + 2 + 2 = 5 refund calls over three runs
    of the node. The gate names each the same effect (the case, the order) and answers the
    repeats from its journal: one $20 refund. The same node without the gate: five, the whole
    $100 the customer paid."""
    model = ScriptedChatModel(steps=SCRIPTS["refund"])
    async with worker(tier2, model) as client:
        handle = await client.start_workflow(
            LoopCase.run,
            LoopCaseFile(**tier2.file(gated=gated).model_dump(), rounds=2),
            id=f"loop-{tier2.case_id}",
            task_queue=tier2.task_queue,
            result_type=LoopOutcome,
        )
        for answer in ("more", "done"):
            await handle.signal(LoopCase.answer, answer)
        done = await asyncio.wait_for(handle.result(), 60)
    assert done.answers == ["more", "done"]
    assert len(done.told) == 5  # each run of the node asked for the refund again
    if not gated:  # #7780 as reported: every run of the node refunded again
        assert tier2.refunds() == [2000] * 5
        return
    assert len(set(done.told)) == 1  # each time the same result: the recorded one
    (landed,) = tier2.payments.refund_records(tier2.order_id)
    assert landed.amount_cents == 2000
    assert f'"refund_id":"{landed.refund_id}"' in done.told[0]
    shown = receipt(tier2.effect_id(), journal=tier2.journal)
    assert (shown.final, shown.dispatches) == ("COMMITTED", 1)


async def test_a_crash_after_the_send_sends_once(
    tier2: Case, client: Client, offline: Trap
) -> None:
    """Tier 2: the worker process running the graph SIGKILLs itself right after the refund was
    sent, before the gate recorded its result; a fresh worker process replays the graph, the
    tool node runs the call again, and the gate asks the service, finds the refund and
    records it: one $20 refund, and the model reads its result."""
    args = [
        "-m",
        "workers.langgraph_story",
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
        handle = await start(tier2, client)
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
    (told,) = done.tool_outputs
    assert f'"refund_id":"{landed.refund_id}"' in told
    assert done.final_output == "Your refund is on its way."


async def test_two_calls_in_one_tool_node_are_two_effects_each_one_span(
    tier2: Case, offline: Trap, opted_in: None
) -> None:
    """One model message with two tool calls (a refund on each of the case's orders): the tool
    node runs both in the workflow, each an activity and an effect of its own (its own key, its
    own journal record), each one ``execute_tool`` span carrying the model's call id; no
    argument value on any span."""
    other = tier2.payments.open_order(f"{tier2.order_id}-b", 10_000)
    both = (
        Call("refund", {"amount_cents": 2000, "reason": "overcharged"}),
        Call("refund_other", {"amount_cents": 3000, "reason": "overcharged"}),
    )
    model = ScriptedChatModel(steps=[both, Say("Both refunds are on their way.")])
    async with worker(tier2, model) as client:
        handle = await start(tier2, client, other_order_id=other)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier2.refunds() == [2000]
    assert [r.amount_cents for r in tier2.payments.refund_records(other)] == [3000]
    effects = {r.effect_id: r for r in tier2.journal.effects() if r.effect_type == "refund"}
    assert len(effects) == 2
    for eid in effects:
        assert receipt(eid, journal=tier2.journal).final == "COMMITTED"
    assert done.statuses == ["success", "success"]
    spans = {(s.attributes or {})["gen_ai.tool.call.id"]: s for s in tool_spans()}
    assert sorted(spans) == ["call_0_0", "call_0_1"]
    assert {s.name for s in spans.values()} == {"execute_tool refund", "execute_tool refund_other"}
    assert {(s.attributes or {})["interlock.state"] for s in spans.values()} == {"DONE"}
    assert not leaked(SPANS.get_finished_spans())


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "replayed"])
async def test_a_call_paused_for_a_review_is_one_span_across_the_interrupt(
    tier3: Case, offline: Trap, opted_in: None, cached: bool
) -> None:
    """The call that paused the graph (AMBIGUOUS) and went on after the person's decision is
    one call: one span, ended when the call ended (the attested outcome). Also on a worker
    that caches nothing, where every step replays the graph's run from the start."""
    tier3.payments.arm("after_commit", "reset")
    model = ScriptedChatModel(steps=SCRIPTS["refund"])
    async with worker(tier3, model, max_cached_workflows=1000 if cached else 0) as client:
        handle = await start(tier3, client)

        async def opened() -> bool:
            rows = [r for r in tier3.journal.effects() if r.effect_type == "refund"]
            return bool(rows) and await review_open(client, rows[0].effect_id)

        await until(opened, "the review of the refund in doubt")
        assert tool_spans() == []  # the call has not ended: it waits on the person
        review = client.get_workflow_handle(review_id("ambiguous", tier3.effect_id()))
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        done = await asyncio.wait_for(handle.result(), 60)
    assert done.statuses == ["success"]
    assert tier3.refunds() == [2000]
    (span,) = tool_spans()
    attributes = span.attributes or {}
    assert (attributes["gen_ai.tool.call.id"], attributes["interlock.state"]) == ("call_0", "DONE")
    assert not leaked(SPANS.get_finished_spans())


def _story_worker(case: Case, *extra: str) -> WorkerProcess:
    args = ["-m", "workers.langgraph_story", "--target", case.dev_server.target]
    args += ["--task-queue", case.task_queue, "--journal", case.journal_url]
    args += ["--payments", str(case.path / "payments.db"), *extra]
    return WorkerProcess(args, cwd=ROOT)


async def test_without_the_gate_the_tool_nodes_activity_runs_again_and_pays_twice(
    tier2: Case, client: Client, offline: Trap
) -> None:
    """The naive baseline: LangGraph's own ``ToolNode`` run as one activity (the plugin's way
    to run a node) over an ungated refund; the worker process is SIGKILLed right after the
    refund landed; Temporal runs the tool node's activity again: $40 in two refunds."""
    tier2.payments.open_order(ORDER, 10_000)  # the order the naive script's model names
    tier2.payments.arm("after_commit", "kill")  # whichever worker process lands it dies
    doomed = await _story_worker(tier2, "--script", "naive").start()
    fresh: WorkerProcess | None = None
    try:
        handle = await start(tier2, client, order_id=ORDER, gated=False, start_to_close_s=5.0)
        try:
            await asyncio.wait_for(doomed.wait(), 30)
        except TimeoutError:
            pytest.fail(f"the worker did not die:\n{doomed.log}")
        assert doomed.killed, doomed.log
        fresh = await _story_worker(tier2, "--script", "naive").start()
        done = await asyncio.wait_for(handle.result(), 60)
    finally:
        for process in (doomed, fresh):
            if process is not None:
                await process.stop()
    assert [r.amount_cents for r in tier2.payments.refund_records(ORDER)] == [2000, 2000]
    (told,) = done.tool_outputs
    assert '"refund_id":' in told


async def test_the_docs_graph_runs_as_written(
    dev_server: DevServer, client: Client, tmp_path: Path, offline: Trap
) -> None:
    """docs/agents.md's LangGraph blocks, with the README's refunds.py beside them, run as a
    worker process of its own; the only glue: the server's address, a task queue of this
    test's own, and the scripted chat model in place of OpenAI's (shown the tool's schema the
    workflow put in the state: a call of a tool it was not shown would fail)."""
    (tmp_path / "refunds.py").write_text(snippet("README.md#bf636f2c37e6"))
    graph_text = snippet("docs/agents.md#7eaa9c4f4f60")
    graph_text = swap(
        graph_text,
        "from langchain_openai import ChatOpenAI",
        "from workers.agent_story import SCRIPTS\n"
        "    from workers.langgraph_story import ScriptedChatModel",
    )
    graph_text = swap(
        graph_text,
        'ChatOpenAI(model="gpt-5")',
        'ScriptedChatModel(steps=SCRIPTS["refund"])',
    )
    (tmp_path / "support_graph.py").write_text(graph_text)
    queue = f"graphs-{uuid.uuid4().hex[:8]}"
    worker_text = snippet("docs/agents.md#55d8706f33ad")
    worker_text = swap(worker_text, '"localhost:7233"', f'"{dev_server.target}"')
    worker_text = swap(worker_text, 'task_queue="graphs"', f'task_queue="{queue}"')
    (tmp_path / "worker.py").write_text(worker_text)
    await refunds_once(client, tmp_path, program="worker.py", workflow="SupportGraph", queue=queue)


async def test_a_call_that_needs_approval_pauses_the_graph_until_a_person_approves(
    tier2: Case, offline: Trap
) -> None:
    """A policy asks a person before any refund (``ApprovalRequired``): the tool interrupts the
    graph with the approval's review; nothing is sent while it waits; a person approves it
    (signal ``resolve``), the graph resumes, and the refund is sent, once, under the approval."""
    model = ScriptedChatModel(steps=SCRIPTS["refund"])
    policy = Policy(Limits(hitl_activities=("refund",)))
    async with worker(tier2, model, policy=policy) as client:
        handle = await start(tier2, client)

        async def paused() -> bool:
            return bool(await handle.query(LangGraphCase.paused_on))

        await until(paused, "the graph paused on the approval")
        (review,) = await handle.query(LangGraphCase.paused_on)
        assert review.startswith("interlock-review-approval-")
        assert tier2.refunds() == [] and len(model.seen) == 1
        decision = {"decision": "approve", "operator": "carol"}
        await client.get_workflow_handle(review).signal("resolve", decision)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier2.refunds() == [2000]
    (told,) = done.tool_outputs
    assert '"refund_id":' in told and done.statuses == ["success"]
    shown = receipt(tier2.effect_id(), journal=tier2.journal)
    assert (shown.final, shown.dispatches) == ("COMMITTED", 1)


async def test_a_gated_tool_runs_in_the_workflow_only() -> None:
    """Put in a node that runs as an activity (or called anywhere outside a workflow), the tool
    refuses, saying where it belongs, and its synchronous path says to await it."""
    from interlock_temporal.langgraph import effect_as_tool
    from workflows.agent_refund import refund

    tool = effect_as_tool(refund, context={"case_id": "c", "order_id": "o", "premises": None})
    call = {"type": "tool_call", "id": "call_0", "name": "refund", "args": {"amount_cents": 1}}
    with pytest.raises(RuntimeError, match="'execute_in': 'workflow'"):
        await tool.ainvoke(call)
    with pytest.raises(NotImplementedError, match="await it"):
        tool.invoke(call)
    assert sorted(tool.tool_call_schema.model_json_schema()["properties"]) == [  # type: ignore[union-attr]
        "amount_cents",
        "reason",
    ]


async def test_two_calls_in_doubt_in_one_tool_node_each_wait_for_their_own_review(
    tier3: Case, offline: Trap
) -> None:
    """Both calls of one model message land and lose their answers (tier 3): two effects in
    doubt, two reviews. The graph pauses on one; decided, it resumes, the node runs both calls
    again, and pauses on the other; decided, it goes on. Nothing is sent twice, and the model
    reads both outcomes."""
    tier3.payments.arm("after_commit", "reset", count=2)
    other = tier3.payments.open_order(f"{tier3.order_id}-b", 10_000)
    both = (
        Call("refund", {"amount_cents": 2000, "reason": "overcharged"}),
        Call("refund_other", {"amount_cents": 3000, "reason": "overcharged"}),
    )
    model = ScriptedChatModel(steps=[both, Say("Both refunds are on their way.")])
    async with worker(tier3, model) as client:
        handle = await start(tier3, client, other_order_id=other)

        async def two_in_doubt() -> bool:
            rows = [r for r in tier3.journal.effects() if r.effect_type == "refund"]
            return len(rows) == 2 and all([await review_open(client, r.effect_id) for r in rows])

        await until(two_in_doubt, "two reviews")
        decided = {"decision": "happened", "operator": "carol"}

        async def paused(n: int) -> bool:
            return len(await handle.query(LangGraphCase.paused_on)) == n

        await until(lambda: paused(1), "the graph paused on one review")
        (first,) = await handle.query(LangGraphCase.paused_on)
        await client.get_workflow_handle(first).signal("resolve", decided)
        await until(lambda: paused(2), "the graph paused again, on the other review")
        second = (await handle.query(LangGraphCase.paused_on))[1]
        assert second != first and len(model.seen) == 1  # the model still waits
        await client.get_workflow_handle(second).signal("resolve", decided)
        done = await asyncio.wait_for(handle.result(), 60)
    assert tier3.refunds() == [2000]
    assert [r.amount_cents for r in tier3.payments.refund_records(other)] == [3000]
    assert (
        done.tool_outputs
        == ["done: a person attested that it happened (no result was recorded)"] * 2
    )
    assert done.statuses == ["success", "success"]
    assert done.interrupts == [first, second]


async def test_a_review_nobody_decides_in_time_reaches_the_model_as_the_refusal(
    tier3: Case, offline: Trap
) -> None:
    """The graph pauses on the review; ``review_timeout`` passes with nobody deciding; the
    graph resumes with ``timed_out``, and the model reads that the outcome is unknown (the tool's
    error). Nothing is sent again; the review stays open for the person."""
    tier3.payments.arm("after_commit", "reset")
    model = ScriptedChatModel(steps=SCRIPTS["refund"])
    async with worker(tier3, model) as client:
        handle = await start(tier3, client, review_timeout_s=1.0)
        done = await asyncio.wait_for(handle.result(), 60)
        eid = tier3.effect_id()
        assert await review_open(client, eid)
        await client.get_workflow_handle(review_id("ambiguous", eid)).terminate("test over")
    assert tier3.refunds() == [2000]
    (told,) = done.tool_outputs
    assert told.startswith("error: refund outcome unknown (") and done.statuses == ["error"]
    assert done.interrupts == [review_id("ambiguous", eid)]
    assert model.seen[-1] == [told]
