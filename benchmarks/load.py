"""Figure 7: load. ``n`` workflows, each one effect, run by two worker processes, ungated and
gated, the gated journal in SQLite (one file both processes share) and in PostgreSQL.

One real Temporal dev server and one throwaway PostgreSQL cluster. Each configuration has its
own task queue and its own two worker processes (``benchmarks.load_worker``), all polling from
the start; configurations run in rounds, in a shuffled order each round (round 0 warms up and
is not counted). A run starts its ``n`` workflows (at most ``STARTING`` start calls in flight)
and waits for every result: throughput is ``n`` ÷ the wall time from the first start to the
last result. The CPU time of the worker processes, of the Temporal server and of PostgreSQL in
each run is read from ``/proc``.

For every gated effect of the counted rounds: the gate's time as recorded in its COMMITTED
entry (``gate_ms``: from the claim to the dispatch transaction durable and the coroutine back,
plus the commit's preparation), and, from the worker process (``Journal.observe_appends``),
how long the dispatch transaction's result then waited for the worker's event loop (the
writer thread's end of the batch to the gate's coroutine running again). The gate's own time
is ``gate_ms`` minus that wait. The commit's own append (outside ``gate_ms``) is reported too.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter

from interlock_temporal import open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.testing import DevServer, PostgresServer, WorkerProcess

from . import ROOT, bench_dir
from .load_worker import LoadOne
from .stats import Dist
from .throughput import _cpu_seconds, _tree_cpu_seconds

KEY = "5d" * 32
UNGATED = "ungated"
SQLITE = "gated, SQLite"
POSTGRES = "gated, PostgreSQL"
#: the issue's target: gated throughput at least this share of ungated
RATIO_MIN = 0.9
#: workflow start calls in flight at once from the client
STARTING = 64


@dataclass(frozen=True)
class Load:
    n: int
    rounds: int
    processes: int
    #: workflows per second, by configuration, one per counted round
    per_s: dict[str, list[float]]
    #: per gated effect of the counted rounds, ms, by configuration: the gate's time recorded
    #: in COMMITTED; the dispatch transaction's result waiting for the loop; the gate's own
    #: time (the first minus the second); the commit append's wait for the loop
    gate_ms: dict[str, list[float]] = field(default_factory=dict)
    loop_wait_ms: dict[str, list[float]] = field(default_factory=dict)
    own_ms: dict[str, list[float]] = field(default_factory=dict)
    commit_wait_ms: dict[str, list[float]] = field(default_factory=dict)
    #: per gated effect, ms: the dispatch append queued before its batch began (the batch
    #: before it on the writer, and ``commit_delay``), and queued to written (part of own_ms)
    queue_ms: dict[str, list[float]] = field(default_factory=dict)
    write_ms: dict[str, list[float]] = field(default_factory=dict)
    #: CPU ms per workflow in the counted rounds, by configuration: worker processes, the
    #: Temporal server, PostgreSQL, this process (the client starting workflows)
    cpu_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    #: mean appends per group-commit batch, by configuration
    batch: dict[str, float] = field(default_factory=dict)
    #: PostgreSQL, per gated effect in the counted rounds (pg_stat_statements and the
    #: cumulative statistics of the journal's database): statements (each a round trip, BEGIN
    #: and COMMIT included), transactions committed, rows inserted / updated / deleted
    pg_per_effect: dict[str, float] = field(default_factory=dict)
    #: the same, by statement (its text, shortened), calls per effect
    pg_statements: dict[str, float] = field(default_factory=dict)
    #: SQLite, ms: each write transaction's BEGIN IMMEDIATE in the worker processes (the wait
    #: for the write lock the other process may hold; it runs on the worker's event loop)
    begin_ms: dict[str, list[float]] = field(default_factory=dict)
    #: the worker processes' CPU ms per workflow in the counted rounds, by configuration and
    #: by thread (``THREADS``), read from ``/proc/<pid>/task``
    cpu_threads_ms: dict[str, dict[str, float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        values = sorted(self.per_s[name])
        return values[len(values) // 2]

    def ratio(self, name: str) -> float:
        """this configuration's throughput ÷ ungated (1.00: as fast as ungated)."""
        return self.median(name) / self.median(UNGATED)

    def round_ratios(self, name: str) -> list[float]:
        """this configuration's throughput ÷ ungated, round by round (each round runs every
        configuration once, so the two saw the same host within a minute)."""
        return [g / u for g, u in zip(self.per_s[name], self.per_s[UNGATED], strict=True)]

    def dist(self, series: dict[str, list[float]], name: str) -> Dist | None:
        values = series.get(name) or []
        return Dist.of(values) if values else None


def _postgres_pid(postgres: PostgresServer) -> int | None:
    try:
        return int((postgres.data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


#: a worker process's threads, grouped by their name at the OS level (``load_worker`` gives
#: its Python threads theirs): the group of the first prefix that matches, else "other"
THREADS = (
    ("interlock-journ", "journal writer"),
    ("interlock-check", "WAL checkpointer"),
    ("temporal_workfl", "workflow tasks"),
    ("tokio-", "SDK core (Rust)"),
    ("workflow-proces", "SDK core (Rust)"),
)
#: the thread that runs the worker's event loop (the process's first thread)
EVENT_LOOP = "event loop"


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of process ``pid``'s threads, by group (``THREADS``)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        group = EVENT_LOOP if int(task) == pid else "other"
        if group != EVENT_LOOP:
            group = next((g for prefix, g in THREADS if comm.startswith(prefix)), "other")
        out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class _Cpu:
    """CPU seconds so far, by part."""

    def __init__(self, server: DevServer, pg_pid: int | None) -> None:
        self.server = server
        self.pg_pid = pg_pid

    def read(self, workers: list[WorkerProcess]) -> dict[str, float]:
        times = os.times()
        return {
            "workers": sum(_tree_cpu_seconds(w.pid) for w in workers),
            "temporal": _cpu_seconds(self.server)[1],
            "postgres": 0.0 if self.pg_pid is None else _tree_cpu_seconds(self.pg_pid),
            "client": times.user + times.system,
        }

    @staticmethod
    def threads(workers: list[WorkerProcess]) -> dict[str, float]:
        out: dict[str, float] = {}
        for w in workers:
            for group, seconds in thread_cpu_seconds(w.pid).items():
                out[group] = out.get(group, 0.0) + seconds
        return out


#: PostgreSQL settings that let the figure count statements per effect
PG_SETTINGS = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}


class _PgCounters:
    """Statements, transactions and rows of the journal's database, read between runs."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.totals: dict[str, float] = {}
        self.statements: dict[str, float] = {}

    def read(self) -> tuple[dict[str, float], dict[str, float]]:
        time.sleep(1.1)  # the cumulative statistics reach the views within a second
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        db = self.conn.execute(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
        assert db is not None
        rows = self.conn.execute(
            "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d "
            "ON d.oid = s.dbid WHERE d.datname = current_database()"
        ).fetchall()
        by_text: dict[str, float] = {}
        for query, calls in rows:
            text = " ".join(str(query).split())[:90]
            by_text[text] = by_text.get(text, 0.0) + float(calls)
        totals = {
            "statements": sum(by_text.values()),
            "transactions": float(db[0]),
            "rows inserted": float(db[1]),
            "rows updated": float(db[2]),
            "rows deleted": float(db[3]),
        }
        return totals, by_text

    def add(self, before: tuple[dict[str, float], dict[str, float]]) -> None:
        after = self.read()
        for part, value in after[0].items():
            self.totals[part] = self.totals.get(part, 0.0) + value - before[0].get(part, 0.0)
        for text, calls in after[1].items():
            delta = calls - before[1].get(text, 0.0)
            if delta:
                self.statements[text] = self.statements.get(text, 0.0) + delta


async def _run_once(client: Client, queue: str, n: int, first: int, lease: str | None) -> float:
    """Start ``n`` LoadOne workflows and wait for all: the seconds from the first start to the
    last result."""
    gate = asyncio.Semaphore(STARTING)
    tag = uuid.uuid4().hex[:8]

    async def one(i: int) -> int:
        async with gate:
            handle = await client.start_workflow(
                LoadOne.run,
                {"n": first + i, "lease": lease},
                id=f"load-{tag}-{i}",
                task_queue=queue,
            )
        try:
            result: int = await handle.result()
        except WorkflowFailureError as err:
            cause = err.cause
            while cause is not None and cause.__cause__ is not None:
                cause = cause.__cause__
            raise RuntimeError(f"{queue}: workflow {handle.id} failed: {cause}") from err
        return result

    started = time.perf_counter()
    results = await asyncio.gather(*[one(i) for i in range(n)])
    elapsed = time.perf_counter() - started
    if results != [first + i for i in range(n)]:
        raise RuntimeError(f"{queue}: wrong results")
    return elapsed


async def _spawn(
    server: DevServer, queue: str, journal: str | None, timings: Path | None, index: int
) -> WorkerProcess:
    args = [
        "-m",
        "benchmarks.load_worker",
        "--target",
        server.target,
        "--task-queue",
        queue,
        "--identity",
        f"{queue}-{index}",
    ]
    if journal is not None:
        args += ["--journal", journal, "--key", KEY]
    if timings is not None:
        args += ["--timings", str(timings)]
    return await WorkerProcess(args, cwd=ROOT).start(60)


async def _measure(n: int, rounds: int, processes: int, configs: list[str]) -> Load:
    directory = bench_dir("load")
    server = await DevServer(ui_port=None).start()
    postgres = PostgresServer(settings=PG_SETTINGS).start() if POSTGRES in configs else None
    urls: dict[str, str | None] = {UNGATED: None}
    if SQLITE in configs:
        urls[SQLITE] = f"sqlite:///{directory / 'journal.db'}"
    if postgres is not None:
        urls[POSTGRES] = postgres.database("load")
    leases: dict[str, str | None] = {UNGATED: None}
    for name, url in urls.items():
        if url is not None:
            with open_journal(url, signing_key=KEY) as journal:
                leases[name] = journal.leases.issue("load-bot", activities=["load_effect"])
    workers: dict[str, list[WorkerProcess]] = {}
    timings: dict[str, list[Path]] = {}
    cpu = _Cpu(server, None if postgres is None else _postgres_pid(postgres))
    per_s: dict[str, list[float]] = {k: [] for k in urls}
    cpu_s: dict[str, dict[str, float]] = {k: {} for k in urls}
    threads_s: dict[str, dict[str, float]] = {k: {} for k in urls}
    counted_from = 0.0
    counters = None if postgres is None else _PgCounters(str(urls[POSTGRES]))
    try:
        for name, url in urls.items():
            queue = f"load-{uuid.uuid4().hex[:8]}"
            timings[name] = [directory / f"{queue}-{i}.json" for i in range(processes)]
            workers[name] = [
                await _spawn(server, queue, url, timings[name][i] if url else None, i)
                for i in range(processes)
            ]
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        order = list(urls)
        rng = random.Random(7)
        next_input = 0
        for round_no in range(rounds + 1):  # round 0 warms up, not counted
            rng.shuffle(order)
            if round_no == 1:
                counted_from = time.time()
            for name in order:
                queue = workers[name][0].args[workers[name][0].args.index("--task-queue") + 1]
                counting = counters if round_no and name == POSTGRES else None
                pg_before = None if counting is None else counting.read()
                before, threads_before = cpu.read(workers[name]), cpu.threads(workers[name])
                elapsed = await _run_once(client, queue, n, next_input, leases[name])
                after, threads_after = cpu.read(workers[name]), cpu.threads(workers[name])
                if counting is not None and pg_before is not None:
                    counting.add(pg_before)
                next_input += n
                if round_no:
                    per_s[name].append(n / elapsed)
                    for part, value in after.items():
                        cpu_s[name][part] = cpu_s[name].get(part, 0.0) + value - before[part]
                    for kind, value in threads_after.items():
                        spent = value - threads_before.get(kind, 0.0)
                        threads_s[name][kind] = threads_s[name].get(kind, 0.0) + spent
                print(f"   round {round_no} {name}: {n / elapsed:.0f} workflows/s", flush=True)
                await asyncio.sleep(0.5)  # let the server settle after a burst
    finally:
        for group in workers.values():
            for w in group:
                await w.stop()
        await server.stop()
        if counters is not None:
            counters.conn.close()
    effects = n * rounds
    load = Load(
        n=n,
        rounds=rounds,
        processes=processes,
        per_s=per_s,
        cpu_ms={k: {part: s / effects * 1000 for part, s in v.items()} for k, v in cpu_s.items()},
        cpu_threads_ms={
            k: {group: s / effects * 1000 for group, s in v.items()} for k, v in threads_s.items()
        },
        pg_per_effect={}
        if counters is None
        else {k: v / effects for k, v in counters.totals.items()},
        pg_statements={}
        if counters is None
        else {k: v / effects for k, v in counters.statements.items()},
    )
    try:
        for name, url in urls.items():
            if url is not None:
                _gate_split(load, name, url, timings[name], counted_from, n * (rounds + 1))
    finally:
        if postgres is not None:
            postgres.close()
    return load


def _gate_split(
    load: Load, name: str, url: str, files: list[Path], since: float, expected: int
) -> None:
    """Read the gate's recorded times back from the journal and join them with the worker
    processes' loop waits, effect by effect."""
    waits: dict[str, list[float]] = {}
    queued: dict[str, list[float]] = {}
    written: dict[str, list[float]] = {}
    batches: list[int] = []
    begin: list[float] = []
    for path in files:
        doc = json.loads(path.read_text())
        waits.update(doc["loop_wait"])
        queued.update(doc["queued"])
        written.update(doc["queued_to_written"])
        batches += doc["batches"]
        begin += [seconds for at, seconds in doc["begin"] if at >= since]
    gate, loop, own, commit, queue, write = [], [], [], [], [], []
    with open_journal(url, signing_key=KEY) as journal:
        rows = journal.effects(status=Kind.COMMITTED)
        if len(rows) != expected:
            raise RuntimeError(f"{name}: {len(rows)} committed effects, expected {expected}")
        for row in rows:
            (entry,) = [e for e in journal.read(row.effect_id) if e.kind is Kind.COMMITTED]
            if entry.ts < since:
                continue
            ms = float(entry.data["gate_ms"])
            gate.append(ms)
            mine = waits.get(row.effect_id)
            if mine:
                loop.append(mine[0] * 1000)
                own.append(ms - mine[0] * 1000)
                queue.append(queued[row.effect_id][0] * 1000)
                write.append(written[row.effect_id][0] * 1000)
                if len(mine) > 1:
                    commit.append(mine[1] * 1000)
    load.gate_ms[name] = gate
    load.loop_wait_ms[name] = loop
    load.own_ms[name] = own
    load.commit_wait_ms[name] = commit
    load.queue_ms[name] = queue
    load.write_ms[name] = write
    if begin:
        load.begin_ms[name] = [b * 1000 for b in begin]
    load.batch[name] = sum(batches) / len(batches) if batches else 0.0


def run(n: int, rounds: int, processes: int = 2, configs: list[str] | None = None) -> Load:
    configs = configs or [UNGATED, SQLITE, POSTGRES]
    print(
        f"7. load: {rounds} rounds of {n} workflows, one effect each, on {processes} worker "
        f"processes ({', '.join(configs)}) ...",
        flush=True,
    )
    return asyncio.run(_measure(n, rounds, processes, configs))


if __name__ == "__main__":
    result = run(
        int(sys.argv[1]) if len(sys.argv) > 1 else 200,
        int(sys.argv[2]) if len(sys.argv) > 2 else 1,
    )
    for cfg in result.per_s:
        print(cfg, f"{result.median(cfg):.0f}/s", f"{result.ratio(cfg):.2f}", result.cpu_ms[cfg])
        for label, series in (
            ("gate", result.gate_ms),
            ("loop", result.loop_wait_ms),
            ("own", result.own_ms),
            ("commit-wait", result.commit_wait_ms),
            ("queue", result.queue_ms),
            ("queued-to-written", result.write_ms),
            ("BEGIN IMMEDIATE", result.begin_ms),
        ):
            d = result.dist(series, cfg)
            if d is not None:
                print(f"  {label}: p50 {d.p50:.2f} p99 {d.p99:.2f} ms (n={d.n})")
        if cfg in result.batch:
            print(f"  batch {result.batch[cfg]:.1f}")
    print(result.pg_per_effect)
    for text, calls in sorted(result.pg_statements.items(), key=lambda kv: -kv[1]):
        print(f"  {calls:6.2f}  {text}")
