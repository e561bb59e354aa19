"""An agent built with Pydantic AI on Temporal (``TemporalAgent``, ``PydanticAIPlugin``) whose
refund tool is a gated activity in a ``GatedToolset``: on a real dev server, with the framework's
real Temporal integration, a scripted ``FunctionModel`` and offline (every proxy variable points
at a loopback trap that must see no connection).

What the agent was told is read from the run's messages (the tool returns the model was given);
the money from the payments service; the effect's record from the journal."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.instrumented import InstrumentationSettings
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer

from interlock_temporal import gated, receipt
from interlock_temporal._tools.spans import OPERATION
from interlock_temporal.core.models import Kind
from interlock_temporal.policy import CallEvent, Decision, Policy, deny_activity, escalate
from interlock_temporal.pydantic_ai import GatedToolset
from interlock_temporal.review import review_id
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer, WorkerProcess
from workers.pydantic_ai_story import pydantic_ai_plugins, pydantic_ai_worker
from workflows.agent_refund import refund
from workflows.pydantic_ai_case import (
    PydanticAICase,
    PydanticAICaseFile,
    PydanticAICaseOutcome,
)

from .agent_docs import refunds_once
from .doc_snippets import snippet, swap
from .test_agents import Case, make_case, offline  # noqa: F401 (a fixture)
from .test_tool_spans import PLAIN, SPANS, leaked, opted_in, plain_provider, tool_spans  # noqa: F401
from .waiting import review_open, until

pytestmark = [pytest.mark.server, pytest.mark.usefixtures("offline")]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def paid2(dev_server: DevServer, tmp_path: Path) -> Iterator[Case]:
    """A case at a tier-2 payments service (it can say whether a refund exists)."""
    case = make_case(dev_server, tmp_path, 2)
    yield case
    case.journal.close()


@pytest.fixture
def paid3(dev_server: DevServer, tmp_path: Path) -> Iterator[Case]:
    """A case at a tier-3 payments service (nobody can say whether a lost refund landed)."""
    case = make_case(dev_server, tmp_path, 3)
    yield case
    case.journal.close()


async def start(
    case: Case, client: Client, **changes: Any
) -> WorkflowHandle[PydanticAICase, PydanticAICaseOutcome]:
    file = PydanticAICaseFile(
        case_id=case.case_id, order_id=case.order_id, lease_id=case.lease_id, **changes
    )
    return await client.start_workflow(
        PydanticAICase.run,
        file,
        id=f"pai-{case.case_id}",
        task_queue=case.task_queue,
        result_type=PydanticAICaseOutcome,
    )


def nothing_pending(handle: WorkflowHandle[Any, Any]) -> Callable[[], Awaitable[bool]]:
    """Whether no activity of the run is pending (only the workflow waits, for a person)."""

    async def check() -> bool:
        return not (await handle.describe()).raw_description.pending_activities

    return check


def worker(case: Case, **options: Any) -> Any:
    return pydantic_ai_worker(
        case.dev_server.target, case.task_queue, case.journal_url, case.payments, **options
    )


async def test_the_agent_refunds_once_through_the_gate(paid2: Case) -> None:
    async with worker(paid2) as client:
        handle = await start(paid2, client)
        done = await asyncio.wait_for(handle.result(), 60)
    assert paid2.refunds() == [2000]
    (landed,) = paid2.payments.refund_records(paid2.order_id)
    eid = paid2.effect_id()
    assert landed.effect_id == eid
    shown = receipt(eid, journal=paid2.journal)
    assert (shown.final, shown.via) == ("COMMITTED", "dispatch")
    (told,) = done.tool_outputs
    assert f'"refund_id":"{landed.refund_id}"' in told
    assert done.tool_outcomes == ["success"]
    assert done.final_output == "Your refund is on its way."
    assert [r.kind for r in paid2.journal.read(eid)].count(Kind.DISPATCHED) == 1


async def test_a_crash_after_the_send_sends_once(paid2: Case, client: Client) -> None:
    """Tier 2: the worker process SIGKILLs itself right after the refund was sent, before the
    gate recorded its result; a fresh worker process takes the run over, asks the service,
    finds the refund and records it: one $20 refund, and the agent is told its result."""
    args = ["-m", "workers.pydantic_ai_story", "--target", paid2.dev_server.target]
    args += ["--task-queue", paid2.task_queue, "--journal", paid2.journal_url]
    args += ["--payments", str(paid2.path / "payments.db")]
    marker = ["--kill-at", "after_send", "--kill-marker", str(paid2.path / "killed")]
    doomed = await WorkerProcess([*args, *marker], cwd=ROOT).start()
    fresh: WorkerProcess | None = None
    try:
        handle = await start(paid2, client)
        await asyncio.wait_for(doomed.wait(), 60)
        assert doomed.killed, doomed.log
        assert paid2.refunds() == [2000]  # sent; the journal does not know its result yet
        row = paid2.journal.row(paid2.effect_id())
        assert row is not None and row.status is Kind.DISPATCHED
        fresh = await WorkerProcess(args, cwd=ROOT).start()
        done = await asyncio.wait_for(handle.result(), 60)
    finally:
        for process in (doomed, fresh):
            if process is not None:
                await process.stop()
    (landed,) = paid2.payments.refund_records(paid2.order_id)
    assert landed.amount_cents == 2000
    shown = receipt(paid2.effect_id(), journal=paid2.journal)
    assert (shown.final, shown.via, shown.dispatches) == ("COMMITTED", "recovery-query", 1)
    (told,) = done.tool_outputs
    assert f'"refund_id":"{landed.refund_id}"' in told
    assert done.final_output == "Your refund is on its way."


async def test_an_effect_in_doubt_is_a_deferred_call_whose_review_reaches_the_agent(
    paid3: Case,
) -> None:
    """Tier 3, the refund's answer lost: AMBIGUOUS. The tool call is deferred (the agent's run
    ends with DeferredToolRequests) and the workflow waits for the EffectReview: no activity
    waits meanwhile. A person resolves it (``happened``); the call's result goes back to the
    agent as DeferredToolResults and the agent finishes."""
    paid3.payments.arm("after_commit", "reset")
    async with worker(paid3) as client:
        handle = await start(paid3, client)

        async def opened() -> bool:
            rows = [r for r in paid3.journal.effects() if r.effect_type == "refund"]
            return bool(rows) and await review_open(client, rows[0].effect_id)

        await until(opened, "the review of the refund in doubt")
        eid = paid3.effect_id()
        assert receipt(eid, journal=paid3.journal).final == "AMBIGUOUS"

        await until(nothing_pending(handle), "no activity pending while the review waits")
        review = client.get_workflow_handle(review_id("ambiguous", eid))
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        done = await asyncio.wait_for(handle.result(), 60)
    assert paid3.refunds() == [2000]
    (told,) = done.tool_outputs
    assert told == "done: a person attested that it happened (no result was recorded)"
    assert done.tool_outcomes == ["success"]
    assert done.final_output == "Your refund is on its way."
    resolved = receipt(eid, journal=paid3.journal)
    assert (resolved.final, resolved.operator, resolved.dispatches) == ("RESOLVED", "carol", 1)
    history = await handle.fetch_history()
    model_requests = [
        e
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and "model_request" in e.activity_task_scheduled_event_attributes.activity_type.name
    ]
    assert len(model_requests) == 2  # the call, then the answer after the review: one run each


async def test_a_re_decided_amount_is_refused_as_conflicting_payload(paid2: Case) -> None:
    """$20 lands; the model re-decides $30 for the same case: the same effect, another
    payload, refused as ``conflicting_payload``; the agent reads it as the tool's error (a
    failed tool return, no retry spent) and the run completes; nothing more is sent."""
    async with worker(paid2) as client:
        handle = await start(paid2, client, script="redecide")
        done = await asyncio.wait_for(handle.result(), 60)
    assert paid2.refunds() == [2000]
    landed, refused = done.tool_outputs
    assert '"refund_id"' in landed
    assert refused == (
        "error: refund refused (conflicting_payload): conflicting_payload: a different "
        "payload was proposed under an effect id already decided."
    )
    assert done.tool_outcomes == ["success", "failed"]
    assert done.final_output == "I could not refund more; a colleague will follow up."
    eid = paid2.effect_id()
    assert receipt(eid, journal=paid2.journal).final == "COMMITTED"
    rejected = [e.data["code"] for e in paid2.journal.read(eid) if e.kind is Kind.REJECTED_PROPOSAL]
    assert rejected == ["conflicting_payload"]


async def test_a_policy_denial_reaches_the_model_as_the_tools_error(paid2: Case) -> None:
    """A denial raised as ``ModelRetry`` would be a retry prompt (and spend the tool's
    retries); as the tool's error it is a failed tool return the model reads, and the run goes
    on."""
    policy = Policy(rules=[deny_activity("refund", code="REFUNDS_PAUSED", reason="paused")])
    async with worker(paid2, policy=policy) as client:
        handle = await start(paid2, client)
        done = await asyncio.wait_for(handle.result(), 60)
    assert paid2.refunds() == []
    (told,) = done.tool_outputs
    assert told.startswith("error: refund denied by policy (REFUNDS_PAUSED): REFUNDS_PAUSED: ")
    assert done.tool_outcomes == ["failed"]
    assert done.final_output == "Your refund is on its way."  # the script goes on; the run ends


@pytest.mark.usefixtures("opted_in")
async def test_each_call_is_one_execute_tool_span_with_the_models_call_id(paid2: Case) -> None:
    async with worker(paid2) as client:
        handle = await start(paid2, client, script="redecide")
        done = await asyncio.wait_for(handle.result(), 60)
    assert len(done.tool_outputs) == 2
    first, second = tool_spans()
    eid = paid2.effect_id()
    for span, call_id in ((first, "call_0"), (second, "call_1")):
        attributes = span.attributes or {}
        assert span.name == "execute_tool refund"
        assert attributes["gen_ai.tool.call.id"] == call_id
        assert attributes["gen_ai.tool.name"] == "refund"
        assert attributes["interlock.toolset"] == "refunds"
    assert ((first.attributes or {})["interlock.state"], first.status.is_ok) == ("DONE", True)
    assert (second.attributes or {})["interlock.state"] == "REFUSED"
    assert (second.attributes or {})["interlock.effect_id"] == eid
    assert (second.attributes or {})["interlock.reason"] == "conflicting_payload"
    assert not leaked(SPANS.get_finished_spans())


async def test_the_docs_wiring_runs_as_written(
    dev_server: DevServer, client: Client, tmp_path: Path
) -> None:
    """docs/agents.md's Pydantic AI block, with the README's refunds.py beside it, run as a
    worker process of its own; the only glue: the server's address, a task queue of this
    test's own, and the scripted model in place of OpenAI's."""
    (tmp_path / "refunds.py").write_text(snippet("README.md#bf636f2c37e6"))
    text = snippet("docs/agents.md#3216aabdaea9")
    queue = f"pai-docs-{uuid.uuid4().hex[:8]}"
    text = swap(text, '"localhost:7233"', f'"{dev_server.target}"')
    text = swap(text, 'task_queue="agents"', f'task_queue="{queue}"')
    text = swap(text, '"openai:gpt-5"', 'scripted(SCRIPTS["refund"])')
    glue = "from workflows.pydantic_ai_case import SCRIPTS, scripted\n"
    (tmp_path / "support_agent.py").write_text(glue + text)
    await refunds_once(
        client, tmp_path, program="support_agent.py", workflow="SupportAgent", queue=queue
    )


def over_25_dollars_asks_a_person(event: CallEvent) -> Decision | None:
    if event.activity == "refund" and event.argument("amount_cents", 0) > 2500:
        return escalate("OVER_25", "refunds over $25 need a person")
    return None


async def approval_review(case: Case, client: Client) -> WorkflowHandle[Any, Any]:
    """The review of the one approval the case's policy asked for, once it is open."""

    async def asked() -> bool:
        return bool(case.journal.policy.approvals())

    await until(asked, "the approval the $50 refund waits for")
    (pending,) = case.journal.policy.approvals()
    review = client.get_workflow_handle(review_id("approval", pending.binding))

    async def open_() -> bool:
        try:
            return bool((await review.query("status"))["state"] == "open")
        except Exception:
            return False

    await until(open_, "the approval's review")
    return review


async def test_a_call_that_needs_an_approval_is_deferred_until_a_person_approves(
    paid2: Case,
) -> None:
    """A policy rule escalates the $50 refund: the call is deferred (no activity waits); a
    person approves it on its review; the call runs then, once, and the agent is given its
    result; its next call ($20, the same case: the same effect) is refused as
    ``conflicting_payload`` (the $50 was the one sent)."""
    policy = Policy(rules=[over_25_dollars_asks_a_person])
    async with worker(paid2, policy=policy) as client:
        handle = await start(paid2, client, script="greedy")

        review = await approval_review(paid2, client)
        assert paid2.refunds() == []

        await until(nothing_pending(handle), "no activity pending while the approval waits")
        await review.signal("resolve", {"decision": "approve", "operator": "carol"})
        done = await asyncio.wait_for(handle.result(), 60)
    assert paid2.refunds() == [5000]
    approved, refused = done.tool_outputs
    assert '"amount_cents":5000' in approved
    assert refused.startswith("error: refund refused (conflicting_payload)")
    assert done.tool_outcomes == ["success", "failed"]
    assert receipt(paid2.effect_id(), journal=paid2.journal).final == "COMMITTED"


async def test_a_deferred_call_a_person_rejects_sends_nothing_and_the_model_reads_why(
    paid2: Case,
) -> None:
    """The same $50 refund, rejected on its review: nothing is sent, and the deferred call's
    result is the refusal the model reads (a failed tool return, not a retry). A rejection
    answers the call a person was asked about, not the effect (no effect was recorded: the
    policy stopped it before the journal's first entry), so the agent's next call, $20, which
    the policy lets through without a person, is sent once."""
    policy = Policy(rules=[over_25_dollars_asks_a_person])
    async with worker(paid2, policy=policy) as client:
        handle = await start(paid2, client, script="greedy")

        review = await approval_review(paid2, client)
        await review.signal("resolve", {"decision": "reject", "operator": "carol"})
        done = await asyncio.wait_for(handle.result(), 60)
    assert paid2.refunds() == [2000]  # the $50 was never sent
    rejected, sent = done.tool_outputs
    assert rejected.startswith("error: refund refused"), rejected
    assert "rejected by carol" in rejected
    assert '"amount_cents":2000' in sent
    assert done.tool_outcomes == ["failed", "success"]


async def test_a_deferred_call_replays_at_every_step_and_from_its_history(paid3: Case) -> None:
    """The deferred path is workflow code: on a worker that caches nothing (each workflow task
    replays the run from its start) the review still reaches the agent, and the finished
    history replays without a nondeterminism error."""
    paid3.payments.arm("after_commit", "reset")
    async with worker(paid3, cached=False) as client:
        handle = await start(paid3, client)

        async def opened() -> bool:
            rows = [r for r in paid3.journal.effects() if r.effect_type == "refund"]
            return bool(rows) and await review_open(client, rows[0].effect_id)

        await until(opened, "the review of the refund in doubt")
        review = client.get_workflow_handle(review_id("ambiguous", paid3.effect_id()))
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        done = await asyncio.wait_for(handle.result(), 60)
    assert done.tool_outputs == [
        "done: a person attested that it happened (no result was recorded)"
    ]
    assert paid3.refunds() == [2000]
    replayer = Replayer(
        workflows=[PydanticAICase],
        plugins=pydantic_ai_plugins(paid3.journal_url, paid3.payments),
    )
    await replayer.replay_workflow(await handle.fetch_history())


@pytest.fixture
def instrumented() -> Iterator[None]:
    """Every Pydantic AI agent instrumented (its own ``execute_tool`` span per call), to this
    module's provider, without message content."""
    Agent.instrument_all(InstrumentationSettings(tracer_provider=PLAIN, include_content=False))
    try:
        yield
    finally:
        Agent.instrument_all(False)


@pytest.mark.usefixtures("opted_in", "instrumented")
async def test_where_pydantic_ai_made_the_span_the_gate_adds_to_it(paid2: Case) -> None:
    """An instrumented agent makes its own ``execute_tool`` span per call: the gate makes no
    second one, and adds its attributes and event to the framework's."""
    async with worker(paid2) as client:
        handle = await start(paid2, client, script="redecide")
        done = await asyncio.wait_for(handle.result(), 60)
    assert len(done.tool_outputs) == 2
    executed = [s for s in tool_spans() if (s.attributes or {})[OPERATION] == "execute_tool"]
    first, second = executed  # the framework's invoke_agent and chat spans beside them
    for span, call_id in ((first, "call_0"), (second, "call_1")):
        attributes = span.attributes or {}
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == "pydantic-ai"  # the framework's span
        assert attributes["gen_ai.tool.call.id"] == call_id
        assert attributes["interlock.toolset"] == "refunds"
    assert (first.attributes or {})["interlock.state"] == "DONE"
    assert (second.attributes or {})["interlock.state"] == "REFUSED"
    assert [e.name for e in second.events if e.name.startswith("interlock.")] == [
        "interlock.REFUSED"
    ]
    assert not leaked(SPANS.get_finished_spans())


def test_gated_toolset_refuses_what_would_let_the_model_name_the_effect(tmp_path: Path) -> None:
    @activity.defn
    async def plain(r: RefundRequest) -> RefundResult:
        raise AssertionError("never run")

    toolset = GatedToolset("refunds")
    with pytest.raises(TypeError, match="activity 'plain' is not gated"):
        toolset.add(plain, context={"case_id": "c"})
    keyless = gated(plain, target=SimulatedPayments(tmp_path / "payments.db", tier=3))
    with pytest.raises(TypeError, match="'plain' declares no key="):
        toolset.add(keyless, context={"case_id": "c"})
    context = {"case_id": "c", "order_id": "o", "premises": None}
    tool = toolset.add(refund, context=context)
    assert set(tool.params_json_schema["properties"]) == {"amount_cents", "reason"}
    with pytest.raises(ValueError, match="a tool named 'refund' is there"):
        toolset.add(refund, context=context)
    with pytest.raises(ValueError, match="id must be a non-empty string"):
        GatedToolset("")
