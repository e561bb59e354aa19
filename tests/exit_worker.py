"""A worker process for the clean-exit test: OpenTelemetry's plugin (tracing on) with or without
``InterlockPlugin``, one workflow left waiting in the worker's cache (as a review nobody has
decided is), then the worker stops and the process exits.

``python -m tests.exit_worker TARGET JOURNAL [--without-interlock]``; prints ``STOPPED`` once the
worker has shut down."""

from __future__ import annotations

import argparse
import asyncio
import uuid
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from opentelemetry import trace
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, create_tracer_provider
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    from interlock_temporal import InterlockPlugin


@workflow.defn
class WaitsForever:
    """Left waiting when its worker stops, like a review nobody has decided."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


async def main(target: str, journal: str, with_interlock: bool) -> None:
    trace.set_tracer_provider(create_tracer_provider())
    plugins: list[Any] = [OpenTelemetryPlugin(add_temporal_spans=True)]
    if with_interlock:
        plugins.append(InterlockPlugin(journal, signing_key="11" * 32))
    client = await Client.connect(target, data_converter=pydantic_data_converter, plugins=plugins)
    queue = f"exit-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[WaitsForever]):
        handle = await client.start_workflow(
            WaitsForever.run, id=f"waits-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        for _ in range(200):  # until the worker ran the run's first task: it is cached now
            events = [e.event_type async for e in handle.fetch_history_events()]
            if EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in events:
                break
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError("the worker never ran the workflow")
    await handle.terminate()
    print("STOPPED", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("journal")
    parser.add_argument("--without-interlock", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.target, args.journal, not args.without_interlock))
