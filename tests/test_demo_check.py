"""The check ``make demo`` holds each story to (``workers/demo_check.py``) can fail: against a
real payments store (the simulated service's SQLite file, the Stripe fake through the real SDK)
and a real journal, a refund missing, a second one, a wrong amount, another ending or no kill
each fail the story, naming it and what was expected against what was found. No Temporal
server: the gated stories run in process against the core protocol (``InProcessWorld``), the
same ``crash_before_ack`` row the demo runs on a server. ``make faults`` runs the demo itself.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.targets.payments import RefundRecord, SimulatedPayments
from interlock_temporal.testing import StripeMock, StripeProxy
from workers import demo
from workers.demo_check import (
    EXPECTED,
    Found,
    check,
    observe,
    observe_world,
    run_demo,
    verdict,
)
from workers.inprocess_world import InProcessWorld
from workers.scenarios import run_in
from workers.stripe_harness import stripe_inprocess_world
from workers.world import ORDER, PAID_CENTS, World, open_world_journal, the_effect_id


def test_every_story_of_the_demo_has_its_money_written_down() -> None:
    stories = [name for name, *_ in demo.ACTS] + [name for name, *_ in demo.STRIPE_ACTS]
    assert sorted(EXPECTED) == sorted(stories)
    # what the README promises: naive $40, gated $20
    assert [EXPECTED[s].refunds * EXPECTED[s].each_cents for s in stories] == [
        4_000,
        2_000,
        2_000,
        4_000,
        2_000,
    ]


async def _gated_story(tmp_path: Path, tier: int, edit: Any) -> list[list[str]]:
    """Row 3 (the refund lands, the attempt dies before the result) at ``tier`` in process;
    before the world closes, check the story as the demo does, then ``edit`` the payments
    store and check again."""
    checks: list[list[str]] = []

    def read(world: World, result: dict[str, Any]) -> None:
        def found() -> Found:
            return observe_world(world, result)

        story = f"gated-t{tier}"
        checks.append(check(story, found()))
        edit(world)
        checks.append(check(story, found()))

    await run_in(InProcessWorld(tmp_path, tier), "crash_before_ack", before_close=read)
    return checks


async def test_a_second_refund_fails_the_tier_2_story(tmp_path: Path) -> None:
    def support_refunds_again(world: World) -> None:
        world.payments.manual_refund(world.order_id, 2_000)

    shown, after = await _gated_story(tmp_path, 2, support_refunds_again)
    assert shown == []  # the story as it happened shows what it must
    assert after == [
        "gated-t2: expected 1 refund of $20 ($20) on order 881; the payments service holds "
        "2 refunds ($20 + $20 = $40)"
    ]


async def test_a_missing_refund_fails_the_tier_2_story(tmp_path: Path) -> None:
    def refund_lost(world: World) -> None:
        with sqlite3.connect(tmp_path / "payments.db") as db:
            db.execute("DELETE FROM refunds")

    shown, after = await _gated_story(tmp_path, 2, refund_lost)
    assert shown == []
    assert after == [
        "gated-t2: expected 1 refund of $20 ($20) on order 881; the payments service holds "
        "no refund"
    ]


async def test_a_refund_the_gate_did_not_send_fails_the_tier_2_story(tmp_path: Path) -> None:
    """One $20 refund, but not the effect's: the receipt confirms another refund."""

    def replaced_by_hand(world: World) -> None:
        with sqlite3.connect(tmp_path / "payments.db") as db:
            db.execute("DELETE FROM refunds")
        world.payments.manual_refund(world.order_id, 2_000)

    shown, after = await _gated_story(tmp_path, 2, replaced_by_hand)
    assert shown == []
    assert len(after) == 2
    assert after[0].startswith("gated-t2: expected the refund that landed (re_manual_")
    assert after[0].endswith(f"to carry the effect id {the_effect_id()}; it carries none")
    assert after[1].startswith(
        "gated-t2: expected the receipt to confirm the refund that landed (re_manual_"
    )


async def test_the_tier_3_story_and_another_ending(tmp_path: Path) -> None:
    """Tier 3 ends AMBIGUOUS with the $20 landed; held to the tier-2 story's ending (COMMITTED
    via recovery-query, the workflow REFUNDED), the same world fails it."""
    found: list[Found] = []

    def read(world: World, result: dict[str, Any]) -> None:
        found.append(observe_world(world, result))

    await run_in(InProcessWorld(tmp_path, 3), "crash_before_ack", before_close=read)
    assert check("gated-t3", found[0]) == []
    problems = check("gated-t2", found[0])
    assert problems[:2] == [
        "gated-t2: expected the workflow to end REFUNDED; it ended AMBIGUOUS",
        "gated-t2: expected the journal to record COMMITTED via recovery-query; "
        "it records AMBIGUOUS",
    ]
    # a tier-3 service keeps no effect id, and the receipt of an ambiguity confirms nothing
    assert problems[2].endswith(f"to carry the effect id {the_effect_id()}; it carries none")
    assert problems[3].endswith("it confirms nothing")
    assert len(problems) == 4
    # and the naive story's money and ending are not the gate's
    assert check("naive", found[0]) == [
        "naive: expected 2 refunds of $20 ($40) on order 881; the payments service holds "
        "1 refund ($20)",
        "naive: expected the workflow to end REFUNDED; it ended AMBIGUOUS",
        "naive: expected the journal to hold no record of the effect (no gate); "
        "it records AMBIGUOUS",
    ]


def _naive_store(tmp_path: Path, *amounts: int) -> Found:
    """The naive story's world: the simulated service's file with the refunds sent without a
    key, and a journal that never saw the effect (no gate ran)."""
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    journal = open_world_journal(tmp_path)
    try:
        payments.open_order(ORDER, PAID_CENTS)
        for cents in amounts:
            payments.refund_sync(ORDER, cents)
        return observe(
            payments,
            journal,
            order_id=ORDER,
            effect_id=the_effect_id(),
            ended="REFUNDED",
            kills=1,
        )
    finally:
        journal.close()
        payments.close()


def test_the_naive_story_must_hold_two_refunds(tmp_path: Path) -> None:
    assert check("naive", _naive_store(tmp_path / "two", 2_000, 2_000)) == []
    assert check("naive", _naive_store(tmp_path / "one", 2_000)) == [
        "naive: expected 2 refunds of $20 ($40) on order 881; the payments service holds "
        "1 refund ($20)"
    ]
    assert check("naive", _naive_store(tmp_path / "other", 2_000, 3_000)) == [
        "naive: expected 2 refunds of $20 ($40) on order 881; the payments service holds "
        "2 refunds ($20 + $30 = $50)"
    ]
    # the gated stories never hold two: the naive money fails them
    assert check("gated-t2", _naive_store(tmp_path / "gated", 2_000, 2_000)) == [
        "gated-t2: expected 1 refund of $20 ($20) on order 881; the payments service holds "
        "2 refunds ($20 + $20 = $40)",
        "gated-t2: expected the journal to record COMMITTED via recovery-query; "
        "it holds no record of the effect",
    ]


def test_a_story_without_a_kill_fails() -> None:
    refund = RefundRecord(
        refund_id="re_1",
        order_id=ORDER,
        amount_cents=2_000,
        source="api",
        effect_id=None,
        created_at=0.0,
    )
    found = Found(ORDER, (refund, refund), "REFUNDED", None, None, None, the_effect_id(), 0)
    assert check("naive", found) == ["naive: expected the worker to be SIGKILLed; no worker died"]


async def test_two_refunds_at_the_stripe_fake_fail_the_stripe_story(tmp_path: Path) -> None:
    """The money read back from the Stripe fake through the real SDK, as the demo's
    ``--stripe`` stories read it: a second refund on the charge fails the gated story."""
    mock = await StripeMock().start()
    proxy = await StripeProxy(mock.port).start()
    checks: list[list[str]] = []

    def read(world: World, result: dict[str, Any]) -> None:
        def found() -> Found:
            return observe_world(world, result)

        checks.append(check("stripe-gated", found()))
        world.payments.manual_refund(world.order_id, 2_000)  # by hand, in the dashboard
        checks.append(check("stripe-gated", found()))

    try:
        world = stripe_inprocess_world(tmp_path, mock, proxy)
        await run_in(world, "crash_before_ack", before_close=read)
    finally:
        await proxy.stop()
        await mock.stop()
    shown, after = checks
    assert shown == []
    assert len(after) == 1
    assert after[0].startswith("stripe-gated: expected 1 refund of $20 ($20) on order ch_")
    assert after[0].endswith("the payments service holds 2 refunds ($20 + $20 = $40)")


def test_the_demo_exits_1_naming_the_stories_that_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    problem = (
        "gated-t2: expected 1 refund of $20 ($20) on order 881; the payments service holds "
        "no refund"
    )
    assert verdict([("naive", []), ("gated-t2", [problem]), ("gated-t3", [])]) == 1
    out, err = capsys.readouterr()
    assert f"  FAILED {problem}\n" in out
    assert "  ok     naive: 2 refunds of $20 ($40) landed, workflow REFUNDED" in out
    assert err == "demo FAILED: 1 of 3 stories did not show what they must (gated-t2)\n"
    assert verdict([("naive", []), ("gated-t3", [])]) == 0


def test_make_faults_fails_on_a_demo_that_exits_non_zero() -> None:
    """``make faults`` runs the demo as ``make demo`` does and fails on its exit code: here
    one that refuses its arguments (no server is started)."""
    run = run_demo(["--stripe", "--stripe-live"])
    assert run.returncode == 2
    assert not run.ok
    assert run.command == "python -m workers.demo --stripe --stripe-live"
