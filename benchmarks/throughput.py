"""Figure 6: gated effects per second with 64 activities in flight on one worker, the journal
in SQLite and in PostgreSQL side by side, and the same activities ungated.

One real Temporal dev server; one in-process worker per configuration with
``max_concurrent_activities=64``; a workflow starts ``n`` activities at once and the worker runs
64 at a time. Each activity is a no-op (its body returns at once) so what is measured is the
machinery: Temporal's own per-activity cost, plus the gate (claim, two durable transactions,
an in-memory target's capture) where the activity is gated. Two configurations split the gate's
cost: the plugin installed with the activity left ungated (the interceptor's own share), and the
same plus the journal's share alone (an ungated body that appends the entries the gate wrote
for one of these activities, in the gate's two durable transactions, with no gate around it).
Configurations are measured in rounds, in a shuffled order each round, on the same server;
throughput is n / the workflow's wall time. The CPU time this process (the worker, every
thread) and the server's processes spend during each run is recorded too: on a small machine
that runs both, it is what sets the throughput. Then, on workers of its own, the in-flight
sweep: the same fan-out with 8, 16 and 32 activities in flight, ungated and gated on both
journals, the curve ``CONCURRENCY``'s point from the rounds ends (``Throughput.in_flight``).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, gated, open_journal
from interlock_temporal.core.errors import HeadConflict
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import DEFAULT_COMMIT_DELAY, Journal
from interlock_temporal.core.models import Draft, Kind
from interlock_temporal.targets import Found
from interlock_temporal.testing import DevServer, PostgresServer
from interlock_temporal.workflow import act_as

from . import bench_dir, pg_trips
from .pg_trips import RoundTrips
from .stats import Dist

KEY = "7c" * 32
CONCURRENCY = 64
#: the plugin installed (interceptors, headers, the journal opened) but the activity not gated
PLUGIN_ONLY = "plugin only, not gated"
#: as PLUGIN_ONLY, and the body appends what the gate would write: the journal's share alone
JOURNAL_ONLY = "plugin + journal writes, not gated"
#: gated SQLite with the journal's commit delay turned off: each batch is written at once
NO_DELAY = "gated, SQLite, commit_delay=0"
#: the pause between a configuration's burst and its sequential run
SETTLE_S = 0.5
#: the targets for gated / ungated throughput (ungated ÷ gated): issue 39's, current
RATIO_MAX = 1.12
PG_RATIO_MAX = 1.35
#: issue 22's, which issue 39's replaced as current: later targets
LATER_RATIO_MAX = 1.08
LATER_PG_RATIO_MAX = 1.25
#: gated with the PostgreSQL journal
PG = "gated, PostgreSQL"
#: the in-flight sweep: these levels of activities in flight besides ``CONCURRENCY`` (whose
#: point is the rounds' own, the targets'), for these configurations
SWEEP_LEVELS = (8, 16, 32)
SWEEP_CONFIGS = ("ungated", "gated, SQLite", PG)


class NullTarget:
    """In memory, tier 2: remembers what it was sent, and can be asked."""

    name = "bench-null"
    dedupe_window = None
    settle_time = timedelta(0)

    def __init__(self) -> None:
        self.sent: dict[str, Any] = {}

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {"open": True}

    def query(self, effect_id: str, args: Any) -> Found | None:
        found = self.sent.get(effect_id)
        return None if found is None else Found(result=found)


TARGET = NullTarget()


@activity.defn(name="bench_noop")
async def ungated_noop(n: int) -> int:
    return n


@activity.defn(name="bench_noop")
@gated(target=TARGET, key=lambda n: {"n": n})
async def gated_noop(n: int) -> int:
    return n


class JournalWrites:
    """The journal's share of a gated activity and nothing else: the entries the gate wrote for
    one activity of this benchmark (read back from the gated SQLite journal), appended for a
    new effect id in the gate's two durable transactions (its dispatch, then its commit), with the
    two values the gate keeps beside them, under the effect's claim (as the gate holds it, so
    the appends are batched as the gate's are). No read before deciding, no lease or premise
    check: those are the gate's."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        # as in a worker, where the interceptor says so: no flush on the worker's loop
        journal.loop_shared = True
        self.dispatch: list[Draft] = []
        self.commit: list[Draft] = []

    def learn(self, gated: Journal) -> None:
        """Take the entries of the last effect the gate committed in ``gated``."""
        (row,) = gated.effects(status=Kind.COMMITTED, limit=1)
        drafts = [Draft(kind=e.kind, data=e.data) for e in gated.read(row.effect_id)]
        kinds = [d.kind.value for d in drafts]
        if kinds != ["PROPOSED", "AUTHORIZED", "DISPATCHED", "COMMITTED"]:
            raise RuntimeError(f"unexpected entries for a gated no-op: {kinds}")
        self.dispatch, self.commit = drafts[:3], drafts[3:]

    @activity.defn(name="bench_noop")
    async def run(self, n: int) -> int:
        if not self.commit:
            raise ApplicationError("JournalWrites.learn was not called", non_retryable=True)
        eid = effect_id("bench_noop", {"n": n, "journal_only": True})
        claim = self.journal.claim(eid)
        try:
            if claim is None:
                raise HeadConflict(eid, "", "claimed")
            written = await self.journal.append_async(
                eid, "", self.dispatch, effect_type="bench_noop", blobs={"approved": [n]}
            )
            await self.journal.append_async(eid, written[-1].hash, self.commit, blobs={"result": n})
        except HeadConflict:
            # fail the run instead of retrying for ever
            raise ApplicationError(f"input {n} was used before", non_retryable=True) from None
        finally:
            if claim is not None:
                claim.release()
        return n


@workflow.defn(name="BenchFanout", sandboxed=False)
class Fanout:
    @workflow.run
    async def run(self, spec: dict[str, Any]) -> int:
        base = spec["base"]
        with act_as("bench-bot", lease=spec.get("lease")):
            results = await asyncio.gather(
                *[
                    workflow.execute_activity(
                        "bench_noop",
                        base + i,
                        start_to_close_timeout=timedelta(seconds=60),
                    )
                    for i in range(spec["n"])
                ]
            )
        return len(results)


@workflow.defn(name="BenchSequential", sandboxed=False)
class Sequential:
    """The same activities one after another: the latency an agent's step sees."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> int:
        base = spec["base"]
        with act_as("bench-bot", lease=spec.get("lease")):
            for i in range(spec["n"]):
                await workflow.execute_activity(
                    "bench_noop", base + i, start_to_close_timeout=timedelta(seconds=60)
                )
        return int(spec["n"])


@dataclass(frozen=True)
class Throughput:
    n: int
    rounds: int
    per_s: dict[str, list[float]]
    #: sequential: milliseconds per activity, by configuration
    sequential_n: int = 0
    latency_ms: dict[str, list[float]] = field(default_factory=dict)
    #: CPU milliseconds per activity in the counted fan-out runs: (worker, server), by
    #: configuration (empty where the server's CPU time cannot be read)
    cpu_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: round trips to PostgreSQL per new effect (``pg_trips``), counted after the rounds
    pg_round_trips: RoundTrips | None = None
    #: the in-flight sweep (after the rounds, on workers of its own): activities per second by
    #: configuration, then in-flight level, over ``sweep_rounds`` counted runs of ``n``
    sweep_rounds: int = 0
    sweep_per_s: dict[str, dict[int, list[float]]] = field(default_factory=dict)

    def latency(self, name: str) -> float:
        values = sorted(self.latency_ms[name])
        return values[len(values) // 2]

    def latency_ratio(self, name: str) -> float:
        """this configuration's sequential latency ÷ ungated (1.00: no slower)."""
        return self.latency(name) / self.latency("ungated")

    def median(self, name: str) -> float:
        values = sorted(self.per_s[name])
        return values[len(values) // 2]

    def ratio(self, name: str) -> float:
        """ungated ÷ this configuration (1.00: as fast as ungated)."""
        return self.median("ungated") / self.median(name)

    def dist(self, name: str) -> Dist:
        return Dist.of(self.per_s[name])

    def in_flight(self, name: str) -> dict[int, list[float]]:
        """The runs (activities per second) by activities in flight, for ``name``: the sweep's
        levels, and ``CONCURRENCY``'s from the rounds (empty: no sweep for it)."""
        levels = self.sweep_per_s.get(name)
        if not levels or not self.per_s.get(name):
            return {}
        return dict(sorted({**levels, CONCURRENCY: self.per_s[name]}.items()))


async def _measure(n: int, rounds: int, sequential_n: int, sweep_rounds: int) -> Throughput:
    directory = bench_dir("throughput")
    server = await DevServer(ui_port=None).start()
    postgres = PostgresServer().start()
    journals = {
        PLUGIN_ONLY: f"sqlite:///{directory / 'plugin.db'}",
        JOURNAL_ONLY: f"sqlite:///{directory / 'plugin-writes.db'}",
        "gated, SQLite": f"sqlite:///{directory / 'journal.db'}",
        NO_DELAY: f"sqlite:///{directory / 'no-delay.db'}",
        PG: postgres.database("bench"),
    }
    writes = JournalWrites(open_journal(directory / "writes.db", signing_key=KEY))
    per_s: dict[str, list[float]] = {"ungated": [], **{k: [] for k in journals}}
    latency_ms: dict[str, list[float]] = {k: [] for k in per_s}
    cpu_s: dict[str, list[float]] = {k: [0.0, 0.0] for k in per_s}
    leases: dict[str, str | None] = {"ungated": None}
    for name, url in journals.items():
        with open_journal(url, signing_key=KEY) as journal:
            leases[name] = journal.leases.issue("bench-bot", activities=["bench_noop"])
    inputs = _Inputs()
    opened: list[Journal] = []
    try:
        clients: dict[str, Client] = {
            "ungated": await Client.connect(server.target, data_converter=pydantic_data_converter)
        }
        for name, url in journals.items():
            delay = 0 if name == NO_DELAY else DEFAULT_COMMIT_DELAY
            opened.append(open_journal(url, signing_key=KEY, commit_delay=delay))
            clients[name] = await Client.connect(
                server.target, plugins=[InterlockPlugin(opened[-1])]
            )
        workers = {}
        for name, client in clients.items():
            queue = f"bench-{uuid.uuid4().hex[:8]}"
            workers[name] = (
                queue,
                Worker(
                    client,
                    task_queue=queue,
                    workflows=[Fanout, Sequential],
                    activities=[
                        gated_noop
                        if name.startswith("gated")
                        else writes.run
                        if name == JOURNAL_ONLY
                        else ungated_noop
                    ],
                    max_concurrent_activities=CONCURRENCY,
                ),
            )
        async with _all(w for _, w in workers.values()):
            # the journal-only configuration writes what the gate writes for these activities
            await clients["gated, SQLite"].execute_workflow(
                Fanout.run,
                {"n": 1, "base": inputs.take(1), "lease": leases["gated, SQLite"]},
                id=f"fanout-{uuid.uuid4().hex[:8]}",
                task_queue=workers["gated, SQLite"][0],
            )
            with open_journal(journals["gated, SQLite"], signing_key=KEY) as gated_journal:
                writes.learn(gated_journal)
            order = list(workers)
            rng = random.Random(6)
            for round_no in range(rounds + 1):  # round 0 warms up, not counted
                rng.shuffle(order)
                for name in order:
                    queue, _ = workers[name]
                    cpu_before = _cpu_seconds(server)
                    elapsed = await _fanout(clients[name], queue, n, inputs, leases[name])
                    cpu_after = _cpu_seconds(server)
                    if round_no:
                        per_s[name].append(n / elapsed)
                        for i in (0, 1):
                            cpu_s[name][i] += cpu_after[i] - cpu_before[i]
                    if not sequential_n:
                        continue
                    # let the server finish with the burst: right after it, a step took up to
                    # 8 ms longer, more after some configurations' bursts than others'
                    await asyncio.sleep(SETTLE_S)
                    started = time.perf_counter()
                    await clients[name].execute_workflow(
                        Sequential.run,
                        {
                            "n": sequential_n,
                            "base": inputs.take(sequential_n),
                            "lease": leases[name],
                        },
                        id=f"sequential-{uuid.uuid4().hex[:8]}",
                        task_queue=queue,
                    )
                    elapsed = time.perf_counter() - started
                    if round_no:
                        latency_ms[name].append(elapsed / sequential_n * 1000)
        sweep = await _sweep(clients, leases, inputs, n, sweep_rounds) if sweep_rounds else {}
        swept = sum(4 * level + sweep_rounds * n for level in SWEEP_LEVELS) if sweep else 0
        _check_all_new(journals["gated, SQLite"], 1 + (rounds + 1) * (n + sequential_n) + swept)
        trips = await pg_trips.count(postgres.database("trips"), KEY)
    finally:
        await server.stop()
        for journal in (*opened, writes.journal):
            journal.close()
        postgres.close()
    counted = n * rounds
    readable = all(v[1] > 0 for v in cpu_s.values())
    return Throughput(
        n=n,
        rounds=rounds,
        per_s=per_s,
        sequential_n=sequential_n,
        latency_ms=latency_ms,
        cpu_ms={k: (w / counted * 1000, s / counted * 1000) for k, (w, s) in cpu_s.items()}
        if readable
        else {},
        pg_round_trips=trips,
        sweep_rounds=sweep_rounds if sweep else 0,
        sweep_per_s=sweep,
    )


async def _sweep(
    clients: dict[str, Client],
    leases: dict[str, str | None],
    inputs: _Inputs,
    n: int,
    rounds: int,
) -> dict[str, dict[int, list[float]]]:
    """Throughput by activities in flight: one worker per configuration and level
    (``SWEEP_CONFIGS`` x ``SWEEP_LEVELS``, ``max_concurrent_activities`` the level), each on a
    queue of its own, on the rounds' clients (so the same journals); a warm-up run each, then
    ``rounds`` rounds of one ``n``-activity fan-out per worker, in a shuffled order each round,
    as the rounds measure. No sequential runs and no CPU reading: the curve's points are the
    medians. Costs about 9 x ``rounds`` runs of ``n`` activities, slower the fewer in flight."""
    workers: dict[tuple[str, int], tuple[str, Worker]] = {}
    for name in SWEEP_CONFIGS:
        for level in SWEEP_LEVELS:
            queue = f"sweep-{uuid.uuid4().hex[:8]}"
            workers[name, level] = (
                queue,
                Worker(
                    clients[name],
                    task_queue=queue,
                    workflows=[Fanout],
                    activities=[gated_noop if name.startswith("gated") else ungated_noop],
                    max_concurrent_activities=level,
                ),
            )
    per_s: dict[str, dict[int, list[float]]] = {
        name: {level: [] for level in SWEEP_LEVELS} for name in SWEEP_CONFIGS
    }
    order = list(workers)
    rng = random.Random(8)
    began = time.monotonic()
    async with _all(w for _, w in workers.values()):
        for round_no in range(rounds + 1):  # round 0 warms up (a short run each), not counted
            rng.shuffle(order)
            for name, level in order:
                queue, _ = workers[name, level]
                count = n if round_no else 4 * level
                elapsed = await _fanout(clients[name], queue, count, inputs, leases[name])
                if round_no:
                    per_s[name][level].append(count / elapsed)
    print(f"   in-flight sweep: {time.monotonic() - began:.0f} s", flush=True)
    return per_s


async def _fanout(
    client: Client, queue: str, count: int, inputs: _Inputs, lease: str | None
) -> float:
    """One ``Fanout`` workflow of ``count`` activities on ``queue``, under ``lease``: its
    seconds from start to result."""
    started = time.perf_counter()
    done = await client.execute_workflow(
        Fanout.run,
        {"n": count, "base": inputs.take(count), "lease": lease},
        id=f"fanout-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )
    elapsed = time.perf_counter() - started
    assert done == count
    return elapsed


class _Inputs:
    """Activity inputs never used before in this run, so every gated activity is a new effect
    (a repeated input would be a duplicate: the recorded result, returned without a send)."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> int:
        """The first of ``count`` fresh inputs."""
        first, self.next = self.next, self.next + count
        return first


def _check_all_new(url: str, activities: int) -> None:
    """Every activity the gated journal saw was a new effect, committed: none was a duplicate
    answered from the journal (which would measure a cheaper path than the one claimed)."""
    with open_journal(url, signing_key=KEY) as journal:
        committed = len(journal.effects(status=Kind.COMMITTED))
    if committed != activities:
        raise RuntimeError(
            f"the gated journal holds {committed} committed effects for {activities} "
            "activities: some inputs repeated"
        )


def _cpu_seconds(server: DevServer) -> tuple[float, float]:
    """CPU seconds (user + system) so far of this process, every thread, and of the server's
    process and its children (0.0 where /proc cannot tell)."""
    times = os.times()
    worker = times.user + times.system
    process = server.process
    return worker, 0.0 if process is None else _tree_cpu_seconds(process.pid)


def _tree_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                total += sum(_tree_cpu_seconds(int(child)) for child in f.read().split())
    except (OSError, ValueError, IndexError):
        return 0.0
    return total


class _all:
    """Run several workers at once (``async with`` each)."""

    def __init__(self, workers: Any) -> None:
        self.workers = list(workers)

    async def __aenter__(self) -> None:
        for w in self.workers:
            await w.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        for w in reversed(self.workers):
            await w.__aexit__(*exc)


#: the issue's target for gated sequential latency (gated ÷ ungated)
LATENCY_RATIO_MAX = 1.05


def run(n: int, rounds: int, sequential_n: int = 40, sweep_rounds: int = 0) -> Throughput:
    """Figure 6: ``rounds`` rounds of ``n`` activities ``CONCURRENCY`` at a time (and
    ``sequential_n`` one after another) per configuration; then, if ``sweep_rounds``, the
    in-flight sweep: ``sweep_rounds`` rounds of ``n`` activities at each of ``SWEEP_LEVELS``,
    ungated and gated on both journals."""
    print(
        f"6. throughput: {rounds} rounds of {n} activities {CONCURRENCY} at a time, and "
        f"{sequential_n} one after another"
        + (
            f"; then {sweep_rounds} rounds of {n} at "
            + ", ".join(str(level) for level in SWEEP_LEVELS)
            + " in flight"
            if sweep_rounds
            else ""
        )
        + " ...",
        flush=True,
    )
    return asyncio.run(_measure(n, rounds, sequential_n, sweep_rounds))
