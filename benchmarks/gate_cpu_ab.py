"""A/B of the gate's CPU per new effect: the core of a git revision against the working tree's,
in one process, interleaved, each on its own ``synchronous=OFF`` journal (figure 1's CPU split:
thread CPU per ``Gate.run``, the part inside the journal's SQL statements counted apart).

    python -m benchmarks.gate_cpu_ab --base main --rounds 4000 --block 1

The base revision's ``interlock_temporal`` (its ``core`` is self-contained) is extracted into a
temporary directory and imported under another name beside the working tree's. Each round runs
``--block`` new effects on one side, then on the other, the order flipping every round, so both
see the same machine. Prints each side's p50 (µs) and new ÷ base; run the same revision against
itself (``--base HEAD`` on a clean tree) to see what the harness itself reads as a difference.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from datetime import timedelta
from io import BytesIO
from pathlib import Path
from types import ModuleType
from typing import Any

from . import ROOT
from .gate_cost import (
    FACTS,
    RESULT,
    ROTATE_WARMUP,
    SIGNING_KEY,
    _TimedConnection,
    issue_bench_lease,
    make_call,
)

BASE_NAME = "_gate_ab_base"


def extract_base(revision: str, directory: Path) -> str:
    """The package of ``revision`` under ``directory`` as ``BASE_NAME``; returns its name."""
    archive = subprocess.run(
        ["git", "archive", revision, "interlock_temporal/__init__.py", "interlock_temporal/core"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    (directory / "interlock_temporal").rename(directory / BASE_NAME)
    sys.path.insert(0, str(directory))
    return BASE_NAME


class _Target:
    name = "bench-trivial"
    dedupe_window: timedelta | None = None
    settle_time = timedelta(0)

    def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        return FACTS


async def _send(ticket: Any) -> Mapping[str, Any]:
    return RESULT


def _unsynced_and_timed(journal: Any, spent: list[int]) -> None:
    """``synchronous=OFF`` on a side's journal, and the thread CPU time of its statements
    counted into ``spent``. A base revision from before the SQLite journal named its
    ``connection`` and ``wrap_connections`` (issue 31) is driven through its private
    attributes."""
    if not hasattr(journal, "wrap_connections"):
        journal._db.execute("PRAGMA synchronous=OFF")  # private: a base from before issue 31
        journal._db = _TimedConnection(journal._db, spent)  # private: as above
        journal._reader = _TimedConnection(journal._reader, spent)  # private: as above
        return
    journal.connection.execute("PRAGMA synchronous=OFF")
    journal.wrap_connections(lambda db: _TimedConnection(db, spent))


class Side:
    """One package's gate on its own journal, and its samples (ns)."""

    def __init__(self, package: str, directory: Path) -> None:
        journals: ModuleType = importlib.import_module(f"{package}.core.journal")
        self.protocol: ModuleType = importlib.import_module(f"{package}.core.protocol")
        journal = journals.open_journal(
            f"sqlite:///{directory / package}.db", signing_key=SIGNING_KEY
        )
        issue_bench_lease(journal.leases)
        self.spent = [0, 0]
        _unsynced_and_timed(journal, self.spent)
        self.journal = journal
        self.gate = self.protocol.Gate(journal)
        self.target = _Target()
        self.made = 0
        self.total: list[int] = []
        self.sql: list[int] = []

    def call(self) -> Any:
        """A new effect as ``gate_cost.make_call`` makes it, in this side's package's types."""
        self.made += 1
        return make_call("ab", self.made - 1, self.protocol)

    async def run(self, n: int, *, record: bool = True) -> None:
        for _ in range(n):
            call = self.call()
            sql0, started = self.spent[0], time.thread_time_ns()
            await self.gate.run(call, self.target, _send)
            if record:
                self.total.append(time.thread_time_ns() - started)
                self.sql.append(self.spent[0] - sql0)

    def p50_us(self) -> tuple[float, float, float]:
        rest = [t - q for t, q in zip(self.total, self.sql, strict=True)]
        return tuple(statistics.median(x) / 1000 for x in (self.total, self.sql, rest))  # type: ignore[return-value]


async def compare(base: str, rounds: int, block: int, directory: Path) -> tuple[Side, Side]:
    a, b = Side(base, directory), Side("interlock_temporal", directory)
    try:
        for side in (a, b):
            await side.run(ROTATE_WARMUP, record=False)
        for round_ in range(rounds):
            for side in (a, b) if round_ % 2 == 0 else (b, a):
                await side.run(block)
    finally:
        a.journal.close()
        b.journal.close()
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=4000)
    parser.add_argument("--block", type=int, default=1, help="new effects per side per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        base = extract_base(args.base, Path(directory))
        a, b = asyncio.run(compare(base, args.rounds, args.block, Path(directory)))
    old, new = a.p50_us(), b.p50_us()
    print(f"thread CPU per new effect, p50 over {len(a.total):,} effects each (µs)")
    print(f"{'':>14} {'total':>8} {'SQL':>8} {'rest':>8}")
    print(f"{args.base:>14} {old[0]:8.1f} {old[1]:8.1f} {old[2]:8.1f}")
    print(f"{'working tree':>14} {new[0]:8.1f} {new[1]:8.1f} {new[2]:8.1f}")
    print(f"{'new / base':>14} " + " ".join(f"{n / o:8.3f}" for n, o in zip(new, old, strict=True)))


if __name__ == "__main__":
    main()
