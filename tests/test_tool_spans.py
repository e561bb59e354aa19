"""The ``execute_tool`` spans of gated tool calls (GenAI semantic conventions 1.44.0, opted in
with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``), on a real dev server: one
span per call, carrying the framework's call id (the scripted model's ``call_0``, ``call_1``,
through the OpenAI Agents SDK and the real Temporal plugin), the effect and how the gate ended
it; none when the user did not opt in, none more when the workflow replays (a worker that
caches nothing replays its history at every step), none of our own where the framework made
one; and no argument value in any exported span. And what ``register`` refuses."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from interlock_temporal import gated
from interlock_temporal._tools.calls import ToolReply, register
from interlock_temporal._tools.spans import (
    OPERATION,
    OPT_IN_VALUE,
    OPT_IN_VARIABLE,
    TOOL_CALL_ID,
    TOOL_NAME,
)
from interlock_temporal.review import review_id
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from workers.agent_story import SCRIPTS, SERVICES, ScriptedModel, agent_plugins
from workflows.agent_case import AgentCase, AgentCaseOutcome
from workflows.agent_refund import refund

from .test_agents import Case, make_case, offline  # noqa: F401 (a fixture)
from .tool_workflows import ToolCalls, ToolCallsFile

pytestmark = pytest.mark.server

SPANS = InMemorySpanExporter()
# spans go to a plain SDK provider of this module's, not the process's global one (which can be
# set once, and another module sets Temporal's replay-safe provider, which drops spans ended
# during a replay by itself): so what keeps a replay from making spans here is the gate's own
# check, and the tests pass whichever module is imported first
PLAIN = TracerProvider()
PLAIN.add_span_processor(SimpleSpanProcessor(SPANS))


@pytest.fixture(autouse=True)
def plain_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def get_tracer(name: str, version: str | None = None, **options: Any) -> Any:
        options.pop("tracer_provider", None)
        return PLAIN.get_tracer(name, version, **options)

    monkeypatch.setattr(trace, "get_tracer", get_tracer)
    # and the process has a provider: the gate makes its own spans only where one is set
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: PLAIN)
    SPANS.clear()
    yield


#: what the scripts' models send as arguments: none may be exported
ARGUMENT_TEXTS = ("overcharged", "for the trouble")
ARGUMENT_AMOUNTS = (2000, 3000)


@pytest.fixture
def opted_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(OPT_IN_VARIABLE, f"http,{OPT_IN_VALUE}")
    SPANS.clear()
    yield


def tool_spans() -> list[ReadableSpan]:
    spans = [s for s in SPANS.get_finished_spans() if (s.attributes or {}).get(OPERATION)]
    return sorted(spans, key=lambda s: s.start_time or 0)


def leaked(spans: Sequence[ReadableSpan]) -> list[str]:
    """The argument values anything the spans export holds: a text in a name or a string
    value, an amount as a value of its own (not as digits inside a duration or an id)."""
    found: list[str] = []
    for s in spans:
        named: list[tuple[str, Any]] = [("name", s.name)]
        named += [(f"{s.name}.{k}", v) for k, v in (s.attributes or {}).items()]
        for e in s.events:
            named.append((f"{s.name}.{e.name}", e.name))
            named += [(f"{s.name}.{e.name}.{k}", v) for k, v in (e.attributes or {}).items()]
        for where, value in named:
            values = list(value) if isinstance(value, (tuple, list)) else [value]
            for v in values:
                text = str(v)
                if any(t in text for t in ARGUMENT_TEXTS) or any(
                    text == str(a) for a in ARGUMENT_AMOUNTS
                ):
                    found.append(f"{where}={text}")
    return found


async def run_agent(case: Case, script: str, *, cached: bool = True, **changes: Any) -> Any:
    """The agent's case on a worker of its own (``cached=False``: a worker that keeps no
    workflow in its cache, so every workflow task replays the history from the start)."""
    model = ScriptedModel(SCRIPTS[script])
    client = await Client.connect(
        case.dev_server.target, plugins=agent_plugins(model, case.journal_url, case.payments)
    )
    SERVICES[case.task_queue] = case.payments
    worker = Worker(
        client,
        task_queue=case.task_queue,
        workflows=[AgentCase, ToolCalls],
        activities=[refund],
        max_cached_workflows=0 if not cached else 1000,
    )
    try:
        async with worker:
            handle = await case.start(client, **changes)
            done = await asyncio.wait_for(handle.result(), 90)
    finally:
        SERVICES.pop(case.task_queue, None)
    return client, handle, done


@pytest.mark.usefixtures("offline")
async def test_each_call_is_one_span_with_the_models_call_id_even_replayed_at_every_step(
    dev_server: Any, tmp_path: Path, opted_in: None
) -> None:
    """The must-show: the scripted model calls the refund tool twice (``call_0``: $20, its
    answer lost, AMBIGUOUS; ``call_1``: $30 re-decided, ``conflicting_payload``); a worker
    that caches nothing replays the run at each of its steps. Two ``execute_tool`` spans, each
    with its model's call id, the effect's id, the state the gate ended it in."""
    case = make_case(dev_server, tmp_path, 3)
    case.payments.arm("after_commit", "reset")
    client, _, done = await run_agent(case, "redecide", cached=False, wait_for_review=False)
    eid = case.effect_id()
    await client.get_workflow_handle(review_id("ambiguous", eid)).terminate("test over")
    assert isinstance(done, AgentCaseOutcome) and len(done.tool_outputs) == 2
    first, second = tool_spans()
    for span, call_id in ((first, "call_0"), (second, "call_1")):
        attributes = span.attributes or {}
        assert span.name == "execute_tool refund"
        assert attributes[TOOL_CALL_ID] == call_id
        assert attributes[TOOL_NAME] == "refund"
        assert attributes["gen_ai.tool.type"] == "function"
        assert attributes["interlock.effect_id"] == eid  # beside the call id, never in its place
        assert attributes["interlock.refused"] is True
    assert (first.attributes or {})["interlock.state"] == "AMBIGUOUS"
    assert (second.attributes or {})["interlock.state"] == "REFUSED"
    assert (second.attributes or {})["interlock.reason"] == "conflicting_payload"
    assert (second.attributes or {})["error.type"] == "EffectRefused"
    assert not leaked(SPANS.get_finished_spans())
    case.journal.close()


@pytest.mark.usefixtures("offline")
async def test_a_replayed_history_makes_no_span_and_a_success_has_its_own(
    dev_server: Any, tmp_path: Path, opted_in: None
) -> None:
    case = make_case(dev_server, tmp_path, 2)
    _, handle, done = await run_agent(case, "refund")
    assert done.final_output == "Your refund is on its way."
    (span,) = tool_spans()
    attributes = span.attributes or {}
    assert (attributes[TOOL_CALL_ID], attributes["interlock.state"]) == ("call_0", "DONE")
    assert attributes["interlock.refused"] is False
    assert span.status.is_ok
    replayer = Replayer(
        workflows=[AgentCase],
        plugins=agent_plugins(ScriptedModel(SCRIPTS["refund"]), case.journal_url, case.payments),
    )
    await replayer.replay_workflow(await handle.fetch_history())
    assert tool_spans() == [span]  # the replay made none
    case.journal.close()


@pytest.mark.usefixtures("offline")
async def test_without_the_opt_in_no_gen_ai_span_is_made(
    dev_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OPT_IN_VARIABLE, raising=False)
    SPANS.clear()
    case = make_case(dev_server, tmp_path, 2)
    _, _, done = await run_agent(case, "refund")
    assert case.refunds() == [2000] and done.tool_outputs
    made = SPANS.get_finished_spans()
    assert made  # the gate's own spans still are
    assert not [s.name for s in made if any(k.startswith("gen_ai.") for k in s.attributes or {})]
    case.journal.close()


async def test_where_the_framework_made_the_span_the_gate_adds_to_it(
    dev_server: Any, tmp_path: Path, opted_in: None
) -> None:
    """A framework that makes its own ``execute_tool`` span (here the workflow, for two
    calls): no second span; the gate's attributes and its event are on the framework's."""
    case = make_case(dev_server, tmp_path, 2)
    calls = [("fw-1", '{"amount_cents": 2000, "reason": "overcharged"}'), ("fw-2", "{}")]
    client = await Client.connect(
        dev_server.target,
        plugins=agent_plugins(ScriptedModel(SCRIPTS["refund"]), case.journal_url, case.payments),
    )
    SERVICES[case.task_queue] = case.payments
    try:
        async with Worker(
            client, task_queue=case.task_queue, workflows=[ToolCalls], activities=[refund]
        ):
            replies = await client.execute_workflow(
                ToolCalls.run,
                ToolCallsFile(
                    case_id=case.case_id,
                    order_id=case.order_id,
                    lease_id=case.lease_id,
                    calls=calls,
                    framework_span=True,
                ),
                id=f"tools-{uuid.uuid4().hex[:8]}",
                task_queue=case.task_queue,
                result_type=list[ToolReply],
            )
    finally:
        SERVICES.pop(case.task_queue, None)
    done, invalid = replies
    assert not done.refused and invalid.refused
    assert invalid.text.startswith("error: refund got invalid arguments: refund.amount_cents")
    sent, refused = tool_spans()
    assert [s.instrumentation_scope.name for s in (sent, refused)] == ["a-framework"] * 2
    assert (sent.attributes or {})[TOOL_CALL_ID] == "fw-1"
    assert (sent.attributes or {})["interlock.state"] == "DONE"
    assert (sent.attributes or {})["interlock.toolset"] == "support"
    assert (sent.attributes or {})["interlock.tier"] == 2
    assert [e.name for e in sent.events] == ["interlock.DONE"]
    assert (refused.attributes or {})["interlock.reason"] == "invalid_arguments"
    assert not leaked(SPANS.get_finished_spans())
    case.journal.close()


def test_register_refuses_what_cannot_be_gated_honestly(tmp_path: Path) -> None:
    payments = SimulatedPayments(tmp_path / "payments.db", tier=3)

    @activity.defn
    async def plain(r: RefundRequest) -> RefundResult:
        raise AssertionError("never run")

    context = {"case_id": "c", "order_id": "o"}
    with pytest.raises(TypeError, match="activity 'plain' is not gated: wrap it with gated"):
        register(plain, context=context)
    keyless = gated(plain, target=payments)
    line = '@gated(target=..., key=lambda r: {"case_id": r.case_id, "order_id": r.order_id})'
    with pytest.raises(TypeError, match="'plain' declares no key=") as refused:
        register(keyless, context=context)
    assert str(refused.value).endswith(line)
    with pytest.raises(TypeError, match="context names 'case', not a field of RefundRequest"):
        register(refund, context={"case": "c"})
    with pytest.raises(TypeError, match="context of 'refund' must name the fields"):
        register(refund, context={})
    with pytest.raises(
        TypeError, match=r"not fit RefundRequest: context.case_id: string_type"
    ) as bad:
        register(refund, context={"case_id": 12345, "order_id": "o"})
    assert "12345" not in str(bad.value)  # the field named, never its value
    keyed = gated(plain, target=payments, key=lambda r: {"case": r.case_id})
    with pytest.raises(TypeError, match=r"declares tier=1, but .* declares tier 3"):
        register(keyed, context=context, tier=1)
    tool = register(keyed, context=context, toolset="support", start_to_close_timeout=timedelta(1))
    assert (tool.tier, tool.effect_type, tool.name, tool.toolset) == (
        3,
        "plain",
        "plain",
        "support",
    )
    assert set(tool.params_json_schema["properties"]) == {"amount_cents", "reason", "premises"}
    assert tool.arguments.model_config.get("extra") == "forbid"
