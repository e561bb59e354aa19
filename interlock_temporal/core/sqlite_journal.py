"""The embedded journal: SQLite in WAL mode with ``synchronous=FULL``, safe for several worker
processes on one host. Claims are ``flock`` files beside the database."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .claims import FileClaims, _FileClaim
from .errors import HeadConflict, JournalConfigError, JournalUnavailable
from .identity import canonical
from .journal import (
    POLICY_CHAIN_TYPE,
    SCHEMA_VERSION,
    Build,
    Journal,
    RawEntry,
    encode_entry,
    policy_chain,
    state_kind,
)
from .leases import LeaseStore
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
from .signing import Keyring

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
]
assert len(_MIGRATIONS) == SCHEMA_VERSION

_ROW_COLUMNS = (
    "effect_id, effect_type, status, head, head_seq, updated_ts, first_dispatch_ts, "
    "last_dispatch_ts"
)


#: what was started and never confirmed, oldest send first; "older than" counts from the last
#: send, so annotations appended since do not hide an effect
IN_DOUBT_SQL = (
    f"SELECT {_ROW_COLUMNS} FROM effects WHERE status = 'DISPATCHED' AND last_dispatch_ts <= ? "
    "ORDER BY last_dispatch_ts"
)


def _row(values: tuple[Any, ...]) -> EffectRow:
    return EffectRow(
        effect_id=values[0],
        effect_type=values[1],
        status=Kind(values[2]),
        head=values[3],
        head_seq=values[4],
        updated_ts=values[5],
        first_dispatch_ts=values[6],
        last_dispatch_ts=values[7],
    )


class _SqliteLeases(LeaseStore):
    def __init__(self, journal: SqliteJournal) -> None:
        self._j = journal

    def _insert(self, lease: Lease) -> None:
        try:
            self._j._write(
                lambda db: db.execute(
                    "INSERT INTO leases (lease_id, doc) VALUES (?, ?)",
                    (lease.lease_id, lease.model_dump_json()),
                )
            )
        except sqlite3.IntegrityError:
            raise ValueError("a lease with this lease_id already exists") from None

    def revoke(self, lease_id: str) -> bool:
        def run(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT doc FROM leases WHERE lease_id = ?", (lease_id,)).fetchone()
            if row is None:
                return False
            lease = Lease.model_validate_json(row[0])
            now = time.time()
            if lease.revoked_at is not None or (
                lease.expires_at is not None and lease.expires_at <= now
            ):
                return False
            revoked = lease.model_copy(update={"revoked_at": now})
            db.execute(
                "UPDATE leases SET doc = ? WHERE lease_id = ?",
                (revoked.model_dump_json(), lease_id),
            )
            return True

        revoked: bool = self._j._write(run)
        return revoked

    def get(self, lease_id: str) -> Lease | None:
        with self._j._lock:
            row = self._j._db.execute(
                "SELECT doc FROM leases WHERE lease_id = ?", (lease_id,)
            ).fetchone()
        return None if row is None else Lease.model_validate_json(row[0])

    def list(self) -> list[Lease]:
        with self._j._lock:
            rows = self._j._db.execute("SELECT doc FROM leases ORDER BY rowid").fetchall()
        return [Lease.model_validate_json(r[0]) for r in rows]


class _SqlitePolicy(PolicyStore):
    def __init__(self, journal: SqliteJournal) -> None:
        self._j = journal

    @staticmethod
    def _spent(db: sqlite3.Connection, scope: str) -> float:
        row = db.execute("SELECT spent_usd FROM policy_spend WHERE scope = ?", (scope,)).fetchone()
        return 0.0 if row is None else float(row[0])

    @staticmethod
    def _load(db: sqlite3.Connection, session: str) -> SessionState:
        row = db.execute("SELECT doc FROM policy_sessions WHERE session = ?", (session,)).fetchone()
        return load_session(row[0] if row else None)

    @staticmethod
    def _save(db: sqlite3.Connection, session: str, state: SessionState) -> None:
        db.execute(
            "INSERT OR REPLACE INTO policy_sessions (session, doc) VALUES (?, ?)",
            (session, dump_session(state).decode()),
        )

    @staticmethod
    def _add_spend(db: sqlite3.Connection, scope: str, delta: float) -> None:
        db.execute(
            "INSERT INTO policy_spend (scope, spent_usd) VALUES (?, max(0.0, ?)) "
            "ON CONFLICT (scope) DO UPDATE SET spent_usd = max(0.0, spent_usd + ?)",
            (scope, delta, delta),
        )

    def _note(self, db: sqlite3.Connection, session: str, data: dict[str, Any]) -> None:
        self._j._append_tx(
            db,
            policy_chain(session),
            None,
            [Draft(kind=Kind.POLICY, data=data)],
            effect_type=POLICY_CHAIN_TYPE,
        )

    @staticmethod
    def _approval(db: sqlite3.Connection, binding: str) -> Approval | None:
        if not binding:
            return None
        row = db.execute(
            "SELECT doc FROM policy_approvals WHERE binding = ?", (binding,)
        ).fetchone()
        return None if row is None else Approval.model_validate_json(row[0])

    @staticmethod
    def _put_approval(db: sqlite3.Connection, approval: Approval) -> None:
        db.execute(
            "INSERT OR REPLACE INTO policy_approvals (binding, doc) VALUES (?, ?)",
            (approval.binding, approval.model_dump_json()),
        )

    def evaluate(
        self, scopes: Scopes, fn: Callable[[PolicyState, bool, Approval | None], Outcome]
    ) -> Decision:
        def run(db: sqlite3.Connection) -> Decision:
            session = self._load(db, scopes.session)
            principal = self._spent(db, "principal:" + scopes.principal)
            namespace = self._spent(db, "namespace:" + scopes.namespace)
            admitted = (
                db.execute(
                    "SELECT 1 FROM policy_admissions WHERE execution = ?", (scopes.execution,)
                ).fetchone()
                is not None
            )
            approval = self._approval(db, scopes.binding)
            out = fn(PolicyState(session, principal, namespace), admitted, approval)
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
                db.execute(
                    "INSERT OR IGNORE INTO policy_admissions (execution, session, principal, "
                    "namespace, estimate_usd, ts) VALUES (?, ?, ?, ?, ?, ?)",
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
            if out.note is not None:
                self._note(db, scopes.session, out.note)
            return out.decision

        decision: Decision = self._j._write(run)
        return decision

    def settle_cost(self, scopes: Scopes, actual_usd: float) -> bool:
        if not actual_usd >= 0 or actual_usd == float("inf"):
            raise ValueError("a cost must be a finite, non-negative number of USD")

        def run(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT session, principal, namespace, estimate_usd, actual_usd "
                "FROM policy_admissions WHERE execution = ?",
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
            db.execute(
                "UPDATE policy_admissions SET actual_usd = ? WHERE execution = ?",
                (actual_usd, scopes.execution),
            )
            return True

        settled: bool = self._j._write(run)
        return settled

    def approval(self, binding: str) -> Approval | None:
        with self._j._lock:
            return self._approval(self._j._db, binding)

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

        def run(db: sqlite3.Connection) -> tuple[bool, Approval]:
            found = self._approval(db, binding)
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

        out: tuple[bool, Approval] = self._j._write(run)
        return out

    def session(self, session: str) -> SessionState | None:
        with self._j._lock:
            row = self._j._db.execute(
                "SELECT doc FROM policy_sessions WHERE session = ?", (session,)
            ).fetchone()
        return None if row is None else load_session(row[0])

    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        with self._j._lock:
            rows = self._j._db.execute("SELECT doc FROM policy_approvals").fetchall()
        found = [Approval.model_validate_json(r[0]) for r in rows]
        found = [a for a in found if status is None or a.status == status]
        return sorted(found, key=lambda a: a.requested_at)

    def open_circuits(self) -> dict[str, SessionState]:
        # the circuit is part of each session's document: a scan, for tools, never the hot path
        with self._j._lock:
            rows = self._j._db.execute(
                "SELECT session, doc FROM policy_sessions WHERE doc NOT LIKE '%\"circuit\":null%'"
            ).fetchall()
        states = {session: load_session(doc) for session, doc in rows}
        return {k: v for k, v in states.items() if v.circuit is not None}

    def spent(self, scope: str) -> float:
        with self._j._lock:
            return self._spent(self._j._db, scope)

    def reset(self, session: str, *, operator: str, note: str = "") -> bool:
        if not operator.strip():
            raise ValueError("operator must name the person resetting the circuit")

        def run(db: sqlite3.Connection) -> bool:
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

        reset: bool = self._j._write(run)
        return reset

    def events(self, since: float | None = None) -> list[Entry]:
        with self._j._lock:
            rows = self._j._db.execute(
                "SELECT effect_id FROM effects WHERE effect_type = ?", (POLICY_CHAIN_TYPE,)
            ).fetchall()
        entries = [e for (chain,) in rows for e in self._j.read(chain)]
        entries = [e for e in entries if since is None or e.ts >= since]
        return sorted(entries, key=lambda e: e.seq)


class SqliteJournal(Journal):
    def __init__(
        self,
        path: Path,
        keyring: Keyring,
        *,
        busy_timeout_s: float = 10.0,
        check_tail: bool = True,
    ) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.keyring = keyring
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
            )
            self._enter_wal(busy_timeout_s)
            self._db.execute("PRAGMA synchronous=FULL")
            # keep the indexes' pages in memory as the journal grows (up to 16 MiB)
            self._db.execute("PRAGMA cache_size=-16384")
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            self._migrate()
        except sqlite3.Error as err:
            self._close_quietly()
            raise JournalUnavailable(f"journal {self.url} cannot be opened: {err}") from err
        except BaseException:
            self._close_quietly()
            raise
        self._leases = _SqliteLeases(self)
        self._policy = _SqlitePolicy(self)
        self._claims = FileClaims(self.path.with_name(self.path.name + ".claims"))
        if check_tail:
            try:
                self.check_tail()
            except BaseException:
                self._close_quietly()
                raise

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

    def _close_quietly(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()

    def _migrate(self) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise JournalConfigError(
                    f"journal {self.url} has schema {version}; this release reads up to "
                    f"{SCHEMA_VERSION}: upgrade interlock-temporal"
                )
            for number in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[number].split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -- writing -------------------------------------------------------------------------------

    def _write(self, fn: Any) -> Any:
        """Run ``fn(db)`` in one durable write transaction (``BEGIN IMMEDIATE``)."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as err:
                raise JournalUnavailable(f"journal {self.url} cannot be written: {err}") from err
            try:
                result = fn(db)
                db.execute("COMMIT")
                return result
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
        try:
            result: list[Entry] = self._write(
                lambda db: self._append_tx(
                    db, effect_id, expected_head, build, effect_type, lease_id, blobs
                )
            )
        except sqlite3.IntegrityError as err:  # the UNIQUE (effect_id, prev) backstop
            raise HeadConflict(effect_id, expected_head, "?") from err
        return result

    def _append_tx(
        self,
        db: sqlite3.Connection,
        effect_id: str,
        expected_head: str | None,
        build: Build,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        """``append`` inside a transaction the caller holds. ``expected_head=None`` appends
        after whatever the head is (for chains only this transaction writes)."""
        row = db.execute(
            "SELECT effect_type, status, head, first_dispatch_ts, last_dispatch_ts "
            "FROM effects WHERE effect_id = ?",
            (effect_id,),
        ).fetchone()
        actual = row[2] if row else ""
        if expected_head is not None and actual != expected_head:
            raise HeadConflict(effect_id, expected_head, actual)
        if callable(build):
            lease = None
            if lease_id is not None:
                doc = db.execute(
                    "SELECT doc FROM leases WHERE lease_id = ?", (lease_id,)
                ).fetchone()
                lease = None if doc is None else Lease.model_validate_json(doc[0])
            drafts = list(build(lease))
        else:
            drafts = list(build)
        if not drafts:
            return []
        etype = row[0] if row else effect_type
        if not etype:
            raise ValueError("a new effect needs its effect_type")
        (seq,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM entries").fetchone()
        now = time.time()
        prev = actual
        written: list[Entry] = []
        for draft in drafts:
            seq += 1
            entry = encode_entry(
                seq=seq,
                ts=now,
                effect_id=effect_id,
                kind=draft.kind,
                prev=prev,
                key=self.keyring.signing,
                data=draft.data,
            )
            written.append(entry)
            prev = entry.hash
        db.executemany(
            "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (e.seq, e.effect_id, e.kind.value, e.prev, e.hash, e.key_id, e.sig, e.body)
                for e in written
            ],
        )
        status = state_kind(drafts, Kind(row[1]) if row else None)
        if status is None:
            raise ValueError("a new effect must start with a state entry, not annotations")
        dispatched = any(d.kind is Kind.DISPATCHED for d in drafts)
        first_dispatch = row[3] if row and row[3] is not None else (now if dispatched else None)
        last_dispatch = now if dispatched else (row[4] if row else None)
        db.execute(
            f"INSERT OR REPLACE INTO effects ({_ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (effect_id, etype, status.value, prev, seq, now, first_dispatch, last_dispatch),
        )
        for name, value in (blobs or {}).items():
            db.execute(
                "INSERT OR REPLACE INTO blobs (effect_id, name, value) VALUES (?, ?, ?)",
                (
                    effect_id,
                    name,
                    (value if isinstance(value, bytes) else canonical(value)).decode(),
                ),
            )
        return written

    # -- reading -------------------------------------------------------------------------------

    def read(self, effect_id: str) -> list[Entry]:
        from .journal import decode_entry

        with self._lock:
            rows = self._db.execute(
                "SELECT seq, effect_id, kind, prev, hash, key_id, sig, body FROM entries "
                "WHERE effect_id = ? ORDER BY seq",
                (effect_id,),
            ).fetchall()
        return [decode_entry(RawEntry(*r)) for r in rows]

    def row(self, effect_id: str) -> EffectRow | None:
        with self._lock:
            values = self._db.execute(
                f"SELECT {_ROW_COLUMNS} FROM effects WHERE effect_id = ?", (effect_id,)
            ).fetchone()
        return None if values is None else _row(values)

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
            # the literal status lets SQLite use the partial in-doubt index
            sql = IN_DOUBT_SQL
            params: list[Any] = [time.time() - (older_than or 0.0)]
        else:
            # policy chains are the policy layer's record, not effects
            where: list[str] = ["effect_type != ?"]
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
            sql = f"SELECT {_ROW_COLUMNS} FROM effects"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " ORDER BY updated_ts DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [_row(r) for r in rows]

    def blob(self, effect_id: str, name: str) -> Any:
        with self._lock:
            row = self._db.execute(
                "SELECT value FROM blobs WHERE effect_id = ? AND name = ?", (effect_id, name)
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def iter_raw(self) -> Iterator[RawEntry]:
        # a separate connection: a long verify must not hold the writers' lock
        db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            cursor = db.execute(
                "SELECT seq, effect_id, kind, prev, hash, key_id, sig, body FROM entries "
                "ORDER BY seq"
            )
            while batch := cursor.fetchmany(4096):
                for r in batch:
                    yield RawEntry(*r)
        finally:
            db.close()

    def last_raw(self) -> RawEntry | None:
        with self._lock:
            r = self._db.execute(
                "SELECT seq, effect_id, kind, prev, hash, key_id, sig, body FROM entries "
                "ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        return None if r is None else RawEntry(*r)

    def head(self) -> JournalHead | None:
        raw = self.last_raw()
        return None if raw is None else JournalHead(seq=raw.seq, hash=raw.hash)

    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    # -- claims, leases --------------------------------------------------------------------------

    @property
    def leases(self) -> LeaseStore:
        return self._leases

    @property
    def policy(self) -> _SqlitePolicy:
        return self._policy

    def claim(self, effect_id: str) -> _FileClaim | None:
        return self._claims.try_claim(effect_id)

    def is_claimed(self, effect_id: str) -> bool:
        return self._claims.is_claimed(effect_id)

    def close(self) -> None:
        with self._lock:
            self._db.close()
