"""Every row of the fault table (``scenarios.md``) at every tier, in-process against the core
protocol: no server, a crash is ``SimulatedCrash`` unwinding the attempt.

``run_in_process`` judges each row itself; this file does not only trust that judge. After the
row, it opens the payments service and the journal again from their files and checks the money,
the refund records and the effect's state against its own copy of the table in ``scenarios.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core.models import Kind
from interlock_temporal.targets.payments import SimulatedPayments
from workers.scenarios import SCENARIOS, run_in_process
from workers.world import ORDER, open_world_journal, the_effect_id

TIERS = (1, 2, 3)


@dataclass(frozen=True)
class Money:
    """What the payments service must hold after the row (read from its file, not the gate)."""

    #: the effect's status in the journal (a re-decided payload does not change it)
    status: Kind
    cents: int
    #: sources of the refund records, sorted: "api" (the gate's send), "manual" (support)
    sources: tuple[str, ...]
    #: refund requests that reached the service, when the row pins it (exactly one send)
    calls: int | None = None


COMMITTED_20 = Money(Kind.COMMITTED, 2_000, ("api",))
AMBIGUOUS_20 = Money(Kind.AMBIGUOUS, 2_000, ("api",))
AMBIGUOUS_0 = Money(Kind.AMBIGUOUS, 0, ())
REFUSED_0 = Money(Kind.REFUSED, 0, ())


def _all(m: Money) -> dict[int, Money]:
    return dict.fromkeys(TIERS, m)


# the table of scenarios.md, written out again here (independent of workers.scenarios.Expect)
MONEY: dict[str, dict[int, Money]] = {
    "happy_path": _all(COMMITTED_20),
    "crash_before_send": {1: COMMITTED_20, 2: COMMITTED_20, 3: AMBIGUOUS_0},
    "crash_before_ack": {1: COMMITTED_20, 2: COMMITTED_20, 3: AMBIGUOUS_20},
    # the second submission returns the recorded result: one request ever reached the service
    "duplicate_submit": _all(Money(Kind.COMMITTED, 2_000, ("api",), calls=1)),
    # the $30 re-decision is refused by identity; the $20 effect keeps the state row 3 left it
    # in (COMMITTED, or AMBIGUOUS at tier 3)
    "model_redecides": {1: COMMITTED_20, 2: COMMITTED_20, 3: AMBIGUOUS_20},
    "lease_revoked": _all(REFUSED_0),
    "stale_premise": _all(REFUSED_0),
    # $20 total, and it is the manual refund: the gate sent nothing
    "refund_during_outage": {
        1: Money(Kind.REFUSED, 2_000, ("manual",), calls=0),
        2: Money(Kind.REFUSED, 2_000, ("manual",), calls=0),
        3: Money(Kind.AMBIGUOUS, 2_000, ("manual",), calls=0),
    },
    "lease_revoked_during_outage": {
        1: Money(Kind.REFUSED, 0, (), calls=0),
        2: Money(Kind.REFUSED, 0, (), calls=0),
        3: Money(Kind.AMBIGUOUS, 0, (), calls=0),
    },
    "key_expired": {1: COMMITTED_20, 2: COMMITTED_20, 3: AMBIGUOUS_20},
    "in_flight_race": _all(Money(Kind.COMMITTED, 2_000, ("api",), calls=1)),
    "concurrent_submit": _all(Money(Kind.COMMITTED, 2_000, ("api",), calls=1)),
    # rows 13 and 14 exist at tier 3 only: a person decides what nobody could know
    "ambiguous_resolved_happened": {3: Money(Kind.RESOLVED, 2_000, ("api",), calls=1)},
    "ambiguous_resolved_not_happened": {3: Money(Kind.COMMITTED, 2_000, ("api",), calls=1)},
}

ROWS = sorted(SCENARIOS.values(), key=lambda s: s.number)


def test_every_row_of_the_table_is_covered() -> None:
    assert set(MONEY) == set(SCENARIOS)
    assert [s.number for s in ROWS] == list(range(1, 15))
    for s in ROWS:
        assert set(MONEY[s.name]) == set(s.expect), s.name


@pytest.fixture
def payments_after(tmp_path: Path) -> Iterator[Any]:
    opened: list[SimulatedPayments] = []

    def open_(tier: int) -> SimulatedPayments:
        p = SimulatedPayments(tmp_path / "payments.db", tier=tier)
        opened.append(p)
        return p

    yield open_
    for p in opened:
        p.close()


@pytest.mark.parametrize(
    ("name", "tier"),
    [(s.name, t) for s in ROWS for t in sorted(MONEY[s.name])],
    ids=lambda v: f"t{v}" if isinstance(v, int) else f"{SCENARIOS[v].number:02}-{v}",
)
async def test_row(name: str, tier: int, tmp_path: Path, payments_after: Any) -> None:
    result = await run_in_process(name, tier, tmp_path)
    summary = {k: result.get(k) for k in ("final", "via", "code", "refunded_cents", "calls")}
    assert result["ok"], f"row {name} tier {tier}: {result['problems']} ({summary})"

    # the money, read from the payments service's own file
    want = MONEY[name][tier]
    payments: SimulatedPayments = payments_after(tier)
    records = payments.refund_records(ORDER)
    assert payments.refunded_cents(ORDER) == want.cents, summary
    assert tuple(sorted(r.source for r in records)) == want.sources, records
    assert result["refunded_cents"] == want.cents  # the judge read the same service
    if want.calls is not None:
        assert payments.calls(ORDER) == want.calls, summary
    eid = the_effect_id()
    for r in records:
        if r.source == "api" and tier <= 2:
            # a queryable service stores the effect id with the refund: it is this effect's
            assert r.effect_id == eid

    # the journal, opened again from its file: the effect's state, and every chain verifies
    journal = open_world_journal(tmp_path)
    try:
        row = journal.row(eid)
        assert row is not None
        assert row.status is want.status, (row.status, summary)
        report = journal.verify()
        assert report.ok, str(report)
        assert report.entries >= 2
    finally:
        journal.close()
