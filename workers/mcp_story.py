"""The worker of the MCP story: ``McpCase`` with the gate, ``MCPPlugin`` (the real
``temporalio-mcp`` plugin) and the declared tools' gated activities, both connecting to the MCP
server at ``--mcp-url`` (``workers.mcp_server``, streamable HTTP).

``python -m workers.mcp_story --target HOST:PORT --task-queue Q --journal URL --mcp-url URL``
runs a worker process (it prints ``READY``); the tests start, SIGKILL (``--kill-at after_send``)
and restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from mcp import Client as McpClient
from temporalio.client import Client
from temporalio.mcp import MCPPlugin
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal.policy import Policy
from interlock_temporal.testing import kill_at
from workflows.mcp_case import McpCase
from workflows.mcp_tools import SERVERS


def connect_to(url: str) -> Callable[[], McpClient]:
    """A factory of MCP clients of the server at ``url`` (``MCPPlugin``'s form)."""
    return lambda: McpClient(url)


@asynccontextmanager
async def mcp_worker(
    target: str,
    task_queue: str,
    journal: str,
    mcp_url: str,
    *,
    on_point: Callable[[str, str], None] | None = None,
    policy: Policy | str | Path | None = None,
) -> AsyncIterator[Client]:
    """A worker for ``McpCase`` on ``task_queue``, running while inside; yields its client."""
    connect = connect_to(mcp_url)
    client = await Client.connect(
        target,
        plugins=[
            MCPPlugin({name: connect for name in SERVERS}),
            InterlockPlugin(journal, on_point=on_point, policy=policy),
        ],
    )
    activities: list[Any] = [a for s in SERVERS.values() for a in s.activities(connect)]
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[McpCase],
        activities=activities,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    async with worker:
        yield client


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="Temporal frontend, HOST:PORT")
    p.add_argument("--task-queue", required=True)
    p.add_argument("--journal", required=True, help="journal URL: sqlite:///interlock.db")
    p.add_argument("--mcp-url", required=True, help="the MCP server: http://HOST:PORT/mcp")
    p.add_argument("--kill-at", action="append", default=[], help="gate point to SIGKILL at")
    p.add_argument("--kill-marker", type=Path, help="fire --kill-at once across processes")
    p.add_argument("--pid-file", type=Path, help="write this process's pid there once ready")
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    hook = kill_at(*args.kill_at, marker=args.kill_marker) if args.kill_at else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with mcp_worker(args.target, args.task_queue, args.journal, args.mcp_url, on_point=hook):
        if args.pid_file is not None:
            args.pid_file.write_text(str(os.getpid()))
        print(f"READY pid={os.getpid()} host={socket.gethostname()}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
