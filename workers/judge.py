"""What a row of the fault table must show, gated (``Expect``) and without the gate
(``Baseline``), and the judge that holds a row's result against it: money read from the
payments service and the effect's record from the journal, never from the gate. The rows
themselves, with what each must show, are ``scenarios.SCENARIOS``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from interlock_temporal.core.models import Receipt
from interlock_temporal.core.receipts import receipt

from .world import REFUND_CENTS, Observed, World


@dataclass(frozen=True)
class Expect:
    final: str
    via: frozenset[str] = frozenset()
    code: str | None = None
    refunded_cents: int = REFUND_CENTS
    records: int = 1


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


@dataclass(frozen=True)
class Scenario:
    """A row of the fault table: the fault, the script that plays it, and what it must show
    at each tier, gated and in each baseline."""

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
    if "stalled_worker" in seen.extra and seen.extra.get("in_flight_seen"):
        in_flight_workers = seen.extra.get("in_flight_workers", [])
        if not in_flight_workers:
            problems.append("no attempt that got EffectInFlight was seen with its worker")
        if seen.extra.get("stalled_worker") in in_flight_workers:
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
