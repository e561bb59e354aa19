"""The fault table of ``scenarios.md``, as scripts that run against a world.

Two worlds run the same scripts: ``ServerWorld`` (a real Temporal dev server, real worker
processes, a real SIGKILL where the row says crash) and ``InProcessWorld`` (the core protocol
alone, a crash being an exception that unwinds like a death). Money is read from the payments
service, never from the gate.

    python -m workers.scenarios --list
    python -m workers.scenarios run --scenario crash_before_ack --tier 2 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Receipt
from interlock_temporal.core.receipts import receipt
from interlock_temporal.targets.payments import (
    FaultAction,
    FaultPoint,
    RefundRecord,
    RefundRequest,
)
from workflows.activities import refund_key
from workflows.support_case import PRINCIPAL, CaseFile, CaseOutcome, Mode

ORDER = "881"
CASE = "4471"
PAID_CENTS = 10_000
REFUND_CENTS = 2_000
REDECIDED_CENTS = 3_000
LEASE_MAX_CENTS = 5_000
OPERATOR = "carol"

T = TypeVar("T")


@dataclass(frozen=True)
class Expect:
    final: str
    via: frozenset[str] = frozenset()
    code: str | None = None
    refunded_cents: int = REFUND_CENTS
    records: int = 1


def _same(e: T) -> dict[int, T]:
    return {1: e, 2: e, 3: e}


#: what Temporal users do without the gate: retries with no idempotency key, and a key made of
#: the workflow and activity ids (stable across one activity's retries, not across a re-run)
BASELINES: tuple[Mode, ...] = ("naive", "activity_key")
#: how a baseline workflow that had not ended when the runner stopped waiting is reported: it
#: retries for ever (a refusal from the service is just another retryable error to it)
RETRYING = "still retrying"

#: the harms a baseline can show, each a departure from the row's unharmed money
DOUBLE_REFUND = "double refund"
REDECIDED_REFUND = "second refund after the re-decision"
REVOKED_LEASE = "refund under a revoked lease"
STALE_FACTS = "refund on stale facts"


@dataclass(frozen=True)
class Baseline:
    """What one baseline cell (the row without the gate) must show: the money the payments
    service holds, how the workflow ends, and the harm that money is. ``harm=None`` is a cell
    clean by nature; ``why`` says why, either way."""

    harm: str | None
    why: str
    refunded_cents: int = REFUND_CENTS
    records: int = 1
    ends: str = "REFUNDED"


def _clean(why: str, **kw: Any) -> Baseline:
    return Baseline(None, why, **kw)


def _harm(harm: str, why: str, cents: int, records: int, **kw: Any) -> Baseline:
    return Baseline(harm, why, refunded_cents=cents, records=records, **kw)


#: a key the service does not honour: the ungated retry refunds again
_KEY_IGNORED = _harm(DOUBLE_REFUND, "the retry's key is the same; the service ignores it", 4_000, 2)


def _both(
    e: Baseline, activity_key: dict[int, Baseline] | None = None
) -> dict[str, dict[int, Baseline]]:
    """The naive baseline shows ``e`` at every tier; the activity-id key too, unless given."""
    return {"naive": _same(e), "activity_key": activity_key or _same(e)}


class WorkflowStillRunning(TimeoutError):
    """The workflow had not ended when the runner stopped waiting for it."""


@dataclass
class Observed:
    outcome: CaseOutcome
    extra: dict[str, Any] = field(default_factory=dict)


class Payments(Protocol):
    """What a row does to the payments service and reads back from it (the money)."""

    def open_order(self, order_id: str, paid_cents: int) -> str: ...

    def arm(
        self, point: FaultPoint, action: FaultAction, *, arg: float | None = None, count: int = 1
    ) -> None: ...

    def manual_refund(self, order_id: str, amount_cents: int) -> str: ...

    def advance_clock(self, seconds: float) -> None: ...

    def refund_records(self, order_id: str) -> list[RefundRecord]: ...

    def calls(self, order_id: str | None = None) -> int: ...

    def order_facts(self, order_id: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


class World(ABC):
    """One row's world: the payments service, the journal, the lease, and workers."""

    tier: int
    mode: Mode
    payments: Payments
    journal: Journal
    lease_id: str
    kill: FaultAction
    kills: int = 0
    #: the support case: worlds that share a Temporal server get their own, because a review's
    #: workflow id derives from the effect id (the case and the order)
    case_id: str = CASE
    #: the order the case refunds (a Stripe world's order is the charge it creates)
    order_id: str = ORDER

    @property
    def effect_id(self) -> str:
        return the_effect_id(self.case_id, self.order_id)

    crash_to_completion_s: float | None = None

    def setup(self) -> None:
        self.order_id = self.payments.open_order(self.order_id, PAID_CENTS)
        self.lease_id = self.journal.leases.issue(
            PRINCIPAL,
            activities=["refund"],
            max_amount_cents=LEASE_MAX_CENTS,
            resources=[f"order:{self.order_id}"],
        )

    def case(self, amount_cents: int = REFUND_CENTS, **kw: Any) -> CaseFile:
        return CaseFile(
            case_id=self.case_id,
            order_id=self.order_id,
            amount_cents=amount_cents,
            lease_id=self.lease_id,
            mode=self.mode,
            **kw,
        )

    @abstractmethod
    async def start(self, case: CaseFile) -> Any: ...

    @abstractmethod
    async def crashed(self, run: Any) -> None:
        """Wait until the worker running ``run`` has died (a real SIGKILL on a server)."""

    @abstractmethod
    async def restart(self) -> None: ...

    @abstractmethod
    async def result(self, run: Any) -> CaseOutcome: ...

    async def submit(self, case: CaseFile) -> CaseOutcome:
        return await self.result(await self.start(case))

    @abstractmethod
    async def resolve(self, decision: str, operator: str, note: str = "") -> None:
        """A person decides the effect's review (once it is open)."""

    @abstractmethod
    async def in_flight_race(self) -> Observed: ...

    @abstractmethod
    async def concurrent_submit(self, n: int) -> list[CaseOutcome]: ...

    async def close(self) -> None:
        return None


# -- the rows -------------------------------------------------------------------------------


async def _crash_then(
    w: World, point: str, during_outage: Callable[[World], None] | None = None
) -> CaseOutcome:
    w.payments.arm(point, w.kill)  # type: ignore[arg-type]
    run = await w.start(w.case())
    await w.crashed(run)
    if during_outage is not None:
        during_outage(w)
    await w.restart()
    return await w.result(run)


async def happy_path(w: World) -> Observed:
    return Observed(await w.submit(w.case()))


async def crash_before_send(w: World) -> Observed:
    return Observed(await _crash_then(w, "before_send"))


async def crash_before_ack(w: World) -> Observed:
    return Observed(await _crash_then(w, "after_commit"))


async def duplicate_submit(w: World) -> Observed:
    first = await w.submit(w.case())
    calls_after_first = w.payments.calls(w.order_id)
    second = await w.submit(w.case())
    return Observed(
        second,
        {
            "first": first.model_dump(mode="json"),
            "body_ran_again": w.payments.calls(w.order_id) != calls_after_first,
            "same_result": first.refund == second.refund,
        },
    )


async def model_redecides(w: World) -> Observed:
    recovered = await _crash_then(w, "after_commit")
    redecided = await w.submit(w.case(amount_cents=REDECIDED_CENTS))
    return Observed(redecided, {"after_row_3": recovered.status})


async def lease_revoked(w: World) -> Observed:
    w.journal.leases.revoke(w.lease_id)
    return Observed(await w.submit(w.case()))


async def stale_premise(w: World) -> Observed:
    """The order stops being eligible after the agent decided, before the gate dispatches: at
    the gate's capture of the premises. A baseline captures nothing: there it happens at the
    same moment of the story, after the decision, as the send starts."""
    w.payments.arm("capture" if w.mode == "gated" else "before_send", "make_ineligible")
    return Observed(await w.submit(w.case()))


async def refund_during_outage(w: World) -> Observed:
    def support_refunds_by_hand(w: World) -> None:
        w.payments.manual_refund(w.order_id, REFUND_CENTS)

    return Observed(await _crash_then(w, "before_send", support_refunds_by_hand))


async def lease_revoked_during_outage(w: World) -> Observed:
    def revoke(w: World) -> None:
        w.journal.leases.revoke(w.lease_id)

    return Observed(await _crash_then(w, "before_send", revoke))


async def key_expired(w: World) -> Observed:
    def window_passes(w: World) -> None:
        w.payments.advance_clock(25 * 3600)

    return Observed(await _crash_then(w, "after_commit", window_passes))


async def in_flight_race(w: World) -> Observed:
    return await w.in_flight_race()


async def _resolved(w: World, point: str, decision: str) -> Observed:
    """The row's crash at tier 3 leaves the effect AMBIGUOUS; the workflow waits for a person,
    who decides the review; the workflow then completes."""
    w.payments.arm(point, w.kill)  # type: ignore[arg-type]
    run = await w.start(w.case(wait_for_review=True))
    await w.crashed(run)
    await w.restart()
    await w.resolve(decision, OPERATOR, "checked the payments dashboard")
    outcome = await w.result(run)
    return Observed(outcome, {"decision": decision, "operator": OPERATOR})


async def ambiguous_resolved_happened(w: World) -> Observed:
    return await _resolved(w, "after_commit", "happened")


async def ambiguous_resolved_not_happened(w: World) -> Observed:
    return await _resolved(w, "before_send", "not_happened")


async def concurrent_submit(w: World) -> Observed:
    outcomes = await w.concurrent_submit(8)
    refunds = {o.refund.refund_id if o.refund else None for o in outcomes}
    return Observed(
        outcomes[0],
        {
            "workflows": len(outcomes),
            "distinct_results": len(refunds),
            "statuses": sorted({o.status for o in outcomes}),
        },
    )


@dataclass(frozen=True)
class Scenario:
    number: int
    name: str
    fault: str
    expect: dict[int, Expect]
    script: Callable[[World], Awaitable[Observed]]
    crash: bool = False
    #: what each baseline must show, by baseline and tier (rows 13 and 14 have none: they need
    #: a review, which only the gate opens)
    baselines: dict[str, dict[int, Baseline]] = field(default_factory=dict)
    #: the money a run that does no harm leaves in the service (a gate's, or a clean baseline's):
    #: a baseline holding more, or more refund records, shows harm
    unharmed_cents: int = REFUND_CENTS
    unharmed_records: int = 1


COMMITTED_FIRST = Expect("COMMITTED", frozenset({"dispatch"}))
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            1,
            "happy_path",
            "none",
            _same(COMMITTED_FIRST),
            happy_path,
            baselines=_both(_clean("no fault: one send, one refund")),
        ),
        Scenario(
            2,
            "crash_before_send",
            "killed after DISPATCHED, before the send",
            {
                1: Expect("COMMITTED", frozenset({"retry-idempotent", "recovery-reapply"})),
                2: Expect("COMMITTED", frozenset({"recovery-reapply"})),
                3: Expect("AMBIGUOUS", refunded_cents=0, records=0),
            },
            crash_before_send,
            crash=True,
            baselines=_both(
                _clean("the worker died before the send: the retry's send is the only one")
            ),
        ),
        Scenario(
            3,
            "crash_before_ack",
            "the refund lands, killed before the result returns",
            {
                1: Expect("COMMITTED", frozenset({"recovery-query", "retry-idempotent"})),
                2: Expect("COMMITTED", frozenset({"recovery-query"})),
                3: Expect("AMBIGUOUS"),
            },
            crash_before_ack,
            crash=True,
            baselines=_both(
                _harm(DOUBLE_REFUND, "the refund landed; the retry sends it again", 4_000, 2),
                {
                    1: _clean("the retry carries the same key, and the service dedupes it"),
                    2: _KEY_IGNORED,
                    3: _KEY_IGNORED,
                },
            ),
        ),
        Scenario(
            4,
            "duplicate_submit",
            "the same approved effect submitted twice",
            _same(COMMITTED_FIRST),
            duplicate_submit,
            baselines=_both(
                _harm(
                    DOUBLE_REFUND,
                    "a second workflow is a second send: nothing ties it to the first decision",
                    4_000,
                    2,
                )
            ),
        ),
        Scenario(
            5,
            "model_redecides",
            "after row 3 recovers, the agent re-decides $30",
            _same(Expect("REFUSED", code="conflicting_payload")),
            model_redecides,
            crash=True,
            baselines=_both(
                _harm(
                    f"{DOUBLE_REFUND}, then a {REDECIDED_REFUND}",
                    "row 3 refunds twice, then the $30 re-decision is sent as a new refund",
                    7_000,
                    3,
                ),
                {
                    1: _harm(
                        REDECIDED_REFUND,
                        "row 3 dedupes; the $30 re-decision runs under a new workflow's key",
                        5_000,
                        2,
                    ),
                    2: _harm(
                        f"{DOUBLE_REFUND}, then a {REDECIDED_REFUND}",
                        "row 3 refunds twice, then the $30 re-decision is sent as a new refund",
                        7_000,
                        3,
                    ),
                    3: _harm(
                        f"{DOUBLE_REFUND}, then a {REDECIDED_REFUND}",
                        "row 3 refunds twice, then the $30 re-decision is sent as a new refund",
                        7_000,
                        3,
                    ),
                },
            ),
        ),
        Scenario(
            6,
            "lease_revoked",
            "lease revoked before dispatch",
            _same(Expect("REFUSED", code="lease", refunded_cents=0, records=0)),
            lease_revoked,
            baselines=_both(
                _harm(REVOKED_LEASE, "nothing reads the lease: the refund is sent", 2_000, 1)
            ),
            unharmed_cents=0,
            unharmed_records=0,
        ),
        Scenario(
            7,
            "stale_premise",
            "the order stops being eligible before dispatch",
            _same(Expect("REFUSED", code="stale_premise", refunded_cents=0, records=0)),
            stale_premise,
            baselines=_both(
                _clean(
                    "the service itself refuses a refund on an ineligible order, so no money "
                    "moves; the workflow retries the refusal for ever",
                    refunded_cents=0,
                    records=0,
                    ends=RETRYING,
                )
            ),
            unharmed_cents=0,
            unharmed_records=0,
        ),
        Scenario(
            8,
            "refund_during_outage",
            "killed before the send; support refunds $20 by hand",
            {
                1: Expect("REFUSED", code="stale_premise_at_recovery"),
                2: Expect("REFUSED", code="stale_premise_at_recovery"),
                3: Expect("AMBIGUOUS"),
            },
            refund_during_outage,
            crash=True,
            baselines=_both(
                _harm(
                    STALE_FACTS,
                    "the retry sends the $20 support already refunded by hand (no key had "
                    "reached the service, so nothing dedupes it)",
                    4_000,
                    2,
                )
            ),
        ),
        Scenario(
            9,
            "lease_revoked_during_outage",
            "killed before the send; lease revoked while down",
            {
                1: Expect("REFUSED", code="lease_at_recovery", refunded_cents=0, records=0),
                2: Expect("REFUSED", code="lease_at_recovery", refunded_cents=0, records=0),
                3: Expect("AMBIGUOUS", refunded_cents=0, records=0),
            },
            lease_revoked_during_outage,
            crash=True,
            baselines=_both(
                _harm(REVOKED_LEASE, "the retry sends with no lease to check", 2_000, 1)
            ),
            unharmed_cents=0,
            unharmed_records=0,
        ),
        Scenario(
            10,
            "key_expired",
            "killed after the refund lands; the dedupe window passes",
            {
                1: Expect("COMMITTED", frozenset({"recovery-query"})),
                2: Expect("COMMITTED", frozenset({"recovery-query"})),
                3: Expect("AMBIGUOUS"),
            },
            key_expired,
            crash=True,
            baselines=_both(
                _harm(DOUBLE_REFUND, "the refund landed; the retry sends it again", 4_000, 2),
                {
                    1: _harm(
                        DOUBLE_REFUND,
                        "the retry's key is the same, but past the service's dedupe window",
                        4_000,
                        2,
                    ),
                    2: _KEY_IGNORED,
                    3: _KEY_IGNORED,
                },
            ),
        ),
        Scenario(
            11,
            "in_flight_race",
            "attempt 1 stalls past its timeout; attempt 2 on another worker",
            _same(COMMITTED_FIRST),
            in_flight_race,
            baselines=_both(
                _harm(
                    DOUBLE_REFUND,
                    "attempt 2 refunds while attempt 1 is stalled; attempt 1 then sends too",
                    4_000,
                    2,
                ),
                {
                    1: _clean("both attempts carry the same key, and the service dedupes it"),
                    2: _harm(
                        DOUBLE_REFUND,
                        "both attempts send the same key; the service ignores it",
                        4_000,
                        2,
                    ),
                    3: _harm(
                        DOUBLE_REFUND,
                        "both attempts send the same key; the service ignores it",
                        4_000,
                        2,
                    ),
                },
            ),
        ),
        Scenario(
            12,
            "concurrent_submit",
            "8 workflows submit the same effect across 2 workers",
            _same(COMMITTED_FIRST),
            concurrent_submit,
            baselines=_both(
                _harm(
                    DOUBLE_REFUND,
                    "each workflow sends its own refund until the order's $100 is used up; "
                    "the service refuses the other 3, which retry for ever",
                    10_000,
                    5,
                    ends=RETRYING,
                )
            ),
        ),
        Scenario(
            13,
            "ambiguous_resolved_happened",
            "row 3 at t3, then an operator resolves happened",
            {3: Expect("RESOLVED", frozenset({"resolved"}))},
            ambiguous_resolved_happened,
            crash=True,
        ),
        Scenario(
            14,
            "ambiguous_resolved_not_happened",
            "row 2 at t3, then an operator resolves not_happened",
            {3: Expect("COMMITTED", frozenset({"recovery-reapply"}))},
            ambiguous_resolved_not_happened,
            crash=True,
        ),
    ]
}


def the_effect_id(case_id: str = CASE, order_id: str = ORDER) -> str:
    """The effect id of the row's refund: the case and the order name the decision."""
    probe = RefundRequest(case_id=case_id, order_id=order_id, amount_cents=REFUND_CENTS)
    return effect_id("refund", refund_key(probe))


def new_workflow_id(prefix: str = "case") -> str:
    return f"{prefix}-{CASE}-{uuid.uuid4().hex[:10]}"


def open_world_journal(workdir: Path) -> Journal:
    return open_journal(f"sqlite:///{workdir / 'journal.db'}")


def judge(s: Scenario, tier: int, w: World, seen: Observed) -> dict[str, Any]:
    """The row's result, read from the payments service and the journal, and its verdict."""
    records = w.payments.refund_records(w.order_id)
    eid = w.effect_id
    try:
        journal_receipt: Receipt | None = receipt(eid, journal=w.journal)
    except KeyError:
        journal_receipt = None
    shown = seen.outcome.receipt or journal_receipt
    result: dict[str, Any] = {
        "scenario": s.name,
        "number": s.number,
        "effect_id": eid,
        "tier": tier,
        "mode": w.mode,
        "final": shown.final if shown else seen.outcome.status,
        "via": shown.via if shown else None,
        "code": shown.code if shown else None,
        "workflow_status": seen.outcome.status,
        "refunded_cents": sum(r.amount_cents for r in records),
        "refund_records": len(records),
        "refunds_by_source": sorted(r.source for r in records),
        "calls": w.payments.calls(w.order_id),
        "kills": w.kills,
        "crash_to_completion_s": w.crash_to_completion_s,
        "receipt": journal_receipt.model_dump(mode="json") if journal_receipt else None,
        "extra": seen.extra,
    }
    if w.mode != "gated":
        result["ended"] = seen.outcome.status
        return judge_baseline(s, result)
    e = s.expect[tier]
    problems = []
    if result["final"] != e.final:
        problems.append(f"final {result['final']} != {e.final}")
    if e.via and result["via"] not in e.via:
        problems.append(f"via {result['via']} not in {sorted(e.via)}")
    if e.code and result["code"] != e.code:
        problems.append(f"code {result['code']} != {e.code}")
    if result["refunded_cents"] != e.refunded_cents:
        problems.append(f"refunded {result['refunded_cents']} != {e.refunded_cents} cents")
    if result["refund_records"] != e.records:
        problems.append(f"{result['refund_records']} refund records != {e.records}")
    if s.crash and w.kills < 1:
        problems.append("no worker died")
    if s.name == "duplicate_submit" and (
        seen.extra["body_ran_again"] or not seen.extra["same_result"]
    ):
        problems.append("the duplicate ran the body again or returned another result")
    if s.name in ("in_flight_race", "concurrent_submit") and result["calls"] != 1:
        problems.append(f"{result['calls']} sends reached the service, expected exactly 1")
    if s.name == "in_flight_race" and not seen.extra.get("in_flight_seen"):
        problems.append("attempt 2 was never seen to get EffectInFlight")
    if seen.extra.get("stalled_worker") in seen.extra.get("in_flight_workers", []):
        problems.append("the in-flight attempt ran on the stalled worker, not another one")
    if s.name == "concurrent_submit" and seen.extra["distinct_results"] != 1:
        problems.append("the workflows did not all get the one result")
    if "decision" in seen.extra:
        if journal_receipt is None or journal_receipt.operator != seen.extra["operator"]:
            problems.append("the receipt does not name the operator who decided")
        if seen.outcome.status not in ("REFUNDED", "RESOLVED"):
            problems.append(f"the workflow ended {seen.outcome.status}, not completed")
    result["expected"] = {
        "final": e.final,
        "via": sorted(e.via),
        "code": e.code,
        "refunded_cents": e.refunded_cents,
        "refund_records": e.records,
    }
    result["problems"] = problems
    result["ok"] = not problems
    return result


def _money(cents: int | None, records: int | None) -> str:
    return f"${(cents or 0) / 100:.0f} in {records or 0} refund record(s)"


def judge_baseline(s: Scenario, result: dict[str, Any]) -> dict[str, Any]:
    """Judge a baseline cell against what the row must show without the gate.

    Harm is money the row's unharmed run would not leave. A cell that must show harm and comes
    out clean proves nothing about the gate; a cell clean by nature that shows harm means the
    fault or the baseline is not what the table says. Either fails, as do money or an ending
    other than the ones written down, and a cell that never sent.

    ``result`` carries ``mode``, ``tier``, ``refunded_cents``, ``refund_records`` and ``calls``
    (read from the payments service), ``ended`` (the workflow's status, or ``RETRYING``) and
    ``kills``; this adds ``expected``, ``harm_shown``, ``verdict``, ``problems`` and ``ok``."""
    mode, tier = result["mode"], result["tier"]
    e = s.baselines.get(mode, {}).get(tier)
    problems: list[str] = list(result.get("problems", []))
    cents, records = result.get("refunded_cents"), result.get("refund_records")
    shown = (
        cents is not None
        and records is not None
        and (cents > s.unharmed_cents or records > s.unharmed_records)
    )
    result["harm_shown"] = shown
    if e is None:
        problems.append(f"no expected outcome is written down for {mode} at tier {tier}")
        result.update(problems=problems, ok=False, verdict="not judged", expected=None)
        return result
    if e.harm and not shown:
        problems.append(
            f"came out clean ({_money(cents, records)}): the {e.harm} it must show did not happen"
        )
    if not e.harm and shown:
        problems.append(
            f"clean by nature, but showed harm: {_money(cents, records)} where "
            f"{_money(s.unharmed_cents, s.unharmed_records)} is right"
        )
    if (cents, records) != (e.refunded_cents, e.records):
        problems.append(
            f"the service holds {_money(cents, records)}, not the "
            f"{_money(e.refunded_cents, e.records)} written down"
        )
    if result.get("ended") != e.ends:
        problems.append(f"the workflow ended {result.get('ended')}, not {e.ends}")
    if s.crash and not result.get("kills"):
        problems.append("no worker died")
    if not result.get("calls"):
        # clean because nothing was tried is not clean by nature
        problems.append("no refund request reached the service")
    result["expected"] = {
        "harm": e.harm,
        "why": e.why,
        "refunded_cents": e.refunded_cents,
        "refund_records": e.records,
        "ends": e.ends,
    }
    result["problems"] = problems
    result["ok"] = not problems
    if e.harm and not shown:
        result["verdict"] = "came out clean"
    elif not e.harm and shown:
        result["verdict"] = "showed harm, though clean by nature"
    elif problems:
        result["verdict"] = "not as written down"
    else:
        result["verdict"] = "harm shown as expected" if e.harm else "clean as expected"
    return result


async def run_in(world: World, name: str) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    if world.mode == "gated" and world.tier not in scenario.expect:
        await world.close()
        raise ValueError(
            f"row {scenario.number} ({name}) is defined at tier(s) "
            f"{', '.join(map(str, sorted(scenario.expect)))} only"
        )
    world.setup()
    started = time.monotonic()
    try:
        seen = await scenario.script(world)
        result = judge(scenario, world.tier, world, seen)
    finally:
        await world.close()
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    return result


async def run_on_server(
    name: str,
    tier: int,
    *,
    mode: Mode = "gated",
    target: str | None = None,
    workdir: Path | None = None,
    stripe: bool = False,
) -> dict[str, Any]:
    """One row on a real dev server (its own, unless ``target`` is given); with ``stripe``,
    against the Stripe fake through the real SDK (tier 1)."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from interlock_temporal.testing import DevServer

    from .server_world import ServerWorld

    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"interlock-{name}-t{tier}-"))
    server = None
    if target is None:
        server = await DevServer(ui_port=None).start()
        target = server.target
    try:
        client = await Client.connect(target, data_converter=pydantic_data_converter)
        if stripe:
            from .stripe_harness import StripeServerWorld

            world: World = await StripeServerWorld.launch(client, workdir, mode)
        else:
            world = await ServerWorld.create(client, workdir, tier, mode)
        return await run_in(world, name)
    finally:
        if server is not None:
            await server.stop()


async def run_in_process(
    name: str, tier: int, workdir: Path, *, stripe: bool = False
) -> dict[str, Any]:
    from .inprocess_world import InProcessWorld

    if not stripe:
        return await run_in(InProcessWorld(workdir, tier), name)
    from interlock_temporal.testing import StripeMock, StripeProxy

    from .stripe_harness import stripe_inprocess_world

    mock = await StripeMock().start()
    proxy = await StripeProxy(mock.port).start()
    try:
        return await run_in(stripe_inprocess_world(workdir, mock, proxy), name)
    finally:
        await proxy.stop()
        await mock.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workers.scenarios",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--list", action="store_true", help="name the rows")
    sub = p.add_subparsers(dest="command")
    r = sub.add_parser("run", help="run one row end to end on a real server")
    r.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    r.add_argument("--tier", type=int, required=True, choices=(1, 2, 3))
    r.add_argument("--mode", default="gated", choices=("gated", "naive", "activity_key"))
    r.add_argument("--target", help="use this Temporal server instead of starting one")
    r.add_argument("--in-process", action="store_true", help="the core protocol only, no server")
    r.add_argument(
        "--stripe",
        action="store_true",
        help="against the Stripe fake through the real SDK (tier 1; make test installs it)",
    )
    r.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.list or args.command is None:
        for s in sorted(SCENARIOS.values(), key=lambda s: s.number):
            print(f"{s.number:>2}  {s.name:<28} {s.fault}")
        return 0
    if args.stripe and args.tier != 1:
        p.error("Stripe dedupes by key and can be asked: it is tier 1")
    if args.in_process:
        if args.mode != "gated":
            p.error("--in-process runs the gate only")
        result = asyncio.run(
            run_in_process(
                args.scenario,
                args.tier,
                Path(tempfile.mkdtemp(prefix="interlock-core-")),
                stripe=args.stripe,
            )
        )
    else:
        result = asyncio.run(
            run_on_server(
                args.scenario, args.tier, mode=args.mode, target=args.target, stripe=args.stripe
            )
        )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        verdict = {True: "PASS", False: "FAIL", None: "-"}[result["ok"]]
        print(
            f"{verdict} row {result['number']} {result['scenario']} tier {result['tier']} "
            f"({result['mode']}): {result['final']} via {result['via']} code {result['code']}, "
            f"refunded {result['refunded_cents']} cents in {result['refund_records']} record(s)"
        )
        for problem in result.get("problems", []):
            print(f"  - {problem}")
    return 0 if result["ok"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
