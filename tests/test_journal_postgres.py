"""The journal conformance suite against PostgreSQL (a throwaway cluster on loopback), and what
only PostgreSQL does: claims as advisory locks that die with their connection."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest

from interlock_temporal.core.errors import InFlight
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.journal.postgres import _MIGRATIONS, PostgresJournal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Done, Gate, Ticket
from interlock_temporal.testing import PostgresServer

from .journal_conformance import KEY, JournalConformance, SqlTamper, schema3_rows
from .test_protocol import ACTIVITY, LEASE_MAX, PRINCIPAL, MemTarget, eid_of, make_call

TABLES = (
    "entries, effects, leases, policy_sessions, policy_spend, policy_admissions, "
    "policy_approvals, lease_spend, notification_failures"
)


@pytest.fixture(scope="module")
def pg_url(postgres: PostgresServer) -> str:
    return postgres.database(f"conformance_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def clean(pg_url: str) -> str:
    """The module's database with its tables emptied (created by a first open)."""
    open_journal(pg_url, signing_key=KEY, check_tail=False).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLES}")  # type: ignore[arg-type]
        conn.execute("DELETE FROM meta WHERE key = 'effect_ids'")
        conn.execute("UPDATE journal_seq SET seq = 0")
        # a test that plays an operator who dropped it (the index of successors) left it so
        conn.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS entries_next ON entries (prev_seq) "
            "WHERE prev_seq IS NOT NULL"
        )
    return pg_url


class PgTamper(SqlTamper):
    def __init__(self, url: str) -> None:
        self.url = url

    def _run(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        with psycopg.connect(self.url) as conn, conn.transaction():
            for sql, params in statements:
                conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()  # type: ignore[arg-type]

    def _tables(self) -> list[str]:
        rows = self._query(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'public' ORDER BY table_name"
        )
        return [r[0] for r in rows]

    def load_schema3(self) -> None:
        """The previous release's schema (its first three migrations) and the fixture's rows."""
        with psycopg.connect(self.url) as conn, conn.transaction():
            for table in self._tables():
                conn.execute(f"DROP TABLE {table} CASCADE")  # type: ignore[arg-type]
            for migration in _MIGRATIONS[:3]:
                for statement in migration.split(";"):
                    if statement.strip():
                        conn.execute(statement)  # type: ignore[arg-type]
            conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '3')")
            for table, (columns, rows) in schema3_rows().items():
                marks = ", ".join(["%s"] * len(columns))
                sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
                for row in rows:
                    conn.execute(sql, row)  # type: ignore[arg-type]
            conn.execute("UPDATE journal_seq SET seq = (SELECT MAX(seq) FROM entries)")


class TestPostgresJournal(JournalConformance):
    @pytest.fixture
    def journal_factory(self, clean: str) -> Callable[..., Journal]:
        def factory(
            signing_key: str | None = KEY, older_keys: Sequence[str] = (), **options: Any
        ) -> Journal:
            return open_journal(clean, signing_key=signing_key, older_keys=older_keys, **options)

        return factory

    @pytest.fixture
    def tamper(self, clean: str) -> PgTamper:
        return PgTamper(clean)


class TestPostgresJournalEd25519(TestPostgresJournal):
    key_scheme = "ed25519"


@pytest.fixture
def journal(clean: str) -> Iterator[Journal]:
    j = open_journal(clean, signing_key=KEY)
    yield j
    j.close()


def test_a_claim_dies_with_its_connection(journal: Journal, clean: str) -> None:
    assert isinstance(journal, PostgresJournal)
    eid = "c" * 64
    claim = journal.claim(eid)
    assert claim is not None and journal.is_claimed(eid)
    with open_journal(clean, signing_key=KEY) as other:
        assert other.claim(eid) is None  # held, by another connection
        # the holder's connection dies (its host vanished): the server frees the lock
        with psycopg.connect(clean, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND granted AND pid <> pg_backend_pid()"
            )
        # the server ends the backend a moment after it is told to: the claim frees with it
        deadline = time.monotonic() + 10
        while (taken := other.claim(eid)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert taken is not None
        taken.release()
    claim.release()  # the dead holder's release is harmless


def test_the_password_never_appears_in_messages(postgres: PostgresServer) -> None:
    from interlock_temporal.core.errors import JournalUnavailable

    url = f"postgresql://postgres:hunter2@127.0.0.1:{postgres.port + 1}/none"
    with pytest.raises(JournalUnavailable) as caught:
        open_journal(url, signing_key=KEY)
    assert "hunter2" not in str(caught.value) and "***" in str(caught.value)


def test_a_postgres_journal_needs_a_configured_key(
    clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlock_temporal.core.errors import JournalConfigError

    monkeypatch.delenv("INTERLOCK_SIGNING_KEY", raising=False)
    with pytest.raises(JournalConfigError, match="INTERLOCK_SIGNING_KEY"):
        open_journal(clean)


# -- the gate on PostgreSQL: the claim taken, and the effect read, off the worker's loop --------


async def test_the_claim_is_held_through_the_send_and_free_when_the_commit_returns(
    journal: Journal, clean: str
) -> None:
    lease = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], max_amount_cents=LEASE_MAX)
    target, call = MemTarget(), make_call(lease)
    eid = eid_of(call)
    with open_journal(clean, signing_key=KEY) as other:
        ticket = await Gate(journal).begin(call, target)
        assert isinstance(ticket, Ticket)
        held: list[bool] = []

        async def send(t: Ticket) -> Any:
            held.append(other.is_claimed(eid) and other.claim(eid) is None)
            with pytest.raises(InFlight):  # another attempt, on another worker, meanwhile
                await Gate(other).begin(call, target)
            return await target.send(t)

        await Gate(journal).commit(ticket, await send(ticket))
        assert held == [True]
        # released before the commit returned, not some time after
        assert not other.is_claimed(eid)
        again = await Gate(other).begin(call, target)
        assert isinstance(again, Done) and again.via == "duplicate"
        assert not other.is_claimed(eid) and not journal.is_claimed(eid)
    assert target.sends == 1


async def test_two_concurrent_first_attempts_on_two_workers_get_one_ticket(
    journal: Journal, clean: str
) -> None:
    lease = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], max_amount_cents=LEASE_MAX)
    target, call = MemTarget(), make_call(lease)
    with open_journal(clean, signing_key=KEY) as other:
        outcomes = await asyncio.gather(
            *(Gate(j).begin(call, target) for j in (journal, other) for _ in range(4)),
            return_exceptions=True,
        )
        tickets = [o for o in outcomes if isinstance(o, Ticket)]
        assert len(tickets) == 1 and all(
            isinstance(o, InFlight) for o in outcomes if o is not tickets[0]
        ), outcomes
        gate = Gate(journal if outcomes.index(tickets[0]) < 4 else other)
        await gate.commit(tickets[0], await target.send(tickets[0]))
    assert [e.kind for e in journal.read(eid_of(call))].count(Kind.DISPATCHED) == 1
    assert target.sends == 1 and not journal.is_claimed(eid_of(call))
