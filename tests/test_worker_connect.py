"""The worker's connection to Temporal on a cold start: it waits for a server that comes up late
(a real dev server, started on the port the worker is already trying), with backoff, and gives
up with a clear message only after its time limit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from interlock_temporal.testing import DevServer, WorkerProcess, free_port
from workers.health import beat, check
from workers.worker import parse, with_backoff

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.server


async def test_a_server_that_starts_listening_late_is_waited_for() -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    said: list[str] = []
    started = time.monotonic()
    connecting = asyncio.create_task(
        with_backoff(
            lambda: Client.connect(target),
            what=f"Temporal at {target}",
            give_up_after_s=30,
            first_delay_s=0.1,
            max_delay_s=0.4,
            say=said.append,
        )
    )
    await asyncio.sleep(1.0)
    assert not connecting.done(), "connected before anything listened"
    server = await DevServer(port=port, ui_port=None).start()
    try:
        client = await asyncio.wait_for(connecting, 10)
        assert time.monotonic() - started >= 1.0
        # the client really talks to the late server
        info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
        assert info.server_version
    finally:
        await server.stop()
    # it retried, reporting each failure, and backed off: 0.1, 0.2, then 0.4 s capped
    assert len(said) >= 4
    assert said[0].startswith(f"Temporal at {target} not reachable yet (attempt 1)")
    assert "retrying in 0.10 s" in said[0] and "retrying in 0.20 s" in said[1]
    assert all("retrying in 0.40 s" in line for line in said[2:])


async def test_it_gives_up_after_its_limit_naming_the_target() -> None:
    target = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(RuntimeError) as gave_up:
        await with_backoff(
            lambda: Client.connect(target),
            what=f"Temporal at {target}",
            give_up_after_s=1.0,
            first_delay_s=0.1,
            say=lambda _: None,
        )
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed <= 1.5
    assert str(gave_up.value).startswith(f"could not connect to Temporal at {target} in ")
    assert "attempts)" in str(gave_up.value) and "Connection refused" in str(gave_up.value)


async def test_a_mistake_that_is_not_a_connection_failure_is_not_retried() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad argument")

    with pytest.raises(ValueError, match="bad argument"):
        await with_backoff(broken, what="x", give_up_after_s=10, say=lambda _: None)
    assert calls == 1


def test_the_limit_is_an_option_with_a_cold_start_sized_default() -> None:
    base = ["--target", "t:7233", "--journal", "sqlite:///x.db"]
    assert parse(base).connect_timeout_s == 300.0
    assert parse([*base, "--connect-timeout-s", "12"]).connect_timeout_s == 12.0


# -- the container's health check: the real worker's heartbeat ------------------------------


async def test_a_polling_worker_keeps_its_health_file_fresh(
    dev_server: DevServer, tmp_path: Path
) -> None:
    health = tmp_path / "worker.health"
    probe = [sys.executable, "-m", "workers.health", "--max-age-s", "10", str(health)]
    assert subprocess.run(probe, cwd=ROOT, capture_output=True).returncode == 1  # not started
    worker = WorkerProcess(
        [
            "-m",
            "workers.worker",
            *("--target", dev_server.target, "--task-queue", f"health-{uuid.uuid4().hex[:8]}"),
            *("--journal", f"sqlite:///{tmp_path / 'journal.db'}"),
            *("--payments", str(tmp_path / "payments.db")),
        ],
        cwd=ROOT,
        env={"INTERLOCK_SIGNING_KEY": "11" * 32, "INTERLOCK_HEALTH_FILE": str(health)},
    )
    await worker.start()
    try:
        await asyncio.sleep(0.3)
        done = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    finally:
        await worker.stop()
    written = float(health.read_text())
    assert abs(written - time.time()) < 10
    # a worker that stopped beating turns unhealthy once its last beat is older than the limit
    stale = subprocess.run(
        [*probe[:-3], "--max-age-s", "0.01", str(health)], cwd=ROOT, text=True, capture_output=True
    )
    assert stale.returncode == 1
    assert f"heartbeat {health} is " in stale.stderr and "s old (more than 0.01 s)" in stale.stderr


def test_the_health_check_says_why_without_a_heartbeat(tmp_path: Path) -> None:
    assert check(tmp_path / "none", 30) == (
        f"no heartbeat at {tmp_path / 'none'}: the worker has not started polling"
    )
    (tmp_path / "bad").write_text("not a time")
    assert (check(tmp_path / "bad", 30) or "").startswith(
        f"heartbeat {tmp_path / 'bad'} unreadable"
    )
    beat(tmp_path / "ok")
    assert check(tmp_path / "ok", 30) is None
    assert check(tmp_path / "ok", 30, now=time.time() + 31) is not None
