"""Figure 1 (and 3): the gate's own cost per new effect, with the SQLite journal.

``Gate.run(call, target, send)`` for new effects (each a distinct key) against a trivial
in-memory target, timed per effect, minus the time spent inside the target's ``capture`` and the
``send`` (both return constants). Measured at several journal sizes (prefilled with real
committed effects through the same API; size 0 on fresh journals), interleaved in short blocks
with two floors taken in the same directory: a bare SQLite WAL + ``synchronous=FULL`` single-row
insert+commit, and an fsync of a small append. Plus: the durable commits per effect (counted
from the SQL the journal runs), the gate with ``synchronous=OFF`` (the CPU part), the WAL
checkpoint's share of the tail (inline, as SQLite runs it by default, against the journal's own
checkpointer, off the effect's path), the WAL pages a new effect writes, by table
(``wal_pages``), and where the time goes (cProfile, and ``rfc8785.dumps`` timed by wrapping it).
"""

from __future__ import annotations

import asyncio
import bisect
import cProfile
import functools
import gc
import os
import pstats
import random
import shutil
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.journal.checkpoints import BACKSTOP_PAGES, Checkpointer
from interlock_temporal.core.journal.sqlite import SqliteJournal
from interlock_temporal.core.models import VerifyReport
from interlock_temporal.core.protocol import Call, Delivery, Gate, Measure, Ticket

from . import ROOT, bench_dir, wal_pages
from .machine import Filesystem, filesystem_of
from .stats import Dist
from .wal_pages import WalPages

SIGNING_KEY = "42" * 32
LEASE_ID = "lease_bench"
PRINCIPAL = "bench-bot"
ACTIVITY = "bench_refund"
#: the lease's cumulative budget: every figure is measured under a lease with one (each
#: dispatch reserves its amount in its transaction); far more than any run spends
BUDGET_CENTS = 10**13
#: journal entries a new, committed effect writes: its dispatch (PROPOSED, AUTHORIZED and
#: DISPATCHED as one entry of format 3 since schema 14) and COMMITTED
ENTRIES_PER_EFFECT = 2
FACTS: Mapping[str, Any] = {"order_paid_cents": 10_000, "refunded_cents": 0, "eligible": True}
RESULT: Mapping[str, Any] = {"refund_id": "re_bench", "amount_cents": 2_000}
#: size 0 is measured on fresh journals, each taking this many untimed effects first
ROTATE_WARMUP = 50
#: figure 1's consecutive operations per subject in each round: long enough (about 0.15 s at
#: the gate's p50) that a journal's checkpoint rounds, 50 ms after its commits, land during its
#: own traffic, as in a worker, before its last one is settled at the block's end
GATE_BLOCK = 200
#: the longest a journal's last checkpoint round may take once its block ended
SETTLE_TIMEOUT_S = 30.0


# -- the trivial target and send -----------------------------------------------------------------


class TrivialTarget:
    """In memory: ``capture`` returns a small constant dict; no ``query``, no dedupe window,
    ``settle_time`` 0. Accumulates the time spent inside ``capture``."""

    name = "bench-trivial"
    dedupe_window: timedelta | None = None
    settle_time: timedelta = timedelta(0)

    def __init__(self) -> None:
        self.capture_ns = 0

    def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        started = time.perf_counter_ns()
        facts = FACTS
        self.capture_ns += time.perf_counter_ns() - started
        return facts


class ConstantSend:
    """The send: returns a constant immediately. Accumulates the time spent inside it."""

    def __init__(self) -> None:
        self.ns = 0

    async def __call__(self, ticket: Ticket) -> Mapping[str, Any]:
        started = time.perf_counter_ns()
        result = RESULT
        self.ns += time.perf_counter_ns() - started
        return result


def _measure(kind: Any, resource: str, _args: tuple[Any, ...]) -> Measure:
    return kind(2_000, resource)  # type: ignore[no-any-return]


def make_call(prefix: str, i: int, protocol: ModuleType | None = None) -> Call:
    """A new effect, shaped like the support-case refund: a distinct key per ``(prefix, i)``.
    ``protocol``: another copy of ``interlock_temporal.core.protocol`` to build it with (an
    A/B against another revision's core, ``gate_cpu_ab``)."""
    call, delivery, measure = (
        (Call, Delivery, Measure)
        if protocol is None
        else (protocol.Call, protocol.Delivery, protocol.Measure)
    )
    order = f"o-{prefix}-{i}"
    payload = {
        "case_id": f"c-{prefix}-{i}",
        "order_id": order,
        "amount_cents": 2_000,
        "reason": "arrived damaged",
    }
    return call(  # type: ignore[no-any-return]
        effect_type=ACTIVITY,
        activity=ACTIVITY,
        input=payload,
        args=(payload,),
        key={"case_id": payload["case_id"], "order_id": order},
        principal=PRINCIPAL,
        lease_id=LEASE_ID,
        session=f"wf-{prefix}-{i}",
        measure=functools.partial(_measure, measure, f"order:{order}"),
        delivery=delivery(
            workflow_id=f"wf-{prefix}-{i}",
            run_id="run-1",
            activity_id="2",
            attempt=1,
            task_queue="bench",
        ),
    )


# -- journals ------------------------------------------------------------------------------------


def connection_of(journal: Journal) -> sqlite3.Connection:
    """The SQLite connection under a journal (to count statements, or to relax durability while
    prefilling)."""
    if not isinstance(journal, SqliteJournal):
        raise TypeError(f"expected the SQLite journal, got {type(journal).__name__}")
    return journal.connection


def issue_bench_lease(
    leases: Any, *, lease_id: str = LEASE_ID, budget_cents: int | None = BUDGET_CENTS
) -> None:
    """The lease every benchmarked effect runs under (with a cumulative budget unless
    ``budget_cents`` is None), issued in ``leases`` (a journal's ``leases``; any revision's,
    for ``gate_cpu_ab``)."""
    leases.issue(
        PRINCIPAL,
        activities=[ACTIVITY],
        max_amount_cents=5_000,
        budget_cents=budget_cents,
        resources=["order:*"],
        lease_id=lease_id,
    )


def open_bench_journal(path: Path, *, durable: bool = True) -> Journal:
    journal = open_journal(f"sqlite:///{path}", signing_key=SIGNING_KEY)
    if journal.leases.get(LEASE_ID) is None:
        issue_bench_lease(journal.leases)
    if not durable:
        connection_of(journal).execute("PRAGMA synchronous=OFF")
    return journal


async def fill(journal: Journal, start: int, stop: int, *, progress: str = "") -> None:
    """Commit effects ``start..stop-1`` through ``Gate.run``, the same API that is measured."""
    gate = Gate(journal)
    target = TrivialTarget()
    send = ConstantSend()
    began = time.monotonic()
    for i in range(start, stop):
        await gate.run(make_call("fill", i), target, send)
        done = i + 1
        if progress and (done % 25_000 == 0 or done == stop):
            rate = (done - start) / max(time.monotonic() - began, 1e-9)
            print(f"  {progress}: {done:,} effects ({rate:,.0f}/s)", flush=True)


@dataclass(frozen=True)
class Prefilled:
    size: int
    path: Path
    seconds: float
    verify: VerifyReport
    verify_s: float


async def prefill(directory: Path, sizes: list[int]) -> dict[int, Prefilled]:
    """One journal per non-zero size, each holding exactly ``size`` committed effects written by
    ``Gate.run``. Built in ascending order, each starting from a copy of the previous one, with
    ``synchronous=OFF`` while filling (the entries are the same; only their fsyncs are skipped),
    then closed (which checkpoints the WAL) and verified once, opened the normal way."""
    built: dict[int, Prefilled] = {}
    previous: tuple[int, Path] | None = None
    for size in sorted(s for s in sizes if s > 0):
        path = directory / f"journal-{size}.db"
        began = time.monotonic()
        start = 0
        if previous is not None:
            start = previous[0]
            shutil.copyfile(previous[1], path)
        journal = open_bench_journal(path, durable=False)
        try:
            await fill(journal, start, size, progress=f"prefill {size:,}")
        finally:
            journal.close()
        seconds = time.monotonic() - began
        if Path(f"{path}-wal").exists():
            raise RuntimeError(f"{path}: the WAL was not checkpointed at close")
        began = time.monotonic()
        journal = open_bench_journal(path)
        try:
            report = journal.verify()
        finally:
            journal.close()
        verify_s = time.monotonic() - began
        print(f"  verify {size:,}: {report} ({verify_s:.1f} s)", flush=True)
        # its effects' chains, and the benchmarked lease's own (``lease:<id>``, signed entries)
        if not report.ok or report.effects != size + 1:
            raise RuntimeError(f"the prefilled journal {path} does not verify: {report}")
        built[size] = Prefilled(size, path, seconds, report, verify_s)
        previous = (size, path)
    return built


# -- one measured subject ------------------------------------------------------------------------


@dataclass
class Subject:
    """A journal at a given size and the gate in front of it; ``one()`` measures one new effect."""

    label: str
    size_at_start: int
    journal: Journal
    durable: bool = True
    prefix: str = ""
    gate: Gate = field(init=False)
    target: TrivialTarget = field(default_factory=TrivialTarget)
    send: ConstantSend = field(default_factory=ConstantSend)
    next_i: int = 0
    net_ns: list[int] = field(default_factory=list)
    total_ns: list[int] = field(default_factory=list)
    target_ns: list[int] = field(default_factory=list)
    #: keep the journal near empty: after this many timed effects, switch (untimed) to a fresh
    #: journal from ``opener`` and commit ``ROTATE_WARMUP`` untimed effects into it first
    rotate_every: int | None = None
    opener: Callable[[int], Journal] | None = None
    generation: int = 0
    in_current: int = 0
    largest: int = 0
    #: ``perf_counter_ns`` at the start of each recorded sample
    started_ns: list[int] = field(default_factory=list)
    #: indexes of the recorded samples that were the first on a fresh journal
    fresh_at: list[int] = field(default_factory=list)
    #: (start, end) ``perf_counter_ns`` of this subject's WAL checkpoint rounds
    rounds: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gate = Gate(self.journal)
        self.prefix = self.prefix or f"m{self.size_at_start}{'' if self.durable else 'x'}"
        self._watch_checkpoints()

    def _watch_checkpoints(self) -> None:
        """Time every checkpoint round of this subject's journal (its checkpointer's thread)."""
        checkpointer: Checkpointer | None = getattr(self.journal, "checkpointer", None)
        if checkpointer is None:
            return
        run = checkpointer.checkpoint
        rounds = self.rounds

        def timed() -> tuple[int, int]:
            started = time.perf_counter_ns()
            try:
                return run()
            finally:
                rounds.append((started, time.perf_counter_ns()))

        checkpointer.checkpoint = timed  # type: ignore[method-assign]

    def settle(self) -> None:
        """The end of this subject's burst of traffic: its checkpointer runs the round the
        last commits asked for now, and this waits for it (untimed), so that it does not
        land in the next subject's block (see ``measure``)."""
        checkpointer: Checkpointer | None = getattr(self.journal, "checkpointer", None)
        if checkpointer is not None and not checkpointer.catch_up(SETTLE_TIMEOUT_S):
            raise RuntimeError(f"{self.label}: the WAL checkpoint did not settle")

    async def _rotate(self) -> None:
        assert self.opener is not None
        self.journal.close()
        self.generation += 1
        self.journal = self.opener(self.generation)
        self.gate = Gate(self.journal)
        self._watch_checkpoints()
        self.in_current = 0
        for _ in range(ROTATE_WARMUP):
            await self._run(record=False)
        self.fresh_at.append(len(self.net_ns))

    async def one(self, *, record: bool = True) -> None:
        if (
            record
            and self.rotate_every is not None
            and self.in_current >= self.rotate_every + ROTATE_WARMUP
        ):
            await self._rotate()
        await self._run(record=record)

    async def _run(self, *, record: bool) -> None:
        call = make_call(self.prefix, self.next_i)
        self.next_i += 1
        self.in_current += 1
        self.largest = max(self.largest, self.size_now)
        capture0, send0 = self.target.capture_ns, self.send.ns
        started = time.perf_counter_ns()
        result = await self.gate.run(call, self.target, self.send)
        total = time.perf_counter_ns() - started
        if result is not RESULT and result != dict(RESULT):
            raise RuntimeError(f"{self.label}: the gate returned {result!r}")
        inside = (self.target.capture_ns - capture0) + (self.send.ns - send0)
        if record:
            self.started_ns.append(started)
            self.total_ns.append(total)
            self.target_ns.append(inside)
            self.net_ns.append(total - inside)

    @property
    def size_now(self) -> int:
        """Effects in the journal now."""
        if self.rotate_every is not None:
            return self.in_current
        return self.size_at_start + self.next_i


@dataclass(frozen=True)
class Series:
    label: str
    size_at_start: int
    size_at_end: int
    durable: bool
    net_us: Dist
    total_us: Dist
    target_us: Dist
    #: a fresh journal every this many samples (None: one journal, growing)
    rotate_every: int | None = None

    @classmethod
    def of(cls, s: Subject) -> Series:
        return cls(
            label=s.label,
            size_at_start=s.size_at_start,
            size_at_end=s.largest,
            rotate_every=s.rotate_every,
            durable=s.durable,
            net_us=Dist.of(n / 1000 for n in s.net_ns),
            total_us=Dist.of(n / 1000 for n in s.total_ns),
            target_us=Dist.of(n / 1000 for n in s.target_ns),
        )

    @property
    def throughput_per_s(self) -> float:
        """Sequential effects per second: 1 / mean wall time of a whole ``Gate.run``."""
        return 1e6 / self.total_us.mean


class SqliteFloor:
    """A bare SQLite WAL + synchronous=FULL single-row insert+commit, in the same directory."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, v BLOB)")
        self.row = os.urandom(300)
        self.ns: list[int] = []
        self.started_ns: list[int] = []

    async def one(self, *, record: bool = True) -> None:
        started = time.perf_counter_ns()
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT INTO floor (v) VALUES (?)", (self.row,))
        self.db.execute("COMMIT")
        if record:
            self.ns.append(time.perf_counter_ns() - started)
            self.started_ns.append(started)

    def close(self) -> None:
        self.db.close()


class FsyncFloor:
    """An fsync of a small append (64 bytes), in the same directory."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.ns: list[int] = []
        self.started_ns: list[int] = []

    async def one(self, *, record: bool = True) -> None:
        started = time.perf_counter_ns()
        os.write(self.fd, b"x" * 63 + b"\n")
        os.fsync(self.fd)
        if record:
            self.ns.append(time.perf_counter_ns() - started)
            self.started_ns.append(started)

    def close(self) -> None:
        os.close(self.fd)


# -- counting and profiling ----------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointProbe:
    """The tail's cause: the same journal with its WAL checkpointed inline (SQLite's default
    auto-checkpoint, run by the commit that crosses it, as the journal did before) and off
    the effect's path (the journal's own checkpointer), in alternating blocks."""

    size_at_start: int
    autocheckpoint_pages: int
    inline_us: Dist
    background_us: Dist


FLOOR_SQLITE = "bare SQLite insert + commit"
FLOOR_FSYNC = "fsync of a 64-byte append"

#: SQLite's default auto-checkpoint, in pages
SQLITE_AUTOCHECKPOINT = 1_000


def checkpoint_inline(journal: Journal, inline: bool) -> None:
    """Switch ``journal`` between SQLite's inline auto-checkpoint (its checkpointer stopped)
    and its own checkpointer (the auto-checkpoint back at the backstop)."""
    if not isinstance(journal, SqliteJournal):
        raise TypeError(f"expected the SQLite journal, got {type(journal).__name__}")
    if inline:
        journal.stop_checkpointer()
        journal.connection.execute(f"PRAGMA wal_autocheckpoint={SQLITE_AUTOCHECKPOINT}")
        return
    journal.connection.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
    journal.start_checkpointer()


async def checkpoint_probe(subject: Subject, n: int, block: int = 25) -> CheckpointProbe:
    size = subject.size_now
    runs: dict[bool, list[int]] = {True: [], False: []}
    try:
        for r in range(-(-n // block)):
            for inline in (r % 2 == 0, r % 2 == 1):
                checkpoint_inline(subject.journal, inline)
                subject.net_ns.clear()
                for _ in range(block):
                    await subject.one()
                runs[inline] += subject.net_ns
    finally:
        checkpoint_inline(subject.journal, False)
    return CheckpointProbe(
        size_at_start=size,
        autocheckpoint_pages=SQLITE_AUTOCHECKPOINT,
        inline_us=Dist.of(ns / 1000 for ns in runs[True]),
        background_us=Dist.of(ns / 1000 for ns in runs[False]),
    )


@dataclass(frozen=True)
class StatementCount:
    effects: int
    commits: float
    begins: float
    rollbacks: float
    statements: float
    inserts: float


async def count_statements(subject: Subject, n: int) -> StatementCount:
    """Trace every SQL statement the journal's connection runs for ``n`` new effects."""
    seen: list[str] = []
    db = connection_of(subject.journal)
    db.set_trace_callback(seen.append)
    try:
        for _ in range(n):
            await subject.one(record=False)
    finally:
        db.set_trace_callback(None)
    words = [s.lstrip().split(None, 1)[0].upper() for s in seen if s.strip()]
    return StatementCount(
        effects=n,
        commits=words.count("COMMIT") / n,
        begins=words.count("BEGIN") / n,
        rollbacks=words.count("ROLLBACK") / n,
        statements=len(words) / n,
        inserts=words.count("INSERT") / n,
    )


class _TimedConnection:
    """A journal's SQLite connection that adds the thread CPU time spent inside its statements
    (``execute``, a cursor's ``executemany``) to ``spent``; everything else is passed through."""

    def __init__(self, db: sqlite3.Connection, spent: list[int]) -> None:
        self._db = db
        self._spent = spent

    def execute(self, *args: Any) -> sqlite3.Cursor:
        started = time.thread_time_ns()
        try:
            return self._db.execute(*args)
        finally:
            self._spent[0] += time.thread_time_ns() - started
            self._spent[1] += 1

    def cursor(self) -> _TimedConnection:
        return _TimedConnection(self._db.cursor(), self._spent)  # type: ignore[arg-type]

    def executemany(self, *args: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return self._db.executemany(*args)
        finally:
            self._spent[0] += time.thread_time_ns() - started
            self._spent[1] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


@dataclass(frozen=True)
class CpuSplit:
    """The gate with ``synchronous=OFF`` on the thread's CPU clock (the machine's other work
    does not count, unlike the wall-clock series): the whole ``Gate.run``, the part inside the
    journal's SQL statements (its writer's and its reader's, the two COMMITs included), and
    the rest (Python)."""

    effects: int
    total_us: Dist
    sql_us: Dist
    rest_us: Dist
    sql_calls: float


async def cpu_split(directory: Path, n: int) -> CpuSplit:
    """``n`` new effects on a fresh ``synchronous=OFF`` journal, each timed on the thread's CPU
    clock, with the time inside the journal's SQL calls counted apart."""
    journal = open_bench_journal(directory / "journal-cpu.db", durable=False)
    spent = [0, 0]
    try:
        if not isinstance(journal, SqliteJournal):
            raise TypeError("the CPU split needs the SQLite journal")
        journal.wrap_connections(lambda db: _TimedConnection(db, spent))
        gate, target, send = Gate(journal), TrivialTarget(), ConstantSend()
        for i in range(ROTATE_WARMUP):
            await gate.run(make_call("cpu-warm", i), target, send)
        totals: list[int] = []
        sqls: list[int] = []
        calls = spent[1]
        for i in range(n):
            call = make_call("cpu", i)
            sql0, started = spent[0], time.thread_time_ns()
            await gate.run(call, target, send)
            totals.append(time.thread_time_ns() - started)
            sqls.append(spent[0] - sql0)
        calls = spent[1] - calls
    finally:
        journal.close()
    return CpuSplit(
        effects=n,
        total_us=Dist.of(t / 1000 for t in totals),
        sql_us=Dist.of(q / 1000 for q in sqls),
        rest_us=Dist.of((t - q) / 1000 for t, q in zip(totals, sqls, strict=True)),
        sql_calls=calls / n,
    )


@dataclass(frozen=True)
class ProfileLine:
    function: str
    calls_per_effect: float
    own_us: float
    cumulative_us: float


@dataclass(frozen=True)
class Profile:
    effects: int
    wall_us_per_effect: float
    by_own_time: list[ProfileLine]
    gate_functions: list[ProfileLine]
    #: (area, own µs per effect) summed over every function, builtins charged to their callers
    by_area: list[tuple[str, float]]
    #: without the profiler, in one pass: the canonicaliser's name, p50 µs per effect inside it,
    #: its calls per effect, and the gate's p50 in that pass (durable journal)
    canonical_json_fn: str
    canonical_json_us: float
    canonical_json_calls: float
    canonical_pass_gate_us: float


def _label(filename: str, line: int, name: str) -> str:
    if filename == "~":
        return name
    parts = Path(filename).parts
    if "site-packages" in parts:
        short = "/".join(parts[parts.index("site-packages") + 1 :])
    else:
        try:
            short = str(Path(filename).relative_to(ROOT))
        except ValueError:
            short = "/".join(parts[-2:])  # the standard library: package/module.py
    return f"{short}:{line}({name})"


AREAS = {
    "sqlite": "SQLite statements (the two COMMITs' fsyncs included)",
    "canonical": "canonical JSON (rfc8785, json, core/identity.py)",
    "pydantic": "pydantic (models, to_jsonable_python)",
    "hash": "sha256 / HMAC",
    "interlock": "interlock_temporal's own Python (protocol, journal, claims, leases)",
    "harness": "benchmark harness (building each Call)",
    "other": "other (stdlib: pathlib, os, asyncio)",
}


def _area(key: tuple[str, int, str]) -> str | None:
    """The area a function's own time belongs to; None: a builtin, charged to its callers."""
    filename, _, name = key
    if filename == "~":
        if "sqlite3" in name:
            return "sqlite"
        if "_hashlib" in name or "hmac" in name:
            return "hash"
        return None
    parts = Path(filename).parts
    if (
        "rfc8785" in parts
        or (len(parts) >= 2 and parts[-2] == "json")
        or filename.endswith("interlock_temporal/core/identity.py")
    ):
        return "canonical"
    if "pydantic" in filename:
        return "pydantic"
    if filename.endswith(("hashlib.py", "hmac.py")):
        return "hash"
    if "benchmarks" in parts:
        return "harness"
    if "interlock_temporal" in filename:
        return "interlock"
    return "other"


async def profile(directory: Path, n: int, top: int = 12) -> Profile:
    """cProfile over ``n`` new effects on a fresh durable journal (profiling inflates the Python
    part; read the shares, not the absolute numbers)."""
    journal = open_bench_journal(directory / "journal-profile.db")
    try:
        subject = Subject("profile", 0, journal, prefix="prof")
        for _ in range(50):
            await subject.one(record=False)
        profiler = cProfile.Profile()
        started = time.perf_counter_ns()
        profiler.enable()
        for _ in range(n):
            await subject.one(record=False)
        profiler.disable()
        wall = (time.perf_counter_ns() - started) / 1000 / n
    finally:
        journal.close()
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    lines = [
        (key, ProfileLine(_label(*key), v[1] / n, v[2] * 1e6 / n, v[3] * 1e6 / n))
        for key, v in raw.items()
    ]
    by_own = sorted(lines, key=lambda kv: kv[1].own_us, reverse=True)[:top]
    gate_fns = sorted(
        (kv for kv in lines if "interlock_temporal" in kv[0][0] and "benchmarks" not in kv[0][0]),
        key=lambda kv: kv[1].cumulative_us,
        reverse=True,
    )[:top]
    areas: dict[str, float] = dict.fromkeys(AREAS, 0.0)
    for key, v in raw.items():
        area = _area(key)
        if area is not None:
            areas[area] += v[2]
            continue
        callers: dict[tuple[str, int, str], tuple[Any, ...]] = v[4]
        charged = 0.0
        for caller, c in callers.items():
            areas[_area(caller) or "other"] += c[2]
            charged += c[2]
        areas["other"] += max(0.0, v[2] - charged)
    by_area = sorted(
        ((AREAS[a], t * 1e6 / n) for a, t in areas.items() if t > 0),
        key=lambda at: at[1],
        reverse=True,
    )
    canonical_name, canonical_us, canonical_calls, pass_gate_us = await time_canonical_json(
        directory, n
    )
    return Profile(
        n,
        wall,
        [line for _, line in by_own],
        [line for _, line in gate_fns],
        by_area,
        canonical_name,
        canonical_us,
        canonical_calls,
        pass_gate_us,
    )


def canonicaliser() -> tuple[str, Callable[..., bytes]]:
    """The function every canonical JSON byte of the gate goes through: the package's own
    ``canonical_json`` where it has one, else ``rfc8785.dumps``."""
    from interlock_temporal.core import identity

    own = getattr(identity, "canonical_json", None)
    if callable(own):
        return "interlock_temporal.core.identity.canonical_json", own
    import rfc8785

    return "rfc8785.dumps", rfc8785.dumps


def _patch_everywhere(original: object, replacement: object) -> list[tuple[object, str]]:
    """Point every reference to ``original`` in the package's modules (and rfc8785) at
    ``replacement``; return what was patched, to undo it."""
    import sys

    patched: list[tuple[object, str]] = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name.startswith("interlock_temporal") or name == "rfc8785"):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)
                patched.append((module, attr))
    return patched


async def time_canonical_json(directory: Path, n: int) -> tuple[str, float, float, float]:
    """Per effect, without a profiler: (the canonicaliser's name, p50 µs inside it, its calls,
    p50 µs of the whole gate in the same pass), measured by wrapping it where it is used."""
    name, original = canonicaliser()
    spent = [0, 0]

    def timed(*args: Any, **kwargs: Any) -> bytes:
        started = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter_ns() - started
            spent[1] += 1

    per_effect: list[float] = []
    journal = open_bench_journal(directory / "journal-canonical.db")
    try:
        subject = Subject("canonical", 0, journal, prefix="canon")
        for _ in range(50):
            await subject.one(record=False)
        patched = _patch_everywhere(original, timed)
        try:
            for _ in range(n):
                before = spent[0]
                await subject.one()
                per_effect.append((spent[0] - before) / 1000)
        finally:
            for module, attr in patched:
                setattr(module, attr, original)
    finally:
        journal.close()
    gate_us = Dist.of(ns / 1000 for ns in subject.net_ns).p50
    return name, Dist.of(per_effect).p50, spent[1] / n, gate_us


# -- the tail, sample by sample ------------------------------------------------------------------

#: what a slow sample is charged to: the first of these that held while it ran
CAUSES = (
    "its own journal's checkpoint round",
    "another journal's checkpoint round",
    "a garbage collection",
    "the first on a fresh journal",
    "the first of its block",
    "none of these (the disk, the machine)",
)


@dataclass(frozen=True)
class TailCauses:
    """A series' samples at or above its p99, each charged to the first of ``CAUSES`` that
    held while it ran (``tail``), beside how many of all its samples each held for (``all``):
    a cause that made the tail is over-represented in it."""

    label: str
    samples: int
    p50_us: float
    p99_us: float
    tail: dict[str, int]
    all: dict[str, int]
    #: its journal's checkpoint rounds, and those of them that overlapped its timed samples
    rounds: int
    rounds_in_traffic: int


def _union(windows: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The union of ``(start, end)`` windows as disjoint sorted windows: (starts, ends)."""
    starts: list[int] = []
    ends: list[int] = []
    for a, b in sorted(windows):
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


def _overlaps(union: tuple[list[int], list[int]], a: int, b: int) -> bool:
    starts, ends = union
    i = bisect.bisect_left(starts, b) - 1
    return i >= 0 and ends[i] > a


def attribute(
    label: str,
    started_ns: list[int],
    ns: list[int],
    *,
    block: int,
    own: list[tuple[int, int]],
    others: list[tuple[int, int]],
    collections: list[tuple[int, int]],
    fresh_at: list[int],
) -> TailCauses:
    """Charge each of a series' samples (``started_ns[i]``, lasting ``ns[i]``; recorded
    ``block`` at a time) to a cause; count them over the tail and over all samples."""
    own_u, others_u, gc_u = _union(own), _union(others), _union(collections)
    fresh = set(fresh_at)
    p50, p99 = Dist.of(ns).p50, Dist.of(ns).p99
    tail = dict.fromkeys(CAUSES, 0)
    every = dict.fromkeys(CAUSES, 0)
    for i, (a, d) in enumerate(zip(started_ns, ns, strict=True)):
        b = a + d
        held = (
            _overlaps(own_u, a, b),
            _overlaps(others_u, a, b),
            _overlaps(gc_u, a, b),
            i in fresh,
            i % block == 0,
            True,
        )
        cause = CAUSES[held.index(True)]
        every[cause] += 1
        if d >= p99:
            tail[cause] += 1
    mine = _union([(a, a + d) for a, d in zip(started_ns, ns, strict=True)])
    return TailCauses(
        label=label,
        samples=len(ns),
        p50_us=p50 / 1000,
        p99_us=p99 / 1000,
        tail=tail,
        all=every,
        rounds=len(own),
        rounds_in_traffic=sum(1 for a, b in own if _overlaps(mine, a, b)),
    )


# -- the figure ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateCost:
    directory: str
    filesystem: Filesystem
    #: samples per series; taken in rounds of ``block`` consecutive operations per subject
    samples: int
    block: int
    warmup: int
    seed: int
    prefilled: list[Prefilled]
    series: list[Series]
    nosync: Series
    floor_sqlite_us: Dist
    floor_fsync_us: Dist
    statements: StatementCount
    checkpoint: CheckpointProbe | None
    profile: Profile
    seconds: float
    #: the ``synchronous=OFF`` gate's CPU, SQL and the rest (None: not measured)
    cpu: CpuSplit | None = None
    #: every series' tail, sample by sample: the journals', then the nosync gate's and the floors'
    tails: list[TailCauses] = field(default_factory=list)
    #: the WAL pages a new effect writes, in all and by table (None: not counted)
    pages: WalPages | None = None

    def tail_of(self, label: str) -> TailCauses:
        return next(t for t in self.tails if t.label == label)

    def at(self, size: int) -> Series:
        return next(s for s in self.series if s.size_at_start == size)

    @property
    def flat_ratio(self) -> float:
        """p50 at the largest size over p50 at size 0."""
        return self.series[-1].net_us.p50 / self.series[0].net_us.p50


async def measure(
    sizes: list[int],
    samples: int,
    *,
    block: int = GATE_BLOCK,
    rotate_every: int = 250,
    warmup: int = ROTATE_WARMUP,
    seed: int = 20_240_601,
    count_n: int = 200,
    checkpoint_n: int = 1_500,
    profile_n: int = 500,
    cpu_n: int = 2_000,
    pages_n: int = 200,
) -> GateCost:
    began = time.monotonic()
    directory = bench_dir("gate")
    fs = filesystem_of(directory)
    if fs.is_tmpfs:
        raise RuntimeError(f"{directory} is on {fs.fstype}: the journal needs a real disk")
    print(f"figure 1: gate cost, journal directory {directory} ({fs.fstype} on {fs.device})")
    built = await prefill(directory, sizes)

    def fresh(name: str, durable: bool = True) -> Callable[[int], Journal]:
        return lambda n: open_bench_journal(directory / f"{name}-{n}.db", durable=durable)

    subjects: list[Subject] = []
    for size in sorted(sizes):
        if size == 0:
            opener = fresh("journal-0")
            subjects.append(
                Subject(
                    "0 effects",
                    0,
                    opener(0),
                    rotate_every=rotate_every,
                    opener=opener,
                )
            )
        else:
            path = directory / f"journal-{size}.db"
            subjects.append(Subject(f"{size:,} effects", size, open_bench_journal(path)))
    nosync_opener = fresh("journal-0-nosync", durable=False)
    nosync = Subject(
        "0 effects, synchronous=OFF",
        0,
        nosync_opener(0),
        durable=False,
        rotate_every=rotate_every,
        opener=nosync_opener,
    )
    floor_sqlite = SqliteFloor(directory / "floor.db")
    floor_fsync = FsyncFloor(directory / "floor.log")
    measured: list[Subject | SqliteFloor | FsyncFloor] = [
        *subjects,
        nosync,
        floor_sqlite,
        floor_fsync,
    ]
    rng = random.Random(seed)
    block = max(1, min(block, samples))
    rounds = -(-samples // block)
    collections: list[tuple[int, int]] = []
    collecting = [0]

    def on_gc(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            collecting[0] = time.perf_counter_ns()
        else:
            collections.append((collecting[0], time.perf_counter_ns()))

    try:
        for m in measured:
            for _ in range(warmup):
                await m.one(record=False)
            if isinstance(m, Subject):
                m.settle()
        gc.collect()
        print(
            f"  measuring {len(measured)} series x {rounds * block:,} samples, interleaved in "
            f"{rounds:,} rounds of {block} consecutive operations each",
            flush=True,
        )
        gc.callbacks.append(on_gc)
        try:
            for r in range(rounds):
                order = list(measured)
                rng.shuffle(order)
                for m in order:
                    for _ in range(block):
                        await m.one()
                    # a journal's checkpoints land in its own traffic, never in another's
                    if isinstance(m, Subject):
                        m.settle()
                if (r + 1) % 10 == 0:
                    print(f"  {(r + 1) * block:,} samples per series", flush=True)
        finally:
            gc.callbacks.remove(on_gc)
        every_round = [w for s in (*subjects, nosync) for w in s.rounds]
        tails = [
            attribute(
                m.label,
                m.started_ns,
                m.net_ns,
                block=block,
                own=m.rounds,
                others=sorted(set(every_round) - set(m.rounds)),
                collections=collections,
                fresh_at=m.fresh_at,
            )
            for m in (*subjects, nosync)
        ] + [
            attribute(
                label,
                f.started_ns,
                f.ns,
                block=block,
                own=[],
                others=every_round,
                collections=collections,
                fresh_at=[],
            )
            for label, f in (
                (FLOOR_SQLITE, floor_sqlite),
                (FLOOR_FSYNC, floor_fsync),
            )
        ]
        series = [Series.of(s) for s in subjects]
        nosync_series = Series.of(nosync)
        subjects[0].rotate_every = None  # counting: no rotation inside the traced pass
        statements = await count_statements(subjects[0], count_n)
        probe_subject = next((s for s in subjects if s.size_at_start == 10_000), subjects[-1])
        checkpoint = (
            await checkpoint_probe(probe_subject, checkpoint_n) if checkpoint_n > 0 else None
        )
    finally:
        for s in (*subjects, nosync):
            s.journal.close()
        floor_sqlite.close()
        floor_fsync.close()
    prof = await profile(directory, profile_n)
    split = await cpu_split(directory, cpu_n) if cpu_n > 0 else None
    pages = await wal_pages.count(directory / "journal-pages.db", pages_n) if pages_n > 0 else None
    return GateCost(
        directory=str(directory.relative_to(ROOT)),
        filesystem=fs,
        samples=rounds * block,
        block=block,
        warmup=warmup,
        seed=seed,
        prefilled=[built[k] for k in sorted(built)],
        series=series,
        nosync=nosync_series,
        floor_sqlite_us=Dist.of(n / 1000 for n in floor_sqlite.ns),
        floor_fsync_us=Dist.of(n / 1000 for n in floor_fsync.ns),
        statements=statements,
        checkpoint=checkpoint,
        profile=prof,
        seconds=time.monotonic() - began,
        cpu=split,
        tails=tails,
        pages=pages,
    )


def run(sizes: list[int], samples: int, **kw: Any) -> GateCost:
    return asyncio.run(measure(sizes, samples, **kw))
