"""The journal for workers on many hosts: PostgreSQL through psycopg 3, the same tables and
semantics as the SQLite journal.

- Appends are serialized by one counter row (``journal_seq``, locked ``FOR UPDATE``), so seqs
  are dense and in commit order, as a single SQLite writer makes them.
- The policy's state locks only its own rows (its session, the spend it charges, the approval
  it reads) and takes the counter last, when it has a note to sign: checks of different
  sessions do not wait for each other.
- Claims are session advisory locks, held on a connection of their own for as long as the
  attempt runs: the server releases them the moment that connection dies. TCP keepalives are
  set short in the connection string (unless it sets them), so the connection of a host that
  vanished dies within seconds, not hours.
- Every session sets ``synchronous_commit = on``; a server with ``fsync = off``, or a pooling
  proxy in transaction mode under the connections, is refused when the journal opens, and
  asynchronous standbys are warned about (``pg_server``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from ..errors import JournalUnavailable
from ..extras import needs_extra
from ..models import Entry
from .claims import Claim
from .entries import ENTRY_COLUMNS, RawEntry, decode_entries, raw_entry
from .interface import SCHEMA_VERSION, redacted
from .pg_server import (
    POOLER_FIX,
    backend_pid,
    check_durability,
    check_sessions,
    configure_session,
    journal_options,
    warn_async_standbys,
)
from .signing import Keyring
from .sql import (
    APPEND_ROW,
    HEAD_ENTRY,
    PUT_ROW,
    READ_EFFECT_PARAMS,
    READ_EFFECT_SQL,
    AppendReads,
    SqlJournal,
)
from .sql_leases import LEASE_COLUMNS, LEASE_LATERALS, LEASE_WIDTH, held_in, own_cents
from .verify_jobs import NO_END, RANGE_ROWS, STRAY_ROWS
from .verifying import read_ahead

with needs_extra("postgres", "a PostgreSQL journal (postgresql://)"):
    import psycopg
    import psycopg.errors
    from psycopg_pool import ConnectionPool, PoolTimeout

T = TypeVar("T")

#: the server notices a silent peer after about idle + interval * count seconds
KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
    "connect_timeout": "5",
}
#: how long an operation waits for a connection before the journal counts as unavailable
ACQUIRE_TIMEOUT_S = 5.0
#: one lock id for the schema migration, across every worker
_MIGRATION_LOCK = 0x1A7E_10C6
_TRY_LOCK = "SELECT pg_try_advisory_lock(%s), pg_backend_pid()"

_MIGRATIONS: list[str] = [
    # 1: entries, the effect index, values beside entries, leases, the append counter
    """
    CREATE TABLE entries (
        seq       BIGINT PRIMARY KEY,
        effect_id TEXT NOT NULL,
        kind      TEXT NOT NULL,
        prev      TEXT NOT NULL,
        hash      TEXT NOT NULL,
        key_id    TEXT NOT NULL,
        sig       TEXT NOT NULL,
        body      BYTEA NOT NULL
    );
    CREATE UNIQUE INDEX entries_chain ON entries (effect_id, substr(prev, 1, 16));
    CREATE TABLE effects (
        effect_id         TEXT PRIMARY KEY,
        effect_type       TEXT NOT NULL,
        status            TEXT NOT NULL,
        head              TEXT NOT NULL,
        head_seq          BIGINT NOT NULL,
        updated_ts        DOUBLE PRECISION NOT NULL,
        first_dispatch_ts DOUBLE PRECISION,
        last_dispatch_ts  DOUBLE PRECISION
    );
    CREATE INDEX effects_in_doubt ON effects (last_dispatch_ts) WHERE status = 'DISPATCHED';
    CREATE TABLE blobs (
        effect_id TEXT NOT NULL,
        name      TEXT NOT NULL,
        value     TEXT NOT NULL,
        PRIMARY KEY (effect_id, name)
    );
    CREATE TABLE leases (
        lease_id TEXT PRIMARY KEY,
        doc      TEXT NOT NULL
    );
    CREATE TABLE journal_seq (
        id  INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL
    );
    INSERT INTO journal_seq (id, seq) VALUES (1, 0);
    """,
    # 2: the policy layer's shared state
    """
    CREATE TABLE policy_sessions (
        session TEXT PRIMARY KEY,
        doc     TEXT NOT NULL
    );
    CREATE TABLE policy_spend (
        scope     TEXT PRIMARY KEY,
        spent_usd DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE policy_admissions (
        execution    TEXT PRIMARY KEY,
        session      TEXT NOT NULL,
        principal    TEXT NOT NULL,
        namespace    TEXT NOT NULL,
        estimate_usd DOUBLE PRECISION NOT NULL,
        actual_usd   DOUBLE PRECISION,
        ts           DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE policy_approvals (
        binding TEXT PRIMARY KEY,
        doc     TEXT NOT NULL
    );
    """,
    # 3: values move into the entries they were appended with (as in the embedded journal)
    """
    ALTER TABLE entries ADD COLUMN vals TEXT;
    UPDATE entries SET vals = b.obj
    FROM (
        SELECT effect_id, json_object_agg(name, value::json)::text AS obj
        FROM blobs GROUP BY effect_id
    ) b, effects f
    WHERE f.effect_id = b.effect_id AND entries.seq = f.head_seq;
    DROP TABLE blobs;
    """,
    # 4: signed values, an effect's origin, lease budgets (as in the embedded journal)
    """
    ALTER TABLE effects ADD COLUMN origin TEXT;
    CREATE INDEX effects_origin ON effects (origin) WHERE origin IS NOT NULL;
    CREATE TABLE lease_spend (
        lease_id       TEXT PRIMARY KEY,
        reserved_cents BIGINT NOT NULL
    );
    CREATE TABLE lease_charges (
        effect_id TEXT PRIMARY KEY,
        lease_id  TEXT NOT NULL,
        cents     BIGINT NOT NULL,
        active    INTEGER NOT NULL
    );
    """,
    # 5: every delivery (nonce) a session allowed (as in the embedded journal). A session's
    # document holds the escape \u0000 (in its last call's signature), which PostgreSQL's JSON
    # functions refuse: it is dropped from the text that is read here (never from the document)
    """
    CREATE TABLE policy_nonces (
        session TEXT NOT NULL,
        nonce   TEXT NOT NULL,
        PRIMARY KEY (session, nonce)
    );
    INSERT INTO policy_nonces (session, nonce)
        SELECT s.session, d.nonce
        FROM policy_sessions s,
             json_array_elements_text(replace(s.doc, '\\u0000', '')::json -> 'deliveries')
                 AS d(nonce)
        WHERE json_typeof(replace(s.doc, '\\u0000', '')::json -> 'deliveries') = 'array'
        ON CONFLICT DO NOTHING;
    """,
    # 6 (retention): archives of effects in a final state leave signed anchors (kind ANCHOR)
    # in the journal; verify reads them first, through this index (a partial one: appends of
    # other kinds never write it). It also keeps a release that cannot read archives from
    # opening an archived journal (it would take the archived seqs for missing entries).
    """
    CREATE INDEX IF NOT EXISTS entries_anchors ON entries (seq) WHERE kind = 'ANCHOR';
    """,
    # 7: notifications that failed to reach people (as in the embedded journal)
    """
    CREATE TABLE IF NOT EXISTS notification_failures (
        id        BIGSERIAL PRIMARY KEY,
        notifier  TEXT NOT NULL,
        review_id TEXT NOT NULL,
        event     TEXT NOT NULL,
        attempt   INTEGER NOT NULL,
        error     TEXT NOT NULL,
        ts        DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX IF NOT EXISTS notification_failures_ts ON notification_failures (ts);
    """,
    # 8: an effect's lease charge moves onto its index row (as in the embedded journal)
    """
    ALTER TABLE effects ADD COLUMN charge_lease_id TEXT;
    ALTER TABLE effects ADD COLUMN charge_cents BIGINT;
    ALTER TABLE effects ADD COLUMN charge_active INTEGER;
    UPDATE effects SET charge_lease_id = c.lease_id, charge_cents = c.cents,
        charge_active = c.active
    FROM lease_charges c WHERE c.effect_id = effects.effect_id;
    DROP TABLE lease_charges;
    """,
    # 9: one-time codes (as in the embedded journal)
    """
    CREATE TABLE IF NOT EXISTS vote_codes (
        episode  TEXT NOT NULL,
        operator TEXT NOT NULL,
        failures INTEGER NOT NULL,
        used     TEXT,
        PRIMARY KEY (episode, operator)
    );
    CREATE UNIQUE INDEX IF NOT EXISTS vote_codes_used ON vote_codes (used) WHERE used IS NOT NULL;
    """,
    # 10: a lease's row is the product of its signed chain, sealed with the chain's head, and
    # what its budget has reserved is sealed (``row_seals``); the rows as they stand are signed
    # by the migration (``SqlJournal._seal_leases``)
    """
    ALTER TABLE leases ADD COLUMN head_seq BIGINT;
    ALTER TABLE leases ADD COLUMN head_hash TEXT;
    ALTER TABLE leases ADD COLUMN seal TEXT;
    ALTER TABLE lease_spend ADD COLUMN seal TEXT;
    """,
    # 11: the policy's rows are sealed (``row_seals``): a session's with its policy chain's
    # head; the rows as they stand are sealed by the migration (``SqlPolicy.seal_rows_tx``)
    """
    ALTER TABLE policy_sessions ADD COLUMN head TEXT;
    ALTER TABLE policy_sessions ADD COLUMN seal TEXT;
    ALTER TABLE policy_spend ADD COLUMN seal TEXT;
    ALTER TABLE policy_admissions ADD COLUMN seal TEXT;
    ALTER TABLE policy_approvals ADD COLUMN seal TEXT;
    """,
    # 12: flow marks (as in the embedded journal)
    """
    CREATE TABLE IF NOT EXISTS flow_marks (
        scope TEXT NOT NULL,
        fp    TEXT NOT NULL,
        label TEXT NOT NULL,
        ts    DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, fp, label)
    );
    CREATE INDEX IF NOT EXISTS flow_marks_age ON flow_marks (scope, ts);
    """,
    # 13: reads walk an effect's chain back from its row's head along each entry's
    # ``prev_seq``, the index of entries by (effect, prev) goes for one of each entry's
    # successor by seq, and the index of origins keeps 16 hex digits of each (as in the
    # embedded journal)
    """
    ALTER TABLE entries ADD COLUMN prev_seq BIGINT;
    UPDATE entries SET prev_seq = l.p
    FROM (
        SELECT seq, CASE WHEN prev = LAG(hash) OVER w THEN LAG(seq) OVER w END AS p
        FROM entries WINDOW w AS (PARTITION BY effect_id ORDER BY seq)
    ) l
    WHERE l.seq = entries.seq AND l.p IS NOT NULL;
    CREATE UNIQUE INDEX entries_next ON entries (prev_seq) WHERE prev_seq IS NOT NULL;
    DROP INDEX IF EXISTS entries_chain;
    DROP INDEX IF EXISTS effects_origin;
    CREATE INDEX effects_origin ON effects (substr(origin, 1, 16)) WHERE origin IS NOT NULL;
    """,
    # 14: dispatch transactions written as one entry of format 3 (as in the embedded journal)
    "",
]
assert len(_MIGRATIONS) == SCHEMA_VERSION


def with_keepalives(url: str) -> str:
    """``url`` with short TCP keepalives (and a connect timeout) unless it sets its own."""
    parsed = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    for key, value in KEEPALIVES.items():
        query.setdefault(key, value)
    return urlunparse(parsed._replace(query=urlencode(query)))


def lock_key(effect_id: str) -> int:
    """The advisory lock's 64-bit key for an effect id."""
    return int.from_bytes(hashlib.sha256(effect_id.encode()).digest()[:8], "big", signed=True)


class _PgClaim:
    """A session advisory lock, and the connection that holds it."""

    def __init__(
        self, claims: _PgClaims, conn: psycopg.Connection[Any], key: int, effect_id: str
    ) -> None:
        self.effect_id = effect_id
        self._claims = claims
        self._conn: psycopg.Connection[Any] | None = conn
        self._key = key

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._claims.count(-1)
        try:
            conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
        except psycopg.Error:
            conn.close()  # a broken connection holds no lock any more
        self._claims.pool.putconn(conn)


class SessionMoved(psycopg.OperationalError):
    """The claim connection's server session is not the one it started with."""


class _PgClaims:
    def __init__(self, conninfo: str) -> None:
        # a claim holds its connection for the whole send: as many as attempts in flight
        self.pool = ConnectionPool(
            conninfo,
            min_size=0,
            max_size=256,
            kwargs={"autocommit": True},
            configure=self._configure,
            timeout=ACQUIRE_TIMEOUT_S,
            open=True,
            name="interlock-claims",
        )
        self._held = 0
        self._lock = threading.Lock()
        #: each connection's server session, as it was when the connection was opened
        self._pids: weakref.WeakKeyDictionary[psycopg.Connection[Any], int] = (
            weakref.WeakKeyDictionary()
        )

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        configure_session(conn)
        self._pids[conn] = backend_pid(conn)

    def count(self, change: int) -> None:
        with self._lock:
            self._held += change

    def held(self) -> int:
        return self._held

    def try_claim(
        self, effect_id: str, then: tuple[str, Sequence[Any]] | None = None
    ) -> tuple[_PgClaim | None, list[Any] | None]:
        """The effect's claim (None while another session holds it); with ``then``, a query
        sent in the same round trip, run once the lock is granted, and its rows (None when the
        lock was not granted)."""
        key = lock_key(effect_id)
        conn = self.pool.getconn()
        rows: list[Any] | None = None
        try:
            if then is None:
                row = conn.execute(_TRY_LOCK, (key,)).fetchone()
            else:
                with conn.pipeline():
                    locked = conn.execute(_TRY_LOCK, (key,))
                    asked = conn.execute(then[0], then[1])
                row = locked.fetchone()
                rows = asked.fetchall()
        except BaseException:
            conn.close()  # the lock may have been granted: a closed connection holds none
            self.pool.putconn(conn)
            raise
        if row is not None and row[1] != self._pids.get(conn):
            # the lock went to another server session than this connection's: a pool in
            # transaction mode; this connection is not used again
            conn.close()
            self.pool.putconn(conn)
            raise SessionMoved(
                "the claim connection's server session changed between statements (a "
                f"pooling proxy in transaction mode): {POOLER_FIX}"
            )
        if row is None or not row[0]:
            self.pool.putconn(conn)
            return None, None
        self.count(1)
        return _PgClaim(self, conn, key, effect_id), rows

    def close(self) -> None:
        self.pool.close()


def _failed_on_the_server(conn: psycopg.Connection[Any], err: BaseException) -> bool:
    """Whether a statement of ``conn``'s transaction failed: it is in error, or ``err`` is (or
    comes from) an error of the database."""
    status = conn.info.transaction_status
    if status in (psycopg.pq.TransactionStatus.INERROR, psycopg.pq.TransactionStatus.UNKNOWN):
        return True
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, psycopg.Error):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


#: the dispatch transaction's read after the seq's: the effect's row (NULLs for a new one) and
#: its lease with what the lease's budget has reserved, locked in that order till the end
_ROW_AND_LEASE = (
    "SELECT "
    + ", ".join(f"f.{c.strip()}" for c in APPEND_ROW.split(","))
    + f", {HEAD_ENTRY.format('f')}, {LEASE_COLUMNS} FROM (SELECT 1) one LEFT JOIN LATERAL "
    f"(SELECT {APPEND_ROW} FROM effects WHERE effect_id = ? FOR UPDATE) f ON true" + LEASE_LATERALS
).replace("?", "%s")
_ROW = (
    f"SELECT {APPEND_ROW}, {HEAD_ENTRY.format('effects')} FROM effects "
    "WHERE effect_id = %s FOR UPDATE"
)


@functools.lru_cache(maxsize=16)
def _store_sql(entries: int) -> str:
    """``PostgresJournal._store``'s statement for an append of ``entries`` entries."""
    one = "(" + ", ".join(["%s"] * (len(ENTRY_COLUMNS.split(",")) + 1)) + ")"
    return (
        "WITH advanced AS (UPDATE journal_seq SET seq = %s WHERE id = 1), "
        f"appended AS (INSERT INTO entries ({ENTRY_COLUMNS}, prev_seq) VALUES "
        + ", ".join([one] * entries)
        + ") "
        + PUT_ROW.replace("?", "%s")
    )


@dataclass(frozen=True)
class PgEntries:
    """Where ``verify`` reads a PostgreSQL journal's entries from (``verify_jobs.EntrySource``):
    its connection string."""

    conninfo: str

    def batches(self, start: int = 1, stop: int | None = None) -> Iterator[Iterable[Sequence[Any]]]:
        # the server reads the next batch while this process checks the last one
        return read_ahead(lambda: self._fetch(start, stop))

    def _fetch(self, start: int, stop: int | None) -> Iterator[Sequence[Sequence[Any]]]:
        # its own connection and a server-side cursor: a long verify holds no pooled connection
        with psycopg.connect(self.conninfo) as conn, conn.cursor(name="interlock_verify") as cur:
            cur.execute(
                f"SELECT {ENTRY_COLUMNS} FROM entries WHERE seq >= %s AND seq < %s ORDER BY seq",
                (start, NO_END if stop is None else stop),
            )
            while batch := cur.fetchmany(4096):
                yield batch

    def rows(self, heads: tuple[int, int | None] | None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.conninfo) as conn:
            if heads is None:
                return conn.execute(STRAY_ROWS.replace("?", "%s"), (NO_END,)).fetchall()
            start, stop = heads
            sql = RANGE_ROWS.replace("?", "%s")
            return conn.execute(sql, (start, NO_END if stop is None else stop)).fetchall()


class PostgresJournal(SqlJournal):
    GREATEST = "GREATEST"
    FOR_UPDATE = " FOR UPDATE"
    JSON_TEXTS = "jsonb_array_elements_text(?::jsonb) AS {0}(value)"
    MIGRATIONS = _MIGRATIONS
    PIPELINES = True
    _pool: ConnectionPool[Any]
    _claims: _PgClaims

    def __init__(
        self,
        url: str,
        keyring: Keyring,
        *,
        check_tail: bool = True,
        pool_size: int = 16,
    ) -> None:
        super().__init__()
        self.url = redacted(url)
        self.keyring = keyring
        #: the pipeline of each connection a pipelined transaction runs on
        self._pipelines: weakref.WeakKeyDictionary[psycopg.Connection[Any], psycopg.Pipeline] = (
            weakref.WeakKeyDictionary()
        )
        plain_url, allow_unsafe = journal_options(url.replace("postgres://", "postgresql://", 1))
        self._conninfo = with_keepalives(plain_url)

        def connect() -> None:
            # one direct connection first: a server that refuses fails now, not after the
            # pool's patient retries; and a server that would lose acknowledged entries is
            # refused before anything is written to it
            with psycopg.connect(self._conninfo, autocommit=True) as first:
                check_durability(first, self.url, allow_unsafe=allow_unsafe)
                warn_async_standbys(first, self.url)
            self._pool = self._opened(
                ConnectionPool(
                    self._conninfo,
                    min_size=1,
                    max_size=pool_size,
                    kwargs={"autocommit": True},
                    configure=configure_session,
                    timeout=ACQUIRE_TIMEOUT_S,
                    open=False,
                    name="interlock-journal",
                )
            )
            self._pool.open(wait=True, timeout=ACQUIRE_TIMEOUT_S)
            self._claims = self._opened(_PgClaims(self._conninfo))
            check_sessions(self._claims.pool.connection, self.url)
            self._migrate()

        self._open(connect, check_tail=check_tail)

    def _exclusively(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            return fn(conn)

    # -- transactions ------------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def writing(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        return self._transaction(fn, pipelined=False)

    def _write_appends(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Appends in pipeline mode: a statement whose result is not read yet is sent without
        waiting for the server, so the writes of an append go in one round trip, with the next
        read (or ``_drain``)."""
        return self._transaction(fn, pipelined=True)

    def _transaction(self, fn: Callable[[psycopg.Connection[Any]], T], *, pipelined: bool) -> T:
        for attempt in range(5):
            try:
                with self._pool.connection() as conn:
                    if pipelined:
                        return self._pipelined(conn, fn)
                    with conn.transaction():
                        return fn(conn)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                time.sleep(0.01 * (attempt + 1))  # rare: retry the whole transaction
            except psycopg.IntegrityError:
                raise
            except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as err:
                raise JournalUnavailable(f"journal {self.url} cannot be written: {err}") from err
        raise JournalUnavailable(f"journal {self.url}: a transaction kept deadlocking")

    def _pipelined(
        self, conn: psycopg.Connection[Any], fn: Callable[[psycopg.Connection[Any]], T]
    ) -> T:
        """``fn(conn)`` in one transaction in pipeline mode: BEGIN goes with the first
        statements, COMMIT with the last ones (psycopg's transaction block would wait for each
        of them); rolled back if anything in it fails. Statements are prepared here as
        everywhere else (the server plans each once per connection, not once per append), and
        a connection on which a statement failed is closed, not rolled back: a statement's
        Parse queued behind the one that failed was skipped by the server, yet psycopg may
        count it prepared, and every later use would fail ("prepared statement does not
        exist")."""
        try:
            with conn.pipeline() as pipeline:
                self._pipelines[conn] = pipeline
                conn.execute("BEGIN")
                result = fn(conn)
                conn.execute("COMMIT")
            return result
        except BaseException as err:
            if _failed_on_the_server(conn, err):
                conn.close()  # the pool drops it
            elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):  # a broken connection: the pool drops it
                    conn.execute("ROLLBACK")
            raise
        finally:
            self._pipelines.pop(conn, None)

    def reading(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        try:
            with self._pool.connection() as conn:
                return fn(conn)
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as err:
            raise JournalUnavailable(f"journal {self.url} cannot be read: {err}") from err

    def hold_seq(self, db: psycopg.Connection[Any]) -> int:
        row = db.execute("SELECT seq FROM journal_seq WHERE id = 1 FOR UPDATE").fetchone()
        assert row is not None
        return int(row[0])

    def advance_seq(self, db: psycopg.Connection[Any], seq: int) -> None:
        db.execute("UPDATE journal_seq SET seq = %s WHERE id = 1", (seq,))

    def _store(
        self, db: psycopg.Connection[Any], entries: Sequence[Sequence[Any]], row: Sequence[Any]
    ) -> None:
        """An append's writes in one statement: its entries, the new last seq and the
        effect's row (each statement costs the driver and the server the same again, whatever
        it writes; they touch different tables, so none needs to see another's rows)."""
        db.execute(
            _store_sql(len(entries)),
            (entries[-1][0], *itertools.chain.from_iterable(entries), *row),
        )

    def _append_reads(
        self, db: psycopg.Connection[Any], effect_id: str, lease_id: str | None
    ) -> AppendReads:
        """Two statements, pipelined: the seq's lock first, then everything else in one
        (``_ROW_AND_LEASE``), which the server runs once that lock is held, so its snapshot
        sees every append before this one."""
        seq_of = self._seq_ask(db)
        if lease_id is None:
            asked = db.execute(_ROW, (effect_id,))
            return seq_of(), asked.fetchone(), None
        asked = db.execute(_ROW_AND_LEASE, (effect_id, lease_id, lease_id))
        seq, found = seq_of(), asked.fetchone()
        assert found is not None
        row = None if found[0] is None else found[:10]
        lease = self._leases.lease_in(found[10 : 10 + LEASE_WIDTH], own_cents(held_in(found[5:8])))
        return seq, row, lambda: lease

    def _seq_ask(self, db: psycopg.Connection[Any]) -> Callable[[], int]:
        cursor = db.execute("SELECT seq FROM journal_seq WHERE id = 1 FOR UPDATE")

        def seq() -> int:
            row = cursor.fetchone()
            assert row is not None
            return int(row[0])

        return seq

    def _drain(self, db: psycopg.Connection[Any]) -> None:
        pipeline = self._pipelines.get(db)
        if pipeline is not None:
            pipeline.sync()

    def is_unique_violation(self, err: BaseException) -> bool:
        return isinstance(err, psycopg.errors.UniqueViolation)

    def refused(self, err: BaseException) -> bool:
        return isinstance(err, psycopg.errors.UniqueViolation | psycopg.errors.NotNullViolation)

    def _is_database_error(self, err: BaseException) -> bool:
        return isinstance(err, psycopg.Error | PoolTimeout)

    # -- reading everything ----------------------------------------------------------------------

    def iter_raw(self) -> Iterator[RawEntry]:
        for batch in self.iter_raw_batches():
            for r in batch:
                yield raw_entry(r)

    def iter_raw_batches(self) -> Iterator[Iterable[Sequence[Any]]]:
        return self.entry_source().batches()

    def entry_source(self) -> PgEntries:
        return PgEntries(self._conninfo)

    # -- claims ----------------------------------------------------------------------------------

    def claim(self, effect_id: str) -> Claim | None:
        return self._claim(effect_id, None)[0]

    def _claim(
        self, effect_id: str, then: tuple[str, Sequence[Any]] | None
    ) -> tuple[_PgClaim | None, list[Any] | None]:
        try:
            return self._claims.try_claim(effect_id, then)
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as err:
            raise JournalUnavailable(f"journal {self.url} cannot take a claim: {err}") from err

    async def claim_reading(self, effect_id: str) -> tuple[Claim | None, list[Entry] | None]:
        """The claim and the effect's read in one round trip: the read is sent behind the lock
        on the claim's connection, so it runs once the lock is granted. Waited for on the
        loop: handed to threads instead, the worker spent about 0.5 ms more CPU per activity
        at 64 in flight, and throughput was lower (``benchmarks.pg_claims``, interleaved)."""
        return self._claim_reading(effect_id)

    def _claim_reading(self, effect_id: str) -> tuple[Claim | None, list[Entry] | None]:
        read = (self._sql(READ_EFFECT_SQL), (effect_id,) * READ_EFFECT_PARAMS)
        claim, rows = self._claim(effect_id, read)
        if claim is None:
            return None, None
        try:
            return claim, [
                e for raw in self._checked_rows(effect_id, rows or []) for e in decode_entries(raw)
            ]
        except BaseException:
            claim.release()
            raise

    def claims_held(self) -> int:
        return self._claims.held()

    def is_claimed(self, effect_id: str) -> bool:
        key = lock_key(effect_id) & 0xFFFF_FFFF_FFFF_FFFF
        high, low = key >> 32, key & 0xFFFF_FFFF
        row = self.reading(
            lambda db: db.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND "
                "database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND classid = %s AND objid = %s AND objsubid = 1 AND granted)",
                (high, low),
            ).fetchone()
        )
        return bool(row and row[0])
