"""A lease may carry a cumulative budget: each effect reserves its approved
amount once, in the transaction that records its dispatch, and gets it back in the transaction
that records it ended without executing. Money is read from the payments service; SQLite and
PostgreSQL both."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal import open_journal, receipt
from interlock_temporal.core.errors import Ambiguous, Refused
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.review import record_resolution
from interlock_temporal.targets.payments import SimulatedPayments

from .refund_story import KEY, ORDER, Refund, Store, journal, payments, store

__all__ = ["journal", "payments", "store"]


def budget_lease(journal: Journal, cents: int) -> str:
    return journal.leases.issue(
        "refund-bot", activities=["refund"], max_amount_cents=5_000, budget_cents=cents
    )


def reserved(journal: Journal, lease: str) -> int | None:
    found = journal.leases.get(lease)
    assert found is not None
    return found.reserved_cents


async def test_two_refunds_under_a_budget_for_one_and_a_half(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = budget_lease(journal, 3_000)
    first = Refund(journal, payments, case_id="c-1", lease=lease)
    second = Refund(journal, payments, case_id="c-2", lease=lease)
    await first.run()
    with pytest.raises(Refused) as refused:
        await second.run()
    assert refused.value.code == "lease_budget"
    assert refused.value.receipt.executed is False
    assert payments.refunded_cents(ORDER) == 2_000
    assert len(payments.refund_records(ORDER)) == 1
    assert reserved(journal, lease) == 2_000
    shown = receipt(first.effect_id, journal=journal)
    assert (shown.lease_budget_cents, shown.lease_charged_cents) == (3_000, 2_000)


async def test_a_resend_is_not_charged_twice(journal: Journal, payments: SimulatedPayments) -> None:
    lease = budget_lease(journal, 3_000)
    refund = Refund(journal, payments, lease=lease)
    await refund.dies_before_send()
    assert reserved(journal, lease) == 2_000
    await refund.run()  # recovery: asks, finds nothing, resends the same effect
    assert receipt(refund.effect_id, journal=journal).via == "recovery-reapply"
    assert reserved(journal, lease) == 2_000
    # a third refund of $10 still fits: the resend took nothing more
    await Refund(journal, payments, 1_000, case_id="c-3", lease=lease).run()
    assert payments.refunded_cents(ORDER) == 3_000


async def test_an_effect_refused_after_its_dispatch_gives_its_reservation_back(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = budget_lease(journal, 3_000)
    refund = Refund(journal, payments, lease=lease)
    await refund.dies_before_send()
    payments.set_eligible(ORDER, False)  # the world moves during the outage
    with pytest.raises(Refused) as refused:
        await refund.run()
    assert refused.value.code == "stale_premise_at_recovery"
    assert reserved(journal, lease) == 0
    assert receipt(refund.effect_id, journal=journal).lease_charged_cents == 0
    payments.set_eligible(ORDER, True)
    await Refund(journal, payments, 3_000, case_id="c-4", lease=lease).run()
    assert payments.refunded_cents(ORDER) == 3_000


async def test_not_happened_keeps_the_reservation_for_the_resend(
    journal: Journal, tmp_path: Path
) -> None:
    tier3 = SimulatedPayments(tmp_path / "tier3.db", tier=3)
    tier3.open_order(ORDER, 10_000)
    lease = budget_lease(journal, 3_000)
    refund = Refund(journal, tier3, lease=lease)
    await refund.dies_before_send()
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(refund.call(last=True), tier3)
    record_resolution(
        journal, refund.effect_id, kind="ambiguous", decision="not_happened", operators=["carol"]
    )
    assert reserved(journal, lease) == 2_000
    await refund.run()
    assert reserved(journal, lease) == 2_000
    assert tier3.refunded_cents(ORDER) == 2_000


async def test_a_late_commit_after_the_reservation_was_given_back_is_charged_again(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = budget_lease(journal, 3_000)
    refund = Refund(journal, payments, lease=lease)
    ticket = await Gate(journal).begin(refund.call(), payments)
    assert isinstance(ticket, Ticket)
    ticket.release()  # the attempt looks dead; its send is still on its way
    payments.set_eligible(ORDER, False)
    with pytest.raises(Refused):
        await refund.run()
    assert reserved(journal, lease) == 0
    payments.set_eligible(ORDER, True)
    result = await refund.send(ticket)  # the zombie's send lands after all
    done = await Gate(journal).commit(ticket, result)
    assert done.after is Kind.REFUSED
    assert reserved(journal, lease) == 2_000
    late = receipt(refund.effect_id, journal=journal)
    assert late.final == "COMMITTED" and late.lease_charged_cents == 2_000
    assert journal.read(refund.effect_id)[-1].data["alarm"] == "executed_after_refused"


async def test_each_dispatch_records_its_reservation_and_what_the_lease_then_holds(
    journal: Journal, payments: SimulatedPayments
) -> None:
    """The signed DISPATCHED entry says what it reserved and what the lease held reserved with
    it, so an auditor can follow a budget entry by entry."""
    lease = budget_lease(journal, 5_000)
    first = Refund(journal, payments, case_id="c-1", lease=lease)
    await first.run()
    second = Refund(journal, payments, 1_000, case_id="c-2", lease=lease)
    await second.run()

    def reservation(effect_id: str) -> Any:
        (note,) = [e.data["budget"] for e in journal.read(effect_id) if e.kind is Kind.DISPATCHED]
        return note

    held = {"lease_id": lease, "budget_cents": 5_000}
    assert reservation(first.effect_id) == {**held, "cents": 2_000, "reserved_cents": 2_000}
    assert reservation(second.effect_id) == {**held, "cents": 1_000, "reserved_cents": 3_000}
    assert reserved(journal, lease) == 3_000


async def test_a_budget_needs_the_activity_to_declare_its_amount(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = budget_lease(journal, 3_000)
    refund = Refund(journal, payments, lease=lease)
    call = refund.call()
    unmeasured = type(call)(**{**call.__dict__, "measure": None})
    with pytest.raises(Refused) as refused:
        await Gate(journal).begin(unmeasured, payments)
    assert refused.value.code == "lease"
    assert "declares no amount" in refused.value.reason
    assert payments.calls(ORDER) == 0


# -- concurrency: 16 attempts at once, across two processes -------------------------------------

ATTEMPTS = 16
BUDGET = 10_000
AMOUNT = 2_000


def _contend(
    url: str,
    payments_path: str,
    leases: dict[str, str],
    barrier: Any,
    outcomes: Any,
    amount: int,
) -> None:
    """One process: each case's first attempt of ``amount`` (``leases``: each case's lease)
    on its own thread and its own journal connection (as separate activities of a worker),
    held at the barrier after capturing its facts, so that all 16 reach their dispatch
    transactions together."""

    class AtTheBarrier(SimulatedPayments):
        def capture(self, args: Any, effect_id: str) -> Any:
            facts = super().capture(args, effect_id)
            barrier.wait(timeout=60)
            return facts

    def attempt(case: str) -> None:
        service = AtTheBarrier(payments_path, tier=2)
        with open_journal(url, signing_key=KEY) as journal:
            refund = Refund(journal, service, amount, case_id=case, lease=leases[case])
            try:
                asyncio.run(refund.run())
                outcomes.put((case, "committed"))
            except Refused as err:
                outcomes.put((case, err.code))
            except BaseException as err:  # reported, so the test shows it
                outcomes.put((case, f"error {type(err).__name__}: {err}"))

    threads = [threading.Thread(target=attempt, args=(c,)) for c in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def contend_in_two_processes(
    store: Store, payments: SimulatedPayments, under: dict[str, str], amount: int
) -> dict[str, str]:
    """Each case of ``under`` (case -> the lease it acts under) refunded ``amount`` at once,
    alternately from two spawned processes (``_contend``); each case's outcome."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(under))
    outcomes = context.Queue()
    cases = list(under)
    processes = [
        context.Process(
            target=_contend,
            args=(
                store.url,
                str(payments.path),
                {c: under[c] for c in cases[i::2]},
                barrier,
                outcomes,
                amount,
            ),
        )
        for i in range(2)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
        assert p.exitcode == 0
    return dict(outcomes.get(timeout=5) for _ in range(len(under)))


def test_sixteen_attempts_at_once_across_two_processes_never_exceed_the_budget(
    store: Store, journal: Journal, payments: SimulatedPayments
) -> None:
    lease = budget_lease(journal, BUDGET)
    seen = contend_in_two_processes(
        store, payments, {f"c-{n}": lease for n in range(ATTEMPTS)}, AMOUNT
    )
    fitting = BUDGET // AMOUNT
    assert sorted(seen.values()) == ["committed"] * fitting + ["lease_budget"] * (
        ATTEMPTS - fitting
    ), seen
    assert payments.refunded_cents(ORDER) == BUDGET
    assert len(payments.refund_records(ORDER)) == fitting
    assert reserved(journal, lease) == BUDGET
    assert journal.verify().ok


@pytest.mark.server
async def test_on_a_real_server_the_second_refund_over_the_budget_is_refused(
    client: Any, tmp_path: Path
) -> None:
    from workers.server_world import ServerWorld

    world = await ServerWorld.create(client, tmp_path, 2, "gated")
    try:
        world.setup()
        world.lease_id = budget_lease(world.journal, 3_000)
        first = await world.result(await world.start(world.case()))
        second = await world.result(
            await world.start(world.case().model_copy(update={"case_id": f"{world.case_id}-b"}))
        )
        assert first.status == "REFUNDED"
        assert second.status == "REFUSED" and second.receipt is not None
        assert second.receipt.code == "lease_budget"
        assert world.payments.refunded_cents(world.order_id) == 2_000
        assert len(world.payments.refund_records(world.order_id)) == 1
    finally:
        await world.close()
