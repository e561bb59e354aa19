"""The sweep and the exhaustive check run (small here; `make faults` runs them whole), and
both catch a planted bug: a gate that forgets to ask a queryable target before resending."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from interlock_temporal.core.journal.sql import SqlJournal
from interlock_temporal.core.targets import capabilities
from workers import model_check, sweep, sweep_case

from . import planted_bugs

#: the real code's exhaustive checks: make faults explores every scope whole, and runs these
#: too (pytest -m faults); make test keeps the planted bugs, which must each be caught
FAULTS = pytest.mark.faults


@pytest.fixture
def gate_that_never_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    def forgetful(target: Any) -> Any:
        return dataclasses.replace(capabilities(target), queryable=False)

    planted_bugs.in_the_gate(monkeypatch, "capabilities", forgetful)


async def test_the_sweep_holds_its_invariants() -> None:
    total, failed = await sweep.sweep(150, 1)
    assert total == 150
    assert failed == [], [(s.case, s.problems) for s in failed]


async def test_the_sweep_catches_a_gate_that_never_asks(gate_that_never_asks: None) -> None:
    _, failed = await sweep.sweep(150, 1)
    assert failed, "a planted bug went unnoticed"
    assert any("landed" in p or "AMBIGUOUS at tier" in p for s in failed for p in s.problems)
    assert sweep.replay_command(failed[0].case.seed).startswith("python -m workers.sweep")


@FAULTS
def test_the_exhaustive_check_finds_no_violation() -> None:
    result = model_check.explore(3, "last", ("revoke_lease",))
    assert result.states > 300 and result.terminal > 100
    assert result.violations == []
    assert {"COMMITTED", "AMBIGUOUS", "REFUSED"} <= set(result.finals)


@pytest.fixture
def gate_that_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    def hasty(target: Any) -> Any:
        return dataclasses.replace(capabilities(target), settle_time=timedelta(0))

    planted_bugs.in_the_gate(monkeypatch, "capabilities", hasty)


@FAULTS
def test_the_exhaustive_check_holds_while_a_request_may_still_land() -> None:
    result = model_check.explore(2, "settling")
    assert result.violations == []
    assert result.states > 100


def test_the_exhaustive_check_catches_a_gate_that_never_waits_for_the_target_to_settle(
    gate_that_never_waits: None,
) -> None:
    result = model_check.explore(2, "settling", (), stop_at_first=True)
    assert result.violations, "a planted bug went unnoticed"
    assert any("landed 2 times" in p for _, found in result.violations for p in found)


def test_the_exhaustive_check_catches_a_gate_that_never_asks(gate_that_never_asks: None) -> None:
    result = model_check.explore(2, "retry", (), stop_at_first=True)
    assert result.violations, "a planted bug went unnoticed"


@FAULTS
def test_the_exhaustive_check_catches_an_outcome_recorded_without_checking_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An outcome folded into the view its attempt read, with the chain it was appended to left
    unchecked: an edit made while the attempt stood before its recovery transaction goes
    unnoticed, and the attempt opens a review on an edited journal."""
    monkeypatch.setattr(SqlJournal, "check", lambda self, effect_id: None)
    result = model_check.explore(3, "retry", ("tamper",), stop_at_first=True)
    assert result.violations, "a planted bug went unnoticed"
    found = [p for _, problems in result.violations for p in problems]
    assert any("recorded on an edited journal" in p for p in found), found


# -- every planted bug is caught by the sweep --------------------------------------------------

OUTSIDER_BUG = "a decision recorded without the worker's rules"


def seeds_showing(bug: planted_bugs.Bug, limit: int) -> list[int]:
    """Seeds among the sweep's first 2,000 whose cases can show ``bug``."""
    seeds = [s for s in range(1, 2001) if bug.shows_in(sweep_case.Case.draw(s))]
    assert seeds, f"the 2,000-case sweep draws no case that can show {bug.name}"
    return seeds[:limit]


#: what the judge must say of a planted bug, in the sweep and in the model check, where the
#: bug's own step could be caught for another reason than the harm it does
SHOWN = {
    # the wrongful not_happened: in the sweep the woken owner's attempt finds the order's facts
    # changed (its refunded_cents counts the refund that landed) and refuses, so the journal
    # denies money the service paid; the model's target counts no sends in its facts, and the
    # woken owner sends again
    OUTSIDER_BUG: ("REFUSED, but the refund landed", "the effect landed 2 times"),
    # a revoked lease whose row was put back as it was: sent under it
    "an unsigned lease read": ("the service was called after the journal was edited", ""),
}


@pytest.mark.parametrize("bug", planted_bugs.BUGS, ids=lambda b: b.name.replace(" ", "-"))
async def test_the_sweep_catches_the_planted_bug(bug: planted_bugs.Bug, tmp_path: Any) -> None:
    caught: list[sweep_case.Story] = []
    for seed in seeds_showing(bug, 12):
        workdir = tmp_path / str(seed)
        workdir.mkdir()
        with planted_bugs.planted(bug):
            story = await sweep.run_case(sweep_case.Case.draw(seed), workdir)
        if story.problems:
            caught.append(story)
            break
    assert caught, f"the sweep did not catch {bug.name}"
    if bug.name in SHOWN:
        assert SHOWN[bug.name][0] in caught[0].problems, caught[0].problems


async def test_an_outsiders_decision_is_refused_and_the_owner_waits_again(tmp_path: Any) -> None:
    """The sweep's cases that hold the outsider's step run it on the real code: its votes (the
    agent's own principal, an operator off the worker's list) reach no decision under the
    worker's rules, nothing is recorded, and the owner, woken, finds the effect still
    AMBIGUOUS and sends nothing. (Were the step skipped, the planted bug could not be
    caught; were the decision recorded, the story would say so.)"""
    bug = planted_bugs.bug_named(OUTSIDER_BUG)
    seeds = seeds_showing(bug, 3)
    for seed in seeds:
        case = sweep_case.Case.draw(seed)
        workdir = tmp_path / str(seed)
        workdir.mkdir()
        story = await sweep.run_case(case, workdir)
        refused = "refused: no decision under the worker's rules"
        assert f"an outsider decides not_happened ({case.outsider}): {refused}" in story.lines
        assert "the owner, woken: ambiguous" in story.lines
        assert story.problems == [], story.problems
    held = [s for s in range(1, 2001) if sweep_case.Case.draw(s).outsider is not None]
    assert 0 < len(held) < 1000  # some of the 2,000 cases, not all


#: planted bugs the model check needs more than three seconds to reach (make faults runs them;
#: make test keeps the others, and the sweep's catch of every one)
SLOW_TO_REACH = frozenset(
    {
        "a journal read not verified",
        "the lease ignored at recovery",
        "the dedupe margin ignored",
        "the claim skipped",
        "a decision recorded without the worker's rules",
        "a duplicate submitter sends",
        "premises never re-validated",
    }
)


@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(b, marks=FAULTS) if b.name in SLOW_TO_REACH else b
        for b in planted_bugs.BUGS
        if b.model is not None  # the others' harm is outside the model's world: the sweep's
    ],
    ids=lambda b: b.name.replace(" ", "-"),
)
def test_the_model_check_catches_the_planted_bug(bug: planted_bugs.Bug) -> None:
    assert bug.model is not None
    tier, variant, events = bug.model
    assert set(events) <= set(model_check.scope(tier, variant))  # make faults explores it
    assert variant in model_check.VARIANTS
    with planted_bugs.planted(bug):
        result = model_check.explore(tier, variant, events, stop_at_first=True)
    assert result.violations, f"the model check did not catch {bug.name}"
    if bug.name in SHOWN:
        found = [p for _, problems in result.violations for p in problems]
        assert SHOWN[bug.name][1] in found, found


@FAULTS
def test_the_model_check_of_a_planted_scope_holds_on_the_real_code() -> None:
    assert planted_bugs.BUGS[0].model is not None
    tier, variant, events = planted_bugs.BUGS[0].model
    result = model_check.explore(tier, variant, events)
    assert result.violations == [] and result.states > 100
