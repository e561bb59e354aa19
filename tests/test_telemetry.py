"""OpenTelemetry on a real server: the gate's spans are children of Temporal's activity spans,
with an event per transition; metrics count final states, decisions and latency; receipts are
log records; and a secret canary in the activity's input appears in none of them."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, create_tracer_provider
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, Telemetry
from interlock_temporal._tools.calls import ToolReply
from interlock_temporal._tools.spans import EXECUTE_TOOL, OPERATION, OPT_IN_VALUE, OPT_IN_VARIABLE
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.policy import Limits, Policy
from interlock_temporal.testing import DevServer
from workflows.agent_refund import SERVICES, refund

from . import test_policy_server as policies
from .server_workflows import ApprovedCall, RunCalls
from .test_agents import make_case
from .tool_workflows import ToolCalls, ToolCallsFile

pytestmark = pytest.mark.server

SPANS = InMemorySpanExporter()
_PROVIDER = create_tracer_provider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(_PROVIDER)


async def test_gate_spans_nest_under_activity_spans_and_no_secret_leaves(
    dev_server: DevServer, tmp_path: Path
) -> None:
    SPANS.clear()
    metrics = InMemoryMetricReader()
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    telemetry = Telemetry(
        tracer_provider=trace.get_tracer_provider(),
        meter_provider=MeterProvider(metric_readers=[metrics]),
        logger_provider=logger_provider,
    )
    journal = open_journal(tmp_path / "journal.db", signing_key="11" * 32)
    lease = journal.leases.issue("billing-agent", activities=["charge"])
    policy = Policy(Limits(max_repeat_calls=2), secret_arguments=["card_number"])
    client = await Client.connect(
        dev_server.target,
        data_converter=pydantic_data_converter,
        plugins=[
            OpenTelemetryPlugin(add_temporal_spans=True),
            InterlockPlugin(
                f"sqlite:///{tmp_path / 'journal.db'}",
                signing_key="11" * 32,
                policy=policy,
                telemetry=telemetry,
            ),
        ],
    )
    queue = f"otel-{uuid.uuid4().hex[:8]}"
    order = f"o-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ApprovedCall, RunCalls],
        activities=[policies.charge, policies.search],
    ):
        charged = await client.execute_workflow(
            ApprovedCall.run,
            {
                "principal": "billing-agent",
                "lease": lease,
                "activity": "charge",
                "arg": {
                    "order_id": order,
                    "amount_cents": 1_234,
                    "card_number": policies.CANARY_CARD,
                    "api_key": policies.CANARY_KEY,
                },
            },
            id=f"charge-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        assert charged == {"ok": {"charged": 1_234}}
        looped = await client.execute_workflow(
            RunCalls.run,
            {"principal": "billing-agent", "calls": [{"activity": "search", "arg": order}] * 3},
            id=f"loop-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        assert [o.get("code") for o in looped][-1] == "MAX_REPEAT_EXCEEDED"

    spans = SPANS.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    (gate,) = [s for s in spans if s.name == "interlock.effect charge"]
    parent = by_id[gate.parent.span_id]  # type: ignore[union-attr]
    assert parent.name == "RunActivity:charge"
    eid = effect_id("charge", {"order": policies_key(order)})
    assert gate.attributes is not None
    assert gate.attributes["interlock.effect_id"] == eid
    assert gate.attributes["interlock.state"] == "COMMITTED"
    assert gate.attributes["interlock.tier"] == 2
    assert [e.name for e in gate.events] == ["DISPATCHED", "COMMITTED"]
    policy_spans = [s for s in spans if s.name == "interlock.policy search"]
    assert len(policy_spans) == 3
    assert all(by_id[s.parent.span_id].name == "RunActivity:search" for s in policy_spans)  # type: ignore[union-attr]
    assert policy_spans[-1].attributes["interlock.reason"] == "MAX_REPEAT_EXCEEDED"  # type: ignore[index]

    data = metrics.get_metrics_data()
    assert data is not None
    points = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    effects = {dict(p.attributes)["interlock.state"]: p.value for p in points["interlock.effects"]}
    assert effects == {"COMMITTED": 1}
    decisions: dict[tuple[str, str], int] = {}
    for p in points["interlock.policy.decisions"]:
        key = (dict(p.attributes)["interlock.verdict"], dict(p.attributes)["interlock.reason"])
        decisions[key] = decisions.get(key, 0) + p.value
    assert decisions[("DENY", "MAX_REPEAT_EXCEEDED")] == 1
    assert decisions[("ALLOW", "-")] == 3  # the charge, and two searches
    (latency,) = points["interlock.gate.latency"]
    assert latency.count == 1 and latency.sum > 0

    records = logs.get_finished_logs()
    receipts = [r for r in records if r.log_record.event_name == "interlock.receipt"]
    assert len(receipts) == 1
    assert eid in str(receipts[0].log_record.body)

    exported = [
        *(s.to_json() for s in spans),
        data.to_json(),
        *(r.to_json() for r in records),
    ]
    for text in exported:
        assert policies.CANARY_CARD not in text and policies.CANARY_KEY not in text
        # and no argument value at all: the order id is the activity's input
        assert order not in text
    journal.close()


def policies_key(order: str) -> str:
    return order


_UNTRACED_THEN_TRACED = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from interlock_temporal import Telemetry

telemetry = Telemetry()  # no provider given, none set globally yet

# untraced: the gate's span is a non-recording one carrying its parent's context, and what
# the gate sets on it never lands on the parent (here, another library's recording span)
outside = InMemorySpanExporter()
other = TracerProvider()
other.add_span_processor(SimpleSpanProcessor(outside))
with other.get_tracer("someone-else").start_as_current_span("activity") as parent:
    with telemetry.effect_span("refund", 1) as span:
        assert not span.is_recording()
        assert span.get_span_context() == parent.get_span_context()
        span.set_attribute("interlock.effect_id", "e1")
        assert trace.get_current_span() is parent
(activity,) = outside.get_finished_spans()
assert "interlock.effect_id" not in (activity.attributes or {})

# a global provider set after the telemetry was made: spans go to it
mine = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(mine))
trace.set_tracer_provider(provider)
with telemetry.effect_span("refund", 1) as span:
    assert span.is_recording()
    assert trace.get_current_span() is span
(effect,) = mine.get_finished_spans()
assert effect.name == "interlock.effect refund", effect.name
print("ok")
"""


def test_an_untraced_gate_makes_no_span_and_picks_up_a_provider_set_later() -> None:
    """The gate skips making spans while no tracer provider exists (each attempt paid for the
    no-op ones), and starts the moment a global provider is set. In a fresh interpreter: this
    module sets the global provider, which can be set only once."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _UNTRACED_THEN_TRACED],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


async def test_a_tool_calls_span_holds_the_gate_span_that_names_its_effect(
    dev_server: DevServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call through the core path that succeeds: its ``execute_tool`` span (made in the
    workflow) does not carry the effect id, which the workflow cannot know; the gate's
    ``interlock.effect`` span, which does, is its descendant through Temporal's activity spans,
    so a trace shows both."""
    monkeypatch.setenv(OPT_IN_VARIABLE, OPT_IN_VALUE)
    SPANS.clear()
    case = make_case(dev_server, tmp_path, 2)
    client = await Client.connect(
        dev_server.target,
        data_converter=pydantic_data_converter,
        plugins=[
            OpenTelemetryPlugin(add_temporal_spans=True),
            InterlockPlugin(case.journal_url, targets={"refund": case.payments}),
        ],
    )
    SERVICES[case.task_queue] = case.payments
    try:
        async with Worker(
            client, task_queue=case.task_queue, workflows=[ToolCalls], activities=[refund]
        ):
            (reply,) = await client.execute_workflow(
                ToolCalls.run,
                ToolCallsFile(
                    case_id=case.case_id,
                    order_id=case.order_id,
                    lease_id=case.lease_id,
                    calls=[("call-1", '{"amount_cents": 2000, "reason": "overcharged"}')],
                ),
                id=f"tools-{uuid.uuid4().hex[:8]}",
                task_queue=case.task_queue,
                result_type=list[ToolReply],
            )
        (row,) = [r for r in case.journal.effects() if r.effect_type == "refund"]
    finally:
        SERVICES.pop(case.task_queue, None)
        case.journal.close()
    assert not reply.refused
    spans = SPANS.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    (tool,) = [s for s in spans if (s.attributes or {}).get(OPERATION) == EXECUTE_TOOL]
    (gate,) = [s for s in spans if s.name == "interlock.effect refund"]
    assert "interlock.effect_id" not in (tool.attributes or {})
    assert (gate.attributes or {})["interlock.effect_id"] == row.effect_id
    chain, at = [], gate
    while at.parent is not None and at.parent.span_id in by_id:
        at = by_id[at.parent.span_id]
        chain.append(at.name)
    assert tool.name in chain, chain
    assert chain.index(tool.name) > chain.index("RunActivity:refund"), chain
