"""The invariants the sweep and the model check both judge an effect's record by, read from
the journal's entries, the lease store and the target itself, never from what the gate said
or through the gate's own code (a planted bug there must not blind the judge)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from interlock_temporal.core.models import Entry, Kind, Lease
from interlock_temporal.core.targets import DEFAULT_DEDUPE_MARGIN

Validate = Callable[[Any, Any, Any], Sequence[Any]]


@dataclass(frozen=True)
class Circumstances:
    """What the world did, as the judge needs it: the lease (as stored now), the clock's
    offset from real time at each moment, and when (if) the owning workflow was cancelled."""

    lease: Lease
    offset_at: Callable[[float], float]
    cancelled_at: float | None = None
    #: the workflow the cancellation ended
    cancelled: str | None = None


def dispatch_problems(
    entries: Sequence[Entry],
    around: Circumstances,
    target: Any,
    payload: Any,
) -> list[str]:
    """Every DISPATCHED entry against what the world did before it: the lease not revoked or
    expired, the facts it captured still holding (``target.validate``), only the owner
    dispatching and not after its cancellation, and a resend only where the target dedupes it
    (inside its window, less settle time and margin), can be asked, or a confirmed absence
    (a send that never left, a person's not_happened, a reopen) came first."""
    problems: list[str] = []
    window = getattr(target, "dedupe_window", None)
    usable = None
    if window is not None:
        margin = getattr(target, "dedupe_margin", DEFAULT_DEDUPE_MARGIN)
        usable = (window - target.settle_time - margin).total_seconds()
    queryable = callable(getattr(target, "query", None))
    lease = around.lease
    owner: str | None = None
    premises: Any = {}
    first_dispatch: float | None = None
    confirmed_absent = True  # nothing sent yet
    for e in entries:
        if e.kind is Kind.PROPOSED:
            owner = (e.data.get("delivery") or {}).get("workflow_id")
            premises = e.data.get("premises") or {}
        if e.kind in (Kind.NOT_SENT, Kind.REOPENED) or (
            e.kind is Kind.RESOLVED and e.data.get("decision") == "not_happened"
        ):
            confirmed_absent = True
        if e.kind is not Kind.DISPATCHED:
            continue
        via = e.data.get("via")
        at = e.ts + around.offset_at(e.ts)  # the world's clock when it was recorded
        who = (e.data.get("delivery") or {}).get("workflow_id")
        if via == "reopened":
            owner = who
        if who != owner:
            problems.append(f"dispatched by {who}, not by the owner {owner}")
        if (
            around.cancelled_at is not None
            and owner == around.cancelled
            and e.ts >= around.cancelled_at
        ):
            problems.append("dispatched after the owning workflow was cancelled")
        if lease.revoked_at is not None and e.ts >= lease.revoked_at:
            problems.append("dispatched after its lease was revoked")
        if lease.expires_at is not None and at >= lease.expires_at:
            problems.append("dispatched after its lease expired")
        changes = target.validate(premises, e.data.get("premises_now") or {}, payload)
        if changes:
            problems.append(f"dispatched on facts that no longer held: {[c.fact for c in changes]}")
        if first_dispatch is None:
            first_dispatch = at
        elif via == "retry-idempotent":
            if usable is None or at >= first_dispatch + usable:
                problems.append("resent on the dedupe window past its end less settle and margin")
        elif not (confirmed_absent or queryable):
            problems.append(f"resent ({via}) with no way to know the first send did not land")
        confirmed_absent = False
    return problems


def budget_problems(lease: Lease) -> list[str]:
    """A lease's reservations within its budget."""
    if lease.budget_cents is None or (lease.reserved_cents or 0) <= lease.budget_cents:
        return []
    return [f"the lease's budget is overspent: {lease.reserved_cents} of {lease.budget_cents}"]
