"""Two checkouts of this project side by side, on what a change to the journal moves:
``python -m benchmarks.checkout_ab OTHER_CHECKOUT [--blocks 40] [--block 150]``, run from one
checkout, the other (``main``'s worktree, say) named. Each checkout runs in a process of its own
(its directory first on ``sys.path``, so an editable install elsewhere does not answer; this
file's measuring code, that checkout's journal and gate), and the two take turns:

- statements per new effect (``gate_cost.count_statements``, figure 1's calls under a lease with
  a cumulative budget) and the WAL frames a new effect writes, by table (``wal_pages.count``, as
  figure 1 counts them: the checkpoints stopped, the WAL's frame headers read after the effects,
  and each page's table from ``dbstat``; that file is this checkout's too);
- the CPU split (as ``gate_cost.cpu_split``: ``synchronous=OFF``, each new effect timed on the
  thread's CPU clock, the time inside the journal's SQL counted apart), in blocks of new effects,
  one checkout's block after the other's, the order swapped every block, so that both see the
  same machine. Reported: each side's p50s over all its effects, and the median over blocks of
  the ratio of the two sides' block p50s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from interlock_temporal.core.journal.sqlite import SqliteJournal
from interlock_temporal.core.protocol import Gate

from . import ROOT, bench_dir, wal_pages
from .gate_cost import (
    ROTATE_WARMUP,
    ConstantSend,
    Subject,
    TrivialTarget,
    _TimedConnection,
    count_statements,
    make_call,
    open_bench_journal,
)


def _time_statements(journal: SqliteJournal, spent: list[int]) -> None:
    """Count the thread CPU time of the journal's statements into ``spent``."""
    if not hasattr(journal, "wrap_connections"):
        old: Any = journal
        old._db = _TimedConnection(old._db, spent)  # private: a checkout from before issue 31
        old._reader = _TimedConnection(old._reader, spent)  # private: as above
        return
    journal.wrap_connections(lambda db: _TimedConnection(db, spent))


async def count(directory: Path, n: int) -> dict[str, Any]:
    """Statements per new effect, and WAL frames per new effect by table."""
    journal = open_bench_journal(directory / "count.db")
    subject = Subject("count", 0, journal)
    for _ in range(ROTATE_WARMUP):
        await subject.one(record=False)
    statements = await count_statements(subject, n)
    journal.close()
    pages = await wal_pages.count(directory / "pages.db", n)
    return {
        "statements": statements.statements,
        "inserts": statements.inserts,
        "commits": statements.commits,
        "wal_pages": pages.per_effect,
        "wal_pages_by_table": pages.by_table,
    }


async def worker() -> None:
    """One checkout's side: commands on stdin (``count N``, ``cpu N``), a JSON line for each."""
    directory = bench_dir(f"checkout-ab-{os.getpid()}")
    journal = open_bench_journal(directory / "cpu.db", durable=False)
    assert isinstance(journal, SqliteJournal)
    spent = [0, 0]
    _time_statements(journal, spent)
    gate, target, send = Gate(journal), TrivialTarget(), ConstantSend()
    for i in range(ROTATE_WARMUP):
        await gate.run(make_call("cpu-warm", i), target, send)
    next_i = 0
    for line in sys.stdin:
        what, n = line.split()
        if what == "count":
            print(json.dumps(await count(directory, int(n))), flush=True)
            continue
        totals, sqls = [], []
        for _ in range(int(n)):
            call = make_call("cpu", next_i)
            next_i += 1
            sql0, started = spent[0], time.thread_time_ns()
            await gate.run(call, target, send)
            totals.append((time.thread_time_ns() - started) / 1000)
            sqls.append((spent[0] - sql0) / 1000)
        print(json.dumps({"total": totals, "sql": sqls}), flush=True)
    journal.close()


#: a worker's start: this file's ``worker`` run as a module of the checkout's ``benchmarks``
#: package (which need not have this file, nor ``wal_pages``, loaded from here first), against
#: the checkout's ``interlock_temporal``
_BOOT = (
    "import asyncio, importlib.util, sys\n"
    "from pathlib import Path\n"
    "import benchmarks\n"
    "for name in ('wal_pages', 'checkout_ab'):\n"
    "    path = Path(sys.argv[1]) / f'{name}.py'\n"
    "    spec = importlib.util.spec_from_file_location(f'benchmarks.{name}', path)\n"
    "    assert spec is not None and spec.loader is not None\n"
    "    module = importlib.util.module_from_spec(spec)\n"
    "    sys.modules[spec.name] = module\n"
    "    setattr(benchmarks, name, module)\n"
    "    spec.loader.exec_module(module)\n"
    "asyncio.run(module.worker())\n"
)


def _start(checkout: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _BOOT, str(Path(__file__).resolve().parent)],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _ask(process: subprocess.Popen[str], command: str) -> Any:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return json.loads(process.stdout.readline())


def main(other: Path, blocks: int, block: int, effects: int) -> None:
    sides = {"this": _start(ROOT), "other": _start(other)}
    try:
        for name, process in sides.items():
            print(name, json.dumps(_ask(process, f"count {effects}")))
        seen: dict[str, dict[str, list[float]]] = {
            k: {"total": [], "sql": [], "p50": []} for k in sides
        }
        for b in range(blocks):
            for name in list(sides) if b % 2 == 0 else list(sides)[::-1]:
                got = _ask(sides[name], f"cpu {block}")
                seen[name]["total"] += got["total"]
                seen[name]["sql"] += got["sql"]
                seen[name]["p50"].append(statistics.median(got["total"]))
    finally:
        for process in sides.values():
            assert process.stdin is not None
            process.stdin.close()
            process.wait()
    for name, s in seen.items():
        rest = [t - q for t, q in zip(s["total"], s["sql"], strict=True)]
        print(
            f"{name}: CPU per new effect p50 {statistics.median(s['total']):.1f} us "
            f"(SQL {statistics.median(s['sql']):.1f}, the rest {statistics.median(rest):.1f}), "
            f"{len(s['total'])} effects"
        )
    this, that = seen["this"], seen["other"]
    ratios = [a / b for a, b in zip(this["p50"], that["p50"], strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    cpu = statistics.median(this["total"]) / statistics.median(that["total"])
    sql = statistics.median(this["sql"]) / statistics.median(that["sql"])
    print(
        f"this / other: CPU p50 {cpu:.3f}, SQL p50 {sql:.3f}; "
        f"per block {statistics.median(ratios):.3f} (quartiles {q1:.3f}, {q3:.3f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout's directory")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--block", type=int, default=150, help="new effects per block")
    parser.add_argument("--effects", type=int, default=200, help="new effects counted")
    args = parser.parse_args()
    main(args.other.resolve(), args.blocks, args.block, args.effects)
