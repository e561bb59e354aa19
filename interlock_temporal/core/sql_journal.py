"""What the SQL journals share: the append, the reads, leases and the policy's state, written
once in SQL both SQLite and PostgreSQL run. A backend supplies its connections and
transactions, its claims, its schema, and the few words the two dialects spell differently."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from json.encoder import encode_basestring
from typing import Any, TypeVar

from .errors import HeadConflict, JournalConfigError
from .identity import canonical
from .journal import (
    POLICY_CHAIN_TYPE,
    SCHEMA_VERSION,
    Build,
    Journal,
    RawEntry,
    check_chain,
    decode_entry,
    encode_entry,
    origin_in,
    policy_chain,
    state_kind,
    value_of,
    values_digest,
)
from .leases import LeaseStore, lease_from_doc
from .models import Draft, EffectRow, Entry, JournalHead, Kind, Lease
from .policy import (
    Approval,
    ApprovalScope,
    ApprovalStatus,
    Decision,
    Outcome,
    PolicyState,
    PolicyStore,
    Scopes,
    SessionState,
    dump_session,
    load_session,
    reset_circuit,
)

T = TypeVar("T")

ROW_COLUMNS = (
    "effect_id, effect_type, status, head, head_seq, updated_ts, first_dispatch_ts, "
    "last_dispatch_ts, origin"
)
ENTRY_COLUMNS = "seq, effect_id, kind, prev, hash, key_id, sig, body, vals"
_ENTRY_COLUMNS_E = ", ".join("e." + c.strip() for c in ENTRY_COLUMNS.split(","))
_ROW_COLUMNS_F = ", ".join("f." + c.strip() for c in ROW_COLUMNS.split(","))
_NO_ENTRY = ", ".join(["NULL"] * len(ENTRY_COLUMNS.split(",")))
#: an effect's entries and its index row, in one statement (one snapshot): the entries with the
#: row beside each, or the row alone when it has no entries
READ_EFFECT_SQL = (
    f"SELECT {_ENTRY_COLUMNS_E}, {_ROW_COLUMNS_F} FROM entries e "
    "LEFT JOIN effects f ON f.effect_id = e.effect_id WHERE e.effect_id = ? "
    f"UNION ALL SELECT {_NO_ENTRY}, {_ROW_COLUMNS_F} FROM effects f WHERE f.effect_id = ? "
    "AND NOT EXISTS (SELECT 1 FROM entries WHERE effect_id = ?) ORDER BY 1"
)


def _values_json(values: Mapping[str, Any]) -> str:
    """The JSON object of an append's values, each already canonical JSON bytes or made so."""
    parts = [
        encode_basestring(name) + ":" + (v if isinstance(v, bytes) else canonical(v)).decode()
        for name, v in values.items()
    ]
    return "{" + ",".join(parts) + "}"


#: what was started and never confirmed, oldest send first; "older than" counts from the last
#: send, so annotations appended since do not hide an effect (the literal status lets the
#: database use its partial in-doubt index)
IN_DOUBT_SQL = (
    f"SELECT {ROW_COLUMNS} FROM effects WHERE status = 'DISPATCHED' AND last_dispatch_ts <= ? "
    "ORDER BY last_dispatch_ts"
)


def effect_row(values: Sequence[Any]) -> EffectRow:
    return EffectRow(
        effect_id=values[0],
        effect_type=values[1],
        status=Kind(values[2]),
        head=values[3],
        head_seq=values[4],
        updated_ts=values[5],
        first_dispatch_ts=values[6],
        last_dispatch_ts=values[7],
        origin=values[8],
    )


def raw_entry(values: Sequence[Any]) -> RawEntry:
    seq, eid, kind, prev, hash_, key_id, sig, body, vals = values
    return RawEntry(seq, eid, kind, prev, hash_, key_id, sig, bytes(body), vals)


_AppendArgs = tuple[str, str, Build, str | None, str | None, Mapping[str, Any] | None]


@dataclasses.dataclass(slots=True)
class _Queued:
    args: _AppendArgs
    future: asyncio.Future[list[Entry]]


class _ItemFailed(Exception):
    """One append of a batch failed on its own (its head moved, its build raised): the batch's
    transaction is rolled back and run again without it."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index)
        self.index = index
        self.error = error


class _GroupCommit:
    """Group commit of one event loop's appends. While one batch is being flushed to disk on
    the journal's writer thread, the appends the loop's other coroutines start queue up; they
    are written together as the next batch, in one transaction and one flush.

    A batch costs far more than an append in it: a flush and two thread hand-offs. In process,
    an effect whose appends go one per batch takes about three times the CPU of one whose
    appends share batches of twenty. So when a batch is about to start while another effect of
    this process holds its claim and has not queued its append, the batch first waits the
    journal's ``commit_delay`` for it and for whatever else arrives meanwhile (PostgreSQL's
    ``commit_delay`` with ``commit_siblings``). An append with no such company is written at
    once (and one alone in its process, on a loop that runs nothing else, never comes here:
    ``SqlJournal.append_async`` writes it itself)."""

    def __init__(
        self, journal: SqlJournal, loop: asyncio.AbstractEventLoop, writer: ThreadPoolExecutor
    ) -> None:
        self.journal = journal
        self.loop = loop
        self.writer = writer
        self._queue: list[_Queued] = []
        self._busy = False

    @property
    def idle(self) -> bool:
        return not self._busy and not self._queue

    def submit(self, args: _AppendArgs) -> asyncio.Future[list[Entry]]:
        future: asyncio.Future[list[Entry]] = self.loop.create_future()
        self._queue.append(_Queued(args, future))
        if not self._busy:
            self._start()
        return future

    def _start(self) -> None:
        delay = self.journal.commit_delay
        if delay > 0 and 0 < len(self._queue) < self.journal._claims_held():
            self._busy = True
            self.loop.call_later(delay, self._next)
        else:
            self._next()

    def _next(self) -> None:
        while True:
            # an append whose caller was cancelled before it was written is not written
            batch = [q for q in self._queue if not q.future.cancelled()]
            self._queue = []
            self._busy = bool(batch)
            if not batch:
                return
            try:
                done = self.journal._write_batch(self.loop, self.writer, [q.args for q in batch])
            except Exception as err:  # the transaction could not even begin
                _settle(batch, [err] * len(batch))
                continue
            done.add_done_callback(functools.partial(self._finish, batch))
            return

    def _finish(
        self, batch: list[_Queued], done: asyncio.Future[list[list[Entry] | Exception]]
    ) -> None:
        outcomes: Sequence[list[Entry] | BaseException]
        try:
            outcomes = done.result()
        except BaseException as err:
            outcomes = [err] * len(batch)
        _settle(batch, outcomes)
        self._start()


def _no_wakeup_preemption() -> None:
    """Make the writer thread a batch thread (Linux's ``SCHED_BATCH``: same priority, but its
    wake-ups never preempt the running thread). Handed a flush, a normal thread woken on the
    loop's CPU preempts the loop's thread while that thread still holds the GIL, runs until it
    needs the GIL, and hands the CPU back: two context switches per hand-off for nothing.
    Measured in a worker, 64 activities in flight: about 0.4 ms less CPU per activity in the
    worker and 8 fewer context switches. Where the policy is missing or refused the writer
    stays a normal thread: slower, never wrong."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, policy, os.sched_param(0))


def _settle(batch: Sequence[_Queued], outcomes: Sequence[list[Entry] | BaseException]) -> None:
    for queued, outcome in zip(batch, outcomes, strict=True):
        if queued.future.done():
            continue  # its caller was cancelled meanwhile; what was written stays written
        if isinstance(outcome, BaseException):
            queued.future.set_exception(outcome)
        else:
            queued.future.set_result(outcome)


class SqlJournal(Journal):
    """A journal in SQL tables. SQL is written with ``?`` placeholders."""

    def __init__(self) -> None:
        #: the thread that writes ``append_async``'s batches, and each event loop's queue
        self._writer: ThreadPoolExecutor | None = None
        self._writer_lock = threading.Lock()
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _GroupCommit] = (
            weakref.WeakKeyDictionary()
        )

    #: the two-argument maximum
    GREATEST = "max"
    #: the suffix that locks the rows a transaction read (none where the transaction holds
    #: the whole database, as SQLite's ``BEGIN IMMEDIATE`` does)
    FOR_UPDATE = ""
    #: the suffix that keeps rows a transaction read from changing until it ends (a lease read
    #: by the dispatch transaction: a revoke waits for the dispatch to be recorded)
    FOR_SHARE = ""

    def _sql(self, text: str) -> str:
        return text

    def _x(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return db.execute(self._sql(sql), tuple(params))

    @abstractmethod
    def _write(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)`` in one durable write transaction."""

    @abstractmethod
    def _read(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)`` for reads."""

    @abstractmethod
    def _seq_base(self, db: Any) -> int:
        """Inside a write transaction: the last seq, held until the transaction ends so that
        appends get dense seqs in commit order."""

    def _seq_advance(self, db: Any, seq: int) -> None:
        """Inside the same transaction: the new last seq (for backends that keep a counter)."""

    def _migrate_in(self, db: Any, migrations: Sequence[str]) -> None:
        """Bring the schema to ``SCHEMA_VERSION`` inside the caller's transaction (which keeps
        other processes out while it runs)."""
        self._x(db, "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row = self._x(db, "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise JournalConfigError(
                f"journal {self.url} has schema {version}; this release reads up to "
                f"{SCHEMA_VERSION}: upgrade interlock-temporal"
            )
        for number in range(version, SCHEMA_VERSION):
            for statement in migrations[number].split(";"):
                if statement.strip():
                    db.execute(statement)
            if number + 1 == 4:
                self._bind_values(db)
        self._x(
            db,
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )

    def _bind_values(self, db: Any) -> None:
        """Schema 4: entries sign the digest of the values stored beside them. Values stored
        before (format-1 entries) are bound now, as they are, by one signed ``VALUES_BOUND``
        entry per effect, so that from here on an edit of any of them is caught."""
        rows = self._x(
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
        args: _AppendArgs = (effect_id, expected_head, build, effect_type, lease_id, blobs)
        try:
            return self._write(lambda db: self._append_tx(db, *args))
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
        group = self._group_commit()
        if group.idle and not self.loop_shared and self._claims_held() <= 1:
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

    def _group_commit(self) -> _GroupCommit:
        loop = asyncio.get_running_loop()
        with self._writer_lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(
                    1, thread_name_prefix="interlock-journal", initializer=_no_wakeup_preemption
                )
            group = self._groups.get(loop)
            if group is None:
                group = self._groups[loop] = _GroupCommit(self, loop, self._writer)
            return group

    def _close_writer(self) -> None:
        """Wait for the batch being written, and stop the writer thread."""
        with self._writer_lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True)

    def _write_batch(
        self,
        loop: asyncio.AbstractEventLoop,
        writer: ThreadPoolExecutor,
        batch: Sequence[_AppendArgs],
    ) -> asyncio.Future[list[list[Entry] | Exception]]:
        """Write a batch of appends in one transaction; the future resolves once it is durable.
        Here the whole transaction runs on the writer thread, leaving the loop free while a
        database server is asked."""
        return loop.run_in_executor(writer, self._append_many, batch, self._write)

    def _append_many(
        self, batch: Sequence[_AppendArgs], transaction: Callable[[Callable[[Any], Any]], Any]
    ) -> list[list[Entry] | Exception]:
        """Several appends in one ``transaction``, in order (a later append of one effect sees
        an earlier one's head). An append that fails on its own gets its own error and the rest
        are written again without it; an error of the database fails them all."""
        outcomes: dict[int, list[Entry] | Exception] = {}
        left = list(range(len(batch)))
        while left:
            try:
                written = transaction(
                    functools.partial(self._append_batch, [batch[i] for i in left])
                )
            except _ItemFailed as failed:
                index = left.pop(failed.index)
                outcomes[index] = self._append_error(batch[index], failed.error)
                continue
            except Exception as err:
                outcomes.update(dict.fromkeys(left, err))
                break
            outcomes.update(zip(left, written, strict=True))
            break
        return [outcomes[i] for i in range(len(batch))]

    def _append_error(self, args: _AppendArgs, err: Exception) -> Exception:
        """What a failed append raises: the UNIQUE (effect_id, prev) backstop is a moved head."""
        if self._is_unique_violation(err):
            return HeadConflict(args[0], args[1], "?")
        return err

    def _append_batch(self, batch: Sequence[_AppendArgs], db: Any) -> list[list[Entry]]:
        written = []
        for index, args in enumerate(batch):
            try:
                written.append(self._append_tx(db, *args))
            except Exception as err:
                if self._is_database_error(err) and not self._is_unique_violation(err):
                    raise
                raise _ItemFailed(index, err) from err
        return written

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
        seq = self._seq_base(db)
        row = self._x(
            db,
            "SELECT effect_type, status, head, first_dispatch_ts, last_dispatch_ts "
            f"FROM effects WHERE effect_id = ?{self.FOR_UPDATE}",
            (effect_id,),
        ).fetchone()
        actual = row[2] if row else ""
        if expected_head is not None and actual != expected_head:
            raise HeadConflict(effect_id, expected_head, actual)
        if callable(build):
            lease = None if lease_id is None else self.leases.read_tx(db, lease_id, effect_id)
            drafts = list(build(lease))
        else:
            drafts = list(build)
        if not drafts:
            return []
        etype = row[0] if row else effect_type
        if not etype:
            raise ValueError("a new effect needs its effect_type")
        if row is None and drafts[0].data.get("effect_type") != etype:
            # the first entry signs the effect's type, so the index row can be checked
            if "effect_type" in drafts[0].data:
                raise ValueError("the first entry's effect_type differs from the effect's")
            drafts[0] = Draft(kind=drafts[0].kind, data={**drafts[0].data, "effect_type": etype})
        vals = _values_json(blobs) if blobs else None
        now = time.time()
        prev = actual
        written: list[Entry] = []
        last_index = len(drafts) - 1
        for index, draft in enumerate(drafts):
            seq += 1
            entry = encode_entry(
                seq=seq,
                ts=now,
                effect_id=effect_id,
                kind=draft.kind,
                prev=prev,
                key=self.keyring.signing,
                data=draft.data,
                # the append's values ride on its last entry, which signs their digest
                vals=vals if index == last_index else None,
            )
            written.append(entry)
            prev = entry.hash
        last = written[-1]
        rows = [
            (e.seq, e.effect_id, e.kind.value, e.prev, e.hash, e.key_id, e.sig, e.body)
            + ((vals,) if e is last else (None,))
            for e in written
        ]
        db.cursor().executemany(
            self._sql(f"INSERT INTO entries ({ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            rows,
        )
        self._seq_advance(db, seq)
        self._keep_budgets(db, effect_id, drafts)
        status = state_kind(drafts, Kind(row[1]) if row else None)
        if status is None:
            raise ValueError("a new effect must start with a state entry, not annotations")
        dispatched = any(d.kind is Kind.DISPATCHED for d in drafts)
        first_dispatch = row[3] if row and row[3] is not None else (now if dispatched else None)
        last_dispatch = now if dispatched else (row[4] if row else None)
        # a new effect's origin is what its first entry signs of it, and never changes
        self._x(
            db,
            f"INSERT INTO effects ({ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (effect_id) DO UPDATE SET status = excluded.status, "
            "head = excluded.head, head_seq = excluded.head_seq, "
            "updated_ts = excluded.updated_ts, first_dispatch_ts = excluded.first_dispatch_ts, "
            "last_dispatch_ts = excluded.last_dispatch_ts",
            (
                effect_id,
                etype,
                status.value,
                prev,
                seq,
                now,
                first_dispatch,
                last_dispatch,
                origin_in(drafts[0].data) if row is None else None,
            ),
        )
        return written

    def _keep_budgets(self, db: Any, effect_id: str, drafts: Sequence[Draft]) -> None:
        """Lease budgets move with the entries that change them, in their transaction: a
        DISPATCHED that reserves (its ``budget`` note), a REFUSED (it never executed: give the
        reservation back), a late COMMITTED after a REFUSED (it did: charge it again)."""
        for draft in drafts:
            if draft.kind is Kind.DISPATCHED:
                note = draft.data.get("budget")
                if note is not None:
                    self.leases.charge_tx(db, effect_id, note["lease_id"], note["cents"])
            elif draft.kind is Kind.REFUSED:
                self.leases.release_tx(db, effect_id)
            elif draft.kind is Kind.COMMITTED and draft.data.get("after") == Kind.REFUSED.value:
                self.leases.recharge_tx(db, effect_id)

    # -- reading -------------------------------------------------------------------------------

    def read(self, effect_id: str) -> list[Entry]:
        """The effect's entries, checked first (chain, signatures, value digests, index row):
        ``JournalCorrupt`` names the entry when they do not hold."""
        rows = self._read(
            lambda db: self._x(db, READ_EFFECT_SQL, (effect_id, effect_id, effect_id)).fetchall()
        )
        width = len(ENTRY_COLUMNS.split(","))
        index = None if not rows or rows[0][width] is None else effect_row(rows[0][width:])
        raws = [raw_entry(r[:width]) for r in rows if r[0] is not None]
        if raws or index is not None:
            check_chain(effect_id, raws, self.keyring, index)
        return [decode_entry(raw) for raw in raws]

    def row(self, effect_id: str) -> EffectRow | None:
        values = self._read(
            lambda db: self._x(
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
            # policy chains are the policy layer's record, not effects
            where: list[str] = ["effect_type <> ?"]
            params = [POLICY_CHAIN_TYPE]
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
        rows = self._read(lambda db: self._x(db, sql, params).fetchall())
        return [effect_row(r) for r in rows]

    def blob(self, effect_id: str, name: str) -> Any:
        return value_of(self.read(effect_id), name)

    def by_origin(self, origin: str) -> list[str]:
        rows = self._read(
            lambda db: self._x(
                db, "SELECT effect_id FROM effects WHERE origin = ?", (origin,)
            ).fetchall()
        )
        return [r[0] for r in rows]

    def iter_rows(self) -> Iterator[EffectRow]:
        rows = self._read(lambda db: self._x(db, f"SELECT {ROW_COLUMNS} FROM effects").fetchall())
        return (effect_row(r) for r in rows)

    def last_raw(self) -> RawEntry | None:
        r = self._read(
            lambda db: self._x(
                db, f"SELECT {ENTRY_COLUMNS} FROM entries ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        )
        return None if r is None else raw_entry(r)

    def head(self) -> JournalHead | None:
        raw = self.last_raw()
        return None if raw is None else JournalHead(seq=raw.seq, hash=raw.hash)

    def schema_version(self) -> int:
        row = self._read(
            lambda db: self._x(db, "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        )
        return int(row[0])

    @property
    def leases(self) -> SqlLeases:
        return SqlLeases(self)

    @property
    def policy(self) -> SqlPolicy:
        return SqlPolicy(self)

    @abstractmethod
    def _is_unique_violation(self, err: BaseException) -> bool: ...

    @abstractmethod
    def _claims_held(self) -> int:
        """How many effects this process holds claims on: the effects in flight here."""

    @abstractmethod
    def _is_database_error(self, err: BaseException) -> bool:
        """An error of the database itself (its driver's), not of one append's inputs."""


def _lease_doc(lease: Lease) -> str:
    """A lease as stored: its reservations live in ``lease_spend``, never in the document."""
    return lease.model_dump_json(exclude={"reserved_cents"})


class SqlLeases(LeaseStore):
    """Leases, and their budgets: ``lease_spend`` holds what each budgeted lease has reserved,
    ``lease_charges`` each effect's reservation (at most one per effect, active or given
    back). The dispatch transaction calls the ``*_tx`` methods with its own connection."""

    def __init__(self, journal: SqlJournal) -> None:
        self._j = journal

    def _insert(self, lease: Lease) -> None:
        j = self._j

        def run(db: Any) -> None:
            j._x(
                db,
                "INSERT INTO leases (lease_id, doc) VALUES (?, ?)",
                (lease.lease_id, _lease_doc(lease)),
            )
            if lease.budget_cents is not None:
                j._x(
                    db,
                    "INSERT INTO lease_spend (lease_id, reserved_cents) VALUES (?, 0)",
                    (lease.lease_id,),
                )

        try:
            j._write(run)
        except Exception as err:
            if j._is_unique_violation(err):
                raise ValueError("a lease with this lease_id already exists") from None
            raise

    def revoke(self, lease_id: str) -> bool:
        j = self._j

        def run(db: Any) -> bool:
            row = j._x(
                db, f"SELECT doc FROM leases WHERE lease_id = ?{j.FOR_UPDATE}", (lease_id,)
            ).fetchone()
            if row is None:
                return False
            lease = Lease.model_validate_json(row[0])
            now = time.time()
            if lease.revoked_at is not None or (
                lease.expires_at is not None and lease.expires_at <= now
            ):
                return False
            revoked = lease.model_copy(update={"revoked_at": now})
            j._x(
                db, "UPDATE leases SET doc = ? WHERE lease_id = ?", (_lease_doc(revoked), lease_id)
            )
            return True

        return j._write(run)

    def _with_reserved(self, db: Any, lease: Lease) -> Lease:
        if lease.budget_cents is None:
            return lease
        row = self._j._x(
            db, "SELECT reserved_cents FROM lease_spend WHERE lease_id = ?", (lease.lease_id,)
        ).fetchone()
        return lease.model_copy(update={"reserved_cents": int(row[0]) if row else 0})

    def get(self, lease_id: str) -> Lease | None:
        def run(db: Any) -> Lease | None:
            sql = "SELECT doc FROM leases WHERE lease_id = ?"
            row = self._j._x(db, sql, (lease_id,)).fetchone()
            return None if row is None else self._with_reserved(db, lease_from_doc(row[0]))

        return self._j._read(run)

    def list(self) -> list[Lease]:
        def run(db: Any) -> list[Lease]:
            rows = self._j._x(db, "SELECT doc FROM leases ORDER BY lease_id").fetchall()
            return [self._with_reserved(db, lease_from_doc(r[0])) for r in rows]

        leases = self._j._read(run)
        return sorted(leases, key=lambda lease: (lease.issued_at, lease.lease_id))

    # -- inside the journal's append transaction ------------------------------------------

    def read_tx(self, db: Any, lease_id: str, effect_id: str) -> Lease | None:
        """The lease as the dispatch transaction checks it. A budgeted lease's row in
        ``lease_spend`` is locked until the transaction ends, and read with what its *other*
        effects hold reserved, so concurrent dispatches under one budget take turns."""
        j = self._j
        doc = j._x(db, f"SELECT doc FROM leases WHERE lease_id = ?{j.FOR_SHARE}", (lease_id,))
        found = doc.fetchone()
        lease = None if found is None else lease_from_doc(found[0])
        if lease is None or lease.budget_cents is None:
            return lease
        (reserved,) = j._x(
            db,
            f"SELECT reserved_cents FROM lease_spend WHERE lease_id = ?{j.FOR_UPDATE}",
            (lease_id,),
        ).fetchone() or (0,)
        own = j._x(
            db,
            "SELECT cents FROM lease_charges WHERE effect_id = ? AND active = 1",
            (effect_id,),
        ).fetchone()
        others = int(reserved) - (int(own[0]) if own else 0)
        return lease.model_copy(update={"reserved_cents": others})

    def charge_tx(self, db: Any, effect_id: str, lease_id: str, cents: int) -> bool:
        """Reserve ``cents`` of ``lease_id`` for ``effect_id``, once: an effect that holds a
        reservation already keeps it. True when this reserved something."""
        j = self._j
        held = j._x(
            db, "SELECT active FROM lease_charges WHERE effect_id = ?", (effect_id,)
        ).fetchone()
        if held is not None and int(held[0]) == 1:
            return False
        j._x(
            db,
            "INSERT INTO lease_charges (effect_id, lease_id, cents, active) VALUES (?, ?, ?, 1) "
            "ON CONFLICT (effect_id) DO UPDATE SET lease_id = excluded.lease_id, "
            "cents = excluded.cents, active = 1",
            (effect_id, lease_id, cents),
        )
        j._x(
            db,
            "UPDATE lease_spend SET reserved_cents = reserved_cents + ? WHERE lease_id = ?",
            (cents, lease_id),
        )
        return True

    def release_tx(self, db: Any, effect_id: str) -> None:
        """Give back ``effect_id``'s reservation: it ended without executing."""
        j = self._j
        held = j._x(
            db,
            f"SELECT lease_id, cents FROM lease_charges WHERE effect_id = ? AND active = 1"
            f"{j.FOR_UPDATE}",
            (effect_id,),
        ).fetchone()
        if held is None:
            return
        lease_id, cents = held
        j._x(db, "UPDATE lease_charges SET active = 0 WHERE effect_id = ?", (effect_id,))
        j._x(
            db,
            "UPDATE lease_spend SET reserved_cents = reserved_cents - ? WHERE lease_id = ?",
            (cents, lease_id),
        )

    def recharge_tx(self, db: Any, effect_id: str) -> bool:
        """A late COMMITTED of an effect that gave its reservation back: it executed after all,
        so it is charged again, budget or not. True when it was."""
        sql = "SELECT lease_id, cents, active FROM lease_charges WHERE effect_id = ?"
        held = self._j._x(db, sql, (effect_id,)).fetchone()
        if held is None or int(held[2]) == 1:
            return False
        return self.charge_tx(db, effect_id, str(held[0]), int(held[1]))


class SqlPolicy(PolicyStore):
    """The policy's state in the journal's database. Each evaluation locks the rows it reads
    (its session, the principal's and namespace's spend, the approval) and only then, if it
    has a note to sign, the journal's sequence."""

    def __init__(self, journal: SqlJournal) -> None:
        self._j = journal

    def _spent(self, db: Any, scope: str) -> float:
        j = self._j
        if j.FOR_UPDATE:
            # a row that does not exist yet cannot be locked: make it first, so two first
            # charges to one scope wait for each other instead of both reading nothing
            j._x(
                db,
                "INSERT INTO policy_spend (scope, spent_usd) VALUES (?, 0.0) "
                "ON CONFLICT (scope) DO NOTHING",
                (scope,),
            )
        row = j._x(
            db, f"SELECT spent_usd FROM policy_spend WHERE scope = ?{j.FOR_UPDATE}", (scope,)
        ).fetchone()
        return 0.0 if row is None else float(row[0])

    def _load(self, db: Any, session: str) -> SessionState:
        j = self._j
        if j.FOR_UPDATE:
            j._x(
                db,
                "INSERT INTO policy_sessions (session, doc) VALUES (?, ?) "
                "ON CONFLICT (session) DO NOTHING",
                (session, dump_session(SessionState()).decode()),
            )
        row = j._x(
            db,
            f"SELECT doc FROM policy_sessions WHERE session = ?{j.FOR_UPDATE}",
            (session,),
        ).fetchone()
        return load_session(row[0] if row else None)

    def _save(self, db: Any, session: str, state: SessionState) -> None:
        self._j._x(
            db,
            "INSERT INTO policy_sessions (session, doc) VALUES (?, ?) "
            "ON CONFLICT (session) DO UPDATE SET doc = excluded.doc",
            (session, dump_session(state).decode()),
        )

    def _add_spend(self, db: Any, scope: str, delta: float) -> None:
        g = self._j.GREATEST
        self._j._x(
            db,
            f"INSERT INTO policy_spend (scope, spent_usd) VALUES (?, {g}(0.0, ?)) "
            f"ON CONFLICT (scope) DO UPDATE SET spent_usd = {g}(0.0, policy_spend.spent_usd + ?)",
            (scope, delta, delta),
        )

    def _note(self, db: Any, session: str, data: dict[str, Any]) -> None:
        self._j._append_tx(
            db,
            policy_chain(session),
            None,
            [Draft(kind=Kind.POLICY, data=data)],
            effect_type=POLICY_CHAIN_TYPE,
        )

    def _approval(self, db: Any, binding: str, lock: bool = False) -> Approval | None:
        if not binding:
            return None
        j = self._j
        row = j._x(
            db,
            "SELECT doc FROM policy_approvals WHERE binding = ?" + (j.FOR_UPDATE if lock else ""),
            (binding,),
        ).fetchone()
        return None if row is None else Approval.model_validate_json(row[0])

    def _put_approval(self, db: Any, approval: Approval) -> None:
        self._j._x(
            db,
            "INSERT INTO policy_approvals (binding, doc) VALUES (?, ?) "
            "ON CONFLICT (binding) DO UPDATE SET doc = excluded.doc",
            (approval.binding, approval.model_dump_json()),
        )

    def evaluate(
        self,
        scopes: Scopes,
        fn: Callable[[PolicyState, bool, Approval | None, bool], Outcome],
        *,
        nonce: str = "",
    ) -> Decision:
        j = self._j

        def run(db: Any) -> Decision:
            session = self._load(db, scopes.session)
            principal = self._spent(db, "principal:" + scopes.principal)
            namespace = self._spent(db, "namespace:" + scopes.namespace)
            admitted = (
                j._x(
                    db, "SELECT 1 FROM policy_admissions WHERE execution = ?", (scopes.execution,)
                ).fetchone()
                is not None
            )
            approval = self._approval(db, scopes.binding, lock=True)
            # the session's row is locked (above): no other check of this session can record
            # the nonce between this read and the write below
            replayed = bool(nonce) and (
                j._x(
                    db,
                    "SELECT 1 FROM policy_nonces WHERE session = ? AND nonce = ?",
                    (scopes.session, nonce),
                ).fetchone()
                is not None
            )
            out = fn(PolicyState(session, principal, namespace), admitted, approval, replayed)
            after = out.state
            if after.session != session:
                self._save(db, scopes.session, after.session)
            if after.principal_spent_usd != principal:
                self._add_spend(
                    db, "principal:" + scopes.principal, after.principal_spent_usd - principal
                )
            if after.namespace_spent_usd != namespace:
                self._add_spend(
                    db, "namespace:" + scopes.namespace, after.namespace_spent_usd - namespace
                )
            if out.charge is not None:
                j._x(
                    db,
                    "INSERT INTO policy_admissions (execution, session, principal, namespace, "
                    "estimate_usd, ts) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (execution) DO NOTHING",
                    (
                        scopes.execution,
                        scopes.session,
                        scopes.principal,
                        scopes.namespace,
                        out.charge,
                        time.time(),
                    ),
                )
            if out.request is not None and not (
                approval is not None
                and approval.status == "pending"
                and approval.same_request(out.request)
            ):
                self._put_approval(db, out.request)
            if out.consumed is not None and out.consumed.scope == "once":
                self._put_approval(db, out.consumed.model_copy(update={"status": "consumed"}))
            if out.nonce:
                j._x(
                    db,
                    "INSERT INTO policy_nonces (session, nonce) VALUES (?, ?) "
                    "ON CONFLICT (session, nonce) DO NOTHING",
                    (scopes.session, out.nonce),
                )
            if out.note is not None:
                self._note(db, scopes.session, out.note)
            return out.decision

        return j._write(run)

    def settle_cost(self, scopes: Scopes, actual_usd: float) -> bool:
        if not actual_usd >= 0 or actual_usd == float("inf"):
            raise ValueError("a cost must be a finite, non-negative number of USD")
        j = self._j

        def run(db: Any) -> bool:
            row = j._x(
                db,
                "SELECT session, principal, namespace, estimate_usd, actual_usd "
                f"FROM policy_admissions WHERE execution = ?{j.FOR_UPDATE}",
                (scopes.execution,),
            ).fetchone()
            if row is None or row[4] is not None:
                return False
            session_id, principal, namespace, estimate, _ = row
            delta = actual_usd - estimate
            state = self._load(db, session_id)
            self._save(
                db,
                session_id,
                dataclasses.replace(state, spent_usd=max(0.0, state.spent_usd + delta)),
            )
            self._add_spend(db, "principal:" + principal, delta)
            self._add_spend(db, "namespace:" + namespace, delta)
            j._x(
                db,
                "UPDATE policy_admissions SET actual_usd = ? WHERE execution = ?",
                (actual_usd, scopes.execution),
            )
            return True

        return j._write(run)

    def approval(self, binding: str) -> Approval | None:
        return self._j._read(lambda db: self._approval(db, binding))

    def decide_approval(
        self,
        binding: str,
        *,
        approve: bool,
        operators: Sequence[str],
        note: str = "",
        scope: ApprovalScope = "once",
        ttl_s: float | None = None,
    ) -> tuple[bool, Approval]:
        if not operators or not all(o.strip() for o in operators):
            raise ValueError("operators must name the people deciding")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError("ttl_s must be a positive number of seconds")

        def run(db: Any) -> tuple[bool, Approval]:
            found = self._approval(db, binding, lock=True)
            if found is None:
                raise KeyError(f"no approval was requested for {binding}")
            if found.status != "pending":
                return False, found
            now = time.time()
            decided = found.model_copy(
                update={
                    "status": "approved" if approve else "rejected",
                    "scope": "ttl" if ttl_s is not None else scope,
                    "expires_at": None if ttl_s is None else now + ttl_s,
                    "operators": [o.strip() for o in operators],
                    "note": note,
                    "decided_at": now,
                }
            )
            self._put_approval(db, decided)
            self._note(
                db,
                found.session,
                {
                    "event": "approval_granted" if approve else "approval_rejected",
                    "binding": binding,
                    "activity": found.activity,
                    "principal": found.principal,
                    "session": found.session,
                    "digest": found.payload_digest,
                    "epoch": found.epoch,
                    "scope": decided.scope,
                    "expires_at": decided.expires_at,
                    "operators": decided.operators,
                    "note": note,
                },
            )
            return True, decided

        return self._j._write(run)

    def session(self, session: str) -> SessionState | None:
        row = self._j._read(
            lambda db: self._j._x(
                db, "SELECT doc FROM policy_sessions WHERE session = ?", (session,)
            ).fetchone()
        )
        return None if row is None else load_session(row[0])

    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        rows = self._j._read(
            lambda db: self._j._x(db, "SELECT doc FROM policy_approvals").fetchall()
        )
        found = [Approval.model_validate_json(r[0]) for r in rows]
        found = [a for a in found if status is None or a.status == status]
        return sorted(found, key=lambda a: a.requested_at)

    def open_circuits(self) -> dict[str, SessionState]:
        # the circuit is part of each session's document: a scan, for tools, never the hot path
        rows = self._j._read(
            lambda db: self._j._x(
                db,
                "SELECT session, doc FROM policy_sessions WHERE doc NOT LIKE ?",
                ('%"circuit":null%',),
            ).fetchall()
        )
        states = {session: load_session(doc) for session, doc in rows}
        return {k: v for k, v in states.items() if v.circuit is not None}

    def spent(self, scope: str) -> float:
        return self._j._read(lambda db: self._spent_unlocked(db, scope))

    def _spent_unlocked(self, db: Any, scope: str) -> float:
        row = self._j._x(
            db, "SELECT spent_usd FROM policy_spend WHERE scope = ?", (scope,)
        ).fetchone()
        return 0.0 if row is None else float(row[0])

    def reset(self, session: str, *, operator: str, note: str = "") -> bool:
        if not operator.strip():
            raise ValueError("operator must name the person resetting the circuit")

        def run(db: Any) -> bool:
            state = self._load(db, session)
            if state.circuit is None:
                return False
            self._save(db, session, reset_circuit(state))
            self._note(
                db,
                session,
                {
                    "event": "circuit_reset",
                    "session": session,
                    "operator": operator.strip(),
                    "note": note,
                    "code": state.circuit.code,
                },
            )
            return True

        return self._j._write(run)

    def events(self, since: float | None = None) -> list[Entry]:
        rows = self._j._read(
            lambda db: self._j._x(
                db, "SELECT effect_id FROM effects WHERE effect_type = ?", (POLICY_CHAIN_TYPE,)
            ).fetchall()
        )
        entries = [e for (chain,) in rows for e in self._j.read(chain)]
        entries = [e for e in entries if since is None or e.ts >= since]
        return sorted(entries, key=lambda e: e.seq)
