"""A worker written as the README's, stopped with Ctrl-C (SIGINT) or SIGTERM: with
``run_worker`` it shuts down and exits 0 with nothing on stderr but what it said when it started;
with ``await worker.run()`` the only traceback is asyncio's ``KeyboardInterrupt`` (``asyncio.run``
raises it from itself), with no line of the plugin's. Real worker processes on a real dev
server, real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from interlock_temporal.testing import DevServer

from .waiting import until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]


async def polled(client: Client, task_queue: str) -> bool:
    """Whether a worker polls ``task_queue`` for activities (it runs, its signals handled)."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    return bool(response.pollers)


async def stopped_by(
    dev_server: DevServer, tmp_path: Path, sig: signal.Signals, *more: str
) -> tuple[int, str]:
    """Start the worker, wait until it polls, send ``sig``: its exit code and stderr."""
    queue = f"stop-{uuid.uuid4().hex[:8]}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
    environ["INTERLOCK_SIGNING_KEY"] = "11" * 32
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.stop_worker",
        dev_server.target,
        queue,
        str(tmp_path),
        *more,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environ,
        cwd=ROOT,
    )
    client = await Client.connect(dev_server.target)
    try:
        await until(lambda: polled(client, queue), "the worker polls its task queue")
        process.send_signal(sig)
        _, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode()


def startup_lines_removed(err: str) -> list[str]:
    """stderr without what the worker says as it starts (the journal's notices)."""
    return [line for line in err.splitlines() if not line.startswith("journal ")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_worker_run_by_run_worker_exits_quietly(
    dev_server: DevServer, tmp_path: Path, sig: signal.Signals
) -> None:
    code, err = await stopped_by(dev_server, tmp_path, sig)
    assert code == 0, err
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    assert startup_lines_removed(err) == [], err
    assert "has no operator roster" in err  # what it said as it started: the stderr is its


async def test_a_plain_worker_runs_traceback_is_asyncios_alone(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """What ``run_worker`` replaces: Ctrl-C on ``await worker.run()`` ends in asyncio's
    ``KeyboardInterrupt``, raised by ``asyncio.run``; the plugin adds no line of its own."""
    code, err = await stopped_by(dev_server, tmp_path, signal.SIGINT, "--plain")
    assert code == -signal.SIGINT, err
    lines = startup_lines_removed(err)
    assert lines[-1] == "KeyboardInterrupt", err
    assert "in run\n    raise KeyboardInterrupt()" in err, err
    said = [line for line in lines if line and line[0] != " " and "Traceback" not in line]
    assert said == [
        "asyncio.exceptions.CancelledError",
        "During handling of the above exception, another exception occurred:",
        "KeyboardInterrupt",
    ], err


async def test_a_cancelled_run_worker_stops_its_worker(dev_server: DevServer) -> None:
    """``run_worker`` cancelled from outside (its task cancelled, as a harness or a supervisor
    does) stops the worker, as a cancelled ``worker.run()`` does, instead of leaving it polling
    with nobody awaiting it."""
    from temporalio.worker import Worker

    from interlock_temporal import run_worker

    client = await Client.connect(dev_server.target)
    queue = f"cancel-{uuid.uuid4().hex[:8]}"

    from temporalio import activity

    @activity.defn
    async def noop() -> None:
        return None

    worker = Worker(client, task_queue=queue, activities=[noop])
    running = asyncio.create_task(run_worker(worker))
    await until(lambda: polled(client, queue), timeout=30)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, timeout=30)
    assert worker.is_shutdown
