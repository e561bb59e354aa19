"""The embedded journal: SQLite in WAL mode with ``synchronous=FULL``, safe for several worker
processes on one host. Claims are kernel locks in ``<journal>.claims/`` beside the database.

Coroutines' appends are committed in groups (``append_async``): the statements run on the
caller's event loop, the COMMIT and its flush to disk on the journal's writer thread, and the
appends that arrive meanwhile go together into the next transaction."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import JournalUnavailable
from ..models import Entry
from .checkpoints import BACKSTOP_PAGES, Checkpointer
from .claims import Claim, Claims, host_claims
from .entries import ENTRY_COLUMNS, RawEntry, raw_entry
from .group_commit import AppendArgs, no_wakeup_preemption
from .interface import SCHEMA_VERSION
from .signing import Keyring
from .sql import HEAD_ENTRY, IN_DOUBT_SQL, AppendReads, SqlJournal
from .sql_leases import LEASE_COLUMNS, LEASE_JOIN, LEASE_WIDTH, held_in, own_cents
from .verify_jobs import NO_END, RANGE_ROWS, STRAY_ROWS

__all__ = ["IN_DOUBT_SQL", "SqliteJournal"]

T = TypeVar("T")

_MIGRATIONS: list[str] = [
    # 1: entries, the effect index, values beside entries, leases. Few indexes on purpose:
    # every index is a page the dispatch and commit transactions must write and fsync.
    """
    CREATE TABLE entries (
        seq       INTEGER PRIMARY KEY,
        effect_id TEXT NOT NULL,
        kind      TEXT NOT NULL,
        prev      TEXT NOT NULL,
        hash      TEXT NOT NULL,
        key_id    TEXT NOT NULL,
        sig       TEXT NOT NULL,
        body      BLOB NOT NULL
    );
    -- no chain forks: one successor per entry (64 bits of prev are plenty to tell them apart,
    -- and keep this index, which every append writes, small)
    CREATE UNIQUE INDEX entries_chain ON entries (effect_id, substr(prev, 1, 16));
    CREATE TABLE effects (
        effect_id         TEXT PRIMARY KEY,
        effect_type       TEXT NOT NULL,
        status            TEXT NOT NULL,
        head              TEXT NOT NULL,
        head_seq          INTEGER NOT NULL,
        updated_ts        REAL NOT NULL,
        first_dispatch_ts REAL,
        last_dispatch_ts  REAL
    ) WITHOUT ROWID;
    CREATE INDEX effects_in_doubt ON effects (last_dispatch_ts) WHERE status = 'DISPATCHED';
    CREATE TABLE blobs (
        effect_id TEXT NOT NULL,
        name      TEXT NOT NULL,
        value     TEXT NOT NULL,
        PRIMARY KEY (effect_id, name)
    ) WITHOUT ROWID;
    CREATE TABLE leases (
        lease_id   TEXT PRIMARY KEY,
        doc        TEXT NOT NULL
    );
    """,
    # 2: the policy layer's shared state. A session's state is one small document (its
    # circuit, repeat streak, windows); spend is kept per budget scope; an admitted execution
    # (or effect) is remembered so Temporal's retries are neither repeats nor charged twice.
    """
    CREATE TABLE policy_sessions (
        session TEXT PRIMARY KEY,
        doc     TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE policy_spend (
        scope     TEXT PRIMARY KEY,
        spent_usd REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE policy_admissions (
        execution    TEXT PRIMARY KEY,
        session      TEXT NOT NULL,
        principal    TEXT NOT NULL,
        namespace    TEXT NOT NULL,
        estimate_usd REAL NOT NULL,
        actual_usd   REAL,
        ts           REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE policy_approvals (
        binding TEXT PRIMARY KEY,
        doc     TEXT NOT NULL
    ) WITHOUT ROWID;
    """,
    # 3: values move into the entries they were appended with (a JSON object on the append's
    # last entry), which every append writes anyway, in seq order: a table keyed by effect id
    # cost each of the two transactions of an effect another page at a random place
    """
    ALTER TABLE entries ADD COLUMN vals TEXT;
    UPDATE entries SET vals = (
        SELECT json_group_object(b.name, json(b.value)) FROM blobs b
        WHERE b.effect_id = entries.effect_id
    ) WHERE seq IN (
        SELECT f.head_seq FROM effects f WHERE f.effect_id IN (SELECT effect_id FROM blobs)
    );
    DROP TABLE blobs;
    """,
    # 4: entries sign the digest of their values (format 2; the values stored before are bound
    # by a VALUES_BOUND entry per effect, written by the migration); an effect's origin (the
    # Temporal activity and input that first proposed it), to catch a key that changes between
    # attempts; lease budgets: what each lease has reserved, and each effect's charge
    """
    ALTER TABLE effects ADD COLUMN origin TEXT;
    CREATE INDEX effects_origin ON effects (origin) WHERE origin IS NOT NULL;
    CREATE TABLE lease_spend (
        lease_id       TEXT PRIMARY KEY,
        reserved_cents INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE lease_charges (
        effect_id TEXT PRIMARY KEY,
        lease_id  TEXT NOT NULL,
        cents     INTEGER NOT NULL,
        active    INTEGER NOT NULL
    ) WITHOUT ROWID;
    """,
    # 5: the deliveries (nonces) each session has allowed, all of them: a replay is denied for
    # the session's whole life, found by this key rather than by a list in the session's
    # document that every check would read and write. The recent deliveries that documents of
    # schema 4 kept move here.
    """
    CREATE TABLE policy_nonces (
        session TEXT NOT NULL,
        nonce   TEXT NOT NULL,
        PRIMARY KEY (session, nonce)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO policy_nonces (session, nonce)
        SELECT s.session, d.value FROM policy_sessions s, json_each(s.doc, '$.deliveries') d
        WHERE json_type(s.doc, '$.deliveries') = 'array';
    """,
    # 6 (retention): archives of effects in a final state leave signed anchors (kind ANCHOR)
    # in the journal; verify reads them first, through this index (a partial one: appends of
    # other kinds never write it). It also keeps a release that cannot read archives from
    # opening an archived journal (it would take the archived seqs for missing entries).
    """
    CREATE INDEX IF NOT EXISTS entries_anchors ON entries (seq) WHERE kind = 'ANCHOR';
    """,
    # 7: notifications that failed to reach people (review opened, reminder, expired,
    # escalated, resolved): a table of their own, in no effect's chain
    """
    CREATE TABLE IF NOT EXISTS notification_failures (
        id        INTEGER PRIMARY KEY,
        notifier  TEXT NOT NULL,
        review_id TEXT NOT NULL,
        event     TEXT NOT NULL,
        attempt   INTEGER NOT NULL,
        error     TEXT NOT NULL,
        ts        REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS notification_failures_ts ON notification_failures (ts);
    """,
    # 8: an effect's lease charge moves onto its index row, which the transactions that
    # reserve, give back or charge again write anyway: a new effect under a budget writes one
    # table less (and runs one statement less). Subqueries, not UPDATE ... FROM, which needs
    # SQLite 3.33
    """
    ALTER TABLE effects ADD COLUMN charge_lease_id TEXT;
    ALTER TABLE effects ADD COLUMN charge_cents INTEGER;
    ALTER TABLE effects ADD COLUMN charge_active INTEGER;
    UPDATE effects SET
        charge_lease_id = (SELECT c.lease_id FROM lease_charges c
            WHERE c.effect_id = effects.effect_id),
        charge_cents = (SELECT c.cents FROM lease_charges c WHERE c.effect_id = effects.effect_id),
        charge_active = (SELECT c.active FROM lease_charges c WHERE c.effect_id = effects.effect_id)
    WHERE effect_id IN (SELECT effect_id FROM lease_charges);
    DROP TABLE lease_charges;
    """,
    # 9: one-time codes (core.vote_codes): per question and operator, the wrong codes offered
    # and the digest of the code that made a decision; an index finds a used code by digest
    """
    CREATE TABLE IF NOT EXISTS vote_codes (
        episode  TEXT NOT NULL,
        operator TEXT NOT NULL,
        failures INTEGER NOT NULL,
        used     TEXT,
        PRIMARY KEY (episode, operator)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX IF NOT EXISTS vote_codes_used ON vote_codes (used) WHERE used IS NOT NULL;
    """,
    # 10: a lease's row is the product of its signed chain, sealed with the chain's head, and
    # what its budget has reserved is sealed (``row_seals``); the rows as they stand are signed
    # by the migration (``SqlJournal._seal_leases``)
    """
    ALTER TABLE leases ADD COLUMN head_seq INTEGER;
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
    # 12: flow marks (``core.policy.flow``): the keyed fingerprints of fragments of what
    # policed and gated activities returned, with their origin labels, per scope (a session or
    # a workflow run); never text. Unsealed: a forged mark can only make the policy refuse
    # (``SqlPolicy.mark_flow``). The oldest of a scope are evicted first, through its index
    """
    CREATE TABLE IF NOT EXISTS flow_marks (
        scope TEXT NOT NULL,
        fp    TEXT NOT NULL,
        label TEXT NOT NULL,
        ts    REAL NOT NULL,
        PRIMARY KEY (scope, fp, label)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS flow_marks_age ON flow_marks (scope, ts);
    """,
    # 13: reads walk an effect's chain back from its row's head (``CHAIN_WALK``) along each entry's
    # ``prev_seq``, filled here for the entries there are: the seq of the previous entry of the same
    # effect when the entry's prev is that entry's hash, else NULL (a first entry, a tombstone, or a
    # broken link, which the read then refuses). The index of entries by (effect, prev) goes: its
    # random inserts were a quarter of the pages a new effect wrote. The row's head, which every
    # append moves on only from the head it read (``PUT_ROW``), keeps two writers from appending
    # after one entry, and ``entries_next`` (one successor per entry, by seq: inserted at its right
    # edge, about one page per transaction) keeps an entry from having two, whatever the row says,
    # and finds the entry after a row's head (an older row put back is refused at the read,
    # ``READ_EFFECT_SQL``). A temporary table keyed by seq, not UPDATE ... FROM, which needs SQLite
    # 3.33. And the index of origins keeps 16 hex digits (64 bits) of each, not all 64
    # (``by_origin`` compares the whole origin in the row): an entry of it is the origin's prefix
    # and the effect's id, and each new effect writes one into a random leaf; narrower entries split
    # leaves less often (1.63 pages per new effect -> 1.24, ``benchmarks.checkout_ab``)
    """
    ALTER TABLE entries ADD COLUMN prev_seq INTEGER;
    CREATE TEMP TABLE entry_links (seq INTEGER PRIMARY KEY, prev_seq INTEGER NOT NULL);
    INSERT INTO entry_links (seq, prev_seq)
        SELECT seq, p FROM (
            SELECT seq, CASE WHEN prev = LAG(hash) OVER w THEN LAG(seq) OVER w END AS p
            FROM entries WINDOW w AS (PARTITION BY effect_id ORDER BY seq)
        ) WHERE p IS NOT NULL;
    UPDATE entries SET prev_seq = (SELECT l.prev_seq FROM entry_links l WHERE l.seq = entries.seq)
        WHERE seq IN (SELECT seq FROM entry_links);
    DROP TABLE entry_links;
    CREATE UNIQUE INDEX entries_next ON entries (prev_seq) WHERE prev_seq IS NOT NULL;
    DROP INDEX IF EXISTS entries_chain;
    DROP INDEX IF EXISTS effects_origin;
    CREATE INDEX effects_origin ON effects (substr(origin, 1, 16)) WHERE origin IS NOT NULL;
    """,
    # 14: a dispatch transaction's PROPOSED, AUTHORIZED and DISPATCHED are written as one entry
    # of format 3 (``entries.COMBINED_VERSION``; ``SqlJournal.combine_dispatch``). The tables do
    # not change; the number makes the release before, which reads no entry of format 3,
    # refuse the journal instead of misreading it
    "",
]
assert len(_MIGRATIONS) == SCHEMA_VERSION

#: the last seq and an effect's index row as an append reads them (``SqlJournal._append_reads``),
#: in one statement (``effect_type`` is NOT NULL, so a missing row reads as NULL there); and
#: with the lease the append's build checks, in the same statement
_SEQ_AND_ROW = (
    "SELECT (SELECT COALESCE(MAX(seq), 0) FROM entries), f.effect_type, f.status, f.head, "
    "f.first_dispatch_ts, f.last_dispatch_ts, f.charge_lease_id, f.charge_cents, "
    f"f.charge_active, f.head_seq, {HEAD_ENTRY.format('f')} "
    "FROM (SELECT 1) LEFT JOIN effects f ON f.effect_id = ?"
)
_SEQ_ROW_AND_LEASE = _SEQ_AND_ROW.replace(" FROM (SELECT 1)", f", {LEASE_COLUMNS} FROM (SELECT 1)")
_SEQ_ROW_AND_LEASE += f" {LEASE_JOIN}"


@dataclass(frozen=True)
class SqliteEntries:
    """Where ``verify`` reads a SQLite journal's entries from (``verify_jobs.EntrySource``):
    its file's URI."""

    uri: str

    def batches(self, start: int = 1, stop: int | None = None) -> Iterator[Iterable[Sequence[Any]]]:
        # a separate connection: a long verify must not hold the writers' lock. One batch, the
        # cursor itself: rows read one at a time stay in the CPU's caches (reads of 4,096 rows
        # took 2.3 µs per row on a 2-core EPYC, the cursor 1.4)
        db = sqlite3.connect(f"{self.uri}?mode=ro", uri=True)
        try:
            if start <= 1 and stop is None:
                yield db.execute(f"SELECT {ENTRY_COLUMNS} FROM entries ORDER BY seq")
            else:
                yield db.execute(
                    f"SELECT {ENTRY_COLUMNS} FROM entries WHERE seq >= ? AND seq < ? ORDER BY seq",
                    (start, NO_END if stop is None else stop),
                )
        finally:
            db.close()

    def rows(self, heads: tuple[int, int | None] | None) -> list[Sequence[Any]]:
        db = sqlite3.connect(f"{self.uri}?mode=ro", uri=True)
        try:
            if heads is None:
                return db.execute(STRAY_ROWS, (NO_END,)).fetchall()
            start, stop = heads
            return db.execute(RANGE_ROWS, (start, NO_END if stop is None else stop)).fetchall()
        finally:
            db.close()


class SqliteJournal(SqlJournal):
    """The embedded journal. Besides ``SqlJournal``'s, its public names for tests and
    measurements (never needed to use the journal): its writers' ``connection``,
    ``wrap_connections`` (a measurement's proxy in place of its connections), its WAL's
    ``checkpointer`` (``stop_checkpointer``, ``start_checkpointer``), ``writers_held`` (no
    write of this process runs while held), ``hold_asked`` and ``observe_write_lock``."""

    MIGRATIONS = _MIGRATIONS
    #: the writers' connection, the readers', the host's claims and the WAL's checkpointer
    _db: sqlite3.Connection
    _reader: sqlite3.Connection
    _claims: Claims
    _checkpointer: Checkpointer | None = None
    #: a measurement's hook, None (the default) in normal use: called with the seconds each
    #: write transaction's ``BEGIN IMMEDIATE`` took (the wait for the database's write lock,
    #: which the other processes writing to it hold in turn)
    observe_write_lock: Callable[[float], None] | None = None

    def __init__(
        self,
        path: Path,
        keyring: Keyring,
        *,
        busy_timeout_s: float = 10.0,
        check_tail: bool = True,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.keyring = keyring
        self._lock = threading.RLock()
        #: cleared while a batch's COMMIT runs on the writer thread
        self._flushed = threading.Event()
        self._flushed.set()
        #: cleared while a pass that must catch up asks for the writers or holds them: a write
        #: arriving meanwhile waits here. ``_lock`` is not fair: a writer in a loop takes it
        #: again before the waiting pass's thread runs, and the WAL grows while it waits
        #: (seen under load: 2,118 frames over a limit of 100). Set, the check is one read.
        self._unheld = threading.Event()
        self._unheld.set()
        #: one hold at a time, so that the first to end does not open the gate on another's
        self._holders = threading.Lock()
        self._reader_lock = threading.Lock()
        self._busy_timeout_s = busy_timeout_s

        def connect() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._opened(self._connect(busy_timeout_s))
            self._enter_wal(busy_timeout_s)
            self._db.execute("PRAGMA synchronous=FULL")
            # checkpoints run off the commits' path (``checkpoints``); this one is a backstop
            self._db.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
            self._migrate()
            # reads have their own connection: WAL lets them go on while a write is flushed
            self._reader = self._opened(self._connect(busy_timeout_s))
            self._claims = host_claims(self.path.with_name(self.path.name + ".claims"))
            self.start_checkpointer()

        self._open(connect, check_tail=check_tail)

    def _connect(self, busy_timeout_s: float) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
        )
        # keep the indexes' pages in memory as the journal grows (up to 16 MiB)
        db.execute("PRAGMA cache_size=-16384")
        db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        return db

    def _enter_wal(self, timeout_s: float) -> None:
        """Switch to WAL. Several processes opening a new journal at once can find it locked
        while one of them switches: the switch does not wait on the busy handler, so retry."""
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
                continue
            if str(mode).lower() != "wal":
                raise JournalUnavailable(f"journal {self.url}: WAL mode is not available")
            return

    @contextlib.contextmanager
    def writers_held(self) -> Iterator[None]:
        """No write of this process runs (nor is being flushed) until the block ends: what a
        checkpoint pass that must catch up holds (``Checkpointer``). A write asked for after
        the hold was asked for starts after it ends, whichever thread runs first. The holder
        must not write inside the block (its write would wait for the block to end)."""
        with self._holders:
            self._unheld.clear()
            try:
                with self._lock:
                    self._flushed.wait()
                    yield
            finally:
                self._unheld.set()

    @property
    def hold_asked(self) -> bool:
        """A hold is asked for or held: writes wait until it ends (for tests)."""
        return not self._unheld.is_set()

    # -- for tests and measurements ----------------------------------------------------------

    @property
    def connection(self) -> sqlite3.Connection:
        """The writers' connection (reads run on it too while it is idle): to look at its
        pragmas, its query plans or the statements it runs. A write made through it, outside
        the journal's transactions, is not the journal's."""
        return self._db

    def wrap_connections(self, wrap: Callable[[sqlite3.Connection], Any]) -> None:
        """Put ``wrap(connection)`` in place of the writers' and the readers' connections: a
        measurement's proxy (the time spent in statements), which must do what the connection
        does (``execute``, ``cursor``, ``in_transaction``, ...)."""
        self._db = wrap(self._db)
        self._reader = wrap(self._reader)

    @property
    def checkpointer(self) -> Checkpointer | None:
        """The thread that checkpoints the WAL off the commits' path (None: stopped)."""
        return self._checkpointer

    def stop_checkpointer(self) -> None:
        """Stop the WAL's checkpointer: SQLite's own auto-checkpoint (at the pages the
        writers' connection sets, the backstop unless changed) is then the only one."""
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            checkpointer.close()
            self._resources.remove(checkpointer)

    def start_checkpointer(self) -> Checkpointer:
        """The WAL's checkpointer, started as the journal starts it if it is stopped."""
        if self._checkpointer is None:
            self._checkpointer = self._opened(
                Checkpointer(
                    lambda: self._connect(self._busy_timeout_s),
                    self.writers_held,
                    on_start=no_wakeup_preemption,
                )
            )
        return self._checkpointer

    def _exclusively(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            result = fn(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return result

    # -- transactions ------------------------------------------------------------------------

    def execute(self, db: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
        """SQLite runs the shared SQL as written (``?`` placeholders), with any sequence of
        parameters: no translation, no copy."""
        return db.execute(sql, params)

    def writing(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(db)`` in one durable write transaction (``BEGIN IMMEDIATE``: the whole
        database is this transaction's until it ends)."""
        if not self._unheld.is_set():
            self._unheld.wait()
        with self._lock:
            self._flushed.wait()
            result = self._uncommitted(fn)
            self._commit()
            return result

    def _uncommitted(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``BEGIN IMMEDIATE`` and ``fn(db)``, leaving the transaction open for its caller to
        commit; rolled back if ``fn`` raises. The caller holds ``_lock``."""
        db = self._db
        observe = self.observe_write_lock
        asked = 0.0 if observe is None else time.perf_counter()
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as err:
            raise JournalUnavailable(f"journal {self.url} cannot be written: {err}") from err
        if observe is not None:
            observe(time.perf_counter() - asked)
        try:
            return fn(db)
        except sqlite3.IntegrityError:
            db.execute("ROLLBACK")
            raise
        except sqlite3.Error as err:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise JournalUnavailable(f"journal {self.url} cannot be written: {err}") from err
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _commit(self) -> None:
        db = self._db
        try:
            db.execute("COMMIT")
        except sqlite3.Error as err:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise JournalUnavailable(f"journal {self.url} cannot be written: {err}") from err
        if self._checkpointer is not None:
            self._checkpointer.nudge()

    def write_batch(
        self,
        loop: asyncio.AbstractEventLoop,
        writer: Executor,
        batch: Sequence[AppendArgs],
    ) -> asyncio.Future[list[list[Entry] | Exception]]:
        """The batch's statements run here, on the loop: they are CPU work, which on another
        thread would only contend for the interpreter. The COMMIT, the flush to disk, runs on
        the writer thread; until it ends, the next write on this connection waits."""
        if not self._unheld.is_set():
            self._unheld.wait()
        with self._lock:
            self._flushed.wait()
            outcomes = self._append_many_in(batch, self._uncommitted)
            if not self._db.in_transaction:  # every append failed on its own
                done: asyncio.Future[list[list[Entry] | Exception]] = loop.create_future()
                done.set_result(outcomes)
                return done
            self._flushed.clear()
        return loop.run_in_executor(writer, self._flush_batch, outcomes)

    def _flush_batch(
        self, outcomes: list[list[Entry] | Exception]
    ) -> list[list[Entry] | Exception]:
        try:
            self._commit()
        except Exception as err:
            return [o if isinstance(o, Exception) else err for o in outcomes]
        finally:
            self._flushed.set()
        return outcomes

    def reading(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the writers' connection when it is idle (no transaction open on it, no
        COMMIT being flushed: both need ``_lock``): its page cache holds what it wrote, where
        the readers' connection drops its whole cache whenever the database changed since its
        last read, so every read after a commit started cold. Else on the readers' connection,
        which WAL lets read while a write is flushed."""
        if self._lock.acquire(blocking=False):
            try:
                if self._flushed.is_set() and not self._db.in_transaction:
                    return fn(self._db)
            finally:
                self._lock.release()
        with self._reader_lock:
            return fn(self._reader)

    def _append_reads(
        self, db: sqlite3.Connection, effect_id: str, lease_id: str | None
    ) -> AppendReads:
        """One statement for the seq, the row and the lease: the transaction holds the whole
        database."""
        if lease_id is None:
            found = db.execute(_SEQ_AND_ROW, (effect_id,)).fetchone()
            return int(found[0]), None if found[1] is None else found[1:], None
        found = db.execute(_SEQ_ROW_AND_LEASE, (effect_id, lease_id)).fetchone()
        lease = self._leases.lease_in(found[11 : 11 + LEASE_WIDTH], own_cents(held_in(found[6:9])))
        return int(found[0]), None if found[1] is None else found[1:11], lambda: lease

    def hold_seq(self, db: sqlite3.Connection) -> int:
        (seq,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM entries").fetchone()
        return int(seq)

    def is_unique_violation(self, err: BaseException) -> bool:
        return isinstance(err, sqlite3.IntegrityError)

    def _is_database_error(self, err: BaseException) -> bool:
        return isinstance(err, sqlite3.Error)

    # -- reading everything ----------------------------------------------------------------------

    def iter_raw(self) -> Iterator[RawEntry]:
        for batch in self.iter_raw_batches():
            for r in batch:
                yield raw_entry(r)

    def iter_raw_batches(self) -> Iterator[Iterable[Sequence[Any]]]:
        return self.entry_source().batches()

    def entry_source(self) -> SqliteEntries:
        return SqliteEntries(self.path.resolve().as_uri())

    # -- claims ----------------------------------------------------------------------------------

    def claim(self, effect_id: str) -> Claim | None:
        return self._claims.try_claim(effect_id)

    def is_claimed(self, effect_id: str) -> bool:
        return self._claims.is_claimed(effect_id)

    def claims_held(self) -> int:
        return self._claims.held()

    def close(self) -> None:
        self._close_writer()
        if self._checkpointer is not None:
            # first, and without the writers' lock: its last pass may be waiting for that lock
            self._checkpointer.close()
        with self._lock, self._reader_lock:
            self._close_quietly()
        self._claims.close()
