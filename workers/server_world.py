"""The fault table on a real Temporal server, with real worker processes and real SIGKILLs."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.review import review_id
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import WorkerProcess
from workflows.support_case import CaseFile, CaseOutcome, Mode

from .attempts import FAILED_ATTEMPT
from .world import (
    CASE,
    Observed,
    Payments,
    WorkflowStillRunning,
    World,
    new_workflow_id,
    open_world_journal,
)

ROOT = Path(__file__).resolve().parents[1]
RESULT_TIMEOUT_S = 120.0
#: row 11: how long attempt 1's send stalls (past its 2 s heartbeat and 2.5 s start-to-close)
STALL_S = 5.0


class ServerWorld(World):
    """``journal_url`` (with ``signing_key``, which every worker process gets in its
    environment) puts the journal elsewhere than the SQLite file in ``workdir``: a PostgreSQL
    journal makes the worker processes share nothing but it and Temporal."""

    def __init__(
        self,
        client: Client,
        workdir: Path,
        tier: int,
        mode: Mode,
        journal_url: str | None = None,
        signing_key: str | None = None,
    ) -> None:
        self.client = client
        self.workdir = workdir
        self.tier = tier
        self.mode = mode
        self.kill = "kill"
        self.kills = 0
        #: how long a workflow's result is waited for
        self.result_timeout_s = RESULT_TIMEOUT_S
        self.crash_to_completion_s = None
        self.task_queue = f"support-{uuid.uuid4().hex[:12]}"
        self.case_id = f"{CASE}-{self.task_queue[-6:]}"
        self.signing_key = signing_key
        self.journal = (
            open_world_journal(workdir)
            if journal_url is None
            else open_journal(journal_url, signing_key=signing_key)
        )
        self.payments: Payments = self._payments()
        self.workers: list[WorkerProcess] = []
        self._killed_at: float | None = None

    def _payments(self) -> Payments:
        self.simulated = SimulatedPayments(self.workdir / "payments.db", tier=self.tier)
        return self.simulated

    def target_args(self) -> list[str]:
        """How a worker process reaches the payments service."""
        return ["--payments", str(self.simulated.path), "--tier", str(self.tier)]

    @classmethod
    async def create(cls, client: Client, workdir: Path, tier: int, mode: Mode) -> ServerWorld:
        return cls(client, workdir, tier, mode)

    async def spawn(self, *extra: str) -> WorkerProcess:
        n = len(self.workers) + 1
        worker = WorkerProcess(
            [
                "-m",
                "workers.worker",
                "--target",
                self.client.service_client.config.target_host,
                "--namespace",
                self.client.namespace,
                "--task-queue",
                self.task_queue,
                "--journal",
                self.journal.url,
                *self.target_args(),
                "--identity",
                f"worker-{n}",
                *extra,
            ],
            cwd=ROOT,
            env={"INTERLOCK_SIGNING_KEY": self.signing_key} if self.signing_key else None,
        )
        self.workers.append(await worker.start())
        return worker

    def _live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.process and w.process.returncode is None]

    async def start(self, case: CaseFile) -> WorkflowHandle[Any, CaseOutcome]:
        if not self._live():
            await self.spawn()
        return await self.client.start_workflow(
            "SupportCase",
            case,
            id=new_workflow_id(),
            task_queue=self.task_queue,
            result_type=CaseOutcome,
        )

    async def crashed(self, run: Any) -> None:
        live = self._live()
        done, _ = await asyncio.wait(
            [asyncio.ensure_future(w.wait()) for w in live],
            timeout=60,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if not done:
            raise RuntimeError("no worker died within 60 s")
        self._killed_at = time.monotonic()
        dead = [w for w in live if w.process and w.process.returncode is not None]
        for w in dead:
            if not w.killed:
                raise RuntimeError(
                    f"worker exited with {w.process and w.process.returncode}, "
                    f"not by SIGKILL:\n{w.log}"
                )
            self.kills += 1

    async def restart(self) -> None:
        await self.spawn()

    async def result(self, run: WorkflowHandle[Any, CaseOutcome]) -> CaseOutcome:
        try:
            outcome = await asyncio.wait_for(run.result(), self.result_timeout_s)
        except TimeoutError:
            raise WorkflowStillRunning(
                f"the workflow had not ended after {self.result_timeout_s:.0f} s"
            ) from None
        if self._killed_at is not None and self.crash_to_completion_s is None:
            self.crash_to_completion_s = round(time.monotonic() - self._killed_at, 3)
        return outcome

    async def resolve(self, decision: str, operator: str, note: str = "") -> None:
        """What a person does in the Web UI: Send a Signal, ``resolve``, with the JSON."""
        handle = self.client.get_workflow_handle(review_id("ambiguous", self.effect_id))
        deadline = time.monotonic() + 60
        while True:
            try:
                description = await handle.describe()
                if description.status == WorkflowExecutionStatus.RUNNING:
                    break
            except RPCError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the review did not open")
            await asyncio.sleep(0.1)
        await handle.signal("resolve", {"decision": decision, "operator": operator, "note": note})

    async def _until(self, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached")
            await asyncio.sleep(0.05)

    async def in_flight_race(self) -> Observed:
        """Attempt 1 stalls inside the send on worker-1 (one activity slot, so it stays busy),
        times out, and attempt 2 runs on worker-2 while attempt 1 still holds the effect."""
        self.payments.arm("before_send", "stall", arg=STALL_S)
        stalled = await self.spawn("--max-concurrent-activities", "1")
        handle = await self.start(self.case(start_to_close_s=2.5, heartbeat_s=2.0))
        if self.mode != "gated":
            return await self._ungated_race(handle)
        eid = self.effect_id

        def dispatched() -> bool:
            row = self.journal.row(eid)
            return row is not None and row.status is Kind.DISPATCHED

        await self._until(dispatched, 30)
        other = await self.spawn()
        outcome = await self.result(handle)
        # each worker prints a line per failed attempt (workers.worker.AttemptFailures): read
        # after the run, they miss no attempt however loaded the machine is
        in_flight = await self._failed_attempts("EffectInFlight")
        seen: dict[str, Any] = {
            "in_flight_seen": bool(in_flight),
            "in_flight_workers": sorted({name for name, _ in in_flight}),
        }
        if in_flight:
            seen["max_attempt"] = max(attempt for _, attempt in in_flight) + 1
        seen["stalled_worker"] = "worker-1" if stalled is self.workers[0] else "?"
        seen["other_worker"] = f"worker-{self.workers.index(other) + 1}"
        return Observed(outcome, seen)

    async def _failed_attempts(self, kind: str, wait_s: float = 5.0) -> list[tuple[str, int]]:
        """(worker, attempt) of every attempt a worker of this world failed with ``kind``, from
        the workers' own output. A line is printed before its failure reaches the server, so
        it is there before the run's result; the wait covers only the output's reader lagging
        behind the pipe."""
        deadline = time.monotonic() + wait_s
        while True:
            found = [
                (f"worker-{n}", int(attempt))
                for n, w in enumerate(self.workers, start=1)
                for line in w.output
                if line.startswith(FAILED_ATTEMPT)
                and f" type={kind}" in line
                and (attempt := line.partition(" attempt=")[2].split(" ")[0]).isdigit()
            ]
            if found or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)

    async def _ungated_race(self, handle: WorkflowHandle[Any, CaseOutcome]) -> Observed:
        """The race without the gate (no journal to watch): once attempt 1 has started on the
        stalled worker, another worker joins to take attempt 2; after the workflow's result,
        the stalled attempt is waited for until its send reaches the service too."""

        async def refund_started() -> bool:
            description = await handle.describe()
            return any(
                p.activity_type.name.startswith("refund")
                and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                for p in description.raw_description.pending_activities
            )

        deadline = time.monotonic() + 30
        while not await refund_started():
            if time.monotonic() > deadline:
                raise TimeoutError("the refund's first attempt never started")
            await asyncio.sleep(0.05)
        other = await self.spawn()
        outcome = await self.result(handle)
        # both attempts' sends: the stalled one arrives STALL_S after it started
        await self._until(lambda: self.payments.calls(self.order_id) >= 2, STALL_S + 30)
        return Observed(
            outcome,
            {
                "stalled_worker": "worker-1",
                "other_worker": f"worker-{self.workers.index(other) + 1}",
            },
        )

    async def concurrent_submit(self, n: int) -> list[CaseOutcome]:
        while len(self._live()) < 2:
            await self.spawn()
        handles = await asyncio.gather(
            *[
                self.client.start_workflow(
                    "SupportCase",
                    self.case(),
                    id=new_workflow_id(f"case-{i}"),
                    task_queue=self.task_queue,
                    result_type=CaseOutcome,
                )
                for i in range(n)
            ]
        )
        return list(await asyncio.gather(*[self.result(h) for h in handles]))

    async def close(self) -> None:
        await asyncio.gather(*[w.stop() for w in self.workers])
        self.journal.close()
        self.payments.close()
