"""The worker's connection to Temporal on a cold start: it waits for a server that comes up late
(a real dev server, started on the port the worker is already trying), with backoff, and gives
up with a clear message only after its time limit."""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from interlock_temporal.testing import DevServer, free_port
from workers.worker import parse, with_backoff

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
