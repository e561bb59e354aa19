"""Figure 2: from a SIGKILL mid-send to the workflow's result, on a real Temporal dev server.

The crash rows of the fault table (``workers.scenarios``), run one after another on one dev
server with real worker processes, as ``workers.faults`` runs them, in two setups interleaved
run by run: *fresh* (one worker; a new one is started once the kill is seen, as the fault
table does) and *standby* (two workers polling from the start, as a fleet runs; the one that
did the send is killed, the other recovers, no worker is started).
``ServerWorld.crash_to_completion_s`` is measured from the observed SIGKILL to the workflow's
result. Each run's journal and workflow history are read back afterwards to split that time:
the heartbeat timeout, the server's retry, the recovery attempt's journal writes, the workflow
task that follows (on which queue, taken by whom) and the workflow's completion.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.testing import DevServer, WorkerProcess
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
#: pairs of standby runs with and without ``release_sticky_on_retry`` (full run only)
STICKY_PAIRS = 4
#: the server setting that sets the floor of a retry's delay (1 s by default: a timer due
#: sooner than the timer queue's read-ahead horizon fires at that horizon), and the value the
#: sensitivity runs give it on a second dev server
TIMER_SHIFT_KEY = "history.timerProcessorMaxTimeShift"
TIMER_SHIFT_S = 0.1
TIMER_SHIFT_RUNS = 4

Setup = Literal["fresh", "standby"]


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
        setup: Setup = "fresh",
        release_sticky: bool = True,
    ) -> None:
        super().__init__(client, workdir, tier, mode)
        self.fleet: Setup = setup
        self.release_sticky = release_sticky
        self.killed_identity: str | None = None
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

    async def spawn(self, *extra: str) -> WorkerProcess:
        keep = () if self.release_sticky else ("--keep-sticky-on-retry",)
        return await super().spawn(*extra, *keep)

    async def start(self, case: CaseFile) -> WorkflowHandle[Any, CaseOutcome]:
        # standby: two workers polling before the workflow starts; either may run its tasks
        while self.fleet == "standby" and len(self._live()) < 2:
            await self.spawn()
        handle = await super().start(case)
        self.handles.append(handle)
        return handle

    async def crashed(self, run: Any) -> None:
        await super().crashed(run)
        if self._killed_at is not None:
            self.killed_wall = time.time() - (time.monotonic() - self._killed_at)
        dead = [i for i, w in enumerate(self.workers) if w.killed]
        if dead:
            self.killed_identity = f"worker-{dead[0] + 1}"

    async def restart(self) -> None:
        if self.fleet == "standby":
            return  # the standby worker, polling all along, recovers; none is started
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
    #: fresh or standby; whether retried attempts released the sticky queue; the server's
    #: timer read-ahead (None: the dev server's default)
    setup: Setup = "fresh"
    release_sticky: bool = True
    timer_shift_s: float | None = None
    #: seconds after the kill (history): the completing attempt's ActivityTaskCompleted; the
    #: workflow task it schedules, on which queue kind, and when a worker starts it
    activity_completed_s: float | None = None
    workflow_task_scheduled_s: float | None = None
    workflow_task_queue: str | None = None
    workflow_task_started_s: float | None = None
    #: whether the killed worker was the one whose sticky queue held the workflow
    sticky_on_killed: bool | None = None


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
    activity_completed_s: float | None = None
    workflow_task_scheduled_s: float | None = None
    workflow_task_queue: str | None = None
    workflow_task_started_s: float | None = None
    #: the identity of the worker that completed the last workflow task before the effect was
    #: scheduled: the one whose sticky queue holds the workflow
    sticky_holder: str | None = None


class _Timeline:
    """The effect activity's events in a workflow history, as wall-clock seconds."""

    def __init__(self, activity: str) -> None:
        self.activity = activity
        self.at: dict[str, float] = {}
        self.scheduled_id: int | None = None
        self.attempt: int | None = None
        self.failure: str | None = None
        self.queue: str | None = None
        self.holder: str | None = None
        self._holder_so_far: str | None = None

    def _first(self, name: str, at: float) -> None:
        self.at.setdefault(name, at)

    def see(self, ev: Any) -> None:
        at = ev.event_time.ToDatetime().timestamp()
        kind = ev.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and self.scheduled_id is None:
            self._holder_so_far = ev.workflow_task_completed_event_attributes.identity
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if ev.activity_task_scheduled_event_attributes.activity_type.name == self.activity:
                self.at["scheduled"], self.scheduled_id = at, ev.event_id
                self.holder = self._holder_so_far
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = ev.activity_task_started_event_attributes
            if attrs.scheduled_event_id == self.scheduled_id:
                self.at["started"], self.attempt = at, attrs.attempt
                self.failure = attrs.last_failure.message or None
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            if ev.activity_task_completed_event_attributes.scheduled_event_id == self.scheduled_id:
                self.at["completed"] = at
        elif "completed" in self.at:
            self._after_activity(ev, kind, at)

    def _after_activity(self, ev: Any, kind: int, at: float) -> None:
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED and "wft_scheduled" not in self.at:
            self.at["wft_scheduled"] = at
            queue_kind = ev.workflow_task_scheduled_event_attributes.task_queue.kind
            sticky = queue_kind == TaskQueueKind.TASK_QUEUE_KIND_STICKY
            self.queue = "sticky" if sticky else "normal"
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            self._first("sticky_timed_out", at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            self._first("wft_started", at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            self._first("workflow_completed", at)


async def _history_split(world: TimedWorld, activity: str = "refund") -> HistorySplit:
    """Read the effect activity's timeline from the run's workflow history."""
    kill = world.killed_wall
    if kill is None or not world.handles:
        return HistorySplit()
    line = _Timeline(activity)
    async for ev in world.handles[0].fetch_history_events():
        line.see(ev)

    def after_kill(name: str) -> float | None:
        return None if name not in line.at else line.at[name] - kill

    scheduled, started = line.at.get("scheduled"), line.at.get("started")
    return HistorySplit(
        last_attempt_started_s=after_kill("started"),
        sticky_timed_out_s=after_kill("sticky_timed_out"),
        workflow_completed_s=after_kill("workflow_completed"),
        retry_after_schedule_s=(
            None if started is None or scheduled is None else started - scheduled
        ),
        killed_after_schedule_s=None if scheduled is None else kill - scheduled,
        completing_attempt=line.attempt,
        last_failure=line.failure,
        activity_completed_s=after_kill("completed"),
        workflow_task_scheduled_s=after_kill("wft_scheduled"),
        workflow_task_queue=line.queue,
        workflow_task_started_s=after_kill("wft_started"),
        sticky_holder=line.holder,
    )


@dataclass(frozen=True)
class Plan:
    """One run's setup: the row, the workers, the case's settings, the server's."""

    name: str
    tier: int
    setup: Setup = "fresh"
    release_sticky: bool = True
    heartbeat_s: float | None = None
    initial_interval_s: float | None = None
    timer_shift_s: float | None = None


async def one_run(client: Client, root: Path, index: int, plan: Plan) -> Run:
    workdir = root / f"{index:03d}-{plan.name}-t{plan.tier}-{plan.setup}"
    workdir.mkdir(parents=True)
    began = time.monotonic()
    world: TimedWorld | None = None
    defaults = CaseFile.model_fields
    hb = plan.heartbeat_s if plan.heartbeat_s is not None else defaults["heartbeat_s"].default
    ii = plan.initial_interval_s
    base = Run(
        index,
        plan.name,
        plan.tier,
        ok=False,
        final="ERROR",
        via=None,
        crash_to_completion_s=None,
        elapsed_s=0.0,
        heartbeat_s=hb,
        initial_interval_s=ii if ii is not None else defaults["initial_interval_s"].default,
        setup=plan.setup,
        release_sticky=plan.release_sticky,
        timer_shift_s=plan.timer_shift_s,
    )
    try:
        # what ServerWorld.create(client, dir, tier, "gated") does (``cls(...)``), typed as ours
        world = TimedWorld(
            client,
            workdir,
            plan.tier,
            "gated",
            heartbeat_s=plan.heartbeat_s,
            initial_interval_s=ii,
            setup=plan.setup,
            release_sticky=plan.release_sticky,
        )
        result = await run_in(world, plan.name)
    except Exception as err:  # a run that cannot finish is a failed run, reported
        return dataclasses.replace(
            base,
            crash_to_completion_s=None if world is None else world.crash_to_completion_s,
            elapsed_s=round(time.monotonic() - began, 3),
            problems=[f"{type(err).__name__}: {err}"],
        )
    return dataclasses.replace(
        base,
        ok=bool(result["ok"]),
        final=str(result["final"]),
        via=result.get("via") or result.get("code"),
        crash_to_completion_s=result.get("crash_to_completion_s"),
        elapsed_s=float(result["elapsed_s"]),
        problems=list(result.get("problems", [])),
        **await _parts(world, workdir),
    )


async def _parts(world: TimedWorld, workdir: Path) -> dict[str, Any]:
    """The run's split from its journal and its workflow history."""
    ready, first, committed = _split(world, workdir)
    try:
        history = await _history_split(world)
    except Exception as err:  # the split is a detail; the run's figure stands without it
        history = HistorySplit(last_failure=f"history unreadable: {type(err).__name__}: {err}")
    parts = dataclasses.asdict(history)
    holder = parts.pop("sticky_holder")
    return {
        **parts,
        "worker_ready_s": ready,
        "recovery_write_s": first,
        "committed_s": committed,
        "sticky_on_killed": (
            None
            if holder is None or world.killed_identity is None
            else holder == world.killed_identity
        ),
    }


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
    #: the fresh-worker runs (the fault table's setup)
    runs: list[Run]
    settings: Settings
    seconds: float
    #: runs with other heartbeat timeouts and retry intervals (not part of the figure)
    sensitivity: list[Run] = field(default_factory=list)
    #: the standby runs, interleaved with ``runs`` (the same rows)
    standby: list[Run] = field(default_factory=list)
    #: standby runs in pairs, with and without ``release_sticky_on_retry`` (full run only)
    sticky_pairs: list[Run] = field(default_factory=list)
    #: standby runs on a dev server whose timer read-ahead is ``TIMER_SHIFT_S`` (full run only)
    timer_shift: list[Run] = field(default_factory=list)

    @property
    def measured(self) -> list[float]:
        return _times(self.runs)

    @property
    def dist(self) -> Dist | None:
        return Dist.of(self.measured) if self.measured else None

    @property
    def standby_dist(self) -> Dist | None:
        times = _times(self.standby)
        return Dist.of(times) if times else None

    @property
    def failed(self) -> list[Run]:
        """Runs that did not end with the fault table's expected outcome (any setup)."""
        every = [*self.runs, *self.standby, *self.sticky_pairs, *self.timer_shift]
        return [r for r in every if not r.ok]

    def part(self, attr: str, runs: list[Run] | None = None) -> Dist | None:
        chosen = self.runs if runs is None else runs
        values = [getattr(r, attr) for r in chosen if getattr(r, attr) is not None]
        return Dist.of(values) if values else None

    def by_row(self, runs: list[Run] | None = None) -> list[tuple[str, int, list[Run]]]:
        chosen = self.runs if runs is None else runs
        return [
            (name, tier, [r for r in chosen if r.scenario == name and r.tier == tier])
            for name, tier in PLAN
            if any(r.scenario == name and r.tier == tier for r in chosen)
        ]


def _times(runs: list[Run]) -> list[float]:
    return [r.crash_to_completion_s for r in runs if r.crash_to_completion_s is not None]


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
    sticky = "" if run.release_sticky else " keep-sticky"
    shift = "" if run.timer_shift_s is None else f" shift {run.timer_shift_s:g}s"
    print(
        f"  {mark} {i:>2}/{total} {run.setup:<7} {run.scenario:<18} t{run.tier} "
        f"{run.final:<10} {run.via or '':<18} hb {run.heartbeat_s:g}s retry "
        f"{run.initial_interval_s:g}s{sticky}{shift}  crash->result {ctc:>7}  "
        f"(wf task {run.workflow_task_queue or '-'}; run {run.elapsed_s:.1f}s)",
        flush=True,
    )
    for problem in run.problems:
        print(f"       {problem}", flush=True)


async def _series(client: Client, root: Path, first: int, plans: list[Plan]) -> list[Run]:
    runs: list[Run] = []
    for i, plan in enumerate(plans):
        run = await one_run(client, root, first + i, plan)
        runs.append(run)
        _print(run, i + 1, len(plans))
    return runs


async def _on_own_server(
    root: Path, first: int, plans: list[Plan], dynamic_config: dict[str, str]
) -> list[Run]:
    server = await DevServer(ui_port=None, dynamic_config=dynamic_config).start()
    try:
        return await _series(await connect(server.target), root, first, plans)
    finally:
        await server.stop()


def _plans(samples: int) -> list[Plan]:
    """Fresh and standby alternating, each cycling through ``PLAN``."""
    rows = [PLAN[i % len(PLAN)] for i in range(samples)]
    return [Plan(name, tier, setup) for name, tier in rows for setup in ("fresh", "standby")]


async def _sensitivity(client: Client, root: Path) -> tuple[list[Run], list[Run], list[Run]]:
    print("  sensitivity (not part of the figures): other settings", flush=True)
    name, tier = SENSITIVITY_ROW
    settings_runs = await _series(
        client,
        root,
        200,
        [Plan(name, tier, heartbeat_s=hb, initial_interval_s=ii) for hb, ii in SENSITIVITY],
    )
    rows = [PLAN[i % len(PLAN)] for i in range(STICKY_PAIRS)]
    pairs = await _series(
        client,
        root,
        300,
        [Plan(n, t, "standby", release) for n, t in rows for release in (True, False)],
    )
    shifted = [
        Plan(n, t, "standby", timer_shift_s=TIMER_SHIFT_S)
        for n, t in (PLAN[i % len(PLAN)] for i in range(TIMER_SHIFT_RUNS))
    ]
    shift = await _on_own_server(
        root, 400, shifted, {TIMER_SHIFT_KEY: f'"{TIMER_SHIFT_S * 1000:g}ms"'}
    )
    return settings_runs, pairs, shift


async def measure(samples: int, *, sensitivity: bool = True) -> CrashRecovery:
    began = time.monotonic()
    root = bench_dir("crash")
    fs = filesystem_of(root)
    for name, _ in PLAN:
        if not SCENARIOS[name].crash:
            raise RuntimeError(f"{name} is not a crash row")
    print(
        f"figure 2: crash to completion, {samples} runs fresh and {samples} standby "
        f"(interleaved), one dev server, files in {root}"
    )
    server = await DevServer(ui_port=None).start()
    tried: tuple[list[Run], list[Run], list[Run]] = ([], [], [])
    try:
        client = await connect(server.target)
        runs = await _series(client, root, 1, _plans(samples))
        if sensitivity:
            tried = await _sensitivity(client, root)
    finally:
        await server.stop()
    return CrashRecovery(
        directory=str(root),
        filesystem=fs,
        runs=[r for r in runs if r.setup == "fresh"],
        settings=settings(),
        seconds=time.monotonic() - began,
        sensitivity=tried[0],
        standby=[r for r in runs if r.setup == "standby"],
        sticky_pairs=tried[1],
        timer_shift=tried[2],
    )


def run(samples: int, *, sensitivity: bool = True) -> CrashRecovery:
    return asyncio.run(measure(samples, sensitivity=sensitivity))
