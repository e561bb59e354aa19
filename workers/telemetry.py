"""OpenTelemetry export for a deployed worker: OTLP over HTTP to a collector (the
docker-compose stack's), for Temporal's spans and the gate's spans, metrics and receipts.

Needs the ``otlp`` extra: ``pip install 'interlock-temporal[otlp]'``.
"""

from __future__ import annotations

from typing import Any

from interlock_temporal.core.extras import MissingExtra, needs_extra


def otlp_plugins(endpoint: str, service: str = "interlock-worker") -> tuple[Any, list[Any]]:
    """(the Interlock ``Telemetry``, the plugins to put *before* ``InterlockPlugin``): every
    signal is exported to ``endpoint`` (``http://collector:4318``)."""
    try:
        with needs_extra("otlp", "OTLP export"):
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except MissingExtra as missing:
        raise SystemExit(str(missing)) from None  # the worker's command line: one line
    from opentelemetry import trace
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, create_tracer_provider

    from interlock_temporal import Telemetry

    base = endpoint.rstrip("/")
    resource = Resource.create({"service.name": service})
    tracer_provider = create_tracer_provider(resource=resource)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"))
    )
    trace.set_tracer_provider(tracer_provider)
    meter_provider = MeterProvider(
        resource=resource,
        metric_readers=[
            PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{base}/v1/metrics"))
        ],
    )
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(
        BatchLogRecordProcessor(OTLPLogExporter(endpoint=f"{base}/v1/logs"))
    )
    telemetry = Telemetry(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        logger_provider=logger_provider,
    )
    return telemetry, [OpenTelemetryPlugin(add_temporal_spans=True)]
