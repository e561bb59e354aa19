"""The support case's refund told against the core gate, on either backend: the journal's
database (and a way to edit it below the journal, as its operator could), the payments service,
and the refund attempt by attempt, as the interceptor would call the gate."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.journal.entries import COMBINED_VERSION, PARTS
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Gate, Ticket
from interlock_temporal.targets.payments import RefundRequest, SimulatedPayments
from interlock_temporal.testing import PostgresServer
from workers.inprocess_world import refund_call
from workflows.support_case import CaseFile

ORDER = "o-9001"
KEY = "5a" * 32


class Store:
    """The journal's database, edited below the journal as its operator could."""

    def __init__(self, url: str, run: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]):
        self.url = url
        self._run = run

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        return self._run(statement, params)

    def entry(self, effect_id: str, kind: Kind) -> tuple[int, bytes, str | None]:
        """The stored entry that holds what an entry of ``kind`` records: its own, or the
        dispatch of format 3 (schema 14) that holds it as one of its parts (``data_path``)."""
        rows = self.sql(
            "SELECT seq, kind, body, vals FROM entries WHERE effect_id = ? ORDER BY seq",
            effect_id,
        )
        ((seq, body, vals),) = [
            (seq, bytes(body), vals)
            for seq, stored, body, vals in rows
            if stored == kind.value
            or (
                stored == "DISPATCHED"
                and kind.value in _PARTS
                and json.loads(bytes(body))["v"] == COMBINED_VERSION
            )
        ]
        return int(seq), body, vals


#: what a dispatch of format 3 holds, by the kind of the entry that held it before schema 14
_PARTS = {kind.value: part for kind, part in PARTS}


def data_path(body: bytes, kind: Kind) -> tuple[str, ...]:
    """Where, in the signed document ``body``, the data an entry of ``kind`` records is: its
    ``data``, or the part of a dispatch of format 3's."""
    if json.loads(body)["v"] == COMBINED_VERSION:
        return ("data", _PARTS[kind.value])
    return ("data",)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        path = tmp_path / "journal.db"

        def run_sqlite(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
            with closing(sqlite3.connect(path)) as db, db:
                return db.execute(statement, params).fetchall()

        yield Store(f"sqlite:///{path}", run_sqlite)
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    url = server.database(f"verified_{uuid.uuid4().hex[:8]}")

    def run_pg(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with psycopg.connect(url) as conn, conn.transaction():
            cursor = conn.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    yield Store(url, run_pg)


@pytest.fixture
def journal(store: Store) -> Iterator[Journal]:
    with open_journal(store.url, signing_key=KEY) as j:
        yield j


@pytest.fixture
def payments(tmp_path: Path) -> SimulatedPayments:
    service = SimulatedPayments(tmp_path / "payments.db", tier=2)
    service.open_order(ORDER, 10_000)
    return service


class Refund:
    """One support case's refund, attempt by attempt, as the interceptor would call the gate."""

    def __init__(
        self,
        journal: Journal,
        payments: SimulatedPayments,
        amount: int = 2_000,
        *,
        case_id: str = "c-77",
        lease: str | None = None,
    ):
        if lease is None:
            lease = journal.leases.issue(
                "refund-bot", activities=["refund"], max_amount_cents=5_000
            )
        self.case = CaseFile(case_id=case_id, order_id=ORDER, amount_cents=amount, lease_id=lease)
        self.request = RefundRequest(
            case_id=case_id,
            order_id=ORDER,
            amount_cents=amount,
            reason="damaged",
            premises=payments.order_facts(ORDER),
        )
        self.journal = journal
        self.payments = payments
        self.attempts = 0

    async def send(self, ticket: Ticket) -> Any:
        r = ticket.input
        return await self.payments.refund(
            r.order_id, r.amount_cents, idempotency_key=ticket.effect_id
        )

    def call(self, *, last: bool = False) -> Call:
        self.attempts += 1
        call = refund_call(self.request, self.case, f"wf-{self.case.case_id}", self.attempts)
        return call if not last else Call(**{**call.__dict__, "last_attempt": True})

    @property
    def effect_id(self) -> str:
        return Gate.identify(refund_call(self.request, self.case, "-", 1))[0]

    async def dies_before_send(self) -> str:
        ticket = await Gate(self.journal).begin(self.call(), self.payments)
        assert isinstance(ticket, Ticket)
        ticket.release()
        return ticket.effect_id

    async def run(self) -> Any:
        return await Gate(self.journal).run(self.call(), self.payments, self.send)
