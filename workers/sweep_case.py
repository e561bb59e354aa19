"""A sweep case: what it draws from its seed (``Case``), the story its run tells
(``Story``), and the world it runs in: the events that happen while no attempt runs, each
recorded in the ``Ledger`` the judge compares the journal against."""

from __future__ import annotations

import random
import sqlite3
import time
from contextlib import closing, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from interlock_temporal.core.errors import GateOutcome
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.protocol import POINTS, Gate, Ticket
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from workflows.activities import refund_key
from workflows.support_case import CaseFile

from .db_edit import raise_approved
from .inprocess_world import refund_call
from .outsider import OUTSIDERS

ORDER = "A-7731"
#: the order of another case that shares the lease's budget
OTHER_ORDER = "B-5512"
PAID_CENTS = 10_000
AMOUNT = 2_000
#: the lease's cumulative budget: this refund fits, this one and another do not
BUDGET_CENTS = 3_000
EVENTS = (
    "none",
    "revoke_lease",
    "expire_lease",
    "ineligible",
    "manual_refund",
    "window_passes",
    "near_window_end",
    "budget_taken",
    "tamper",
    "owner_cancelled",
)
NEXT = ("retry", "duplicate", "duplicate_other", "redecide")
OWNER = "wf-sweep"
OTHER_WORKFLOW = "wf-other"
#: the share of cases in which an outsider's decision arrives while the effect is in doubt
OUTSIDER_SHARE = 0.25


@dataclass(frozen=True)
class Case:
    seed: int
    tier: int
    first_dies_at: str | None
    second_dies_at: str | None
    event: str
    then: str
    concurrent: bool
    #: the first attempt hangs on, alive, holding its claim, and records its result last;
    #: ``stalled``: its request has not reached the target yet (it lands late), else it has
    zombie: bool = False
    stalled: bool = False
    #: while the effect is AMBIGUOUS, an outsider's decision arrives (``outsider.OUTSIDERS``:
    #: votes by the agent's own principal, by an operator not on the allow-list, or both)
    outsider: str | None = None
    #: the ``tamper`` event puts back the lease's row as it was before its revocation (seal and
    #: all) instead of editing the effect's values
    lease_rollback: bool = False

    @classmethod
    def draw(cls, seed: int) -> Case:
        rng = random.Random(seed)
        points: list[str | None] = [*POINTS, None]
        first = rng.choice(points)
        second = rng.choice([None, None, *POINTS])
        event = rng.choice(EVENTS)
        then = rng.choice(NEXT)
        concurrent = rng.random() < 0.3
        zombie = rng.random() < 0.12
        stalled = rng.random() < 0.5
        # drawn from a stream of its own: every other draw of a seed is what it was before
        apart = random.Random(f"outsider {seed}")
        outsider = apart.choice(OUTSIDERS) if apart.random() < OUTSIDER_SHARE else None
        rollback = event == "tamper" and random.Random(f"lease rollback {seed}").random() < 0.5
        return cls(
            seed=seed,
            tier=rng.choice((1, 2, 3)),
            first_dies_at=None if zombie else first,
            second_dies_at=second,
            event=event,
            then=then,
            concurrent=concurrent,
            zombie=zombie,
            stalled=zombie and stalled,
            outsider=outsider,
            lease_rollback=rollback,
        )


@dataclass
class Story:
    case: Case
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.lines.append(text)

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)


@dataclass
class Ledger:
    """What the world did, and when (real time, and the world clock's offset then): what the
    judge compares the journal against."""

    lease: str
    #: (real time it took effect, the world clock's offset from then on)
    offsets: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    #: when the owning workflow was cancelled (its attempts stop; the reconciler runs)
    cancelled_at: float | None = None
    #: when the operator edited the journal, and the service's calls then
    tampered_at: float | None = None
    calls_at_tamper: int = 0
    #: the zombie attempt recorded its (late) result
    zombie_committed: bool = False
    #: the zombie's stalled request reached the service at the very end (dispatched before
    #: anything the world did after it)
    zombie_sent_late: bool = False
    #: a late COMMITTED after a refusal charges the budget again, whatever it holds
    reconciled: bool = False

    def offset_at(self, ts: float) -> float:
        return max((o for at, o in self.offsets if at <= ts), default=0.0)


def effect_of(request: RefundRequest) -> str:
    return effect_id("refund", refund_key(request))


async def world_event(
    event: str,
    payments: SimulatedPayments,
    journal: Journal,
    ledger: Ledger,
    story: Story,
    request: RefundRequest | None = None,
) -> None:
    if event == "revoke_lease":
        journal.leases.revoke(ledger.lease)
    elif event == "expire_lease":
        _advance(payments, ledger, timedelta(hours=2))
    elif event == "ineligible":
        payments.set_eligible(ORDER, False)
    elif event == "manual_refund":
        payments.manual_refund(ORDER, AMOUNT)
    elif event == "window_passes":
        _advance(payments, ledger, timedelta(hours=25))
    elif event == "near_window_end":
        # inside the 24-hour window, but past its end less settle time and the margin
        _advance(payments, ledger, timedelta(hours=24) - timedelta(minutes=2))
    elif event == "budget_taken" and request is not None:
        await _another_refund(journal, payments, ledger, request)
    elif event == "tamper" and story.case.lease_rollback and request is not None:
        ledger.calls_at_tamper = payments.calls(ORDER)
        _roll_back_lease(journal, ledger.lease)
        ledger.tampered_at = time.time()
    elif event == "tamper" and request is not None:
        ledger.calls_at_tamper = payments.calls(ORDER)
        if _tamper(journal, effect_of(request)):
            ledger.tampered_at = time.time()
    elif event == "owner_cancelled":
        ledger.cancelled_at = time.time()
    story.say(f"world: {event}")


def _advance(payments: SimulatedPayments, ledger: Ledger, by: timedelta) -> None:
    payments.advance_clock(by.total_seconds())
    ledger.offsets.append((time.time(), ledger.offsets[-1][1] + by.total_seconds()))


async def _another_refund(
    journal: Journal, payments: SimulatedPayments, ledger: Ledger, request: RefundRequest
) -> None:
    """Another case refunds another order under the same lease: its reservation leaves less
    of the budget than this refund needs."""
    other = request.model_copy(
        update={
            "case_id": "other",
            "order_id": OTHER_ORDER,
            "premises": payments.order_facts(OTHER_ORDER),
        }
    )
    case = CaseFile(
        case_id="other", order_id=OTHER_ORDER, amount_cents=AMOUNT, lease_id=ledger.lease
    )

    async def send(ticket: Ticket) -> RefundResult:
        r = ticket.input
        return await payments.refund(r.order_id, r.amount_cents, idempotency_key=ticket.effect_id)

    with suppress(GateOutcome):
        await Gate(journal, clock=payments.clock).run(
            refund_call(other, case, "wf-budget", 1), payments, send
        )


def _roll_back_lease(journal: Journal, lease_id: str) -> None:
    """The lease is revoked (a signed entry), and the operator puts its row back as it was
    before, seal and all (he has no key to seal another): the gate must not read it as live."""
    path = Path(journal.url.removeprefix("sqlite:///"))
    sql = "SELECT doc, head_seq, head_hash, seal FROM leases WHERE lease_id = ?"
    with closing(sqlite3.connect(path)) as db:
        before = db.execute(sql, (lease_id,)).fetchone()
    journal.leases.revoke(lease_id)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE leases SET doc = ?, head_seq = ?, head_hash = ?, seal = ? WHERE lease_id = ?",
            (*before, lease_id),
        )


def _tamper(journal: Journal, eid: str) -> bool:
    """The operator raises the approved amount stored beside the effect's dispatch, and the
    digest its authorization signed, to match (he has no key to sign them again)."""

    def raised(values: dict[str, Any]) -> None:
        values["approved"][0]["amount_cents"] = AMOUNT + 900  # within the lease and its budget

    path = Path(journal.url.removeprefix("sqlite:///"))
    return raise_approved(path, eid, raised) is not None
