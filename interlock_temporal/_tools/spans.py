"""One OpenTelemetry ``execute_tool`` span per gated tool call, in the GenAI semantic conventions.

The problem: a trace of an agent shows each tool call as an ``execute_tool`` span (the GenAI
conventions), but nothing on it says what the gate did: which effect the call named, at which
tier, whether it was sent, refused, or waits for a person. And two spans for one call (the
framework's and ours) make every dashboard count calls twice.

The mechanism: ``ToolSpan.begin`` looks at the span current when the call starts. Where the
framework already made the call's ``execute_tool`` span (its ``gen_ai.operation.name`` is
``execute_tool`` and its ``gen_ai.tool.name``, when set, is this tool's), the gate adds its
``interlock.*`` attributes and an event for the state the call ended in to that span, and makes
none. Otherwise it makes one, named ``execute_tool <tool>``, with ``gen_ai.operation.name``,
``gen_ai.tool.name``, ``gen_ai.tool.type`` and ``gen_ai.tool.call.id`` (the framework's own call
id, never the effect id in its place; left out where the framework has none, as MCP does), and
makes it current while the call runs, so the gate's activity-side ``interlock.effect`` span (and
the Temporal OpenTelemetry plugin's activity spans) nest under it. Only names, ids, the tier,
states and codes are exported, never an argument value.

Which conventions: semantic conventions **1.44.0**, ``execute_tool`` spans, which are at
Development status there. As the conventions ask of instrumentations that emit Development
GenAI conventions, the spans are off unless the user opts in:
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` (one value of the comma-separated
list), read when a call starts.

Workflow code replays: a span made while the workflow replays history would be a second span for
a call already reported, so none is made or changed while ``workflow.unsafe.is_replaying()``.
A call whose start was replayed (the worker evicted the run while it waited, e.g. for a review)
and whose end is new gets its span at the end, started at the workflow time the call began:
still one span per call. The OpenTelemetry SDK runs outside the sandbox (this package is passed
through, as the Temporal OpenTelemetry plugin passes ``opentelemetry`` through), inside
``sandbox_unrestricted`` so a span processor may read the clock or take a lock. Cost: with the
opt-in off, one environment read per call; with it on, one span per call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from temporalio import workflow

from .._worker.telemetry import EFFECT_ID, INSTRUMENTATION, REASON, STATE, TIER

#: the semantic-conventions release these spans follow (GenAI: Development status)
SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
#: the environment variable, and the value in it, by which a user opts in to the spans
OPT_IN_VARIABLE = "OTEL_SEMCONV_STABILITY_OPT_IN"
OPT_IN_VALUE = "gen_ai_latest_experimental"

#: the GenAI attributes (semantic conventions 1.44.0)
OPERATION = "gen_ai.operation.name"
EXECUTE_TOOL = "execute_tool"
TOOL_NAME = "gen_ai.tool.name"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_CALL_ID = "gen_ai.tool.call.id"
ERROR_TYPE = "error.type"
#: ours, beside the gate's own (``interlock.effect_id``, ``interlock.tier``, ...)
TOOLSET = "interlock.toolset"
REFUSED = "interlock.refused"


def opted_in() -> bool:
    """Whether the user asked for the GenAI spans (``OTEL_SEMCONV_STABILITY_OPT_IN``)."""
    values = os.environ.get(OPT_IN_VARIABLE, "")
    return OPT_IN_VALUE in {v.strip() for v in values.split(",")}


def _replaying() -> bool:
    return workflow.in_workflow() and workflow.unsafe.is_replaying()


def _unrestricted() -> AbstractContextManager[None]:
    if workflow.in_workflow():
        return workflow.unsafe.sandbox_unrestricted()
    return nullcontext()


def _now_ns() -> int:
    return workflow.time_ns() if workflow.in_workflow() else 0


def _frameworks(tool: str) -> Span | None:
    """The framework's ``execute_tool`` span of this call, if it made one and it is current."""
    span = trace.get_current_span()
    attributes = getattr(span, "attributes", None)
    if not span.is_recording() or not isinstance(attributes, Mapping):
        return None
    if attributes.get(OPERATION) != EXECUTE_TOOL:
        return None
    named = attributes.get(TOOL_NAME)
    return span if named is None or named == tool else None


class ToolSpan:
    """The ``execute_tool`` span of one tool call: ``begin`` it where the call starts, run the
    call inside ``current()``, ``end`` it with how the call ended. Inert when the user did not
    opt in."""

    def __init__(
        self,
        tool: str,
        call_id: str | None,
        tier: int | None,
        toolset: str | None,
        *,
        enabled: bool,
    ) -> None:
        self.tool = tool
        self.call_id = call_id
        self.tier = tier
        self.toolset = toolset
        self.enabled = enabled
        self.parent = otel_context.get_current()
        self.began_ns = _now_ns() if enabled else 0
        self.framework: Span | None = _frameworks(tool) if enabled else None
        self.span: Span | None = None
        if enabled and self.framework is None and not _replaying():
            with _unrestricted():
                self.span = self._start(start_time=None)

    @classmethod
    def begin(
        cls, tool: str, *, call_id: str | None, tier: int | None, toolset: str | None = None
    ) -> ToolSpan:
        return cls(tool, call_id, tier, toolset, enabled=opted_in())

    def _ours(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        if self.tier is not None:
            attributes[TIER] = self.tier
        if self.toolset:
            attributes[TOOLSET] = self.toolset
        return attributes

    def _start(self, start_time: int | None) -> Span:
        attributes: dict[str, Any] = {
            OPERATION: EXECUTE_TOOL,
            TOOL_NAME: self.tool,
            TOOL_TYPE: "function",
            **self._ours(),
        }
        if self.call_id:
            attributes[TOOL_CALL_ID] = self.call_id
        tracer = trace.get_tracer(INSTRUMENTATION, schema_url=SCHEMA_URL)
        return tracer.start_span(
            f"{EXECUTE_TOOL} {self.tool}",
            context=self.parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start_time,
            record_exception=False,
            set_status_on_exception=False,
        )

    def current(self) -> AbstractContextManager[Any]:
        """Make our span current while the call runs (the activity's spans nest under it)."""
        if self.span is None:
            return nullcontext()
        return trace.use_span(self.span, end_on_exit=False)

    def end(
        self,
        state: str,
        *,
        effect_id: str | None = None,
        code: str | None = None,
        refused: bool = False,
        error: str | None = None,
    ) -> None:
        """The call ended in ``state`` (what the gate answered), for effect ``effect_id`` when
        known, with the refusal's or error's ``code``; ``error``: the error type of a call
        that did not succeed (``error.type``)."""
        if not self.enabled or _replaying():
            return
        with _unrestricted():
            span = self.framework or self.span
            if span is None:  # its start was replayed: made now, as of when the call began
                span = self.span = self._start(start_time=self.began_ns or None)
            ended: dict[str, Any] = {STATE: state, REFUSED: refused}
            if self.framework is not None:
                ended.update(self._ours())
            if effect_id:
                ended[EFFECT_ID] = effect_id
            if code:
                ended[REASON] = code
            if error:
                ended[ERROR_TYPE] = error
            span.set_attributes(ended)
            span.add_event(
                f"interlock.{state}",
                {k: v for k, v in ((EFFECT_ID, effect_id), (REASON, code)) if v},
            )
            if error:
                span.set_status(Status(StatusCode.ERROR, f"{state}: {code or error}"))
            if span is not self.framework:
                span.end()
