"""OpenTelemetry: a span per gated call (a child of the activity's span when the Temporal
OpenTelemetry plugin runs outside ours), an event per transition, metrics for final states,
policy decisions and the gate's latency, and each receipt as a log record.

Only ids, names, states, codes and digests are exported: never an argument value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import LoggerProvider, SeverityNumber, get_logger_provider
from opentelemetry.trace import NonRecordingSpan, Span, Status, StatusCode

from ..core.models import Receipt
from ..core.policy import Decision
from ..core.protocol import Call, Done, Ticket
from .errors import (
    AmbiguousEffect,
    ApprovalRequired,
    AuthorityRejected,
    EffectInFlight,
    EffectRefused,
    InterlockDenied,
)
from .gated import sent_in_begin

#: the instrumentation scope (OpenTelemetry's term) the spans, metrics and logs are made under
INSTRUMENTATION = "interlock_temporal"

#: span attribute names
EFFECT_ID = "interlock.effect_id"
ACTIVITY = "interlock.activity"
STATE = "interlock.state"
TIER = "interlock.tier"
VIA = "interlock.via"
VERDICT = "interlock.verdict"
REASON = "interlock.reason"
POLICY = "interlock.policy_id"
ARGUMENT = "interlock.argument"

#: what the global tracer provider is while nobody has set one
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


class Attempt:
    """One gated attempt's span, recorded from what the gate's steps returned: ``began`` with
    what ``begin`` returned (the effect, and a send about to start or the attempt already
    done), ``committed`` with what the commit returned. How the attempt ended is recorded when
    ``Telemetry.attempt`` closes: the state it reached, or the one its error names."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.effect_id: str | None = None
        self.state: str | None = None
        self.gate_ms: float | None = None

    def began(self, call: Call, step: Ticket | Done) -> None:
        self.effect_id = step.effect_id
        self.span.set_attribute(EFFECT_ID, step.effect_id)
        if isinstance(step, Done) and sent_in_begin(call, step):
            # tier 0: dispatched and committed in begin's one transaction, by this attempt
            self._event("DISPATCHED", via=step.via, dispatch=1)
            self._event("COMMITTED", via=step.via)
            self.state = "COMMITTED"
        elif isinstance(step, Done):
            # done before: replayed from the journal, or as a person resolved it
            self._event(step.via.upper())
            self.state = "COMMITTED" if step.via != "resolved" else "RESOLVED"
        else:
            admitted = call.admission.get(step.effect_id)
            if admitted is not None:
                self.span.set_attributes(
                    {VERDICT: admitted.verdict.value, REASON: admitted.code or "-"}
                )
            self._event(
                "DISPATCHED", via=step.via, dispatch=step.dispatch_no, gate_ms=step.gate_s * 1000
            )

    def committed(self, done: Done) -> None:
        self._event("COMMITTED", via=done.via)
        self.state = "COMMITTED"
        self.gate_ms = None if done.gate_s is None else done.gate_s * 1000

    def _event(self, name: str, **attributes: Any) -> None:
        Telemetry.transition(self.span, name, **attributes)


class Telemetry:
    """Where the gate reports. Uses the global OpenTelemetry providers unless given others;
    with none configured every call is a no-op."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        logger_provider: LoggerProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
        self._tracer_given = tracer_provider is not None
        meter = metrics.get_meter(INSTRUMENTATION, meter_provider=meter_provider)
        self.effects = meter.create_counter(
            "interlock.effects",
            unit="{effect}",
            description="gated calls by the state they ended in",
        )
        self.decisions = meter.create_counter(
            "interlock.policy.decisions",
            unit="{decision}",
            description="policy decisions by verdict and reason",
        )
        self.refused_reviews = meter.create_counter(
            "interlock.reviews.refused",
            unit="{call}",
            description="calls to record a decision refused: not the genuine review, or votes "
            "that reach no decision under the worker's rules",
        )
        self.latency = meter.create_histogram(
            "interlock.gate.latency",
            unit="ms",
            description="the gate's own time per effect: before the send, and the commit's checks",
        )
        provider = logger_provider or get_logger_provider()
        self.logger = provider.get_logger(INSTRUMENTATION)
        #: receipts cost a journal read each: only where a log pipeline is configured (set
        #: the global providers before creating the plugin, or pass them)
        self.emits_receipts = type(provider).__name__ not in (
            "ProxyLoggerProvider",
            "NoOpLoggerProvider",
        )

    @contextlib.contextmanager
    def effect_span(self, activity: str, tier: int | None) -> Iterator[Span]:
        """The span of one gated attempt, current while it runs."""
        if not self._tracing():
            # what the no-op tracer would give, without making it current: every attempt
            # pays for this, traced or not
            yield NonRecordingSpan(trace.get_current_span().get_span_context())
            return
        attributes: dict[str, Any] = {ACTIVITY: activity}
        if tier is not None:
            attributes[TIER] = tier
        with self.tracer.start_as_current_span(
            f"interlock.effect {activity}",
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def _tracing(self) -> bool:
        """Whether spans go anywhere: a tracer provider was given, or one is set globally (it
        may be set after the plugin is made, so this is asked on each attempt)."""
        return self._tracer_given or not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)

    @contextlib.contextmanager
    def policy_span(self, activity: str) -> Iterator[Span]:
        with self.tracer.start_as_current_span(
            f"interlock.policy {activity}",
            attributes={ACTIVITY: activity},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @staticmethod
    def transition(span: Span, state: str, **attributes: Any) -> None:
        span.add_event(state, {k: v for k, v in attributes.items() if v is not None})

    @contextlib.contextmanager
    def attempt(
        self, activity: str, tier: int | None, receipt_of: Callable[[str], Receipt | None]
    ) -> Iterator[Attempt]:
        """Observe one gated attempt: its span, and how it ended (the outcome's error types
        name the state; a normal end is whatever the attempt reported)."""
        with self.effect_span(activity, tier) as span:
            attempt = Attempt(span)
            try:
                yield attempt
            except (AmbiguousEffect, EffectRefused) as err:
                state = "AMBIGUOUS" if isinstance(err, AmbiguousEffect) else "REFUSED"
                r = err.receipt
                self.finished(
                    span,
                    activity,
                    state,
                    effect_id=r.effect_id if r else attempt.effect_id,
                    code=r.code if r else None,
                )
                if r is not None and self.emits_receipts:
                    self.receipt(r)
                raise
            except InterlockDenied as err:
                self.finished(span, activity, "DENIED", effect_id=attempt.effect_id, code=err.code)
                raise
            except AuthorityRejected as err:
                self.finished(span, activity, "REJECTED", code=err.code)
                raise
            except ApprovalRequired as err:
                self.finished(
                    span, activity, "ESCALATED", effect_id=attempt.effect_id, code=err.code
                )
                raise
            except EffectInFlight:
                self.finished(span, activity, "IN_FLIGHT", effect_id=attempt.effect_id)
                raise
            except BaseException as err:
                # the send failed and Temporal retries: the effect is in doubt until then
                self.finished(
                    span,
                    activity,
                    "IN_DOUBT",
                    effect_id=attempt.effect_id,
                    code=type(err).__name__,
                )
                raise
            if attempt.state is not None:
                self.finished(
                    span,
                    activity,
                    attempt.state,
                    effect_id=attempt.effect_id,
                    gate_ms=attempt.gate_ms,
                )
                if attempt.effect_id is not None and self.emits_receipts:
                    found = receipt_of(attempt.effect_id)
                    if found is not None:
                        self.receipt(found)

    def decided(self, decision: Decision, activity: str) -> None:
        """Count a policy decision (the reason is a code, never a value)."""
        self.decisions.add(
            1,
            {
                VERDICT: decision.verdict.value,
                REASON: decision.code or "-",
                ACTIVITY: activity,
                "interlock.observed": decision.observed,
            },
        )

    def refused_review(self, code: str) -> None:
        """Count a refused call to record a decision (``code``: why, never who)."""
        self.refused_reviews.add(1, {REASON: code})

    def finished(
        self,
        span: Span,
        activity: str,
        state: str,
        *,
        effect_id: str | None = None,
        code: str | None = None,
        gate_ms: float | None = None,
    ) -> None:
        """The attempt ended in ``state`` (a final one, or IN_FLIGHT / DENIED / ESCALATED /
        REJECTED: its authority header granted nothing)."""
        span.set_attribute(STATE, state)
        if effect_id is not None:
            span.set_attribute(EFFECT_ID, effect_id)
        if code:
            span.set_attribute(REASON, code)
        if state in ("REFUSED", "AMBIGUOUS", "DENIED", "REJECTED"):
            span.set_status(Status(StatusCode.ERROR, f"{state}: {code or '-'}"))
        self.effects.add(1, {STATE: state, ACTIVITY: activity})
        if gate_ms is not None:
            self.latency.record(gate_ms, {ACTIVITY: activity})

    def receipt(self, receipt: Receipt) -> None:
        """The receipt as a log record: digests and names only, like the receipt itself."""
        self.logger.emit(
            event_name="interlock.receipt",
            severity_number=SeverityNumber.INFO,
            body=receipt.model_dump_json(),
            attributes={
                EFFECT_ID: receipt.effect_id,
                STATE: receipt.final,
                ACTIVITY: receipt.effect_type,
            },
        )
