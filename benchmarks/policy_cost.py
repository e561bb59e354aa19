"""Figure 4: the policy layer's cost.

a. ``decide`` alone (pure, no I/O), with every layer configured (three budgets, an escalation
   threshold, repeats, a window, a call cap), on a session state that carries a window of
   recent calls. Each sample is one call, timed with ``perf_counter_ns`` (its own overhead,
   measured and reported, is not subtracted). The calls are built before timing.
b. The whole check of one ungated call, ``PolicyGuard.check``: the rules, ``decide`` and the
   state read and written in one durable SQLite transaction (WAL, ``synchronous=FULL``) in the
   journal's database, spread over a few sessions so repeats and caps never deny. Interleaved
   in blocks with a bare single-row SQLite insert+commit in the same directory (the floor a
   durable state update cannot go under).
"""

from __future__ import annotations

import gc
import random
import sqlite3
import time
from dataclasses import dataclass

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.policy import (
    CallEvent,
    CallFacts,
    Limits,
    Policy,
    PolicyGuard,
    PolicyState,
    Scopes,
    SessionState,
    Verdict,
    decide,
    deny_activity,
)

from . import bench_dir
from .stats import Dist

SIGNING_KEY = "42" * 32
LIMITS = Limits(
    session_budget_usd=1_000_000.0,
    principal_budget_usd=1_000_000.0,
    namespace_budget_usd=1_000_000.0,
    escalate_below_fraction=0.05,
    max_repeat_calls=3,
    window_s=60.0,
    window_max_calls=1_000_000,
    max_total_calls=10_000_000,
    costs={"search": 0.001},
)
#: SHACKLE's published figure for its decide(), and its spec's pre-execution SLA
SHACKLE_DECIDE_P50_US = 2.0
SHACKLE_SLA_MS = 5.0


@dataclass(frozen=True)
class PolicyCost:
    decide_us: Dist
    timer_overhead_us: float
    check_ms: Dist
    floor_ms: Dist
    samples_decide: int
    samples_check: int
    block: int


def _decide_series(n: int) -> tuple[Dist, float]:
    now = time.time()
    state = PolicyState(
        SessionState(
            last_call="search\x00d0",
            streak=1,
            total=500,
            spent_usd=12.5,
            windows={"search": tuple(now - i for i in range(20, 0, -1))},
        ),
        principal_spent_usd=40.0,
        namespace_spent_usd=900.0,
    )
    calls = [
        CallFacts(
            "search",
            f"d{i % 7}",
            now=now + i * 1e-6,
            cost_usd=0.001,
        )
        for i in range(n)
    ]
    ns: list[int] = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for call in calls:
            started = clock()
            d = decide(state, call, LIMITS, 0.5)
            ns.append(clock() - started)
            if d.verdict is not Verdict.ALLOW:
                raise RuntimeError(f"the benchmark's calls must be allowed: {d}")
        overhead = []
        for _ in range(min(n, 20_000)):
            started = clock()
            overhead.append(clock() - started)
    finally:
        gc.enable()
    return Dist.of(x / 1000 for x in ns), sorted(overhead)[len(overhead) // 2] / 1000


class _SqliteFloor:
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        self.i = 0

    def one(self) -> None:
        self.i += 1
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT INTO t (k, v) VALUES (?, ?)", (self.i, "x" * 200))
        self.db.execute("COMMIT")


def _check_series(n: int, block: int) -> tuple[Dist, Dist]:
    directory = bench_dir("policy")
    journal = open_journal(f"sqlite:///{directory / 'journal.db'}", signing_key=SIGNING_KEY)
    guard = PolicyGuard(
        Policy(LIMITS, rules=[deny_activity("delete_*")], policy_id="bench"), journal.policy
    )
    floor = _SqliteFloor(str(directory / "floor.db"))
    check_ns: list[int] = []
    floor_ns: list[int] = []
    rng = random.Random(7)
    i = 0

    def one_check() -> None:
        nonlocal i
        i += 1
        event = CallEvent(
            activity="search",
            args=(f"query {i}",),
            principal="bench-bot",
            session=f"session-{i % 8}",
            namespace="default",
            workflow_id=f"session-{i % 8}",
        )
        scopes = Scopes.of(event, f"run/{i}")
        started = time.perf_counter_ns()
        d = guard.check(event, scopes, delivery=f"run/{i}/1")
        check_ns.append(time.perf_counter_ns() - started)
        if d.verdict is not Verdict.ALLOW:
            raise RuntimeError(f"the benchmark's calls must be allowed: {d}")

    def one_floor() -> None:
        started = time.perf_counter_ns()
        floor.one()
        floor_ns.append(time.perf_counter_ns() - started)

    for _ in range(50):
        one_check()
        one_floor()
    check_ns.clear()
    floor_ns.clear()
    subjects = [one_check, one_floor]
    while len(check_ns) < n:
        rng.shuffle(subjects)
        for subject in subjects:
            for _ in range(block):
                subject()
    journal.close()
    floor.db.close()
    return Dist.of(x / 1e6 for x in check_ns[:n]), Dist.of(x / 1e6 for x in floor_ns[:n])


def run(decide_samples: int, check_samples: int, block: int = 25) -> PolicyCost:
    print(f"4. policy: decide x {decide_samples:,}, check x {check_samples:,} ...", flush=True)
    decide_us, overhead = _decide_series(decide_samples)
    check_ms, floor_ms = _check_series(check_samples, block)
    return PolicyCost(
        decide_us=decide_us,
        timer_overhead_us=overhead,
        check_ms=check_ms,
        floor_ms=floor_ms,
        samples_decide=decide_samples,
        samples_check=check_samples,
        block=block,
    )
