"""What every agent framework's story worker process shares (``workers.agent_story``,
``workers.langgraph_story``, ``workers.pydantic_ai_story``): its options, the payments service
and kill hook they name, and running until SIGTERM with ``READY`` printed once it polls (the
demos and tests start, SIGKILL and restart these)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import kill_at


def story_parser(description: str | None, scripts: Collection[str] = ()) -> argparse.ArgumentParser:
    """The options of an agent framework's story worker (``--script``: one of ``scripts``, when
    the framework's model is chosen by the worker)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--target", required=True, help="Temporal frontend, HOST:PORT")
    p.add_argument("--task-queue", required=True)
    p.add_argument("--journal", required=True, help="journal URL: sqlite:///interlock.db")
    p.add_argument("--payments", type=Path, required=True, help="the simulated service's file")
    p.add_argument("--tier", type=int, default=2, choices=(1, 2, 3))
    if scripts:
        p.add_argument("--script", choices=sorted(scripts), default="refund")
    p.add_argument("--kill-at", action="append", default=[], help="gate point to SIGKILL at")
    p.add_argument("--kill-marker", type=Path, help="fire --kill-at once across processes")
    return p


def story_parts(
    args: argparse.Namespace,
) -> tuple[SimulatedPayments, Callable[[str, str], None] | None]:
    """The payments service a story worker's refunds land on, and its kill hook."""
    payments = SimulatedPayments(args.payments, tier=args.tier)
    hook = kill_at(*args.kill_at, marker=args.kill_marker) if args.kill_at else None
    return payments, hook


async def serve(worker: AbstractAsyncContextManager[Any]) -> None:
    """Run a story worker until SIGTERM or SIGINT, saying ``READY`` once it polls."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        print(f"READY pid={os.getpid()} host={socket.gethostname()}", flush=True)
        await stop.wait()
