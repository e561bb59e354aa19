"""Leases: whether one authorises a call, and why not, never quoting argument values; what the
store keeps when one is issued, and what it refuses to issue."""

from __future__ import annotations

import fnmatch
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interlock_temporal.core import leases
from interlock_temporal.core.leases import Demand, LeaseProblem, LeaseStore, check_lease
from interlock_temporal.core.models import Lease
from interlock_temporal.testing import throwaway_journal

from .properties import examples

NOW = 1_700_000_000.0

# distinctive values, so a problem that quotes any of them is caught
PRINCIPAL = "agent-7f3a9q"
ACTIVITY = "refund_order_zq9"
RESOURCE = "order/ord_secret_42"
AMOUNT = 987_654
VALUES = (PRINCIPAL, ACTIVITY, RESOURCE, str(AMOUNT), "987654", "9876.54")


def lease(**changes: object) -> Lease:
    fields: dict[str, object] = {
        "lease_id": "lease_abc",
        "principal": PRINCIPAL,
        "activities": ["refund_*", "lookup"],
        "max_amount_cents": 1_000_000,
        "resources": ["order/*"],
        "issued_at": NOW - 60,
        "expires_at": NOW + 3600,
        "revoked_at": None,
    }
    fields.update(changes)
    return Lease.model_validate(fields)


def demand(**changes: object) -> Demand:
    fields: dict[str, object] = {
        "principal": PRINCIPAL,
        "activity": ACTIVITY,
        "amount_cents": AMOUNT,
        "resource": RESOURCE,
    }
    fields.update(changes)
    return Demand(**fields)  # type: ignore[arg-type]


def problem_of(lease_: Lease | None, demand_: Demand, now: float = NOW) -> str | None:
    problem = check_lease(lease_, demand_, now)
    if problem is None:
        return None
    assert isinstance(problem, LeaseProblem)
    # an activity outside the lease names the activity and the lease's principal (no argument
    # values: what the code asked for, and the line that issues a lease for it)
    scope = problem.configuration == "outside_scope"
    named = (PRINCIPAL, ACTIVITY, demand_.activity) if scope else ()
    for value in VALUES:
        if value not in named:
            assert value not in problem.detail, (value, problem.detail)
    for field_value in (demand_.principal, demand_.activity, demand_.resource):
        if field_value and field_value not in named:
            assert field_value not in problem.detail
    if demand_.amount_cents is not None:
        assert str(demand_.amount_cents) not in problem.detail
    return problem.detail


def test_the_allowed_case() -> None:
    assert check_lease(lease(), demand(), NOW) is None
    # exactly at the cap, and unlimited leases
    assert check_lease(lease(max_amount_cents=AMOUNT), demand(), NOW) is None
    unlimited = lease(activities=None, max_amount_cents=None, resources=None, expires_at=None)
    assert check_lease(unlimited, demand(amount_cents=None, resource=None), NOW) is None
    assert check_lease(unlimited, demand(activity="anything.at.all"), NOW) is None


def test_no_lease() -> None:
    detail = problem_of(None, demand())
    assert detail is not None
    assert "no" in detail and "lease" in detail


def test_revoked() -> None:
    detail = problem_of(lease(revoked_at=NOW - 1), demand())
    assert detail is not None
    assert "revoked" in detail
    assert problem_of(lease(revoked_at=NOW), demand()) == detail
    # revocation wins over every other reason
    assert problem_of(lease(revoked_at=NOW - 1, expires_at=NOW - 1), demand()) == detail


def test_expired() -> None:
    detail = problem_of(lease(expires_at=NOW - 0.001), demand())
    assert detail is not None
    assert "expired" in detail
    assert problem_of(lease(expires_at=NOW), demand()) == detail  # the end is exclusive
    assert check_lease(lease(expires_at=NOW + 0.001), demand(), NOW) is None


def test_other_principal() -> None:
    detail = problem_of(lease(), demand(principal="agent-other-77"))
    assert detail is not None
    assert "principal" in detail
    assert problem_of(lease(), demand(principal=None)) == detail
    assert problem_of(lease(), demand(principal=PRINCIPAL.upper())) == detail


@pytest.mark.parametrize(
    ("patterns", "activity", "allowed"),
    [
        (["refund_*"], ACTIVITY, True),
        (["refund_*"], "refund_", True),
        (["refund_*"], "charge_card", False),
        (["refund_*"], "Refund_order", False),  # case matters
        (["refund_order_zq?"], ACTIVITY, True),
        (["refund_order_zq?"], "refund_order_zq10", False),
        (["refund_[a-m]*"], ACTIVITY, False),
        (["refund_[n-z]*"], ACTIVITY, True),
        (["lookup", "email.*"], "email.send", True),
        (["lookup", "email.*"], "emailsend", False),
        ([], ACTIVITY, False),
        (["*"], "anything", True),
    ],
)
def test_activity_scope_globs(patterns: list[str], activity: str, allowed: bool) -> None:
    detail = problem_of(lease(activities=patterns), demand(activity=activity))
    if allowed:
        assert detail is None
    else:
        assert detail is not None
        assert "activity" in detail


def test_amount_over_the_maximum() -> None:
    detail = problem_of(lease(max_amount_cents=AMOUNT - 1), demand())
    assert detail is not None
    assert "amount" in detail
    assert "maximum" in detail or "max" in detail


def test_amount_missing_when_the_lease_caps_it() -> None:
    detail = problem_of(lease(max_amount_cents=5000), demand(amount_cents=None))
    assert detail is not None
    assert "amount" in detail
    assert problem_of(lease(max_amount_cents=5000), demand(amount_cents=6000)) != detail
    # an uncapped lease does not need an amount
    assert check_lease(lease(max_amount_cents=None), demand(amount_cents=None), NOW) is None


@pytest.mark.parametrize(
    ("patterns", "resource", "allowed"),
    [
        (["order/*"], RESOURCE, True),
        (["order/*"], "customer/c-1", False),
        (["order/ord_public_*"], RESOURCE, False),
        (["customer/*", "order/ord_secret_*"], RESOURCE, True),
        (["order/*"], None, False),  # a scoped lease needs the call to name its resource
        ([], RESOURCE, False),
    ],
)
def test_resource_scope(patterns: list[str], resource: str | None, allowed: bool) -> None:
    detail = problem_of(lease(resources=patterns), demand(resource=resource))
    if allowed:
        assert detail is None
    else:
        assert detail is not None
        assert "resource" in detail


def test_each_problem_names_its_own_reason() -> None:
    details = {
        problem_of(None, demand()),
        problem_of(lease(revoked_at=NOW - 1), demand()),
        problem_of(lease(expires_at=NOW - 1), demand()),
        problem_of(lease(), demand(principal="someone-else")),
        problem_of(lease(activities=["charge"]), demand()),
        problem_of(lease(max_amount_cents=1), demand()),
        problem_of(lease(max_amount_cents=1), demand(amount_cents=None)),
        problem_of(lease(resources=["customer/*"]), demand()),
    }
    assert None not in details
    assert len(details) == 8


@pytest.mark.parametrize(
    ("lease_", "demand_", "detail", "code"),
    [
        (lease(revoked_at=NOW), demand(), "lease revoked", "lease"),
        (lease(expires_at=NOW), demand(), "lease expired", "lease"),
        (lease(), demand(principal="other"), "lease held by another principal", "lease"),
        (
            lease(),
            demand(amount_cents=None),
            "the lease caps the amount but the activity declares no amount",
            "lease",
        ),
        (lease(max_amount_cents=1), demand(), "amount over the lease's maximum", "lease"),
        (lease(resources=["a/*"]), demand(), "resource outside the lease's scope", "lease"),
        (
            lease(max_amount_cents=None, budget_cents=5),
            demand(amount_cents=None),
            "the lease has a budget but the activity declares no amount",
            "lease",
        ),
        (
            lease(budget_cents=AMOUNT * 2, reserved_cents=AMOUNT + 1),
            demand(),
            "the lease's budget does not cover this amount",
            "lease_budget",
        ),
    ],
)
def test_each_problem_is_worded_for_the_receipt(
    lease_: Lease | None, demand_: Demand, detail: str, code: str
) -> None:
    """The detail is the refusal's reason in the receipt and the error a person reads; the
    code is what callers match on (only a short budget is ``lease_budget``). Each of these is
    about the effect: it stays until a person reopens it (no ``configuration``)."""
    assert check_lease(lease_, demand_, NOW) == LeaseProblem(detail, code)


def test_an_activity_outside_the_lease_names_it_the_lease_and_what_the_lease_allows() -> None:
    """The caller's configuration (decided again at the next attempt): the message names the
    activity, the lease, what it allows and the command that issues one that does."""
    scoped = lease(activities=["refund", "refund_sync"], budget_cents=6_000)
    problem = check_lease(scoped, demand(activity="send_welcome_sms"), NOW)
    assert problem == LeaseProblem(
        "activity 'send_welcome_sms' is outside the scope of lease lease_abc: it allows "
        f"{PRINCIPAL} the activities 'refund', 'refund_sync' (at most 1000000 cents an effect; "
        "a budget of 6000 cents; resources 'order/*'). Run send_welcome_sms under a lease that "
        f"allows it (`interlock leases issue {PRINCIPAL} --activity send_welcome_sms`)",
        "lease",
        configuration="outside_scope",
    )
    bare = lease(activities=[], max_amount_cents=None, resources=None)
    problem = check_lease(bare, demand(), NOW)
    assert problem is not None and problem.configuration == "outside_scope"
    assert f"it allows {PRINCIPAL} the activities none. Run" in problem.detail
    assert str(AMOUNT) not in problem.detail and RESOURCE not in problem.detail


def test_a_lease_this_journal_does_not_hold_is_the_callers_configuration() -> None:
    assert check_lease(None, demand(), NOW) == LeaseProblem(
        "no live lease with that id", "lease", configuration="unknown_lease"
    )


def test_a_budget_counts_what_its_other_effects_hold_reserved() -> None:
    exactly = lease(budget_cents=AMOUNT * 2, reserved_cents=AMOUNT)
    assert check_lease(exactly, demand(), NOW) is None
    assert check_lease(lease(budget_cents=AMOUNT), demand(), NOW) is None  # nothing reserved
    over = check_lease(lease(budget_cents=AMOUNT - 1), demand(), NOW)
    assert over is not None and over.code == "lease_budget"


# -- issuing: what the store keeps, and what it refuses ------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LeaseStore]:
    journal = throwaway_journal(tmp_path)
    try:
        yield journal.leases
    finally:
        journal.close()


def test_an_issued_lease_reads_back_as_issued(store: LeaseStore) -> None:
    before = time.time()
    lease_id = store.issue(
        PRINCIPAL,
        activities=["refund_*"],
        max_amount_cents=5_000,
        budget_cents=20_000,
        resources=["order/*"],
        ttl=timedelta(hours=1),
    )
    found = store.get(lease_id)
    assert found is not None
    assert (found.lease_id, found.principal) == (lease_id, PRINCIPAL)
    assert (found.activities, found.resources) == (["refund_*"], ["order/*"])
    assert (found.max_amount_cents, found.budget_cents) == (5_000, 20_000)
    assert before <= found.issued_at <= time.time()
    assert found.expires_at == pytest.approx(found.issued_at + 3_600)
    assert found.revoked_at is None
    # what it authorises follows from what was kept
    assert check_lease(found, demand(amount_cents=5_000), found.issued_at + 3_599) is None
    assert check_lease(found, demand(amount_cents=5_000), found.issued_at + 3_600) is not None
    assert check_lease(found, demand(activity="charge_card"), found.issued_at) is not None
    assert check_lease(found, demand(resource="customer/c-1"), found.issued_at) is not None


def test_an_unscoped_lease_without_a_ttl_never_expires(store: LeaseStore) -> None:
    found = store.get(store.issue(PRINCIPAL))
    assert found is not None
    assert (found.activities, found.resources, found.expires_at) == (None, None, None)
    assert (found.max_amount_cents, found.budget_cents) == (None, None)
    assert check_lease(found, demand(amount_cents=None), found.issued_at + 10**9) is None


def test_issued_ids_are_named_leases_and_never_repeat(store: LeaseStore) -> None:
    ids = {store.issue(PRINCIPAL) for _ in range(5)}
    assert len(ids) == 5
    for lease_id in ids:
        assert re.fullmatch(r"lease_[0-9a-f]{24,}", lease_id), lease_id
    assert store.issue(PRINCIPAL, lease_id="lease_chosen") == "lease_chosen"


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1)])
def test_a_ttl_must_be_positive(store: LeaseStore, ttl: timedelta) -> None:
    with pytest.raises(ValueError, match=r"^ttl must be positive$"):
        store.issue(PRINCIPAL, ttl=ttl)
    assert store.list() == []


def test_a_short_ttl_is_kept(store: LeaseStore) -> None:
    found = store.get(store.issue(PRINCIPAL, ttl=timedelta(seconds=1)))
    assert found is not None and found.expires_at == pytest.approx(found.issued_at + 1)


def test_a_lease_needs_a_principal(store: LeaseStore) -> None:
    with pytest.raises(ValueError, match=r"^principal must be a non-empty string$"):
        store.issue("")
    assert store.list() == []


@pytest.mark.parametrize("field", ["max_amount_cents", "budget_cents"])
@pytest.mark.parametrize("value", [True, 12.5, "100"])
def test_amounts_are_whole_cents(store: LeaseStore, field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be a whole number of cents$"):
        store.issue(PRINCIPAL, **{field: value})  # type: ignore[arg-type]
    assert store.list() == []


@pytest.mark.parametrize("field", ["max_amount_cents", "budget_cents"])
def test_amounts_are_never_negative_but_may_be_zero(store: LeaseStore, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must not be negative$"):
        store.issue(PRINCIPAL, **{field: -1})  # type: ignore[arg-type]
    assert store.list() == []
    zero = store.get(store.issue(PRINCIPAL, **{field: 0}))  # type: ignore[arg-type]
    assert zero is not None and getattr(zero, field) == 0


# -- the gate's shortcuts answer as the general machinery does ------------------------------------

_glob_text = st.text(alphabet="ab*?[]!-\n/", max_size=6)


@pytest.mark.properties
@examples(2000)
@given(name=_glob_text, pattern=_glob_text)
def test_a_scope_pattern_matches_as_fnmatch_does(name: str, pattern: str) -> None:
    """``check_lease`` answers plain names and ``prefix*`` without a regular expression: for
    every pattern, what ``fnmatch.fnmatchcase`` answers."""
    assert leases._matches(name, pattern) is fnmatch.fnmatchcase(name, pattern)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"activities": None, "resources": None, "expires_at": None},
        {"budget_cents": 10**13, "reserved_cents": 2_000, "max_amount_cents": None},
        {"issued_at": 5, "expires_at": 7.25},  # an int read as a float
        {"revoked_at": float("inf")},  # not JSON data: the serializer's answer
        {"activities": [], "resources": ["caf\u00e9/*"]},
    ],
)
def test_a_lease_snapshot_is_its_json_dump(changes: dict[str, object]) -> None:
    """What every AUTHORIZED records of its lease is ``model_dump(mode="json")``, value for
    value and type for type (a root lease's, without its empty ``ancestors``: the snapshot it
    had before delegation), and a copy: the parsed lease is shared between dispatches."""
    held = lease(**changes)
    dumped = held.model_dump(mode="json", exclude={"ancestors"})
    snapshot = held.snapshot()
    assert json.dumps(snapshot, sort_keys=True) == json.dumps(dumped, sort_keys=True)
    for name in ("activities", "resources"):
        if isinstance(snapshot[name], list):
            snapshot[name].append("x")
    assert held.model_dump(mode="json", exclude={"ancestors"}) == dumped
