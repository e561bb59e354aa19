"""The tier-0 kill matrix (``make faults``): an effect on the journal's own database, SQLite and
PostgreSQL, a worker process that SIGKILLs itself at each point of the effect's one transaction,
several times over, then a fresh worker. Every cell reads the credits table and the markers with
SQL, and the receipt from the journal: exactly one row, never AMBIGUOUS, nothing left in doubt.

Writes ``docs/fault-table-sql.md`` (the counts docs/targets.md cites)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from interlock_temporal import open_journal
from interlock_temporal.testing import DevServer, PostgresServer

from .sql_app import SIGNING_KEY, create_credits, kill_story
from .test_target_sql import KILL_POINTS

pytestmark = [pytest.mark.server, pytest.mark.faults]

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "fault-table-sql.md"
REPETITIONS = 4
#: stories run at once (each has two worker processes, one after the other)
AT_ONCE = 4


async def test_tier_zero_kill_matrix(
    dev_server: DevServer, client: Client, tmp_path: Path, postgres: PostgresServer
) -> None:
    journals = {
        "SQLite": f"sqlite:///{tmp_path / 'journal.db'}",
        "PostgreSQL": postgres.database(f"sqlkills_{uuid.uuid4().hex[:8]}"),
    }
    for url in journals.values():
        open_journal(url, signing_key=SIGNING_KEY).close()
        create_credits(url)
    cells = [
        (backend, point)
        for _ in range(REPETITIONS)
        for backend in journals
        for point in KILL_POINTS
    ]
    started = time.monotonic()
    stories: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(0, len(cells), AT_ONCE):
        batch = cells[i : i + AT_ONCE]
        done = await asyncio.gather(
            *(
                kill_story(client, dev_server.target, journals[b], p, tmp_path, ROOT)
                for b, p in batch
            )
        )
        stories += [(b, p, s) for (b, p), s in zip(batch, done, strict=True)]
    took = time.monotonic() - started
    tally: dict[tuple[str, str], Counter[str]] = {}
    for backend, point, story in stories:
        c = tally.setdefault((backend, point), Counter())
        c["runs"] += 1
        c["kills"] += bool(story["killed"])
        c["committed"] += story["final"] == "COMMITTED" and story["executed"] is True
        c["ambiguous"] += story["ambiguous"] + (story["final"] == "AMBIGUOUS")
        c["duplicates"] += story["rows"] > 1 or story["markers"] > 1
        c["lost"] += story["rows"] == 0
        c["in_doubt"] += story["in_doubt"]
    total = sum(tally.values(), Counter())
    write_table(tally, total, took)
    assert total["kills"] == len(cells) >= 30
    assert total["committed"] == len(cells)
    assert (total["ambiguous"], total["duplicates"], total["lost"], total["in_doubt"]) == (0,) * 4


def write_table(
    tally: dict[tuple[str, str], Counter[str]], total: Counter[str], took: float
) -> None:
    lines = [
        "# Tier 0: the kill matrix",
        "",
        "Written by `tests/test_target_sql_faults.py` (`make faults`). An `SqlTarget` with "
        "`tier=0` on the journal's own database: the worker process running the `credit` "
        "activity SIGKILLs itself at a point of the effect's one transaction, then a fresh "
        "worker takes the retry. Each cell reads the credits table and the marker table with "
        "SQL, and the receipt from the journal.",
        "",
        "| journal | killed at | kills | COMMITTED | AMBIGUOUS | duplicate rows | lost "
        "| in doubt after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (backend, point), c in tally.items():
        lines.append(
            f"| {backend} | `{point}` | {c['kills']} | {c['committed']} | {c['ambiguous']} | "
            f"{c['duplicates']} | {c['lost']} | {c['in_doubt']} |"
        )
    lines += [
        "",
        f"Total: {total['kills']} real SIGKILLs, {total['committed']} effects COMMITTED with "
        f"exactly one row, {total['ambiguous']} AMBIGUOUS, {total['duplicates']} duplicate rows, "
        f"{total['lost']} lost, {total['in_doubt']} left in doubt ({took:.0f} s, {AT_ONCE} "
        "stories at a time).",
        "",
    ]
    OUT.write_text("\n".join(lines))
