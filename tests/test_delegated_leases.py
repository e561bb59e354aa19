"""Delegated leases: a lease issued from another only narrows it, checked at issue (an
over-grant is refused, naming the field) and again at dispatch along the chain (a revoked
ancestor ends it; a child's spend counts against every ancestor's budget in the dispatch
transaction). Money is read from the payments service; SQLite and PostgreSQL both."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from interlock_temporal import receipt
from interlock_temporal.cli._render import render_receipt
from interlock_temporal.core.errors import DelegationTooDeep, LeaseOverGrant, Refused, RowCorrupt
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.leases import MAX_DELEGATION_DEPTH, covers, delegated
from interlock_temporal.core.models import Kind, Lease
from interlock_temporal.core.protocol import Gate
from interlock_temporal.targets.payments import SimulatedPayments

from .refund_story import ORDER, Refund, Store, journal, payments, store
from .test_lease_budgets import contend_in_two_processes, reserved

__all__ = ["journal", "payments", "store"]

NOW = 1_000_000.0


def parent_lease(**changes: Any) -> Lease:
    fields: dict[str, Any] = {
        "lease_id": "lease_parent",
        "principal": "planner",
        "activities": ["refund", "order:*"],
        "max_amount_cents": 5_000,
        "budget_cents": 10_000,
        "resources": ["order:*"],
        "issued_at": NOW - 10,
        "expires_at": NOW + 3_600,
        **changes,
    }
    return Lease(**fields)


def asked(**changes: Any) -> Lease:
    return Lease(**{"lease_id": "lease_child", "principal": "sub-bot", "issued_at": NOW, **changes})


# -- at issue: the narrowing, a pure function ----------------------------------------------------


def test_a_child_that_names_nothing_has_its_parents_authority_and_ancestry() -> None:
    child = delegated(parent_lease(ancestors=["lease_root"]), asked(), NOW)
    assert child.ancestors == ["lease_parent", "lease_root"]
    assert child.parent == "lease_parent"
    assert child.chain() == ["lease_root", "lease_parent", "lease_child"]
    assert child.principal == "sub-bot"  # a sub-agent is another principal
    assert (child.activities, child.resources) == (["refund", "order:*"], ["order:*"])
    assert (child.max_amount_cents, child.budget_cents) == (5_000, 10_000)
    assert child.expires_at == NOW + 3_600


def test_a_narrower_child_keeps_what_it_asked() -> None:
    child = delegated(
        parent_lease(),
        asked(
            activities=["refund", "order:cancel", "order:x*"],
            resources=["order:9001"],
            max_amount_cents=1_000,
            budget_cents=3_000,
            expires_at=NOW + 60,
        ),
        NOW,
    )
    assert child.activities == ["refund", "order:cancel", "order:x*"]
    assert (child.max_amount_cents, child.budget_cents) == (1_000, 3_000)
    assert child.expires_at == NOW + 60


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"activities": ["refund*"]}, "activities"),  # wider than the plain name
        ({"activities": ["refund", "send_email"]}, "activities"),
        ({"activities": ["*"]}, "activities"),
        ({"resources": ["*"]}, "resources"),
        ({"resources": ["order:9001", "case:1"]}, "resources"),
        ({"max_amount_cents": 5_001}, "max_amount_cents"),
        ({"budget_cents": 10_001}, "budget_cents"),
        ({"expires_at": NOW + 3_601}, "ttl"),
    ],
)
def test_an_over_grant_is_refused_naming_the_field_never_the_value(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(LeaseOverGrant) as refused:
        delegated(parent_lease(), asked(**changes), NOW)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")
    for value in changes.values():
        assert str(value) not in str(refused.value)


def test_under_an_unlimited_parent_anything_is_narrower() -> None:
    root = Lease(lease_id="lease_root", principal="planner", issued_at=NOW - 1)
    child = delegated(root, asked(activities=["x*"], budget_cents=7, expires_at=NOW + 1), NOW)
    assert (child.activities, child.budget_cents, child.max_amount_cents) == (["x*"], 7, None)


@pytest.mark.parametrize(
    ("parent", "problem"),
    [
        (None, "no lease"),
        (parent_lease(revoked_at=NOW - 1), "revoked"),
        (parent_lease(expires_at=NOW), "expired"),
    ],
)
def test_only_a_live_parent_delegates(parent: Lease | None, problem: str) -> None:
    with pytest.raises(LeaseOverGrant, match=problem) as refused:
        delegated(parent, asked(), NOW)
    assert refused.value.field == "parent"


def test_the_depth_is_limited() -> None:
    deep = [f"lease_{n}" for n in range(MAX_DELEGATION_DEPTH - 1)]
    assert delegated(parent_lease(ancestors=deep), asked(), NOW).ancestors is not None
    with pytest.raises(DelegationTooDeep) as refused:
        delegated(parent_lease(ancestors=[*deep, "lease_x"]), asked(), NOW)
    assert refused.value.field == "parent"


@pytest.mark.parametrize(
    ("parent", "child", "covered"),
    [
        ("refund", "refund", True),
        ("refund*", "refund_partial", True),
        ("refund*", "refund_*", True),  # every name it matches starts with refund
        ("refund*", "refun*", False),
        ("refund", "refund*", False),
        ("ref?nd", "refund", True),
        ("ref?nd", "ref?nd", True),
        ("ref?nd", "ref[u]nd", False),  # narrower in truth; refused, conservatively
        ("*", "anything*", True),
    ],
)
def test_a_pattern_covers_only_what_it_surely_matches(
    parent: str, child: str, covered: bool
) -> None:
    assert covers(parent, child) is covered


# -- in the journal, at dispatch -----------------------------------------------------------------


def family(journal: Journal, parent_budget: int, child_budget: int) -> tuple[str, str, str]:
    """A parent lease for refunds with a budget, and two children issued from it."""
    parent = journal.leases.issue(
        "planner", activities=["refund"], max_amount_cents=5_000, budget_cents=parent_budget
    )
    first = journal.leases.issue("refund-bot", budget_cents=child_budget, parent=parent)
    second = journal.leases.issue("refund-bot", budget_cents=child_budget, parent=parent)
    return parent, first, second


async def test_an_over_grant_is_refused_at_issue_and_nothing_is_issued(journal: Journal) -> None:
    parent = journal.leases.issue("planner", activities=["refund"], budget_cents=3_000)
    with pytest.raises(LeaseOverGrant) as refused:
        journal.leases.issue("refund-bot", budget_cents=3_001, parent=parent)
    assert refused.value.field == "budget_cents"
    with pytest.raises(LeaseOverGrant, match="activities"):
        journal.leases.issue("refund-bot", activities=["refund", "wire"], parent=parent)
    with pytest.raises(LeaseOverGrant, match="parent"):
        journal.leases.issue("refund-bot", parent="lease_unknown")
    assert [lease.lease_id for lease in journal.leases.list()] == [parent]
    child = journal.leases.issue("refund-bot", budget_cents=1_000, parent=parent)
    issued = journal.read(f"lease:{child}")[0].data
    assert issued["event"] == "issued" and issued["lease"]["ancestors"] == [parent]


async def test_a_childs_refund_over_its_parents_remaining_budget_is_refused_at_dispatch(
    journal: Journal, payments: SimulatedPayments
) -> None:
    parent, first, second = family(journal, 5_000, 4_000)
    await Refund(journal, payments, 3_000, case_id="c-1", lease=first).run()
    with pytest.raises(Refused) as refused:
        await Refund(journal, payments, 3_000, case_id="c-2", lease=second).run()
    assert refused.value.code == "lease_budget"
    assert parent in refused.value.reason
    assert refused.value.receipt.executed is False
    assert payments.refunded_cents(ORDER) == 3_000  # the service holds one refund
    assert len(payments.refund_records(ORDER)) == 1
    assert (reserved(journal, parent), reserved(journal, second)) == (3_000, 0)
    # what the parent has left still fits
    fits = Refund(journal, payments, 2_000, case_id="c-3", lease=second)
    await fits.run()
    assert payments.refunded_cents(ORDER) == 5_000
    assert [reserved(journal, x) for x in (parent, first, second)] == [5_000, 3_000, 2_000]
    shown = receipt(fits.effect_id, journal=journal)
    assert shown.lease_chain == [parent, second]
    assert f"{second} (delegated: {parent} > {second})" in render_receipt(shown)
    (note,) = [e.data["budget"] for e in journal.read(fits.effect_id) if e.kind is Kind.DISPATCHED]
    assert note["ancestors"] == [
        {"lease_id": parent, "cents": 2_000, "budget_cents": 5_000, "reserved_cents": 5_000}
    ]
    assert journal.verify().ok


async def test_revoking_the_parent_stops_the_childs_next_dispatch(
    journal: Journal, payments: SimulatedPayments
) -> None:
    parent, child, _ = family(journal, 10_000, 5_000)
    await Refund(journal, payments, 1_000, case_id="c-1", lease=child).run()
    assert journal.leases.revoke(parent)
    calls = payments.calls(ORDER)
    with pytest.raises(Refused) as refused:
        await Refund(journal, payments, 1_000, case_id="c-2", lease=child).run()
    assert refused.value.code == "lease"
    assert f"ancestor lease {parent} revoked" in refused.value.reason
    assert payments.calls(ORDER) == calls and payments.refunded_cents(ORDER) == 1_000
    revoked = [e.data["event"] for e in journal.read(f"lease:{parent}")]
    assert revoked == ["issued", "revoked"]
    with pytest.raises(LeaseOverGrant, match="revoked"):
        journal.leases.issue("refund-bot", parent=parent)  # nor can it delegate any more


async def test_a_child_expires_with_its_parent(
    journal: Journal, payments: SimulatedPayments
) -> None:
    parent = journal.leases.issue("planner", activities=["refund"], ttl=timedelta(hours=1))
    child = journal.leases.issue("refund-bot", parent=parent)
    found = journal.leases.get(child)
    held = journal.leases.get(parent)
    assert found is not None and held is not None and found.expires_at == held.expires_at
    late = Refund(journal, payments, 1_000, lease=child)
    with pytest.raises(Refused, match="expired"):
        await Gate(journal, clock=lambda: time.time() + 7_200).run(late.call(), payments, late.send)
    assert payments.calls(ORDER) == 0


async def test_a_refusal_after_dispatch_gives_back_on_every_ancestor(
    journal: Journal, payments: SimulatedPayments
) -> None:
    root = journal.leases.issue("planner", activities=["refund"], budget_cents=9_000)
    middle = journal.leases.issue("planner", budget_cents=6_000, parent=root)
    leaf = journal.leases.issue("refund-bot", budget_cents=3_000, parent=middle)
    refund = Refund(journal, payments, 2_000, lease=leaf)
    await refund.dies_before_send()
    assert [reserved(journal, x) for x in (root, middle, leaf)] == [2_000, 2_000, 2_000]
    payments.set_eligible(ORDER, False)  # the world moves during the outage
    with pytest.raises(Refused):
        await refund.run()
    assert [reserved(journal, x) for x in (root, middle, leaf)] == [0, 0, 0]
    assert receipt(refund.effect_id, journal=journal).lease_chain == [root, middle, leaf]
    assert journal.verify().ok


async def test_an_edited_ancestor_budget_is_refused_at_dispatch_and_named_by_verify(
    journal: Journal, payments: SimulatedPayments, store: Store
) -> None:
    parent, child, _ = family(journal, 3_000, 3_000)
    await Refund(journal, payments, 2_000, case_id="c-1", lease=child).run()
    assert journal.verify().ok
    store.sql("UPDATE lease_spend SET reserved_cents = 0 WHERE lease_id = ?", parent)
    with pytest.raises(RowCorrupt, match=rf"lease_spend\[{parent}\]"):
        await Refund(journal, payments, 1_000, case_id="c-2", lease=child).run()
    assert payments.refunded_cents(ORDER) == 2_000
    problems = journal.verify().control.problems  # type: ignore[union-attr]
    assert any(p.startswith(f"lease_spend[{parent}]: reserved_cents is 0") for p in problems)


# -- concurrency: 16 attempts, two processes, a parent and two children --------------------------

ATTEMPTS = 16
PARENT_BUDGET = 7_000
CHILD_BUDGET = 5_000
AMOUNT = 1_000


def test_sixteen_attempts_under_two_children_never_exceed_the_parents_budget(
    store: Store, journal: Journal, payments: SimulatedPayments
) -> None:
    parent, first, second = family(journal, PARENT_BUDGET, CHILD_BUDGET)
    # each process runs attempts under both children
    under = {f"c-{n}": (first, second)[(n // 2) % 2] for n in range(ATTEMPTS)}
    seen = contend_in_two_processes(store, payments, under, AMOUNT)
    fitting = PARENT_BUDGET // AMOUNT
    assert sorted(seen.values()) == ["committed"] * fitting + ["lease_budget"] * (
        ATTEMPTS - fitting
    ), seen
    # the money as the payments service holds it
    assert payments.refunded_cents(ORDER) == PARENT_BUDGET
    assert len(payments.refund_records(ORDER)) == fitting
    assert reserved(journal, parent) == PARENT_BUDGET
    children = [reserved(journal, first), reserved(journal, second)]
    assert sum(c or 0 for c in children) == PARENT_BUDGET
    assert all(c is not None and c <= CHILD_BUDGET for c in children)
    assert journal.verify().ok
