"""The baselines are judged: every row, tier and baseline has its outcome written down (the harm
it must show, or clean by nature), and the judge `make faults` uses fails a baseline that
comes out otherwise. Here the judge is fed outcomes directly; `make faults` feeds it the
payments service after each real run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.targets.payments import RefundRejected, SimulatedPayments
from workers.faults import baseline_unfinished, failed_cells, markdown
from workers.judge import Baseline, Scenario, judge_baseline
from workers.scenarios import BASELINES, RETRYING, SCENARIOS
from workers.world import ORDER, PAID_CENTS, REFUND_CENTS, WorkflowStillRunning

TIERS = (1, 2, 3)
BY_NUMBER = {s.number: s for s in SCENARIOS.values()}

#: the cells clean by nature, written out again here (independent of Scenario.baselines):
#: rows 1 and 2 (no fault, or a death before anything was sent); the activity-id key at tier 1
#: in rows 3 and 11 (the retry, or the second attempt, carries the key the service dedupes);
#: row 7 (the simulated service refuses a refund on an ineligible order itself)
CLEAN_BY_NATURE = {(n, b, t) for n in (1, 2, 7) for b in BASELINES for t in TIERS} | {
    (3, "activity_key", 1),
    (11, "activity_key", 1),
}

CELLS = [
    (s, b, t, s.baselines[b][t])
    for s in sorted(SCENARIOS.values(), key=lambda s: s.number)
    for b in sorted(s.baselines)
    for t in sorted(s.baselines[b])
]
HARMFUL = [c for c in CELLS if c[3].harm]
CLEAN = [c for c in CELLS if not c[3].harm]


def cell_id(cell: tuple[Scenario, str, int, Baseline]) -> str:
    s, b, t, _ = cell
    return f"row{s.number}-{b}-t{t}"


def outcome(
    s: Scenario, mode: str, tier: int, cents: int, records: int, ended: str = "REFUNDED"
) -> dict[str, Any]:
    """A baseline cell's result as ``judge`` builds it from the payments service."""
    return {
        "scenario": s.name,
        "number": s.number,
        "tier": tier,
        "mode": mode,
        "final": ended,
        "ended": ended,
        "refunded_cents": cents,
        "refund_records": records,
        "calls": max(records, 1),
        "kills": 1 if s.crash else 0,
    }


def test_every_row_tier_and_baseline_has_its_outcome_written_down() -> None:
    for s in SCENARIOS.values():
        if s.number <= 12:
            assert set(s.baselines) == set(BASELINES), s.name
            for b in BASELINES:
                assert set(s.baselines[b]) == set(TIERS), (s.name, b)
        else:
            # rows 13 and 14 need a review, which only the gate opens
            assert s.baselines == {}, s.name
    assert {(s.number, b, t) for s, b, t, e in CLEAN} == CLEAN_BY_NATURE
    for s, b, t, e in CELLS:
        assert e.why, (s.name, b, t)
        more = e.refunded_cents > s.unharmed_cents or e.records > s.unharmed_records
        assert more == (e.harm is not None), f"{s.name} {b} t{t}: {e}"


def test_the_harms_written_down_are_the_faults_own() -> None:
    """Which harm each row's fault causes without a gate, from first principles."""
    harms = {
        s.number: {e.harm for e in (s.baselines[b][t] for b in BASELINES for t in TIERS)}
        for s in SCENARIOS.values()
        if s.baselines
    }
    assert harms[6] == harms[9] == {"refund under a revoked lease"}
    assert harms[8] == {"refund on stale facts"}
    assert harms[4] == harms[10] == harms[12] == {"double refund"}
    assert harms[3] == harms[11] == {"double refund", None}
    assert harms[5] == {
        "second refund after the re-decision",
        "double refund, then a second refund after the re-decision",
    }
    # the order's $100 caps what eight submissions can refund
    assert BY_NUMBER[12].baselines["naive"][1].refunded_cents == PAID_CENTS


@pytest.mark.parametrize("cell", HARMFUL, ids=cell_id)
def test_a_baseline_that_must_show_harm_and_comes_out_clean_fails(
    cell: tuple[Scenario, str, int, Baseline],
) -> None:
    s, b, t, e = cell
    clean = outcome(s, b, t, s.unharmed_cents, s.unharmed_records, e.ends)
    judged = judge_baseline(s, clean)
    assert judged["ok"] is False
    assert judged["verdict"] == "came out clean"
    assert any(f"the {e.harm} it must show did not happen" in p for p in judged["problems"])
    assert failed_cells([judged]) == [judged]


@pytest.mark.parametrize("cell", CLEAN, ids=cell_id)
def test_a_baseline_clean_by_nature_that_shows_harm_fails(
    cell: tuple[Scenario, str, int, Baseline],
) -> None:
    s, b, t, e = cell
    # one refund more than the unharmed run leaves: a double refund, or a refund that should
    # never have been sent
    harmed = outcome(s, b, t, s.unharmed_cents + REFUND_CENTS, s.unharmed_records + 1, e.ends)
    judged = judge_baseline(s, harmed)
    assert judged["ok"] is False
    assert judged["verdict"] == "showed harm, though clean by nature"
    assert any(p.startswith("clean by nature, but showed harm") for p in judged["problems"])


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_a_baseline_as_written_down_passes(cell: tuple[Scenario, str, int, Baseline]) -> None:
    s, b, t, e = cell
    judged = judge_baseline(s, outcome(s, b, t, e.refunded_cents, e.records, e.ends))
    assert judged["ok"] is True, judged["problems"]
    assert judged["verdict"] == ("harm shown as expected" if e.harm else "clean as expected")
    assert judged["expected"]["harm"] == e.harm


def test_harm_of_another_size_ending_or_run_fails() -> None:
    s = SCENARIOS["concurrent_submit"]
    # harm, but not the harm written down: eight refunds where the order's $100 allows five
    judged = judge_baseline(s, outcome(s, "naive", 2, 16_000, 8, RETRYING))
    assert judged["ok"] is False and judged["verdict"] == "not as written down"
    assert any("not the $100 in 5 refund record(s) written down" in p for p in judged["problems"])
    # every workflow ended: three of them must still be retrying a refusal
    judged = judge_baseline(s, outcome(s, "naive", 2, 10_000, 5, "REFUNDED"))
    assert judged["ok"] is False
    assert any(f"not {RETRYING}" in p for p in judged["problems"])
    # a crash row whose worker never died did not run its fault
    s = SCENARIOS["crash_before_ack"]
    judged = judge_baseline(s, {**outcome(s, "naive", 1, 4_000, 2), "kills": 0})
    assert judged["ok"] is False and "no worker died" in judged["problems"]
    # clean because nothing was sent is not clean by nature
    s = SCENARIOS["happy_path"]
    judged = judge_baseline(s, {**outcome(s, "naive", 1, 2_000, 1), "calls": 0})
    assert judged["ok"] is False
    assert "no refund request reached the service" in judged["problems"]


def test_a_baseline_with_nothing_written_down_fails_closed() -> None:
    s = SCENARIOS["ambiguous_resolved_happened"]
    judged = judge_baseline(s, outcome(s, "naive", 3, 2_000, 1))
    assert judged["ok"] is False
    assert judged["problems"] == ["no expected outcome is written down for naive at tier 3"]


@pytest.fixture
def refused_cell(tmp_path: Path) -> Path:
    """A baseline cell's payments file after row 7's send: the order made ineligible, the
    refund refused by the service itself."""
    service = SimulatedPayments(tmp_path / "payments.db", tier=2)
    try:
        service.open_order(ORDER, PAID_CENTS)
        service.set_eligible(ORDER, False)
        with pytest.raises(RefundRejected):
            service.refund_sync(ORDER, REFUND_CENTS)
    finally:
        service.close()
    return tmp_path


def test_an_unfinished_baseline_is_judged_on_the_money(refused_cell: Path) -> None:
    still = WorkflowStillRunning("the workflow had not ended after 30 s")
    judged = baseline_unfinished("stale_premise", 2, "naive", refused_cell, still, 0)
    assert judged["ok"] is True, judged["problems"]
    assert judged["verdict"] == "clean as expected"
    assert judged["ended"] == RETRYING and judged["calls"] == 1
    # the same money after the harness broke is a cell that did not run, not a clean one
    broken = baseline_unfinished("stale_premise", 2, "naive", refused_cell, TimeoutError(), 0)
    assert broken["ok"] is False
    assert broken["problems"][0].startswith("TimeoutError")
    # and a row that must show harm, found holding no refund, came out clean
    clean = baseline_unfinished("lease_revoked", 2, "naive", refused_cell, still, 0)
    assert clean["ok"] is False and clean["verdict"] == "came out clean"


def test_the_table_marks_a_failed_baseline_and_counts_baselines_apart() -> None:
    s = SCENARIOS["crash_before_ack"]
    gated = {
        "scenario": s.name,
        "number": s.number,
        "tier": 1,
        "target": "simulated",
        "ok": True,
        "final": "COMMITTED",
        "via": "recovery-query",
        "code": None,
        "refunded_cents": 2_000,
        "refund_records": 1,
    }
    harmed = {**judge_baseline(s, outcome(s, "naive", 1, 4_000, 2)), "target": "naive"}
    came_out_clean = {
        **judge_baseline(s, outcome(s, "activity_key", 2, 2_000, 1)),
        "target": "activity_key",
    }
    results = [gated, harmed, came_out_clean]
    assert failed_cells(results) == [came_out_clean]
    table = markdown(results, [1, 2], 1.0)
    assert "- with the gate: 1 cells judged against `scenarios.md`, 0 failed" in table
    assert (
        "- baselines: 2 cells judged for the harm each must or must not show, 1 failed "
        "(1 harm shown as expected, 0 clean as expected)"
    ) in table
    assert "REFUNDED, $40 (2 refunds): harm shown as expected" in table
    assert "REFUNDED, $20: **FAIL**, came out clean" in table
    # what each baseline must show is tabled from the code, with the reasons
    assert "| 3 | crash_before_ack | $20 | double refund, $40 in 2 |" in table
    assert "- row 3 (activity-id key t1): clean by nature:" in table
