"""The world a row of the fault table runs in, shared by the rows (``scenarios``) and the
worlds that run them (``inprocess_world``, ``server_world``, ``stripe_harness``): the payments
service a row acts on and reads its money from, the journal, the lease, and the workers. The
order, the case and the amounts of the row's story are fixed here, so every world tells the
same one."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.targets.payments import (
    FaultAction,
    FaultPoint,
    RefundRecord,
    RefundRequest,
)
from workflows.activities import refund_key
from workflows.support_case import PRINCIPAL, CaseFile, CaseOutcome, Mode

ORDER = "881"
CASE = "4471"
PAID_CENTS = 10_000
REFUND_CENTS = 2_000
LEASE_MAX_CENTS = 5_000


class WorkflowStillRunning(TimeoutError):
    """The workflow had not ended when the runner stopped waiting for it."""


@dataclass
class Observed:
    outcome: CaseOutcome
    extra: dict[str, Any] = field(default_factory=dict)


class Payments(Protocol):
    """What a row does to the payments service and reads back from it (the money)."""

    def open_order(self, order_id: str, paid_cents: int) -> str: ...

    def arm(
        self, point: FaultPoint, action: FaultAction, *, arg: float | None = None, count: int = 1
    ) -> None: ...

    def manual_refund(self, order_id: str, amount_cents: int) -> str: ...

    def advance_clock(self, seconds: float) -> None: ...

    def refund_records(self, order_id: str) -> list[RefundRecord]: ...

    def calls(self, order_id: str | None = None) -> int: ...

    def order_facts(self, order_id: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


class World(ABC):
    """One row's world: the payments service, the journal, the lease, and workers."""

    tier: int
    mode: Mode
    payments: Payments
    journal: Journal
    lease_id: str
    kill: FaultAction
    kills: int = 0
    #: the support case: worlds that share a Temporal server get their own, because a review's
    #: workflow id derives from the effect id (the case and the order)
    case_id: str = CASE
    #: the order the case refunds (a Stripe world's order is the charge it creates)
    order_id: str = ORDER

    @property
    def effect_id(self) -> str:
        return the_effect_id(self.case_id, self.order_id)

    crash_to_completion_s: float | None = None

    def setup(self) -> None:
        self.order_id = self.payments.open_order(self.order_id, PAID_CENTS)
        self.lease_id = self.journal.leases.issue(
            PRINCIPAL,
            activities=["refund"],
            max_amount_cents=LEASE_MAX_CENTS,
            resources=[f"order:{self.order_id}"],
        )

    def case(self, amount_cents: int = REFUND_CENTS, **kw: Any) -> CaseFile:
        return CaseFile(
            case_id=self.case_id,
            order_id=self.order_id,
            amount_cents=amount_cents,
            lease_id=self.lease_id,
            mode=self.mode,
            **kw,
        )

    @abstractmethod
    async def start(self, case: CaseFile) -> Any: ...

    @abstractmethod
    async def crashed(self, run: Any) -> None:
        """Wait until the worker running ``run`` has died (a real SIGKILL on a server)."""

    @abstractmethod
    async def restart(self) -> None: ...

    @abstractmethod
    async def result(self, run: Any) -> CaseOutcome: ...

    async def submit(self, case: CaseFile) -> CaseOutcome:
        return await self.result(await self.start(case))

    @abstractmethod
    async def resolve(self, decision: str, operator: str, note: str = "") -> None:
        """A person decides the effect's review (once it is open)."""

    @abstractmethod
    async def in_flight_race(self) -> Observed: ...

    @abstractmethod
    async def concurrent_submit(self, n: int) -> list[CaseOutcome]: ...

    async def close(self) -> None:
        return None


def the_effect_id(case_id: str = CASE, order_id: str = ORDER) -> str:
    """The effect id of the row's refund: the case and the order name the decision."""
    probe = RefundRequest(case_id=case_id, order_id=order_id, amount_cents=REFUND_CENTS)
    return effect_id("refund", refund_key(probe))


def new_workflow_id(prefix: str = "case") -> str:
    return f"{prefix}-{CASE}-{uuid.uuid4().hex[:10]}"


def open_world_journal(workdir: Path) -> Journal:
    return open_journal(f"sqlite:///{workdir / 'journal.db'}")
