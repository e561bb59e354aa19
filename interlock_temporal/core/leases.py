"""Leases: the authority a principal holds. Issued and revoked by operators, checked by the gate
inside the same transaction that records a dispatch, so a revoke is either seen or too late.

A lease may be issued from another (delegated, ``issue(..., parent=...)``): a planner hands a
sub-agent part of its own authority. ``delegated`` checks at issue that the child only narrows
its parent; ``check_lease`` checks every ancestor again at dispatch (as the dispatch
transaction read them), and ``reservation_for`` reserves the amount on each budgeted one."""

from __future__ import annotations

import fnmatch
import functools
import secrets
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .errors import DelegationTooDeep, LeaseOverGrant
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
    if lease.ancestors:
        return _ancestors_problem(lease, demand, now)
    return None


def _ancestors_problem(lease: Lease, demand: Demand, now: float) -> LeaseProblem | None:
    """What an ancestor of a delegated ``lease`` (as the dispatch transaction read them,
    ``lease.delegators``) says against ``demand``: revoked or expired ends it; each one's
    scope and per-effect maximum are checked again (they were narrowed at issue, and the rows
    are sealed: this costs a loop, not a read); each budgeted one must cover its reservations
    with this amount. Names the ancestor, never a value."""
    if lease.delegators is None:  # read by something that does not read the chain: refuse
        return LeaseProblem("the lease's ancestors were not read with it")
    found = {above.lease_id: above for above in lease.delegators}
    for lease_id in lease.ancestors or ():
        named = f"ancestor lease {lease_id}"
        above = found.get(lease_id)
        if above is None:
            return LeaseProblem(f"{named} is not held by this journal")
        if above.revoked_at is not None and above.revoked_at <= now:
            return LeaseProblem(f"{named} revoked")
        if above.expires_at is not None and above.expires_at <= now:
            return LeaseProblem(f"{named} expired")
        if above.activities is not None and not any(
            _matches(demand.activity, p) for p in above.activities
        ):
            return LeaseProblem(f"activity outside the scope of {named}")
        if above.max_amount_cents is not None and (
            demand.amount_cents is None or demand.amount_cents > above.max_amount_cents
        ):
            return LeaseProblem(f"amount over the maximum of {named}")
        resource = demand.resource
        if above.resources is not None and (
            resource is None or not any(_matches(resource, p) for p in above.resources)
        ):
            return LeaseProblem(f"resource outside the scope of {named}")
        if above.budget_cents is not None:
            if demand.amount_cents is None or lease.budget_cents is None:
                return LeaseProblem(f"{named} has a budget but the effect reserves no amount")
            if (above.reserved_cents or 0) + demand.amount_cents > above.budget_cents:
                return LeaseProblem(
                    f"the budget of {named} does not cover this amount", "lease_budget"
                )
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
    """What a dispatch reserves of its lease's budget (recorded, signed, in DISPATCHED); under
    a delegated lease, also what it reserves of each budgeted ancestor's (``ancestors``, in the
    order of the lease's ``ancestors``: the same cents, each with its budget and total)."""

    lease_id: str
    cents: int
    budget_cents: int
    #: the lease's reservations with this one
    reserved_cents: int
    ancestors: tuple[Reservation, ...] = ()

    def as_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "lease_id": self.lease_id,
            "cents": self.cents,
            "budget_cents": self.budget_cents,
            "reserved_cents": self.reserved_cents,
        }
        if self.ancestors:
            data["ancestors"] = [a.as_data() for a in self.ancestors]
        return data


def reservation_for(lease: Lease | None, demand: Demand) -> Reservation | None:
    """The reservation a dispatch that ``check_lease`` allowed makes, if its lease has a budget
    (a lease under a budgeted ancestor always has one: ``delegated``)."""
    if lease is None or lease.budget_cents is None or demand.amount_cents is None:
        return None
    cents = demand.amount_cents
    return Reservation(
        lease.lease_id,
        cents,
        lease.budget_cents,
        (lease.reserved_cents or 0) + cents,
        tuple(
            Reservation(a.lease_id, cents, a.budget_cents, (a.reserved_cents or 0) + cents)
            for a in lease.delegators or ()
            if a.budget_cents is not None
        ),
    )


#: the most ancestors a lease may have: a delegation deeper than this is refused at issue
#: (``DelegationTooDeep``), which bounds the rows a dispatch under it reads
MAX_DELEGATION_DEPTH = 8


def covers(parent: str, child: str) -> bool:
    """Whether every name the glob ``child`` matches is matched by the glob ``parent`` too,
    decided conservatively: the same pattern; a plain name (no ``*``, ``?`` or ``[``) that
    ``parent`` matches; or a parent that is a plain prefix then ``*`` (``order:*``) and a child
    that starts with that prefix. Any other pair counts as wider, even where it is not
    (``refund_[ab]`` under ``refund_?``): the operator then names the activities instead."""
    if child == parent:
        return True
    if _WILD.isdisjoint(child):
        return _matches(child, parent)
    head = parent[:-1]
    return parent[-1:] == "*" and _WILD.isdisjoint(head) and child.startswith(head)


def _narrows(parent: list[str] | None, child: list[str] | None) -> bool:
    if parent is None:
        return True
    return child is not None and all(any(covers(p, c) for p in parent) for c in child)


def delegated(parent: Lease | None, asked: Lease, now: float) -> Lease:
    """``asked`` issued from ``parent`` (as read in the issuing transaction), or
    ``LeaseOverGrant`` naming the first field that would grant more than the parent, or
    ``parent`` itself when it cannot delegate (absent, revoked, expired; ``DelegationTooDeep``
    past ``MAX_DELEGATION_DEPTH`` ancestors).

    A field ``asked`` leaves unset (None) is the parent's: a child without activities has its
    parent's activities, one without a ttl its parent's expiry, one without a budget a budget
    as large as its parent's. A field set must be within the parent's: activities and resources
    each covered by one of the parent's patterns (``covers``), a maximum, a budget and an
    expiry no larger. The principal may differ (a sub-agent is another principal). The child's
    budget caps the child; what its parent has left is checked at dispatch, where every
    ancestor's budget is charged too. Nothing asked is dropped: a wider field refuses."""
    if parent is None:
        raise LeaseOverGrant("parent", "no lease with that id in this journal")
    if parent.revoked_at is not None and parent.revoked_at <= now:
        raise LeaseOverGrant("parent", "the lease is revoked")
    if parent.expires_at is not None and parent.expires_at <= now:
        raise LeaseOverGrant("parent", "the lease has expired")
    ancestors = [parent.lease_id, *(parent.ancestors or [])]
    if len(ancestors) > MAX_DELEGATION_DEPTH:
        raise DelegationTooDeep(
            "parent", f"the lease already has {MAX_DELEGATION_DEPTH} ancestors, the most allowed"
        )
    fields: dict[str, Any] = {"ancestors": ancestors}
    for name in ("activities", "resources"):
        mine, theirs = getattr(asked, name), getattr(parent, name)
        if mine is None:
            fields[name] = theirs
        elif not _narrows(theirs, mine):
            raise LeaseOverGrant(name, "a pattern is not within the parent lease's")
    for name in ("max_amount_cents", "budget_cents"):
        mine, theirs = getattr(asked, name), getattr(parent, name)
        if mine is None:
            fields[name] = theirs
        elif theirs is not None and mine > theirs:
            raise LeaseOverGrant(name, "more than the parent lease's")
    if asked.expires_at is None:
        fields["expires_at"] = parent.expires_at
    elif parent.expires_at is not None and asked.expires_at > parent.expires_at:
        raise LeaseOverGrant("ttl", "the lease would outlive the parent lease")
    return asked.model_copy(update=fields)


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
        parent: str | None = None,
    ) -> str:
        """Issue a lease; ``max_amount_cents`` caps each effect, ``budget_cents`` all of its
        effects together (see ``Lease``). ``parent``: issue it from that lease, which it may
        only narrow (``delegated``: read and checked in the transaction that writes the new
        lease; a wider field raises ``LeaseOverGrant`` naming it, and nothing is issued)."""
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
        self._insert(lease, parent)
        return lease.lease_id

    @abstractmethod
    def _insert(self, lease: Lease, parent: str | None = None) -> None:
        """Store ``lease``; with ``parent``, as ``delegated(parent as read, lease, now)``
        makes it, the parent read in the same transaction."""

    @abstractmethod
    def revoke(self, lease_id: str) -> bool:
        """Revoke now. True if the lease existed and was live."""

    @abstractmethod
    def get(self, lease_id: str) -> Lease | None: ...

    @abstractmethod
    def list(self) -> list[Lease]: ...
