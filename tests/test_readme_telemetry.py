"""The README's OpenTelemetry worker, run as written on a real dev server, in a process of its
own (OpenTelemetry's global tracer provider can be set once per process, and the tests' own
process has set one already).

The block is written to ``traced_worker.py`` beside the README's app (``refunds.py``,
``support_case.py``, ``lease.py``), with the server's address in place of ``localhost:7233``
and a task queue of the test's own in place of ``refunds``.
A harness (the glue) runs its ``main()`` with one addition: an in-memory span exporter on the
provider the block makes (``create_tracer_provider`` wrapped, as the page's own call). It starts
one support case, stops the worker, and prints the finished spans: the gate's
``interlock.effect refund`` span must be a child of Temporal's ``RunActivity:refund``.

With ``plain``, the wrapper hands the block a plain SDK ``TracerProvider`` instead: the worker
refuses to start, with the message the README quotes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer

from .doc_snippets import ROOT, snippet
from .test_readme_example import app_env, at, run, write_app

pytestmark = pytest.mark.server

HARNESS = """\
import asyncio
import contextlib
import gc
import json
import sys

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

import traced_worker
from interlock_temporal.targets.payments import RefundRequest
from support_case import Case, SupportCase

ADDRESS, QUEUE, LEASE, PROVIDER = sys.argv[1:5]
SPANS = InMemorySpanExporter()
made = traced_worker.create_tracer_provider


def create_tracer_provider(*args, **kwargs):
    provider = TracerProvider() if PROVIDER == "plain" else made(*args, **kwargs)
    provider.add_span_processor(SimpleSpanProcessor(SPANS))
    return provider


traced_worker.create_tracer_provider = create_tracer_provider


async def main() -> None:
    worker = asyncio.ensure_future(traced_worker.main())
    client = await Client.connect(ADDRESS, data_converter=pydantic_data_converter)
    decision = RefundRequest(case_id="c-1", order_id="o-1", amount_cents=2000)
    case = asyncio.ensure_future(
        client.execute_workflow(
            SupportCase.run,
            Case(lease_id=LEASE, decision=decision),
            id=f"traced-case-{QUEUE}",
            task_queue=QUEUE,
        )
    )
    await asyncio.wait([worker, case], return_when=asyncio.FIRST_COMPLETED)
    if worker.done():
        with contextlib.suppress(Exception):  # the case waits for no worker
            await client.get_workflow_handle(f"traced-case-{QUEUE}").terminate()
        case.cancel()
        worker.result()  # the worker's own error, if it could not start
    await case
    worker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await worker
    spans = [
        {
            "name": s.name,
            "id": s.context.span_id,
            "parent": s.parent.span_id if s.parent else None,
            "attributes": dict(s.attributes or {}),
        }
        for s in SPANS.get_finished_spans()
    ]
    print("SPANS " + json.dumps(spans))


asyncio.run(main())
gc.collect()  # the SDK's client freed before Python exits (temporalio/sdk-python#300)
"""


def traced_app(directory: Path, address: str) -> tuple[str, str]:
    """The README's app and its traced worker in ``directory``; its task queue and the lease."""
    queue = write_app(directory, address)
    traced = at(snippet("docs/operations/telemetry.md#328d27e8d20f"), address, queue)
    (directory / "traced_worker.py").write_text(traced)
    (directory / "harness.py").write_text(HARNESS)
    payments = SimulatedPayments(directory / "payments.db", tier=2)
    payments.open_order("o-1", 5000)
    payments.close()
    return queue, run(directory, "lease.py").strip().splitlines()[-1]


def harness(
    directory: Path, address: str, app: tuple[str, str], provider: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "harness.py", address, *app, provider],
        cwd=directory,
        env=app_env(directory),
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_the_gate_span_is_a_child_of_temporals_activity_span(
    dev_server: DevServer, tmp_path: Path
) -> None:
    app = traced_app(tmp_path, dev_server.target)
    done = harness(tmp_path, dev_server.target, app, "replay-safe")
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("SPANS ")]
    spans = json.loads(line.removeprefix("SPANS "))
    by_id = {s["id"]: s for s in spans}
    (gate,) = [s for s in spans if s["name"] == "interlock.effect refund"]
    assert by_id[gate["parent"]]["name"] == "RunActivity:refund"
    assert gate["attributes"]["interlock.state"] == "COMMITTED"
    assert gate["attributes"]["interlock.tier"] == 2
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    try:
        assert payments.refunded_cents("o-1") == 2000  # the traced worker did the work
    finally:
        payments.close()
    # the block's own exporter printed the same spans to the console
    assert '"name": "interlock.effect refund"' in done.stdout


async def test_a_plain_tracer_provider_is_refused_as_the_readme_says(
    dev_server: DevServer, tmp_path: Path
) -> None:
    app = traced_app(tmp_path, dev_server.target)
    done = harness(tmp_path, dev_server.target, app, "plain")
    assert done.returncode != 0
    message = (
        "ValueError: When using OpenTelemetryPlugin, the global trace provider must be a "
        "ReplaySafeTracerProvider."
    )
    assert message in done.stderr, done.stderr[-3000:]
    readme = " ".join((ROOT / "docs" / "operations" / "telemetry.md").read_text().split())
    assert f"`{message} ...`" in readme
    assert "SPANS " not in done.stdout
