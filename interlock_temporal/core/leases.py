"""Leases: the authority a principal holds. Issued and revoked by operators, checked by the gate
inside the same transaction that records a dispatch, so a revoke is either seen or too late."""

from __future__ import annotations

import fnmatch
import functools
import secrets
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta

from .models import Lease


@dataclass(frozen=True)
class Demand:
    """What a call needs from a lease."""

    principal: str | None
    activity: str
    amount_cents: int | None = None
    resource: str | None = None


#: the refusals about the caller's own configuration rather than the effect (see
#: ``LeaseProblem.configuration``): no ``act_as`` at all, ``act_as`` without a lease, a lease id
#: this journal does not hold, an activity the lease does not name. The next attempt decides
#: such a refusal again (``Kind.REOPENED``, naming it); every other refusal stays until a person
#: reopens it
CONFIGURATION = ("no_act_as", "no_lease", "unknown_lease", "outside_scope")


@dataclass(frozen=True)
class LeaseProblem:
    """Why a lease does not authorise a call. ``detail`` names no argument values; ``code`` is
    the refusal's code (``lease``, or ``lease_budget`` when only the budget is short).
    ``configuration``: set (one of ``CONFIGURATION``) when the problem is the caller's own
    configuration, not the effect: fixed in code or by issuing a lease, the next attempt
    decides it again."""

    detail: str
    code: str = "lease"
    configuration: str | None = None


def check_lease(lease: Lease | None, demand: Demand, now: float) -> LeaseProblem | None:
    """None when ``lease`` authorises ``demand`` at ``now``; otherwise what is wrong. A lease
    with a budget is read with what its other effects hold reserved (``reserved_cents``)."""
    if lease is None:
        return LeaseProblem("no live lease with that id", configuration="unknown_lease")
    if lease.revoked_at is not None and lease.revoked_at <= now:
        return LeaseProblem("lease revoked")
    if lease.expires_at is not None and lease.expires_at <= now:
        return LeaseProblem("lease expired")
    if demand.principal != lease.principal:
        return LeaseProblem("lease held by another principal")
    if lease.activities is not None and not any(
        _matches(demand.activity, pattern) for pattern in lease.activities
    ):
        return LeaseProblem(outside_scope(lease, demand.activity), configuration="outside_scope")
    if lease.max_amount_cents is not None:
        if demand.amount_cents is None:
            return LeaseProblem("the lease caps the amount but the activity declares no amount")
        if demand.amount_cents > lease.max_amount_cents:
            return LeaseProblem("amount over the lease's maximum")
    if lease.resources is not None and (
        demand.resource is None or not any(_matches(demand.resource, p) for p in lease.resources)
    ):
        return LeaseProblem("resource outside the lease's scope")
    if lease.budget_cents is not None:
        if demand.amount_cents is None:
            return LeaseProblem("the lease has a budget but the activity declares no amount")
        if (lease.reserved_cents or 0) + demand.amount_cents > lease.budget_cents:
            return LeaseProblem("the lease's budget does not cover this amount", "lease_budget")
    return None


def outside_scope(lease: Lease, activity: str) -> str:
    """Why ``activity`` is outside ``lease``: the activity, the lease and what it allows (its
    activities, and the limits it sets), and the way out. Names no argument value."""
    allowed = ", ".join(repr(a) for a in lease.activities or []) or "none"
    limits = []
    if lease.max_amount_cents is not None:
        limits.append(f"at most {lease.max_amount_cents} cents an effect")
    if lease.budget_cents is not None:
        limits.append(f"a budget of {lease.budget_cents} cents")
    if lease.resources is not None:
        limits.append("resources " + (", ".join(repr(r) for r in lease.resources) or "none"))
    also = f" ({'; '.join(limits)})" if limits else ""
    return (
        f"activity {activity!r} is outside the scope of lease {lease.lease_id}: it allows "
        f"{lease.principal} the activities {allowed}{also}. Run {activity} under a lease that "
        f"allows it (`interlock leases issue {lease.principal} --activity {activity}`)"
    )


_WILD = frozenset("*?[")


def _matches(name: str, pattern: str) -> bool:
    """``fnmatch.fnmatchcase(name, pattern)``, with its two common patterns answered without a
    regular expression: a plain name, and a plain prefix then ``*`` (``order:*``)."""
    if _WILD.isdisjoint(pattern):
        return name == pattern
    if pattern[-1] == "*" and _WILD.isdisjoint(pattern[:-1]):
        return name.startswith(pattern[:-1])
    return fnmatch.fnmatchcase(name, pattern)


@dataclass(frozen=True)
class Reservation:
    """What a dispatch reserves of its lease's budget (recorded, signed, in DISPATCHED)."""

    lease_id: str
    cents: int
    budget_cents: int
    #: the lease's reservations with this one
    reserved_cents: int

    def as_data(self) -> dict[str, int | str]:
        return {
            "lease_id": self.lease_id,
            "cents": self.cents,
            "budget_cents": self.budget_cents,
            "reserved_cents": self.reserved_cents,
        }


def reservation_for(lease: Lease | None, demand: Demand) -> Reservation | None:
    """The reservation a dispatch that ``check_lease`` allowed makes, if its lease has a budget."""
    if lease is None or lease.budget_cents is None or demand.amount_cents is None:
        return None
    return Reservation(
        lease.lease_id,
        demand.amount_cents,
        lease.budget_cents,
        (lease.reserved_cents or 0) + demand.amount_cents,
    )


@functools.lru_cache(maxsize=256)
def lease_from_doc(doc: str) -> Lease:
    """The lease stored as ``doc``, for the gate's own checks. Every dispatch transaction reads
    its lease, and a lease changes rarely (a revoke writes a new document): each version is
    parsed once. The parsed lease is shared, so it is never handed to callers."""
    return Lease.model_validate_json(doc)


def new_lease_id() -> str:
    return "lease_" + secrets.token_hex(12)


class LeaseStore(ABC):
    """Leases live in the journal's store, so every worker sees a revoke at once."""

    def issue(
        self,
        principal: str,
        *,
        activities: list[str] | None = None,
        max_amount_cents: int | None = None,
        budget_cents: int | None = None,
        resources: list[str] | None = None,
        ttl: timedelta | None = None,
        lease_id: str | None = None,
    ) -> str:
        """Issue a lease; ``max_amount_cents`` caps each effect, ``budget_cents`` all of its
        effects together (see ``Lease``)."""
        if not principal:
            raise ValueError("principal must be a non-empty string")
        if ttl is not None and ttl <= timedelta(0):
            raise ValueError("ttl must be positive")
        for name, cents in (("max_amount_cents", max_amount_cents), ("budget_cents", budget_cents)):
            if cents is not None and (isinstance(cents, bool) or not isinstance(cents, int)):
                raise ValueError(f"{name} must be a whole number of cents")
            if cents is not None and cents < 0:
                raise ValueError(f"{name} must not be negative")
        now = time.time()
        lease = Lease(
            lease_id=lease_id or new_lease_id(),
            principal=principal,
            activities=activities,
            max_amount_cents=max_amount_cents,
            budget_cents=budget_cents,
            resources=resources,
            issued_at=now,
            expires_at=None if ttl is None else now + ttl.total_seconds(),
        )
        self._insert(lease)
        return lease.lease_id

    @abstractmethod
    def _insert(self, lease: Lease) -> None: ...

    @abstractmethod
    def revoke(self, lease_id: str) -> bool:
        """Revoke now. True if the lease existed and was live."""

    @abstractmethod
    def get(self, lease_id: str) -> Lease | None: ...

    @abstractmethod
    def list(self) -> list[Lease]: ...
