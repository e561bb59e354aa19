"""A ledger app for the SQL target's tests: a credits table, the gated ``credit`` activity whose
body writes it through ``SqlTarget``, and a worker process that runs it and can SIGKILL itself
at a named gate point (``python -m tests.sql_app ADDRESS QUEUE JOURNAL_URL DB_URL TIER``, with
``KILL_AT``/``KILL_MARKER`` in the environment; prints ``READY`` once polling).

Everything the tests assert is read back from the database with SQL (``rows``) and from the
journal, never from the worker."""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from interlock_temporal import gated
from interlock_temporal.targets.sql import SqlTarget, SqlTransaction

SIGNING_KEY = "5a" * 32
PRINCIPAL = "ledger-bot"
CREDITS_DDL = (
    "CREATE TABLE IF NOT EXISTS credits (credit_id TEXT PRIMARY KEY, account TEXT NOT NULL, "
    "cents INTEGER NOT NULL CHECK (cents > 0))"
)


class Credit(BaseModel):
    credit_id: str
    account: str
    cents: int
    #: seconds the body sleeps between its two statements (the time-limit tests)
    linger_s: float = 0.0


class Credited(BaseModel):
    credit_id: str
    balance: int


def credit_body(tx: SqlTransaction, req: Credit) -> Credited:
    tx.execute(
        "INSERT INTO credits (credit_id, account, cents) VALUES (?, ?, ?)",
        (req.credit_id, req.account, req.cents),
    )
    if req.linger_s:
        if tx.dialect == "postgresql":
            tx.execute("SELECT pg_sleep(?)", (req.linger_s,))
        else:
            import time

            time.sleep(req.linger_s)
    row = tx.fetchone("SELECT SUM(cents) FROM credits WHERE account = ?", (req.account,))
    assert row is not None
    return Credited(credit_id=req.credit_id, balance=int(row[0]))


def credit_activity(target: SqlTarget) -> Any:
    """The gated activity ``credit`` on ``target`` (one per target: tests make their own)."""

    def credit(tx: SqlTransaction, req: Credit) -> Credited:
        return credit_body(tx, req)

    return activity.defn(name="credit")(
        gated(credit, target=target, key=lambda req: {"credit": req.credit_id})
    )


def create_credits(url: str) -> None:
    """The user's own table, in the target's database."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(url[len("sqlite:///") :])
        try:
            db.execute(CREDITS_DDL)
            db.commit()
        finally:
            db.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CREDITS_DDL)


def rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the target's database with SQL."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(url[len("sqlite:///") :])
        try:
            return [tuple(r) for r in db.execute(sql, params).fetchall()]
        finally:
            db.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql.replace("?", "%s"), params).fetchall()]  # type: ignore[arg-type]


async def main(address: str, queue: str, journal: str, database: str, tier: int) -> None:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    from interlock_temporal import InterlockPlugin
    from interlock_temporal.testing import kill_at

    from .server_workflows import CallActivity

    kill = os.environ.get("KILL_AT")
    marker = os.environ.get("KILL_MARKER")
    on_point = kill_at(kill, marker=Path(marker) if marker else None) if kill else None
    plugin = InterlockPlugin(journal, signing_key=SIGNING_KEY, on_point=on_point)
    client = await Client.connect(address, data_converter=pydantic_data_converter, plugins=[plugin])
    target = SqlTarget("ledger", database, tier=tier)
    async with Worker(
        client, task_queue=queue, workflows=[CallActivity], activities=[credit_activity(target)]
    ):
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("address", "queue", "journal", "database"):
        parser.add_argument(name)
    parser.add_argument("tier", type=int)
    a = parser.parse_args()
    asyncio.run(main(a.address, a.queue, a.journal, a.database, a.tier))


# -- a crash story: the worker SIGKILLs itself at a point, a fresh one finishes the effect ------


async def kill_story(
    client: Any, address: str, journal_url: str, point: str, workdir: Path, cwd: Path
) -> dict[str, Any]:
    """One effect on the journal's own database (tier 0): a worker that SIGKILLs itself at
    ``point``, then a fresh worker. What it returns is read from the database and the journal:
    whether the first worker died by SIGKILL, the rows and markers of the credit, the receipt's
    final state, the AMBIGUOUS entries and the effects in doubt."""
    import uuid

    from interlock_temporal import open_journal, receipt
    from interlock_temporal.core.identity import effect_id
    from interlock_temporal.testing import WorkerProcess

    from .server_workflows import CallActivity

    queue = f"sql-{uuid.uuid4().hex[:10]}"
    argv = ["-m", "tests.sql_app", address, queue, journal_url, journal_url, "0"]
    first = WorkerProcess(argv, env={"KILL_AT": point}, cwd=cwd)
    await first.start()
    req = Credit(credit_id=f"c-{uuid.uuid4().hex[:10]}", account="acct-k", cents=125)
    journal = open_journal(journal_url, signing_key=SIGNING_KEY)
    second = None
    try:
        lease_id = journal.leases.issue(PRINCIPAL, activities=["credit"])
        handle = await client.start_workflow(
            CallActivity.run,
            {
                "activity": "credit",
                "arg": req.model_dump(),
                "principal": PRINCIPAL,
                "lease": lease_id,
                "heartbeat_s": 1,
            },
            id=f"credit-{queue}",
            task_queue=queue,
        )
        await first.wait(60)
        second = await WorkerProcess(argv, env={"KILL_AT": ""}, cwd=cwd).start()
        result = await asyncio.wait_for(handle.result(), 60)
        eid = effect_id("credit", {"credit": req.credit_id})
        entries = journal.read(eid)
        found = receipt(eid, journal=journal) if entries else None
        return {
            "killed": first.killed,
            "result": result,
            "rows": len(
                rows(journal_url, "SELECT 1 FROM credits WHERE credit_id = ?", (req.credit_id,))
            ),
            "markers": len(
                rows(journal_url, "SELECT 1 FROM interlock_markers WHERE effect_id = ?", (eid,))
            ),
            "final": found.final if found else None,
            "executed": found.executed if found else None,
            "ambiguous": sum(e.kind.value == "AMBIGUOUS" for e in entries),
            "in_doubt": len(journal.in_doubt()),
            "credit_id": req.credit_id,
        }
    finally:
        journal.close()
        for worker in (first, second):
            if worker is not None:
                await worker.stop()
