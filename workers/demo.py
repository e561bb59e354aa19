"""The story in under a minute, on a real Temporal dev server with its Web UI.

A customer paid $100; support case 4471 approves one $20 partial refund; the refund lands and
the worker is killed (SIGKILL) before the result comes back. Three endings:

1. naive: Temporal retries the activity, which has no idea it already ran: $40 refunded.
2. gated, tier 2 (the service can be asked): recovery asks first, finds the refund: $20, once.
3. gated, tier 3 (the service can neither dedupe nor answer): AMBIGUOUS, said out loud.

    python -m workers.demo            (what `make demo` runs)
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from interlock_temporal._render import render_entries, render_receipt
from interlock_temporal.core.receipts import receipt
from interlock_temporal.testing import DevServer

from .scenarios import ORDER, run_in
from .server_world import ServerWorld

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / ".demo"

ACTS: list[tuple[str, str, int, str]] = [
    ("naive", "naive", 2, "Temporal's retries, no gate"),
    ("gated-t2", "gated", 2, "the gate, against a service it can ask (tier 2)"),
    ("gated-t3", "gated", 3, "the gate, against a service that can neither dedupe nor answer"),
]


def say(text: str = "") -> None:
    print(text, flush=True)


def indent(text: str) -> str:
    return textwrap.indent(text, "    ")


async def act(client: Client, name: str, mode: str, tier: int, title: str) -> dict[str, Any]:
    workdir = DEMO / name
    workdir.mkdir(parents=True)
    say(f"== {title} ==")
    world = await ServerWorld.create(client, workdir, tier, mode)  # type: ignore[arg-type]
    result = await run_in(world, "crash_before_ack")
    payments_records = result["refund_records"]
    say(
        f"  the refund landed, then the worker was SIGKILLed ({result['kills']} kill); "
        "a freshly started worker took over"
    )
    say(
        f"  payments service: ${result['refunded_cents'] / 100:.0f} refunded on order #{ORDER} "
        f"in {payments_records} refund(s)"
    )
    if mode == "gated":
        from interlock_temporal.core.journal import open_journal

        journal_url = f"sqlite:///{(workdir / 'journal.db').relative_to(ROOT)}"
        with open_journal(workdir / "journal.db", create=False) as journal:
            eid = result["effect_id"]
            say("  journal:")
            say(indent(render_entries(journal.read(eid))))
            say("  receipt:")
            say(indent(render_receipt(receipt(eid, journal=journal))))
        say(f"  explore: .venv/bin/interlock --journal {journal_url} effects list")
    say(f"  ({result['elapsed_s']:.1f} s)")
    say()
    return result


async def main() -> int:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    server = await DevServer(db_file=DEMO / "temporal.db").start()
    say(f"Temporal dev server at {server.target}; Web UI at {server.ui_url}")
    say(__doc__.split("\n\n", 2)[1] if __doc__ else "")
    say()
    try:
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        results = [await act(client, *spec) for spec in ACTS]
        naive, gated2, gated3 = results
        say("== what happened ==")
        say(
            f"  naive:    ${naive['refunded_cents'] / 100:.0f} in {naive['refund_records']} "
            "refunds: the retry paid again"
        )
        say(
            f"  tier 2:   ${gated2['refunded_cents'] / 100:.0f}, {gated2['final']} via "
            f"{gated2['via']}: asked the service first, found it"
        )
        say(
            f"  tier 3:   ${gated3['refunded_cents'] / 100:.0f}, {gated3['final']}: nobody can "
            "know if it landed, so the gate refuses to guess"
        )
        say()
        say(
            "Browse the workflows in the Temporal Web UI: "
            f"{server.ui_url}/namespaces/default/workflows"
        )
        if sys.stdin.isatty():
            say("Press Enter to stop the server (the journals stay in .demo/).")
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        ok = (
            naive["refunded_cents"] == 4000
            and gated2["final"] == "COMMITTED"
            and gated2["refunded_cents"] == 2000
            and gated3["final"] == "AMBIGUOUS"
        )
        return 0 if ok else 1
    finally:
        await server.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
