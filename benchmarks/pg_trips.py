"""Round trips to PostgreSQL per new effect: ``Gate.run`` for new effects (figure 1's calls,
target and send) against a PostgreSQL journal, with libpq's protocol trace on every connection
the journal hands out (its pool and its claims' pool). A round trip is the client sending and
then waiting for the server's answer (``_tally``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import pq
from psycopg_pool import ConnectionPool

from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.protocol import Call, Gate

from .gate_cost import (
    LEASE_ID,
    ConstantSend,
    TrivialTarget,
    issue_bench_lease,
    make_call,
)

#: a lease like figure 1's, with a cumulative budget besides (its reservation is checked and
#: kept in the dispatch transaction)
BUDGET_LEASE_ID = "lease_bench_budget"


@dataclass(frozen=True)
class RoundTrips:
    effects: int
    #: round trips per new effect, under figure 1's lease (a cap per effect, no budget)
    per_effect: float
    #: statements per new effect (Execute and Query messages)
    statements: float
    #: round trips per new effect under a lease with a cumulative budget
    budgeted: float


@contextlib.contextmanager
def _traced(directory: Path) -> Iterator[list[Path]]:
    """Trace every connection a pool hands out while the block runs, each to a file of its
    own; yields the files (read them after the block)."""
    files: list[Path] = []
    traced: set[int] = set()
    original = ConnectionPool.getconn

    def getconn(self: ConnectionPool[Any], timeout: float | None = None) -> Any:
        conn = original(self, timeout)
        if id(conn) not in traced:
            traced.add(id(conn))
            path = directory / f"trace-{len(files)}.txt"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            conn.pgconn.trace(fd)
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            files.append(path)
            opened.append(conn)
        return conn

    opened: list[Any] = []
    ConnectionPool.getconn = getconn  # type: ignore[method-assign]
    try:
        yield files
    finally:
        ConnectionPool.getconn = original  # type: ignore[method-assign]
        for conn in opened:
            with contextlib.suppress(Exception):
                conn.pgconn.untrace()


def _tally(files: list[Path]) -> tuple[int, int]:
    """(round trips, statements) over every trace file. A round trip is a run
    of messages the client sent followed by the server's answer: each time the trace turns
    from frontend (F) to backend (B) lines, the client waited for the server. Statements are
    ``Execute`` and simple ``Query`` messages."""
    trips = statements = 0
    for path in files:
        previous = ""
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) < 3 or parts[0] not in ("F", "B"):
                continue
            if parts[0] == "B" and previous == "F":
                trips += 1
            previous = parts[0]
            if parts[0] == "F" and parts[2] in ("Execute", "Query"):
                statements += 1
    return trips, statements


async def _count(journal: Journal, n: int, warmup: int, lease_id: str) -> tuple[float, float]:
    """(round trips, statements) per new effect under ``lease_id``."""
    gate = Gate(journal)
    target, send = TrivialTarget(), ConstantSend()

    def call(prefix: str, i: int) -> Call:
        return dataclasses.replace(make_call(f"{prefix}-{lease_id}", i), lease_id=lease_id)

    for i in range(warmup):  # statements prepared, pools filled
        await gate.run(call("trips-warm", i), target, send)
    with tempfile.TemporaryDirectory(prefix="interlock-trips-") as tmp, _traced(Path(tmp)) as files:
        for i in range(n):
            await gate.run(call("trips", i), target, send)
        trips, statements = _tally(files)
    return trips / n, statements / n


async def count(url: str, key: str, n: int = 50, warmup: int = 10) -> RoundTrips:
    """Round trips per new effect through ``Gate.run`` against the PostgreSQL journal at
    ``url``, under figure 1's lease and under one with a cumulative budget."""
    journal = open_journal(url, signing_key=key)
    try:
        for lease_id, budget in ((LEASE_ID, None), (BUDGET_LEASE_ID, 10**12)):
            if journal.leases.get(lease_id) is None:
                issue_bench_lease(journal.leases, lease_id=lease_id, budget_cents=budget)
        trips, statements = await _count(journal, n, warmup, LEASE_ID)
        budgeted, _ = await _count(journal, n, warmup, BUDGET_LEASE_ID)
    finally:
        journal.close()
    return RoundTrips(effects=n, per_effect=trips, statements=statements, budgeted=budgeted)


if __name__ == "__main__":
    from interlock_temporal.testing import PostgresServer

    server = PostgresServer().start()
    try:
        print(asyncio.run(count(server.database("trips"), "42" * 32)))
    finally:
        server.close()
