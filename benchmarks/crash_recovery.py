"""Figure 2: from a SIGKILL mid-send to the workflow's result, on a real Temporal dev server.

The crash rows of the fault table (``workers.scenarios``), run one after another on one dev
server with real worker processes, as ``workers.faults`` runs them.
``ServerWorld.crash_to_completion_s`` is measured from the observed SIGKILL to the workflow's
result. Each run's journal is read back afterwards to split that time at the recovery
attempt's first journal write and at its ``COMMITTED`` entry.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.testing import DevServer
from workers.scenarios import SCENARIOS, run_in
from workers.server_world import ServerWorld
from workflows.support_case import CaseFile, CaseOutcome, Mode

from . import bench_dir
from .machine import Filesystem, filesystem_of
from .stats import Dist

#: the rows measured, cycled until the sample count is reached
PLAN: list[tuple[str, int]] = [
    ("crash_before_ack", 1),
    ("crash_before_ack", 2),
    ("crash_before_send", 1),
    ("crash_before_send", 2),
]


#: (heartbeat_timeout s, retry initial interval s) for the sensitivity runs (full run only), on
#: crash_before_ack at tier 2: which part of the time follows which setting
SENSITIVITY: list[tuple[float, float]] = [(1.0, 0.5), (2.0, 0.1), (2.0, 1.0), (3.0, 0.5)]
SENSITIVITY_ROW = ("crash_before_ack", 2)


class TimedWorld(ServerWorld):
    """``ServerWorld`` that also notes the wall-clock time of the kill and of the replacement
    worker's readiness, to split the crash-to-completion time against journal timestamps, and
    can override the case's heartbeat timeout and retry interval (sensitivity runs only)."""

    def __init__(
        self,
        client: Client,
        workdir: Path,
        tier: int,
        mode: Mode,
        *,
        heartbeat_s: float | None = None,
        initial_interval_s: float | None = None,
    ) -> None:
        super().__init__(client, workdir, tier, mode)
        self.overrides: dict[str, float] = {}
        if heartbeat_s is not None:
            self.overrides["heartbeat_s"] = heartbeat_s
        if initial_interval_s is not None:
            self.overrides["initial_interval_s"] = initial_interval_s
        self.killed_wall: float | None = None
        self.ready_wall: float | None = None
        self.handles: list[WorkflowHandle[Any, CaseOutcome]] = []

    def case(self, amount_cents: int | None = None, **kw: Any) -> CaseFile:
        merged: dict[str, Any] = {**self.overrides, **kw}
        if amount_cents is None:
            return super().case(**merged)
        return super().case(amount_cents, **merged)

    async def start(self, case: CaseFile) -> WorkflowHandle[Any, CaseOutcome]:
        handle = await super().start(case)
        self.handles.append(handle)
        return handle

    async def crashed(self, run: Any) -> None:
        await super().crashed(run)
        if self._killed_at is not None:
            self.killed_wall = time.time() - (time.monotonic() - self._killed_at)

    async def restart(self) -> None:
        await super().restart()
        self.ready_wall = time.time()


@dataclass
class Run:
    index: int
    scenario: str
    tier: int
    ok: bool
    final: str
    via: str | None
    crash_to_completion_s: float | None
    elapsed_s: float
    #: seconds after the kill: the replacement worker ready, the recovery attempt's first
    #: journal write, its COMMITTED entry
    worker_ready_s: float | None = None
    recovery_write_s: float | None = None
    committed_s: float | None = None
    #: from the workflow history (server clock, same host), seconds after the kill: the
    #: attempt that completed the effect started; the workflow task that follows it timed out
    #: on the dead worker's sticky queue; the workflow completed
    last_attempt_started_s: float | None = None
    sticky_timed_out_s: float | None = None
    workflow_completed_s: float | None = None
    #: attempt 1 scheduled → the completing attempt started, and that attempt's number
    retry_after_schedule_s: float | None = None
    killed_after_schedule_s: float | None = None
    completing_attempt: int | None = None
    last_failure: str | None = None
    #: the case's settings for this run
    heartbeat_s: float | None = None
    initial_interval_s: float | None = None
    problems: list[str] = field(default_factory=list)


def _split(world: TimedWorld, workdir: Path) -> tuple[float | None, float | None, float | None]:
    kill = world.killed_wall
    if kill is None:
        return None, None, None
    ready = None if world.ready_wall is None else world.ready_wall - kill
    journal = open_journal(f"sqlite:///{workdir / 'journal.db'}", create=False)
    try:
        entries = journal.read(world.effect_id)
    finally:
        journal.close()
    after = [e for e in entries if e.ts > kill]
    first = after[0].ts - kill if after else None
    committed = next((e.ts - kill for e in after if e.kind is Kind.COMMITTED), None)
    return ready, first, committed


@dataclass(frozen=True)
class HistorySplit:
    last_attempt_started_s: float | None = None
    sticky_timed_out_s: float | None = None
    workflow_completed_s: float | None = None
    retry_after_schedule_s: float | None = None
    killed_after_schedule_s: float | None = None
    completing_attempt: int | None = None
    last_failure: str | None = None


async def _history_split(world: TimedWorld, activity: str = "refund") -> HistorySplit:
    """Read the effect activity's timeline from the run's workflow history."""
    kill = world.killed_wall
    if kill is None or not world.handles:
        return HistorySplit()
    scheduled_at: float | None = None
    scheduled_id: int | None = None
    started_at: float | None = None
    attempt: int | None = None
    failure: str | None = None
    sticky: float | None = None
    completed: float | None = None
    async for ev in world.handles[0].fetch_history_events():
        at = ev.event_time.ToDatetime().timestamp()
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if ev.activity_task_scheduled_event_attributes.activity_type.name == activity:
                scheduled_at, scheduled_id = at, ev.event_id
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = ev.activity_task_started_event_attributes
            if attrs.scheduled_event_id == scheduled_id:
                started_at, attempt = at, attrs.attempt
                failure = attrs.last_failure.message or None
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            if started_at is not None and sticky is None:
                sticky = at - kill
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            completed = at - kill
    return HistorySplit(
        last_attempt_started_s=None if started_at is None else started_at - kill,
        sticky_timed_out_s=sticky,
        workflow_completed_s=completed,
        retry_after_schedule_s=(
            None if started_at is None or scheduled_at is None else started_at - scheduled_at
        ),
        killed_after_schedule_s=None if scheduled_at is None else kill - scheduled_at,
        completing_attempt=attempt,
        last_failure=failure,
    )


async def one_run(
    client: Client,
    root: Path,
    index: int,
    name: str,
    tier: int,
    *,
    heartbeat_s: float | None = None,
    initial_interval_s: float | None = None,
) -> Run:
    workdir = root / f"{index:02d}-{name}-t{tier}"
    workdir.mkdir(parents=True)
    began = time.monotonic()
    world: TimedWorld | None = None
    defaults = CaseFile.model_fields
    hb = heartbeat_s if heartbeat_s is not None else defaults["heartbeat_s"].default
    ii = (
        initial_interval_s
        if initial_interval_s is not None
        else defaults["initial_interval_s"].default
    )
    try:
        # what ServerWorld.create(client, dir, tier, "gated") does (``cls(...)``), typed as ours
        world = TimedWorld(
            client,
            workdir,
            tier,
            "gated",
            heartbeat_s=heartbeat_s,
            initial_interval_s=initial_interval_s,
        )
        result = await run_in(world, name)
    except Exception as err:  # a run that cannot finish is a failed run, reported
        return Run(
            index,
            name,
            tier,
            ok=False,
            final="ERROR",
            via=None,
            crash_to_completion_s=None if world is None else world.crash_to_completion_s,
            elapsed_s=round(time.monotonic() - began, 3),
            heartbeat_s=hb,
            initial_interval_s=ii,
            problems=[f"{type(err).__name__}: {err}"],
        )
    ready, first, committed = _split(world, workdir)
    try:
        history = await _history_split(world)
    except Exception as err:  # the split is a detail; the run's figure stands without it
        history = HistorySplit(last_failure=f"history unreadable: {type(err).__name__}: {err}")
    return Run(
        index,
        name,
        tier,
        ok=bool(result["ok"]),
        final=str(result["final"]),
        via=result.get("via") or result.get("code"),
        crash_to_completion_s=result.get("crash_to_completion_s"),
        elapsed_s=float(result["elapsed_s"]),
        worker_ready_s=ready,
        recovery_write_s=first,
        committed_s=committed,
        last_attempt_started_s=history.last_attempt_started_s,
        sticky_timed_out_s=history.sticky_timed_out_s,
        workflow_completed_s=history.workflow_completed_s,
        retry_after_schedule_s=history.retry_after_schedule_s,
        killed_after_schedule_s=history.killed_after_schedule_s,
        completing_attempt=history.completing_attempt,
        last_failure=history.last_failure,
        heartbeat_s=hb,
        initial_interval_s=ii,
        problems=list(result.get("problems", [])),
    )


@dataclass(frozen=True)
class Settings:
    """What the recovery time is made of, read from the code that sets it."""

    heartbeat_s: float | None
    initial_interval_s: float
    sticky_timeout_s: float


def settings() -> Settings:
    from workers.worker import parse

    worker = parse(["--target", "x", "--journal", "x", "--payments", "x"])
    fields = CaseFile.model_fields
    return Settings(
        heartbeat_s=fields["heartbeat_s"].default,
        initial_interval_s=fields["initial_interval_s"].default,
        sticky_timeout_s=worker.sticky_timeout_s,
    )


@dataclass(frozen=True)
class CrashRecovery:
    directory: str
    filesystem: Filesystem
    runs: list[Run]
    settings: Settings
    seconds: float
    #: runs with other heartbeat timeouts and retry intervals (not part of the figure)
    sensitivity: list[Run] = field(default_factory=list)

    @property
    def measured(self) -> list[float]:
        return [r.crash_to_completion_s for r in self.runs if r.crash_to_completion_s is not None]

    @property
    def dist(self) -> Dist | None:
        return Dist.of(self.measured) if self.measured else None

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if not r.ok]

    def part(self, attr: str) -> Dist | None:
        values = [getattr(r, attr) for r in self.runs if getattr(r, attr) is not None]
        return Dist.of(values) if values else None

    def by_row(self) -> list[tuple[str, int, list[Run]]]:
        return [
            (name, tier, [r for r in self.runs if r.scenario == name and r.tier == tier])
            for name, tier in PLAN
            if any(r.scenario == name and r.tier == tier for r in self.runs)
        ]


async def connect(target: str, timeout_s: float = 30.0) -> Client:
    """A client with the pydantic converter. The dev server accepts connections a moment before
    its frontend is healthy ("Frontend is not healthy yet"), so retry briefly."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await Client.connect(target, data_converter=pydantic_data_converter)
        except RuntimeError as err:
            if "not healthy" not in str(err) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def _print(run: Run, i: int, total: int) -> None:
    mark = "ok  " if run.ok else "FAIL"
    ctc = "-" if run.crash_to_completion_s is None else f"{run.crash_to_completion_s:.2f}s"
    print(
        f"  {mark} {i:>2}/{total} {run.scenario:<18} t{run.tier} {run.final:<10} "
        f"{run.via or '':<18} hb {run.heartbeat_s:g}s retry {run.initial_interval_s:g}s  "
        f"crash->result {ctc:>7}  (run {run.elapsed_s:.1f}s)",
        flush=True,
    )
    for problem in run.problems:
        print(f"       {problem}", flush=True)


async def measure(samples: int, *, sensitivity: bool = True) -> CrashRecovery:
    began = time.monotonic()
    root = bench_dir("crash")
    fs = filesystem_of(root)
    for name, _ in PLAN:
        if not SCENARIOS[name].crash:
            raise RuntimeError(f"{name} is not a crash row")
    plan = [PLAN[i % len(PLAN)] for i in range(samples)]
    print(f"figure 2: crash to completion, {samples} runs, one dev server, files in {root}")
    server = await DevServer(ui_port=None).start()
    runs: list[Run] = []
    tried: list[Run] = []
    try:
        client = await connect(server.target)
        for i, (name, tier) in enumerate(plan, 1):
            run = await one_run(client, root, i, name, tier)
            runs.append(run)
            _print(run, i, samples)
        if sensitivity:
            print(
                "  sensitivity (not part of the figure): other heartbeat timeouts and retry "
                "intervals",
                flush=True,
            )
            name, tier = SENSITIVITY_ROW
            for j, (hb, ii) in enumerate(SENSITIVITY, 1):
                run = await one_run(
                    client, root, 100 + j, name, tier, heartbeat_s=hb, initial_interval_s=ii
                )
                tried.append(run)
                _print(run, j, len(SENSITIVITY))
    finally:
        await server.stop()
    return CrashRecovery(
        directory=str(root),
        filesystem=fs,
        runs=runs,
        settings=settings(),
        seconds=time.monotonic() - began,
        sensitivity=tried,
    )


def run(samples: int, *, sensitivity: bool = True) -> CrashRecovery:
    return asyncio.run(measure(samples, sensitivity=sensitivity))
