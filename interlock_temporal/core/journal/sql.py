"""What the SQL journals share: the append, the reads, the schema's migration and the
journal's lifecycle, written once in SQL both SQLite and PostgreSQL run. A backend (``sqlite``,
``postgres``) supplies its connections and transactions, its claims, its migrations, and the
few words the two dialects spell differently.

The modules beside it see the journal through protocols it implements, never through its
private methods: the stores kept in its database (``sql_leases``, ``sql_policy``,
``sql_notify``) through ``sql_access.SqlAccess``; the effect-id setting (``sql_ids``) and an
archive run (``sql_archive``) through ``sql_access.JournalAccess``; the group commit
(``group_commit``) through ``group_commit.BatchWriter``. The journal is one concept and this
module stays whole: the append and the reads share their SQL and their checks."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, ClassVar, Protocol, TypeVar

from ..errors import HeadConflict, JournalConfigError, JournalCorrupt, JournalUnavailable
from ..models import Draft, EffectRow, Entry, JournalHead, Kind, Lease
from .control_check import ControlRows
from .entries import (
    CHAIN_WALK,
    COMBINED_VERSION,
    ENTRY_COLUMNS,
    ENTRY_VERSION,
    ROW_COLUMNS,
    RawEntry,
    check_chain,
    combined,
    combined_data,
    decode_entries,
    effect_row,
    encode_entry,
    origin_in,
    raw_entry,
    state_kind,
    value_of,
    values_digest,
    values_json,
    views,
)
from .group_commit import AppendArgs, GroupCommit, no_wakeup_preemption
from .interface import OWN_CHAIN_TYPES, SCHEMA_VERSION, Build, Journal, JournalTx
from .sql_codes import SqlCodeUses
from .sql_ids import EffectIdSetting
from .sql_leases import (
    RESERVATION_COLUMNS,
    Held,
    SqlLeases,
    held_columns,
    held_in,
    own_cents,
)
from .sql_notify import SqlNotifications
from .sql_policy import SqlPolicy

T = TypeVar("T")
#: what an append reads first: the last seq, the effect's row, the lease (asked, to be read)
AppendReads = tuple[int, Sequence[Any] | None, Callable[[], Lease | None] | None]
C = TypeVar("C", bound="_Closable")


class _Closable(Protocol):
    def close(self) -> None: ...


_ROW_COLUMNS_F = ", ".join("f." + c.strip() for c in ROW_COLUMNS.split(","))
_ENTRY_COLUMNS_N = ", ".join("n." + c.strip() for c in ENTRY_COLUMNS.split(","))
#: what an append reads of an effect's row: the lease reservation it holds (``held_in``), the
#: head's seq (the next entry's ``prev_seq``), and the hash of the entry at that seq, which must
#: be the row's head (``head_entry``)
APPEND_ROW = (
    f"effect_type, status, head, first_dispatch_ts, last_dispatch_ts, {RESERVATION_COLUMNS}, "
    "head_seq"
)
#: the entry the row's ``head_seq`` names (``APPEND_ROW``'s last), read with it by the append
HEAD_ENTRY = "(SELECT h.hash FROM entries h WHERE h.seq = {0}.head_seq)"
#: an effect's index row as an append writes it, with its lease reservation (``_put_row``). An
#: existing row is moved on only from the head the append read: were it any other, ``head_seq``
#: would be set to NULL, which its NOT NULL refuses, and a new effect's row is only ever
#: inserted, never overwritten (its ``head`` is not ''). So two writers can never both append
#: after one head: the row's head is the chain's fork backstop (``refused`` maps the refusal to
#: ``HeadConflict``). One statement, as before; the parameters are the row's and, last, the
#: head the append read.
PUT_ROW = (
    f"INSERT INTO effects ({ROW_COLUMNS}, {RESERVATION_COLUMNS}) VALUES ({', '.join('?' * 12)}) "
    "ON CONFLICT (effect_id) DO UPDATE SET status = excluded.status, "
    "head = excluded.head, "
    "head_seq = CASE WHEN effects.head = ? THEN excluded.head_seq END, "
    "updated_ts = excluded.updated_ts, first_dispatch_ts = excluded.first_dispatch_ts, "
    "last_dispatch_ts = excluded.last_dispatch_ts, "
    + ", ".join(f"{c} = excluded.{c}" for c in RESERVATION_COLUMNS.split(", "))
)
_INSERT_ENTRY = (
    f"INSERT INTO entries ({ENTRY_COLUMNS}, prev_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
#: an effect's entries and its index row, in one statement (one snapshot): the entries with the
#: row beside each, or the row alone when it has no entries (``CHAIN_WALK``: no index on entries
#: by effect); and the entry after the row's head, if one is there (``entries_next``), which
#: the chain's check then refuses: the row is older than its chain (put back, or its entries
#: edited), and what came after it must not be hidden from the decision
READ_EFFECT_SQL = CHAIN_WALK + (
    f"SELECT {', '.join('c.' + c.strip() for c in ENTRY_COLUMNS.split(','))}, {_ROW_COLUMNS_F} "
    "FROM effects f LEFT JOIN chain c ON 1 = 1 WHERE f.effect_id = ? "
    f"UNION ALL SELECT {_ENTRY_COLUMNS_N}, {_ROW_COLUMNS_F} FROM effects f "
    "JOIN entries n ON n.prev_seq = f.head_seq AND n.effect_id = f.effect_id "
    "WHERE f.effect_id = ? ORDER BY 1"
)
#: the parameters of ``READ_EFFECT_SQL`` for one effect
READ_EFFECT_PARAMS = 3


def _signing_its_type(first: Draft, effect_type: str) -> Draft:
    """A new effect's first entry, made to sign the effect's type, so that its index row can
    be checked."""
    if first.data.get("effect_type") == effect_type:
        return first
    if "effect_type" in first.data:
        raise ValueError("the first entry's effect_type differs from the effect's")
    return Draft(kind=first.kind, data={**first.data, "effect_type": effect_type})


#: what was started and never confirmed, oldest send first; "older than" counts from the last
#: send, so annotations appended since do not hide an effect (the literal status lets the
#: database use its partial in-doubt index)
IN_DOUBT_SQL = (
    f"SELECT {ROW_COLUMNS} FROM effects WHERE status = 'DISPATCHED' AND last_dispatch_ts <= ? "
    "ORDER BY last_dispatch_ts"
)


class _UnknownRefusal(Exception):
    """A pipelined batch's append was refused, and which one is not known: the batch's
    transaction is rolled back and run again, each append's statements drained before the
    next's are sent."""


class _ItemFailed(Exception):
    """One append of a batch failed on its own (its head moved, its build raised): the batch's
    transaction is rolled back and run again without it."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index)
        self.index = index
        self.error = error


class SqlJournal(Journal):
    """A journal in SQL tables. SQL is written with ``?`` placeholders.

    Besides ``Journal``, it implements the seams of the modules beside it: ``SqlAccess`` and
    ``JournalAccess`` (``sql_access``: ``reading``, ``writing``, ``execute``,
    ``append_within``, ``is_unique_violation``, ``hold_seq``, ``advance_seq``) and
    ``BatchWriter`` (``group_commit``: ``claims_held``, ``write_batch``). A backend implements
    the abstract ones."""

    #: the two-argument maximum
    GREATEST = "max"
    #: the suffix that locks the rows a transaction read (none where the transaction holds
    #: the whole database, as SQLite's ``BEGIN IMMEDIATE`` does)
    FOR_UPDATE = ""
    #: the texts of a JSON array given as one parameter, as a table ``{0}`` of one column
    #: ``value`` (formatted with the table's name)
    JSON_TEXTS = "json_each(?) AS {0}"
    #: the schema's migrations in the backend's dialect: the n-th brings schema n to n + 1
    MIGRATIONS: ClassVar[Sequence[str]] = ()
    #: whether appends pipeline their statements (``_write_appends``)
    PIPELINES = False
    #: write a dispatch transaction's PROPOSED, AUTHORIZED and DISPATCHED (or, for a reopened
    #: effect, the last two) as one entry of format 3 (``combined``): one signature, one row
    #: and one link where there were three, about a quarter fewer bytes (schema 14). Every
    #: reader reads both formats. Off: the separate entries, as before schema 14 (tests of
    #: both formats, and measurements of each)
    combine_dispatch = True

    def __init__(self) -> None:
        #: the dialect's words, as ``SqlAccess`` gives them to the stores
        self.for_update = self.FOR_UPDATE
        self.greatest = self.GREATEST
        self.json_texts = self.JSON_TEXTS
        #: the thread that writes ``append_async``'s batches, and each event loop's queue
        self._writer: ThreadPoolExecutor | None = None
        self._writer_lock = threading.Lock()
        self._writer_id: int | None = None
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit] = (
            weakref.WeakKeyDictionary()
        )
        self._ids = EffectIdSetting(self)
        self._last_group: Callable[[], GroupCommit | None] = lambda: None
        #: what the backend opened (connections, pools), closed with the journal
        self._resources: list[_Closable] = []
        self._leases = SqlLeases(self)
        self._policy = SqlPolicy(self)
        self._notifications = SqlNotifications(self)
        self._code_uses = SqlCodeUses(self)

    # -- opening and closing ---------------------------------------------------------------------

    def _open(self, connect: Callable[[], None], *, check_tail: bool) -> None:
        """Open the journal: ``connect`` opens the backend's connections (each through
        ``_opened``) and migrates the schema; if it fails, what it opened is closed again, and
        an error of the database is ``JournalUnavailable``. Then the last entry is checked, and
        the journal closed if it is unusable."""
        try:
            connect()
        except BaseException as err:
            self._close_quietly()
            if self._is_database_error(err):
                raise JournalUnavailable(f"journal {self.url} cannot be opened: {err}") from err
            raise
        try:
            self.effect_ids = self.reading(self._ids.recorded)
            if check_tail:
                self.check_tail()
                self.check_effect_ids()
        except BaseException:
            self.close()
            raise

    def _opened(self, resource: C) -> C:
        """``resource``, a connection or a pool the backend opened, to close with the journal."""
        self._resources.append(resource)
        return resource

    # -- effect ids (``sql_ids``) -----------------------------------------------------------------

    def key_effect_ids(self, scheme: str) -> None:
        self._ids.key(scheme)

    def check_effect_ids(self) -> None:
        self._ids.check()

    def _close_quietly(self) -> None:
        """Close what the backend opened, the last opened first: after an open that failed,
        and when the journal closes."""
        while self._resources:
            self._resources.pop().close()

    def close(self) -> None:
        self._close_writer()
        self._close_quietly()

    def _migrate(self) -> None:
        """Bring the schema to ``SCHEMA_VERSION``, in one transaction that keeps every other
        process out while it runs."""
        self._exclusively(self._migrate_in)

    @abstractmethod
    def _exclusively(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)`` in one transaction no other process can run beside (the
        migration's)."""

    # -- the backend's transactions (``SqlAccess``, ``JournalAccess``) ----------------------------

    def _sql(self, text: str) -> str:
        return text

    def execute(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement on ``db``, a connection of this journal's; returns its cursor."""
        return db.execute(self._sql(sql), tuple(params))

    @abstractmethod
    def writing(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)`` in one durable write transaction."""

    @abstractmethod
    def reading(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)`` for reads."""

    @abstractmethod
    def hold_seq(self, db: Any) -> int:
        """Inside a write transaction: the last seq, held until the transaction ends so that
        appends get dense seqs in commit order."""

    def advance_seq(self, db: Any, seq: int) -> None:
        """Inside the same transaction: the new last seq (for backends that keep a counter)."""

    def _seq_ask(self, db: Any) -> Callable[[], int]:
        """``hold_seq``, asked now and read when the returned function is called (a backend
        that pipelines sends the question with the next ones)."""
        seq = self.hold_seq(db)
        return lambda: seq

    def _drain(self, db: Any) -> None:
        """The statements sent so far in this transaction have run: their errors are raised
        here (a backend that pipelines its statements waits for their results; the others
        already have)."""

    def _write_appends(self, fn: Callable[[Any], T]) -> T:
        """``writing`` for appends. A backend may pipeline it: the errors of the last writes
        are then raised by the COMMIT, out of ``fn`` (``_drain`` raises them sooner)."""
        return self.writing(fn)

    def _migrate_in(self, db: Any) -> None:
        """Bring the schema to ``SCHEMA_VERSION`` inside the caller's transaction (which keeps
        other processes out while it runs)."""
        self.execute(db, "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row = self.execute(db, "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise JournalConfigError(
                f"journal {self.url} has schema {version}; this release reads up to "
                f"{SCHEMA_VERSION}: upgrade interlock-temporal"
            )
        for number in range(version, SCHEMA_VERSION):
            for statement in self.MIGRATIONS[number].split(";"):
                if statement.strip():
                    db.execute(statement)
        if version < 4:
            # once the tables are the current ones: it appends, as this release does
            self._bind_values(db)
        if 0 < version < 10:
            self._leases.seal_rows_tx(db, self.url, SCHEMA_VERSION)
        if 0 < version < 11:
            self._policy.seal_rows_tx(db, self.url, SCHEMA_VERSION)
        self.execute(
            db,
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )

    def _bind_values(self, db: Any) -> None:
        """Schema 4: entries sign the digest of the values stored beside them. Values stored
        before (format-1 entries) are bound now, as they are, by one signed ``VALUES_BOUND``
        entry per effect, so that from here on an edit of any of them is caught."""
        rows = self.execute(
            db, "SELECT seq, effect_id, vals FROM entries WHERE vals IS NOT NULL ORDER BY seq"
        ).fetchall()
        unbound: dict[str, dict[str, str]] = {}
        for seq, eid, vals in rows:
            unbound.setdefault(eid, {})[str(seq)] = values_digest(vals)
        if unbound and not self.keyring.can_sign:
            raise JournalConfigError(
                f"journal {self.url} must be upgraded to schema {SCHEMA_VERSION}, which signs "
                "the values it stored before: open it once with its signing key"
            )
        for eid, values in unbound.items():
            self._append_tx(db, eid, None, [Draft(kind=Kind.VALUES_BOUND, data={"values": values})])

    # -- writing -------------------------------------------------------------------------------

    def append(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        args: AppendArgs = (effect_id, expected_head, build, effect_type, lease_id, blobs)
        try:
            return self._write_appends(lambda db: self._append_tx(db, *args))
        except HeadConflict:
            raise
        except Exception as err:
            raise self._append_error(args, err) from err

    async def append_async(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        group = self.group_commit()
        if group.idle and not self.loop_shared and self.claims_held() <= 1:
            # alone in this process, and the loop has nothing else to do: no hand-off to pay
            return self.append(
                effect_id,
                expected_head,
                build,
                effect_type=effect_type,
                lease_id=lease_id,
                blobs=blobs,
            )
        return await group.submit((effect_id, expected_head, build, effect_type, lease_id, blobs))

    async def transact_async(self, fn: Callable[[JournalTx], T]) -> T:
        """``fn(tx)`` in one ``writing`` transaction on the writer thread, alone (see
        ``GroupCommit.run_alone``): the appends of this process wait for it, they do not fail."""
        job = functools.partial(self.writing, lambda db: fn(SqlTx(self, db)))
        return await self.group_commit().run_alone(job)

    def group_commit(self) -> GroupCommit:
        """The running event loop's group commit, which ``append_async`` hands its appends to
        when they can share a batch (made, with the journal's writer thread, on first use)."""
        loop = asyncio.get_running_loop()
        last = self._last_group()
        if last is not None and last.loop is loop and self._writer is not None:
            return last
        with self._writer_lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(
                    1, thread_name_prefix="interlock-journal", initializer=self._writer_started
                )
            group = self._groups.get(loop)
            if group is None:
                group = self._groups[loop] = GroupCommit(self, loop, self._writer)
            self._last_group = weakref.ref(group)
            return group

    def _writer_started(self) -> None:
        """On the writer thread, as it starts: note its id, and keep it from preempting the
        loop that hands it a flush (``no_wakeup_preemption``)."""
        self._writer_id = threading.get_native_id()
        no_wakeup_preemption()

    @property
    def writer_thread_id(self) -> int | None:
        """The native id of the journal's writer thread (None before its first batch): for a
        test or a profile that looks at that thread."""
        return self._writer_id

    def _close_writer(self) -> None:
        """Wait for the batch being written, and stop the writer thread."""
        with self._writer_lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True)

    def write_batch(
        self,
        loop: asyncio.AbstractEventLoop,
        writer: Executor,
        batch: Sequence[AppendArgs],
    ) -> asyncio.Future[list[list[Entry] | Exception]]:
        """Write a batch of appends in one transaction; the future resolves once it is durable
        (``BatchWriter``). Here the whole transaction runs on the writer thread, leaving the
        loop free while a database server is asked."""
        return loop.run_in_executor(writer, self._append_many_in, batch, self._write_appends)

    def append_many(self, batch: Sequence[AppendArgs]) -> list[list[Entry] | Exception]:
        """Several appends in one transaction, as a group commit writes a batch: each one's
        entries, or its own error (see ``_append_many_in``)."""
        return self._append_many_in(batch, self._write_appends)

    def _append_many_in(
        self, batch: Sequence[AppendArgs], transaction: Callable[[Callable[[Any], Any]], Any]
    ) -> list[list[Entry] | Exception]:
        """Several appends in one ``transaction``, in order (a later append of one effect sees
        an earlier one's head). An append that fails on its own gets its own error and the rest
        are written again without it; an error of the database fails them all."""
        outcomes: dict[int, list[Entry] | Exception] = {}
        left = list(range(len(batch)))
        drain_each = not self.PIPELINES
        while left:
            try:
                written = transaction(
                    functools.partial(
                        self._append_batch, [batch[i] for i in left], drain_each=drain_each
                    )
                )
            except _UnknownRefusal:
                drain_each = True
                continue
            except _ItemFailed as failed:
                index = left.pop(failed.index)
                outcomes[index] = self._append_error(batch[index], failed.error)
                continue
            except Exception as err:
                if self.refused(err):
                    # raised by the COMMIT: the last append's writes (the others' had drained)
                    index = left.pop()
                    outcomes[index] = self._append_error(batch[index], err)
                    continue
                outcomes.update(dict.fromkeys(left, err))
                break
            outcomes.update(zip(left, written, strict=True))
            break
        return [outcomes[i] for i in range(len(batch))]

    def _append_error(self, args: AppendArgs, err: Exception) -> Exception:
        """What a failed append raises: the row's head backstop (``PUT_ROW``) is a moved head."""
        if self.refused(err):
            return HeadConflict(args[0], args[1], "?")
        return err

    def refused(self, err: BaseException) -> bool:
        """Whether ``err`` is the database refusing an append's writes: a new effect's row
        that exists already (a duplicate key), or a row whose head moved (``PUT_ROW``'s NULL
        ``head_seq``, which SQLite reports as the same integrity error)."""
        return self.is_unique_violation(err)

    def _append_batch(
        self, batch: Sequence[AppendArgs], db: Any, *, drain_each: bool
    ) -> list[list[Entry]]:
        """The appends of a batch. Pipelined, an append's writes are sent with the next one's
        reads, and their refusal comes with those reads: whose it is, is not known, and the
        batch is written again with each append's statements drained before the next's
        (``drain_each``). The last one's writes drain with the COMMIT (``_append_many_in``
        knows whose they are)."""
        written = []
        for index, args in enumerate(batch):
            try:
                written.append(self._append_tx(db, *args))
                if drain_each and index < len(batch) - 1:
                    self._drain(db)
            except Exception as err:
                if self._is_database_error(err) and not self.refused(err):
                    raise
                if not drain_each and self.refused(err):
                    raise _UnknownRefusal() from err
                raise _ItemFailed(index, err) from err
        return written

    def append_within(
        self, db: Any, chain: str, drafts: Sequence[Draft], *, effect_type: str
    ) -> list[Entry]:
        """Append ``drafts`` to ``chain`` after whatever its head is, inside the caller's write
        transaction (``SqlAccess``: for chains only such transactions write)."""
        return self._append_tx(db, chain, None, drafts, effect_type=effect_type)

    def _append_tx(
        self,
        db: Any,
        effect_id: str,
        expected_head: str | None,
        build: Build,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        """``append`` inside a transaction the caller holds. ``expected_head=None`` appends
        after whatever the head is (for chains only this transaction writes)."""
        seq, row, lease_of = self._append_reads(
            db, effect_id, lease_id if callable(build) else None
        )
        self._ids.confirm(db, seq, effect_id, row[0] if row else effect_type)
        actual = row[2] if row else ""
        if expected_head is not None and actual != expected_head:
            raise HeadConflict(effect_id, expected_head, actual)
        if row is not None and row[9] != actual:
            # the next entry would name a head that is not the one its row's seq names: its
            # chain would fork (or break), and the read of it says so first
            raise JournalCorrupt.at(
                effect_id, row[8], "the effects table's head of its effect is not its head_seq's"
            )
        read = None if lease_of is None else lease_of()
        if read is not None and read.ancestors:
            # a delegated lease: its ancestors too, in this transaction (a root reads nothing more)
            own = own_cents(held_in(row[5:8] if row else None))
            read = self._leases.delegators_tx(db, read, own)
        drafts = list(build(read)) if callable(build) else list(build)
        if not drafts:
            return []
        etype = row[0] if row else effect_type
        if not etype:
            raise ValueError("a new effect needs its effect_type")
        if row is None:
            drafts[0] = _signing_its_type(drafts[0], etype)
        vals = values_json(blobs) if blobs else None
        now = time.time()
        written, rows = self._signed(
            effect_id, seq, actual, row[8] if row else None, drafts, vals, now
        )
        held = self._leases.keep_tx(db, held_in(row[5:8] if row else None), drafts, read)
        after = self._row_after(effect_id, etype, row, drafts, written[-1], now, held)
        self._store(db, rows, (*after, actual))
        return written

    def _store(self, db: Any, entries: Sequence[Sequence[Any]], row: Sequence[Any]) -> None:
        """An append's writes: its entries (``_INSERT_ENTRY``'s parameters, in seq order), the
        new last seq (``_seq_advance``) and the effect's index row (``PUT_ROW``'s parameters:
        the row, and the head it moves on from)."""
        if len(entries) == 1:
            self.execute(db, _INSERT_ENTRY, entries[0])
        else:
            db.cursor().executemany(self._sql(_INSERT_ENTRY), entries)
        self.advance_seq(db, entries[-1][0])
        self.execute(db, PUT_ROW, row)

    @abstractmethod
    def _append_reads(self, db: Any, effect_id: str, lease_id: str | None) -> AppendReads:
        """What an append reads before it writes, locked till the transaction ends: the last
        seq (``_seq_base``), the effect's index row (``APPEND_ROW`` and ``HEAD_ENTRY``; None: a
        new effect) and,
        with ``lease_id``, the lease as its build checks it (with what its *other* effects hold
        reserved: the row says what this one holds; ``lease_in``)."""

    def _signed(
        self,
        effect_id: str,
        seq: int,
        prev: str,
        prev_seq: int | None,
        drafts: Sequence[Draft],
        vals: str | None,
        now: float,
    ) -> tuple[list[Entry], list[tuple[Any, ...]]]:
        """``drafts`` signed as the entries after ``seq`` and ``prev`` (the entry at
        ``prev_seq``, None for a new effect), and their rows as ``_store`` writes them: each
        with the seq of its effect's previous entry (``prev_seq``, which reads walk)."""
        written: list[Entry] = []
        rows: list[tuple[Any, ...]] = []
        grouped = combined(drafts) if self.combine_dispatch else drafts
        last_index = len(grouped) - 1
        for index, group in enumerate(grouped):
            seq += 1
            if isinstance(group, Draft):
                kind, data, version = group.kind, group.data, ENTRY_VERSION
            else:
                kind, data, version = Kind.DISPATCHED, combined_data(group), COMBINED_VERSION
            # the append's values ride on its last entry, which signs their digest
            last_vals = vals if index == last_index else None
            entry = encode_entry(
                seq=seq,
                ts=now,
                effect_id=effect_id,
                kind=kind,
                prev=prev,
                key=self.keyring.signing,
                data=data,
                vals=last_vals,
                version=version,
            )
            if version == ENTRY_VERSION:
                written.append(entry)
            else:
                written += views(entry, entry.data)
            signed = (entry.hash, entry.key_id, entry.sig, entry.body)
            rows.append((seq, effect_id, kind.value, prev, *signed, last_vals, prev_seq))
            prev, prev_seq = entry.hash, seq
        return written, rows

    def _row_after(
        self,
        effect_id: str,
        etype: str,
        row: Sequence[Any] | None,
        drafts: Sequence[Draft],
        head: Entry,
        now: float,
        held: Held,
    ) -> tuple[Any, ...]:
        """The effect's index row after ``drafts`` (``PUT_ROW``'s parameters), whose last
        entry is ``head``; ``row`` is the one before them (status, dispatch times), None for a
        new effect; ``held`` the lease reservation it holds after them (``SqlLeases.keep_tx``)."""
        status = state_kind(drafts, Kind(row[1]) if row else None)
        if status is None:
            raise ValueError("a new effect must start with a state entry, not annotations")
        dispatched = any(d.kind is Kind.DISPATCHED for d in drafts)
        first_dispatch = row[3] if row and row[3] is not None else (now if dispatched else None)
        last_dispatch = now if dispatched else (row[4] if row else None)
        # a new effect's origin is what its first entry signs of it, and never changes
        return (
            effect_id,
            etype,
            status.value,
            head.hash,
            head.seq,
            now,
            first_dispatch,
            last_dispatch,
            origin_in(drafts[0].data) if row is None else None,
            *held_columns(held),
        )

    # -- reading -------------------------------------------------------------------------------

    def read(self, effect_id: str) -> list[Entry]:
        """The effect's entries, checked first (chain, signatures, value digests, index row):
        ``JournalCorrupt`` names the entry when they do not hold."""
        return [e for raw in self._checked(effect_id) for e in decode_entries(raw)]

    def check(self, effect_id: str) -> None:
        self._checked(effect_id)

    def _checked(self, effect_id: str) -> list[RawEntry]:
        params = (effect_id,) * READ_EFFECT_PARAMS
        rows = self.reading(lambda db: self.execute(db, READ_EFFECT_SQL, params).fetchall())
        return self._checked_rows(effect_id, rows)

    def _checked_rows(self, effect_id: str, rows: Sequence[Sequence[Any]]) -> list[RawEntry]:
        """The entries in ``READ_EFFECT_SQL``'s rows, checked as ``read`` checks them."""
        width = len(ENTRY_COLUMNS.split(","))
        index = None if not rows or rows[0][width] is None else effect_row(rows[0][width:])
        raws = [raw_entry(r[:width]) for r in rows if r[0] is not None]
        if raws or index is not None:
            check_chain(effect_id, raws, self.keyring, index)
        return raws

    def row(self, effect_id: str) -> EffectRow | None:
        values = self.reading(
            lambda db: self.execute(
                db, f"SELECT {ROW_COLUMNS} FROM effects WHERE effect_id = ?", (effect_id,)
            ).fetchone()
        )
        return None if values is None else effect_row(values)

    def effects(
        self,
        *,
        status: Kind | None = None,
        in_doubt: bool = False,
        older_than: float | None = None,
        limit: int | None = None,
        since: float | None = None,
    ) -> list[EffectRow]:
        if in_doubt:
            sql = IN_DOUBT_SQL
            params: list[Any] = [time.time() - (older_than or 0.0)]
        else:
            # policy chains, archive anchors and configuration are the journal's own records
            where: list[str] = [f"effect_type NOT IN ({', '.join('?' * len(OWN_CHAIN_TYPES))})"]
            params = list(OWN_CHAIN_TYPES)
            if status is not None:
                where.append("status = ?")
                params.append(status.value)
            if older_than is not None:
                where.append("updated_ts <= ?")
                params.append(time.time() - older_than)
            if since is not None:
                where.append("updated_ts >= ?")
                params.append(since)
            sql = f"SELECT {ROW_COLUMNS} FROM effects WHERE " + " AND ".join(where)
            sql += " ORDER BY updated_ts DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self.reading(lambda db: self.execute(db, sql, params).fetchall())
        return [effect_row(r) for r in rows]

    def blob(self, effect_id: str, name: str) -> Any:
        return value_of(self.read(effect_id), name)

    def by_origin(self, origin: str) -> list[str]:
        """Found through ``effects_origin``, which indexes an origin's first 16 hex digits
        (schema 13: narrower entries, fewer pages per new effect); the whole origin is then
        compared in the row."""
        rows = self.reading(
            lambda db: self.execute(
                db,
                "SELECT effect_id FROM effects WHERE substr(origin, 1, 16) = substr(?, 1, 16) "
                "AND origin = ?",
                (origin, origin),
            ).fetchall()
        )
        return [r[0] for r in rows]

    def iter_rows(self) -> Iterator[EffectRow]:
        return (effect_row(r) for r in self.row_values())

    def row_values(self) -> Sequence[Sequence[Any]]:
        sql = f"SELECT {ROW_COLUMNS} FROM effects"
        return self.reading(lambda db: self.execute(db, sql).fetchall())

    def anchor_entries(self) -> list[RawEntry]:
        sql = f"SELECT {ENTRY_COLUMNS} FROM entries WHERE kind = 'ANCHOR' ORDER BY seq"
        return [raw_entry(r) for r in self.reading(lambda db: self.execute(db, sql).fetchall())]

    def last_raw(self) -> RawEntry | None:
        r = self.reading(
            lambda db: self.execute(
                db, f"SELECT {ENTRY_COLUMNS} FROM entries ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        )
        return None if r is None else raw_entry(r)

    def head(self) -> JournalHead | None:
        raw = self.last_raw()
        return None if raw is None else JournalHead(seq=raw.seq, hash=raw.hash)

    def schema_version(self) -> int:
        sql = "SELECT value FROM meta WHERE key = 'schema_version'"
        row = self.reading(lambda db: self.execute(db, sql).fetchone())
        return int(row[0])

    def control_rows(self) -> ControlRows:
        def run(db: Any) -> ControlRows:
            leases = self.execute(
                db, "SELECT lease_id, doc, head_seq, head_hash, seal FROM leases ORDER BY lease_id"
            ).fetchall()
            spends = self.execute(
                db, "SELECT lease_id, reserved_cents, seal FROM lease_spend ORDER BY lease_id"
            ).fetchall()
            sessions = self.execute(
                db,
                "SELECT s.session, s.doc, s.head, s.seal, c.head FROM policy_sessions s "
                "LEFT JOIN effects c ON c.effect_id = 'policy:' || s.session ORDER BY s.session",
            ).fetchall()
            approvals = self.execute(
                db, "SELECT binding, doc, seal FROM policy_approvals ORDER BY binding"
            ).fetchall()
            return ControlRows(leases, spends, sessions, approvals, self._policy.sealed_rows(db))

        return self.reading(run)

    @property
    def leases(self) -> SqlLeases:
        return self._leases

    @property
    def policy(self) -> SqlPolicy:
        return self._policy

    @property
    def notifications(self) -> SqlNotifications:
        return self._notifications

    @property
    def code_uses(self) -> SqlCodeUses:
        return self._code_uses

    @abstractmethod
    def is_unique_violation(self, err: BaseException) -> bool:
        """Whether ``err`` is the database refusing a duplicate key (``SqlAccess``)."""

    @abstractmethod
    def claims_held(self) -> int:
        """How many effects this process holds claims on: the effects in flight here
        (``BatchWriter``)."""

    @abstractmethod
    def _is_database_error(self, err: BaseException) -> bool:
        """An error of the database itself (its driver's), not of one append's inputs."""


class SqlTx:
    """One write transaction of a SQL journal, as ``transact_async``'s function sees it
    (``JournalTx``)."""

    def __init__(self, journal: SqlJournal, db: Any) -> None:
        self._journal = journal
        self.db = db

    def append(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        args: AppendArgs = (effect_id, expected_head, build, effect_type, lease_id, blobs)
        try:
            return self._journal._append_tx(self.db, *args)
        except Exception as err:
            raise self._journal._append_error(args, err) from err
