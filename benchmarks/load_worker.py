"""A worker process for figure 7 (``benchmarks.load``):
``python -m benchmarks.load_worker --target HOST:PORT --task-queue Q [--journal URL]``.

Runs ``LoadOne`` workflows, each one activity ``load_effect``: gated (the plugin installed,
the journal at ``--journal``) or, without ``--journal``, ungated (no plugin at all). Prints
``READY`` once it polls. With ``--timings``, gated, it notes for every effect how long the
results of its two journal appends waited for this process's event loop
(``Journal.observe_appends``) and writes them there as JSON when it gets SIGTERM. Its Python
threads carry their names at the OS level too (``name_os_threads``), so the figure can split
the process's CPU by thread from ``/proc``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, gated, open_journal
from interlock_temporal.core.journal.group_commit import AppendTiming
from interlock_temporal.workflow import act_as

from .throughput import NullTarget

ACTIVITY = "load_effect"
TARGET = NullTarget()
#: activities a worker process runs at once (the SDK's default is 100)
CONCURRENCY = 100


@activity.defn(name=ACTIVITY)
async def ungated_effect(n: int) -> int:
    return n


@activity.defn(name=ACTIVITY)
@gated(target=TARGET, key=lambda n: {"n": n, "load": True})
async def gated_effect(n: int) -> int:
    return n


@workflow.defn(name="LoadOne", sandboxed=False)
class LoadOne:
    """One gated (or ungated) effect: the unit of the load figure."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> int:
        with act_as("load-bot", lease=spec.get("lease")):
            result: int = await workflow.execute_activity(
                ACTIVITY, spec["n"], start_to_close_timeout=timedelta(seconds=120)
            )
        return result


class Timings:
    """Per effect, for its appends in order (dispatch, then commit): the wait for the loop,
    the wait in the queue (for the batch before and ``commit_delay``), and the time from
    queued to written."""

    def __init__(self) -> None:
        self.loop_wait: dict[str, list[float]] = {}
        self.queued: dict[str, list[float]] = {}
        self.queued_to_written: dict[str, list[float]] = {}
        self.batches: list[int] = []
        #: SQLite: (when, seconds) each write transaction's ``BEGIN IMMEDIATE`` took (the wait
        #: for the database's write lock, which the other process may hold), on the loop
        self.begin: list[tuple[float, float]] = []

    def observe(self, t: AppendTiming) -> None:
        self.loop_wait.setdefault(t.effect_id, []).append(t.loop_wait)
        self.queued.setdefault(t.effect_id, []).append(t.started - t.submitted)
        self.queued_to_written.setdefault(t.effect_id, []).append(
            (t.written - t.submitted) if t.written else 0.0
        )
        self.batches.append(t.batch)

    def dump(self, path: Path) -> None:
        path.write_text(
            json.dumps(
                {
                    "loop_wait": self.loop_wait,
                    "queued": self.queued,
                    "queued_to_written": self.queued_to_written,
                    "batches": self.batches,
                    "begin": self.begin,
                }
            )
        )


def time_the_write_lock(journal: Any, timings: Timings) -> None:
    """SQLite: note how long each write transaction's ``BEGIN IMMEDIATE`` takes (measured in
    this benchmark's worker only, through the journal's ``observe_write_lock``; nothing else
    changes)."""
    if not hasattr(journal, "observe_write_lock"):
        return
    journal.observe_write_lock = lambda waited: timings.begin.append((time.time(), waited))


#: Linux's prctl option that names the calling thread (15 bytes at most)
_PR_SET_NAME = 15


def name_os_threads() -> None:
    """Every Python thread this process starts from now on takes its ``threading`` name
    (``interlock-journal_0``, ``temporal_workflow_1``, ...) as its OS name, which Python 3.11
    does not set: ``/proc/<pid>/task/<tid>/comm`` then tells them apart."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return
    run = threading.Thread.run

    def named_run(self: threading.Thread) -> None:
        with contextlib.suppress(Exception):
            libc.prctl(_PR_SET_NAME, self.name.encode()[:15], 0, 0, 0)
        run(self)

    threading.Thread.run = named_run  # type: ignore[method-assign]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--task-queue", required=True)
    p.add_argument("--journal", help="gated, with this journal (else ungated, no plugin)")
    p.add_argument("--key", help="the journal's signing key (hex)")
    p.add_argument("--timings", type=Path, help="gated: write the appends' loop waits here")
    p.add_argument("--identity", default=None)
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    plugins: list[Any] = []
    journal = None
    timings = Timings()
    if args.journal:
        journal = open_journal(args.journal, signing_key=args.key)
        if args.timings:
            journal.observe_appends = timings.observe
            time_the_write_lock(journal, timings)
        plugins.append(InterlockPlugin(journal))
    client = await Client.connect(
        args.target,
        data_converter=pydantic_data_converter,
        plugins=plugins,
        identity=args.identity or f"load-{args.task_queue}",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=[LoadOne],
        activities=[gated_effect if journal is not None else ungated_effect],
        max_concurrent_activities=CONCURRENCY,
    )
    async with worker:
        print("READY", flush=True)
        await stop.wait()
    if args.timings:
        timings.dump(args.timings)
    if journal is not None:
        journal.close()


def main(argv: list[str] | None = None) -> None:
    name_os_threads()
    asyncio.run(serve(parse(argv)))


if __name__ == "__main__":
    main()
