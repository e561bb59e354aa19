"""What happened over a period, from the journal alone: effects by final state, what waits for
a person, denials by reason, the gate's own latency, and notifications that failed to reach
people."""

from __future__ import annotations

import math
import time
from collections import Counter

from pydantic import BaseModel, Field

from .journal import Journal
from .models import Kind
from .notifications import NotificationFailures


class Latency(BaseModel):
    """The gate's own time per committed effect, in milliseconds: before the send (claim,
    reads, checks, the dispatch transaction) plus the commit's checks; the commit's own
    durable write, which records the figure, is not in it."""

    count: int
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


class Waiting(BaseModel):
    """What waits for a person now, whatever the period."""

    ambiguous_effects: int
    pending_approvals: int
    open_circuits: int
    in_doubt: int


class JournalReport(BaseModel):
    since: float
    until: float
    effects: dict[str, int] = Field(default_factory=dict)
    waiting: Waiting
    denials: dict[str, int] = Field(default_factory=dict)
    escalations: dict[str, int] = Field(default_factory=dict)
    observed: dict[str, int] = Field(default_factory=dict)
    gate_latency_ms: Latency
    #: failed notification deliveries in the period, per notifier and review
    notification_failures: list[NotificationFailures] = Field(default_factory=list)


def _nearest_rank(ordered: list[float], p: float) -> float:
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def build_report(journal: Journal, since: float, until: float | None = None) -> JournalReport:
    until = time.time() if until is None else until
    rows = journal.effects(since=since)
    effects = Counter(row.status.value for row in rows)
    latencies: list[float] = []
    for row in rows:
        if row.status is not Kind.COMMITTED:
            continue
        for entry in journal.read(row.effect_id):
            if entry.kind is Kind.COMMITTED and since <= entry.ts <= until:
                value = entry.data.get("gate_ms")
                if isinstance(value, int | float):
                    latencies.append(float(value))
    latencies.sort()
    latency = Latency(count=len(latencies))
    if latencies:
        latency = Latency(
            count=len(latencies),
            p50=_nearest_rank(latencies, 50),
            p95=_nearest_rank(latencies, 95),
            p99=_nearest_rank(latencies, 99),
            max=latencies[-1],
        )
    denials: Counter[str] = Counter()
    escalations: Counter[str] = Counter()
    observed: Counter[str] = Counter()
    for entry in journal.policy.events(since=since):
        event = entry.data.get("event")
        code = str(entry.data.get("code") or "-")
        if event == "deny":
            denials[code] += 1
        elif event == "escalate":
            escalations[code] += 1
        elif event == "observed":
            observed[code] += 1
    waiting = Waiting(
        ambiguous_effects=len(journal.effects(status=Kind.AMBIGUOUS)),
        pending_approvals=len(journal.policy.approvals("pending")),
        open_circuits=len(journal.policy.open_circuits()),
        in_doubt=len(journal.in_doubt()),
    )
    return JournalReport(
        since=since,
        until=until,
        effects=dict(sorted(effects.items())),
        waiting=waiting,
        denials=dict(denials.most_common()),
        escalations=dict(escalations.most_common()),
        observed=dict(observed.most_common()),
        gate_latency_ms=latency,
        notification_failures=journal.notifications.failures(since=since),
    )
