"""Figure 4: the policy layer's cost.

a. ``decide`` alone (pure, no I/O), in three configurations, timed interleaved in blocks in one
   process (each sample one call, timed with ``perf_counter_ns``, whose own overhead is
   measured and reported, not subtracted; the calls built before timing; the garbage collector
   paused):

   - SHACKLE's: configured as SHACKLE's own benchmark (``v2/benchmarks/perf.py`` in its public
     repository) configures its ``decide()``: a $1.00 session budget with $0.75 left, a repeat
     limit of 3 with error amplification, a cap of 1,000 calls, a session 42 calls in whose last
     call was the same tool with other parameters, an estimated cost of $0.002, rng 0.5, and
     the replay check of the call's delivery against the session's seen deliveries (none, as
     in SHACKLE's benchmark, whose ``decide()`` makes that check itself) timed with it. Given
     SHACKLE's ``decide.py`` at run time (``--shackle-spec DIR`` or ``SHACKLE_SPEC_DIR``: the
     directory holding it, such as a checkout's ``v2/spec``; its code is never part of this
     repository), its ``decide()`` is timed in the same rounds with its benchmark's exact
     inputs, so the two read as a ratio; without it the figure is ours alone;
   - every layer: three budgets, an escalation threshold, repeats, a window, a call cap, the
     random denial and an activity that needs a person (which this call is not), on a session
     whose window holds 20 recent calls;
   - every layer after 10,000 deliveries in one session: the state ``decide`` itself made from
     10,000 allowed deliveries, one a second over four activity types, and the replay check of
     the timed call against the session's 10,000 deliveries (a set; in the store, an indexed
     table) inside the timed region.
b. The whole check of one ungated call, ``PolicyGuard.check``: the rules, ``decide`` and the
   state read and written in one durable SQLite transaction (WAL, ``synchronous=FULL``) in the
   journal's database, spread over a few sessions so repeats and caps never deny. Interleaved
   in blocks with a bare single-row SQLite insert+commit in the same directory (the floor a
   durable state update cannot go under).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import random
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.policy import (
    Accounts,
    CallEvent,
    CallFacts,
    Limits,
    Policy,
    PolicyGuard,
    PolicyState,
    SessionState,
    Verdict,
    decide,
    deny_activity,
    input_digest,
)

from . import bench_dir
from .stats import Dist

SIGNING_KEY = "42" * 32
#: the policy check's limits (b)
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
#: every layer of the breaker configured (a): LIMITS, and the random denial and an activity
#: that always needs a person
EVERY_LAYER = LIMITS.model_copy(
    update={"probabilistic_deny": True, "hitl_activities": ("delete_*",)}
)
#: SHACKLE's benchmark's configuration, in our names (docs/shackle-conformance.md)
SHACKLE_LIMITS = Limits(
    session_budget_usd=1.0, max_repeat_calls=3, error_amplification=True, max_total_calls=1000
)
#: deliveries in the long session of the third series
DELIVERIES = 10_000
#: SHACKLE's decide() p50, measured interleaved with ours in one process on these machines
#: (issue 22), cited when its decide.py is not given
SHACKLE_RECORDED_P50_US = 0.93
#: SHACKLE's spec's pre-execution SLA
SHACKLE_SLA_MS = 5.0
#: where SHACKLE's decide.py may be found when --shackle-spec is not given
SHACKLE_SPEC_ENV = "SHACKLE_SPEC_DIR"


@dataclass(frozen=True)
class PolicyCost:
    #: every layer configured
    decide_us: Dist
    timer_overhead_us: float
    check_ms: Dist
    floor_ms: Dist
    samples_decide: int
    samples_check: int
    block: int
    #: ours with SHACKLE's configuration, and SHACKLE's own when its decide.py was given
    shackle_config_us: Dist | None = None
    shackle_us: Dist | None = None
    #: every layer, after DELIVERIES deliveries in one session
    long_session_us: Dist | None = None
    deliveries: int = DELIVERIES
    #: the calls of the timed call's activity in its window, in the long session
    long_session_window: int = 0


def load_shackle(spec_dir: str | Path) -> ModuleType:
    """SHACKLE's ``decide.py`` from ``spec_dir`` (the directory, or the file itself)."""
    path = Path(spec_dir)
    if path.is_dir():
        path = path / "decide.py"
    if not path.is_file():
        raise SystemExit(f"--shackle-spec: no decide.py at {path}")
    spec = importlib.util.spec_from_file_location("shackle_spec_decide", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--shackle-spec: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # registered first: its dataclasses look their module up while they are made
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def shackle_spec_dir(given: str | Path | None) -> Path | None:
    """``--shackle-spec``, else the ``SHACKLE_SPEC_DIR`` environment variable, else None."""
    found = given or os.environ.get(SHACKLE_SPEC_ENV)
    return Path(found) if found else None


@dataclass(frozen=True)
class Subject:
    """One series of figure 4a: ``fn(state, call, limits, 0.5)`` timed as SHACKLE's benchmark
    times its ``decide()``; with ``seen``, the replay check of ``delivery`` against it first,
    inside the timed region."""

    fn: Callable[[Any, Any, Any, float], Any]
    state: Any
    call: Any
    limits: Any
    seen: frozenset[str] | None = None
    delivery: str = ""

    def verdict(self) -> str:
        if self.seen is not None and self.delivery in self.seen:
            return "REPLAY"
        return str(self.fn(self.state, self.call, self.limits, 0.5).verdict.value)


def _shackle_config() -> Subject:
    state = PolicyState(
        SessionState(
            last_call="web_search\x00" + input_digest([{"query": "test"}]),
            streak=1,
            total=42,
            spent_usd=0.25,
        )
    )
    digest = input_digest([{"query": "latest news"}])
    call = CallFacts("web_search", digest, now=time.time(), cost_usd=0.002)
    # SHACKLE's decide() checks the call's nonce against the session's seen nonces (an empty
    # set in its benchmark); ours is told by the store (``replayed``), so its check is timed
    # beside it here, against the same empty set, as the long session's is against 10,000
    return Subject(decide, state, call, SHACKLE_LIMITS, frozenset(), "run-1/activity-43/1")


def _shackle_own(shackle: ModuleType) -> Subject:
    """SHACKLE's decide() with its benchmark's exact inputs (v2/benchmarks/perf.py)."""
    sh: Any = shackle
    config = sh.GuardConfig(
        budget_usd=1.0, max_repeat_calls=3, error_amplification=True, max_total_calls=1000
    )
    state = sh.SessionState(
        budget_initial_usd=1.0,
        budget_remaining_usd=0.75,
        budget_spent_usd=0.25,
        total_calls=42,
        last_tool_name="web_search",
        last_tool_params_hash=sh.hash_params({"query": "test"}),
    )
    call = sh.ToolCall(
        tool_name="web_search",
        tool_params_hash=sh.hash_params({"query": "latest news"}),
        estimated_cost_usd=0.002,
        nonce=12345,
    )
    return Subject(sh.decide, state, call, config)


def _every_layer() -> Subject:
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
    return Subject(decide, state, CallFacts("search", "d3", now=now, cost_usd=0.001), EVERY_LAYER)


def _long_session() -> tuple[Subject, int]:
    """Every layer, on the state ``decide`` made of DELIVERIES allowed deliveries (one a
    second, over four activity types), with the replay check of the timed call's delivery
    against them; and how many calls of its activity its window holds."""
    activities = ("search", "fetch", "summarise", "write")
    start = time.time() - DELIVERIES
    state = PolicyState()
    seen: set[str] = set()
    for i in range(DELIVERIES):
        call = CallFacts(activities[i % 4], f"d{i}", now=start + i, cost_usd=0.001)
        d = decide(state, call, EVERY_LAYER, 0.5)
        if d.verdict is not Verdict.ALLOW or d.state is None:
            raise RuntimeError(f"the long session's deliveries must be allowed: {d}")
        state = d.state
        seen.add(f"run-{i % 97}/activity-{i}/1")
    now = start + DELIVERIES
    timed = CallFacts("search", "d-next", now=now, cost_usd=0.001)
    delivery = f"run-{DELIVERIES % 97}/activity-{DELIVERIES}/1"
    window = state.session.windows.get("search", ())
    recent = sum(1 for t in window if t > now - 60.0)
    return Subject(decide, state, timed, EVERY_LAYER, frozenset(seen), delivery), recent


def _time(subject: Subject, k: int, out: list[int]) -> None:
    """``k`` samples of ``subject`` (ns) appended to ``out``."""
    clock = time.perf_counter_ns
    fn, state, call, limits = subject.fn, subject.state, subject.call, subject.limits
    seen, delivery = subject.seen, subject.delivery
    if seen is None:
        for _ in range(k):
            started = clock()
            fn(state, call, limits, 0.5)
            out.append(clock() - started)
        return
    for _ in range(k):
        started = clock()
        if delivery in seen:
            raise RuntimeError("the timed delivery must be a new one")
        fn(state, call, limits, 0.5)
        out.append(clock() - started)


def _interleaved(subjects: dict[str, Subject], n: int, block: int = 1_000) -> dict[str, Dist]:
    """``n`` samples of each subject (µs), in blocks of ``block`` taken in turn, in an order
    shuffled each round, with the garbage collector paused."""
    ns: dict[str, list[int]] = {name: [] for name in subjects}
    for name, subject in subjects.items():
        if subject.verdict() != "ALLOW":
            raise RuntimeError(f"the benchmark's {name} call must be allowed: {subject.verdict()}")
        _time(subject, 1_000, [])
    order = list(subjects.items())
    rng = random.Random(4)
    gc.disable()
    try:
        while any(len(v) < n for v in ns.values()):
            rng.shuffle(order)
            for name, subject in order:
                _time(subject, min(block, n - len(ns[name])), ns[name])
    finally:
        gc.enable()
    return {name: Dist.of(x / 1000 for x in v) for name, v in ns.items()}


def _timer_overhead(n: int) -> float:
    clock = time.perf_counter_ns
    overhead = []
    for _ in range(n):
        started = clock()
        overhead.append(clock() - started)
    return sorted(overhead)[len(overhead) // 2] / 1000


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
        accounts = Accounts.of(event, f"run/{i}")
        started = time.perf_counter_ns()
        d = guard.check(event, accounts, delivery=f"run/{i}/1")
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


def run(
    decide_samples: int, check_samples: int, block: int = 25, shackle_spec: Path | None = None
) -> PolicyCost:
    shackle = None if shackle_spec is None else load_shackle(shackle_spec)
    with_them = "" if shackle is None else ", interleaved with SHACKLE's"
    print(
        f"4. policy: decide x {decide_samples:,} per series{with_them}, "
        f"check x {check_samples:,} ...",
        flush=True,
    )
    long_session, window = _long_session()
    subjects = {
        "shackle config": _shackle_config(),
        "every layer": _every_layer(),
        "long session": long_session,
    }
    if shackle is not None:
        subjects["shackle"] = _shackle_own(shackle)
    dists = _interleaved(subjects, decide_samples)
    overhead = _timer_overhead(min(decide_samples, 20_000))
    check_ms, floor_ms = _check_series(check_samples, block)
    return PolicyCost(
        decide_us=dists["every layer"],
        timer_overhead_us=overhead,
        check_ms=check_ms,
        floor_ms=floor_ms,
        samples_decide=decide_samples,
        samples_check=check_samples,
        block=block,
        shackle_config_us=dists["shackle config"],
        shackle_us=dists.get("shackle"),
        long_session_us=dists["long session"],
        long_session_window=window,
    )
