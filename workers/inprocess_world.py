"""The fault table against the core protocol alone: no server, no processes. A crash is
``SimulatedCrash`` unwinding the attempt, which releases its claim as a death would; the "retry"
is the next attempt on a fresh ``Gate``. Thousands of cases run in seconds this way."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from interlock_temporal.core.errors import Ambiguous, InFlight, Refused
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Delivery, Gate, Measure, Ticket
from interlock_temporal.core.receipts import fold
from interlock_temporal.core.review import record_resolution
from interlock_temporal.core.targets import EffectTarget
from interlock_temporal.targets.payments import (
    RefundRequest,
    RefundResult,
    SimulatedCrash,
    SimulatedPayments,
)
from workflows.activities import (
    REFUND_EFFECT,
    RefundService,
    refund_amount,
    refund_key,
    refund_resource,
)
from workflows.support_case import PRINCIPAL, CaseFile, CaseOutcome

from .world import Observed, Payments, World, new_workflow_id, open_world_journal

MAX_ATTEMPTS = 500


def refund_call(req: RefundRequest, case: CaseFile, workflow_id: str, attempt: int) -> Call:
    """The call the interceptor would build for the ``refund`` activity."""
    return Call(
        effect_type="refund",
        activity="refund",
        input=req,
        args=(req,),
        key=refund_key(req),
        premises_field=REFUND_EFFECT["premises"],
        principal=PRINCIPAL,
        lease_id=case.lease_id,
        session=workflow_id,
        measure=lambda args: Measure(refund_amount(args[0]), refund_resource(args[0])),
        delivery=Delivery(workflow_id=workflow_id, activity_id="2", attempt=attempt),
        decode_args=lambda blob: (RefundRequest.model_validate(blob[0]),),
    )


class Run:
    """One support-case workflow, driven attempt by attempt as Temporal would retry it."""

    def __init__(self, world: InProcessWorld, case: CaseFile) -> None:
        self.world = world
        self.case = case
        self.workflow_id = new_workflow_id()
        self.attempt = 0
        self.crashed = False
        self.waiting = False
        self.outcome: CaseOutcome | None = None
        self.request = RefundRequest(
            case_id=case.case_id,
            order_id=case.order_id,
            amount_cents=case.amount_cents,
            reason=f"support case {case.case_id}",
            premises=world.payments.order_facts(case.order_id),
        )

    async def _send(self, ticket: Ticket) -> RefundResult:
        r = ticket.input
        return await self.world.service.refund(
            r.order_id, r.amount_cents, idempotency_key=ticket.effect_id
        )

    async def attempt_once(self, gate: Gate) -> CaseOutcome | None:
        """One attempt; None when it should be retried."""
        self.attempt += 1
        call = refund_call(self.request, self.case, self.workflow_id, self.attempt)
        try:
            result = await gate.run(call, self.world.target, self._send)
        except (Refused, Ambiguous) as err:
            return CaseOutcome(
                case_id=self.case.case_id,
                status=err.receipt.final,
                receipt=err.receipt,
                error=str(err),
            )
        except InFlight:
            return None
        except SimulatedCrash:
            raise
        except Exception:
            return None  # in doubt: the next attempt recovers
        return CaseOutcome(
            case_id=self.case.case_id, status="REFUNDED", refund=RefundResult.model_validate(result)
        )

    async def drive(self, gate: Gate | None = None) -> None:
        self.crashed = False
        while self.outcome is None:
            if self.attempt >= MAX_ATTEMPTS:
                raise RuntimeError(f"no outcome after {MAX_ATTEMPTS} attempts")
            try:
                self.outcome = await self.attempt_once(gate or self.world.gate)
            except SimulatedCrash:
                self.crashed = True
                return
            if self.outcome is None:
                await asyncio.sleep(0.002)
            elif self.outcome.status == "AMBIGUOUS" and self.case.wait_for_review:
                self.outcome, self.waiting = None, True  # execute_effect waits for a person
                return

    async def after_review(self) -> None:
        """What execute_effect does once the review is decided."""
        view = fold(self.workflow_effect(), self.world.journal.read(self.workflow_effect()))
        self.waiting = False
        if view.status is Kind.RESOLVED and view.resolution == "happened":
            self.outcome = CaseOutcome(case_id=self.case.case_id, status="RESOLVED")
            return
        await self.drive()

    def workflow_effect(self) -> str:
        return Gate.identify(refund_call(self.request, self.case, self.workflow_id, 1))[0]


class InProcessWorld(World):
    def __init__(
        self,
        workdir: Path,
        tier: int,
        parts: tuple[Payments, RefundService, EffectTarget] | None = None,
    ) -> None:
        self.workdir = workdir
        self.tier = tier
        self.mode = "gated"
        self.kill = "crash"
        self.kills = 0
        self.crash_to_completion_s = None
        self.journal = open_world_journal(workdir)
        if parts is None:
            simulated = SimulatedPayments(workdir / "payments.db", tier=tier)
            parts = (simulated, simulated, simulated)
        self.payments: Payments = parts[0]
        self.service: RefundService = parts[1]
        self.target: EffectTarget = parts[2]
        self.gate = Gate(self.journal)
        self._others: list[Journal] = []
        self.runs: list[Run] = []

    def other_worker(self) -> Gate:
        """A gate on its own journal connection and claims, as another process would have."""
        journal = open_world_journal(self.workdir)
        self._others.append(journal)
        return Gate(journal)

    async def start(self, case: CaseFile) -> Run:
        run = Run(self, case)
        self.runs.append(run)
        await run.drive()
        return run

    async def resolve(self, decision: str, operator: str, note: str = "") -> None:
        run = self.runs[-1]
        if not run.waiting:
            await run.drive()
        if not run.waiting:
            raise RuntimeError("the run is not waiting for a review")
        record_resolution(
            self.journal,
            run.workflow_effect(),
            kind="ambiguous",
            decision=decision,
            operators=[operator],
            note=note,
        )

    async def crashed(self, run: Any) -> None:
        if not run.crashed:
            raise RuntimeError("the attempt was expected to crash and did not")
        self.kills += 1

    async def restart(self) -> None:
        self.gate = Gate(self.journal)

    async def result(self, run: Any) -> CaseOutcome:
        if run.waiting:
            await run.after_review()
        if run.outcome is None:
            await run.drive()
        if run.outcome is None:
            raise RuntimeError("the run crashed again")
        assert isinstance(run.outcome, CaseOutcome)
        return run.outcome

    async def in_flight_race(self) -> Observed:
        self.payments.arm("before_send", "stall", arg=0.3)
        run = Run(self, self.case())
        first = asyncio.ensure_future(run.attempt_once(self.gate))
        eid = self.effect_id
        while (row := self.journal.row(eid)) is None or row.status is not Kind.DISPATCHED:
            await asyncio.sleep(0.005)
        seen = False
        try:
            await self.other_worker().run(
                refund_call(run.request, run.case, run.workflow_id, 2), self.target, run._send
            )
        except InFlight:
            seen = True
        run.attempt = 2
        run.outcome = await first
        if run.outcome is None:
            await run.drive(self.other_worker())
        assert run.outcome is not None
        return Observed(run.outcome, {"in_flight_seen": seen})

    async def concurrent_submit(self, n: int) -> list[CaseOutcome]:
        workers = [self.gate, self.other_worker()]
        runs = [Run(self, self.case()) for _ in range(n)]
        await asyncio.gather(*[r.drive(workers[i % 2]) for i, r in enumerate(runs)])
        return [r.outcome for r in runs if r.outcome is not None]

    async def close(self) -> None:
        for journal in [*self._others, self.journal]:
            journal.close()
        self.payments.close()
