"""A/B of figure 6's PostgreSQL configuration: the code before (the claim, then the read before
deciding, two round trips; nothing prepared in a pipelined append), this release (the claim and
the read in one round trip, appends prepared), the two changes one at a time (``on-loop``: the
claim and the read apart; ``unprepared``), and the claim, read and release handed to claim
threads instead of waited for on the loop. One dev server, one PostgreSQL cluster, a worker per
configuration (and one ungated), 64 activities in flight; rounds alternate the configurations
in a shuffled order.

    python -m benchmarks.pg_claims [--n 640] [--rounds 8] [--sequential 20]

Prints, per configuration: activities/s (median and runs), ungated ÷ this, CPU per activity
(worker; the Temporal server; PostgreSQL), sequential milliseconds per activity, and for the
code before the time per activity its loop waited in the claim, the read and the release.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, open_journal
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.journal.claims import Claim
from interlock_temporal.core.journal.group_commit import no_wakeup_preemption
from interlock_temporal.core.journal.postgres import PostgresJournal
from interlock_temporal.core.models import Entry
from interlock_temporal.testing import DevServer, PostgresServer

from .throughput import (
    CONCURRENCY,
    KEY,
    Fanout,
    Sequential,
    _all,
    _cpu_seconds,
    _Inputs,
    _tree_cpu_seconds,
    gated_noop,
    ungated_noop,
)

T = TypeVar("T")
#: the gated PostgreSQL configurations: the code before (claim, read and release waited for on
#: the loop; nothing prepared in appends), this release (``after``), and steps between
BEFORE = "before"
ON_LOOP = "on-loop"
UNPREPARED = "unprepared"
AFTER = "after"
OFF_LOOP = "off-loop-2-threads"
OFF_LOOP_8 = "off-loop-8-threads"


class _OnLoop(PostgresJournal):
    """The interface's synchronous defaults for a coroutine's claim, read, release and origin
    look-up (the code before), timing the loop's waits in them."""

    blocked_s = 0.0

    def _timed(self, fn: Callable[..., T], *args: Any) -> T:
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            _OnLoop.blocked_s += time.perf_counter() - started

    async def claim_reading(self, effect_id: str) -> tuple[Claim | None, list[Entry] | None]:
        return self._timed(self.claim, effect_id), None

    async def release_async(self, claim: Claim) -> None:
        self._timed(claim.release)

    async def read_async(self, effect_id: str) -> list[Entry]:
        return self._timed(self.read, effect_id)

    async def by_origin_async(self, origin: str) -> list[str]:
        return self._timed(self.by_origin, origin)


class _Unprepared(PostgresJournal):
    """Nothing prepared in a pipelined append (the code before)."""

    def _pipelined(
        self, conn: psycopg.Connection[Any], fn: Callable[[psycopg.Connection[Any]], T]
    ) -> T:
        threshold, conn.prepare_threshold = conn.prepare_threshold, None
        try:
            return super()._pipelined(conn, fn)
        finally:
            conn.prepare_threshold = threshold


class _Before(_OnLoop, _Unprepared):
    pass


class _OffLoop(PostgresJournal):
    """The claim with the read, the read, the release and the origin look-up waited for on
    ``threads`` claim threads instead of on the loop (shielded: a cancelled caller does not
    stop them; not for production: a claim taken for a cancelled caller is not given back)."""

    threads = 2
    _pool_of_threads: ThreadPoolExecutor | None = None

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool_of_threads is None:
            self._pool_of_threads = ThreadPoolExecutor(
                self.threads, initializer=no_wakeup_preemption
            )
        loop = asyncio.get_running_loop()
        return await asyncio.shield(loop.run_in_executor(self._pool_of_threads, fn, *args))

    async def claim_reading(self, effect_id: str) -> tuple[Claim | None, list[Entry] | None]:
        return await self._off_loop(self._claim_reading, effect_id)

    async def release_async(self, claim: Claim) -> None:
        await self._off_loop(claim.release)

    async def read_async(self, effect_id: str) -> list[Entry]:
        return await self._off_loop(self.read, effect_id)

    async def by_origin_async(self, origin: str) -> list[str]:
        return await self._off_loop(self.by_origin, origin)

    def close(self) -> None:
        if self._pool_of_threads is not None:
            self._pool_of_threads.shutdown(wait=True)
        super().close()


class _OffLoop8(_OffLoop):
    threads = 8


KINDS: dict[str, type[PostgresJournal] | None] = {
    BEFORE: _Before,
    ON_LOOP: _OnLoop,
    UNPREPARED: _Unprepared,
    AFTER: None,
    OFF_LOOP: _OffLoop,
    OFF_LOOP_8: _OffLoop8,
}


def _postgres_cpu(server: PostgresServer) -> float:
    pid = int((server.data / "postmaster.pid").read_text().split()[0])
    return _tree_cpu_seconds(pid)


async def _measure(
    n: int, rounds: int, sequential_n: int, kinds: dict[str, type[PostgresJournal] | None]
) -> None:
    server = await DevServer(ui_port=None).start()
    postgres = PostgresServer().start()
    journals: dict[str, Journal] = {}
    try:
        for i, (name, kind) in enumerate(kinds.items()):
            journal = open_journal(postgres.database(f"ab{i}"), signing_key=KEY)
            assert isinstance(journal, PostgresJournal)
            if kind is not None:
                journal.__class__ = kind
            journals[name] = journal
        leases: dict[str, str | None] = {"ungated": None}
        leases.update(
            {k: j.leases.issue("bench-bot", activities=["bench_noop"]) for k, j in journals.items()}
        )
        clients = {
            "ungated": await Client.connect(server.target, data_converter=pydantic_data_converter)
        }
        for name, journal in journals.items():
            clients[name] = await Client.connect(server.target, plugins=[InterlockPlugin(journal)])
        workers: dict[str, tuple[str, Worker]] = {}
        for name, client in clients.items():
            queue = f"ab-{uuid.uuid4().hex[:8]}"
            activity = ungated_noop if name == "ungated" else gated_noop
            workers[name] = (
                queue,
                Worker(
                    client,
                    task_queue=queue,
                    workflows=[Fanout, Sequential],
                    activities=[activity],
                    max_concurrent_activities=CONCURRENCY,
                ),
            )
        per_s: dict[str, list[float]] = {k: [] for k in workers}
        seq_ms: dict[str, list[float]] = {k: [] for k in workers}
        cpu: dict[str, list[float]] = {k: [0.0, 0.0, 0.0] for k in workers}
        blocked = 0.0
        inputs = _Inputs()
        order = list(workers)
        rng = random.Random(22)
        async with _all(w for _, w in workers.values()):
            for round_no in range(rounds + 1):  # round 0 warms up
                rng.shuffle(order)
                for name in order:
                    queue, _ = workers[name]
                    before = (*_cpu_seconds(server), _postgres_cpu(postgres))
                    was_blocked = _OnLoop.blocked_s
                    started = time.perf_counter()
                    spec = {"n": n, "base": inputs.take(n), "lease": leases[name]}
                    await clients[name].execute_workflow(
                        Fanout.run, spec, id=f"ab-{uuid.uuid4().hex[:8]}", task_queue=queue
                    )
                    elapsed = time.perf_counter() - started
                    after = (*_cpu_seconds(server), _postgres_cpu(postgres))
                    if round_no:
                        per_s[name].append(n / elapsed)
                        for i in range(3):
                            cpu[name][i] += after[i] - before[i]
                        if name == BEFORE:
                            blocked += _OnLoop.blocked_s - was_blocked
                    if not sequential_n:
                        continue
                    await asyncio.sleep(0.5)
                    spec = {"n": sequential_n, "base": inputs.take(sequential_n)}
                    spec["lease"] = leases[name]
                    started = time.perf_counter()
                    await clients[name].execute_workflow(
                        Sequential.run, spec, id=f"ab-{uuid.uuid4().hex[:8]}", task_queue=queue
                    )
                    if round_no:
                        seq_ms[name].append((time.perf_counter() - started) / sequential_n * 1e3)
    finally:
        await server.stop()
        for journal in journals.values():
            journal.close()
        postgres.close()

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    counted = n * rounds
    ungated = median(per_s["ungated"])
    print(f"{rounds} rounds of {n} activities, {CONCURRENCY} in flight; {sequential_n} sequential")
    for name, values in per_s.items():
        worker, temporal, pg = (c / counted * 1e3 for c in cpu[name])
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(
            f"{name}: {median(values):.0f}/s (runs {runs}); ungated ÷ this "
            f"{ungated / median(values):.2f}; CPU ms per activity: worker {worker:.2f}, "
            f"temporal {temporal:.2f}, postgres {pg:.2f}"
            + (f"; sequential {median(seq_ms[name]):.1f} ms" if seq_ms[name] else "")
        )
    for gated in kinds:
        ratios = [u / g for u, g in zip(per_s["ungated"], per_s[gated], strict=True)]
        print(f"round by round, ungated ÷ {gated}: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"{BEFORE}: the loop waited in claim/read/release {blocked / counted * 1e3:.3f} ms/act")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pg_claims", description=__doc__)
    p.add_argument("--n", type=int, default=640)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument(
        "--only",
        help=f"gated configurations, comma-separated, of: {', '.join(KINDS)} (default all)",
    )
    p.add_argument("--sequential", type=int, default=20)
    args = p.parse_args()
    kinds = KINDS if not args.only else {k: KINDS[k] for k in args.only.split(",")}
    asyncio.run(_measure(args.n, args.rounds, args.sequential, kinds))


if __name__ == "__main__":
    main()
