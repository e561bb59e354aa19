"""check_lease: whether a lease authorises a call, and why not, never quoting argument values."""

from __future__ import annotations

import pytest

from interlock_temporal.core.leases import Demand, LeaseProblem, check_lease
from interlock_temporal.core.models import Lease

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
    for value in VALUES:
        assert value not in problem.detail, (value, problem.detail)
    for field_value in (demand_.principal, demand_.activity, demand_.resource):
        if field_value:
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
