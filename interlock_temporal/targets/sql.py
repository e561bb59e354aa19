"""An effect that is a write to a database you control (SQLite or PostgreSQL).

The body is synchronous SQL, ``def body(tx: SqlTransaction, *args) -> result``, and the target
runs it inside a transaction together with a **marker** row (primary key: the effect id, with
the result), so "did it happen?" has an exact answer:

- ``tier=2`` (the default), the database is not the journal's: the body and its marker commit
  in one transaction of the target's database; after a crash the gate finds the marker
  (``query``), with ``settle_time`` 0.
- ``tier=0``, the database *is* the journal's (the same SQLite file, the same PostgreSQL
  database): the journal's PROPOSED, AUTHORIZED and DISPATCHED, the body's write, the marker
  and COMMITTED are one transaction. No crash can leave the effect in doubt. A worker whose
  journal is elsewhere refuses to start.

An effect of a tier-0 target found dispatched and never confirmed (only an edited journal, or an
effect sent while the target was tier 2, can be) is recovered as at tier 2: through its marker,
never resent blindly.

Every statement runs under ``time_limit``; a body that runs past it, or raises, rolls the whole
transaction back: nothing happened. ``classify`` says what that means for a retry: a lock, a
timeout or a lost connection (``OperationalError``) may succeed next time (``not_sent``); a
constraint, bad SQL or an exception of the body's own would fail again (``rejected``).
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any, Literal

from ..core.extras import needs_extra
from ..core.identity import canonical, jsonable
from ..core.journal.interface import database_of, redacted
from ..core.models import Found
from ..core.targets import BaseTarget, Classification, TargetDeclarationError

__all__ = [
    "CommitInDoubt",
    "ForbiddenStatement",
    "MarkerExists",
    "SqlTarget",
    "SqlTransaction",
    "TimeLimitExceeded",
]

Dialect = Literal["sqlite", "postgresql"]
#: statements a body may not run: they would end, or escape, the transaction it is given
_FORBIDDEN = re.compile(
    r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*"
    r"(BEGIN|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE|START|PREPARE|ATTACH|DETACH|VACUUM"
    r"|PRAGMA|SET|RESET|LOCK|DISCARD)\b",
    re.I | re.S,
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: DB-API errors after which a retry may succeed: the statement, or the connection, failed
_TRANSIENT = frozenset({"OperationalError", "InterfaceError"})


class TimeLimitExceeded(Exception):
    """The body ran past the target's ``time_limit``: its transaction was rolled back."""


class ForbiddenStatement(Exception):
    """The body ran a statement that would end or escape its transaction (``COMMIT``,
    ``ROLLBACK``, ``BEGIN``, ``SAVEPOINT``, ``ATTACH``, ``PRAGMA``, ``SET``...)."""


class MarkerExists(Exception):
    """Tier 0: the marker of an effect the journal has no record of (an edited database)."""


class CommitInDoubt(Exception):
    """The target's COMMIT itself failed: whether it took is unknown until the marker is read
    (the gate does that, as for any effect in doubt)."""


class SqlTransaction:
    """What a body gets: statements inside the transaction the target opened, nothing more (no
    commit, rollback or close; ``COMMIT`` and the like are refused). Placeholders are ``?`` on
    both databases (on PostgreSQL they become ``%s``; a ``%`` in the text stays literal)."""

    def __init__(self, db: Any, dialect: Dialect) -> None:
        self._db = db
        #: ``"sqlite"`` or ``"postgresql"``, for the rare statement the two spell differently
        self.dialect: Dialect = dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        return int(self._run(sql, params).rowcount)

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self._run(sql, params).fetchone()
        return None if row is None else tuple(row)

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._run(sql, params).fetchall()]

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        found = _FORBIDDEN.match(sql)
        if found:
            raise ForbiddenStatement(
                f"a body may not run {found.group(1).upper()}: the target opens and ends its "
                "transaction (with the effect's marker, and at tier 0 the journal's entries)"
            )
        if self.dialect == "postgresql":
            sql = sql.replace("%", "%%").replace("?", "%s")
            # prepared: one statement only ("...; COMMIT" would end the transaction it is given;
            # sqlite3 refuses a second statement by itself)
            return self._db.execute(sql, tuple(params), prepare=True)
        return self._db.execute(sql, tuple(params))


class SqlTarget(BaseTarget):
    """A database you control, as a target: ``SqlTarget("ledger", database=url)``.

    - ``database``: ``sqlite:///path.db`` or ``postgresql://user@host:port/db``.
    - ``tier``: 2 (default) when the database is not the journal's: a marker in the target's
      database answers ``query``; 0 when it is the journal's own database: the effect and its
      record commit in one transaction (a worker whose journal is elsewhere refuses to start).
    - ``time_limit``: how long the body's statements may run (default 5 s); past it the
      transaction is rolled back. At tier 0 every append of the worker waits while a body
      runs: keep bodies to a few short statements.
    - ``marker_table``: the table of markers (created if missing; one row per effect).

    Write a body as ``def body(tx: SqlTransaction, *args) -> result`` under
    ``@gated(target=...)`` (``@activity.defn`` above it): the activity takes the arguments
    after ``tx``. ``capture`` returns no premises; subclass to read some (with your own
    connection). The body must not call anything outside the database (a send there could
    not be rolled back), nor catch a database error and go on.
    """

    dedupe_window = None
    settle_time = timedelta(0)

    def __init__(
        self,
        name: str,
        database: str,
        *,
        tier: int = 2,
        time_limit: timedelta = timedelta(seconds=5),
        marker_table: str = "interlock_markers",
    ) -> None:
        self.name = name
        self.database = database
        self.tier = tier
        self.time_limit = time_limit
        self.marker_table = marker_table
        where = database_of(database) if isinstance(database, str) else ("",)
        if where[0] not in ("sqlite", "postgresql") or not database.startswith(
            ("sqlite:", "postgresql:", "postgres:")
        ):
            raise TargetDeclarationError(
                f"target {name}: database must be a sqlite:/// or postgresql:// URL"
            )
        self.dialect: Dialect = "sqlite" if where[0] == "sqlite" else "postgresql"
        self._path = where[1] if self.dialect == "sqlite" else ""
        if isinstance(tier, bool) or tier not in (0, 2):
            raise TargetDeclarationError(
                f"target {name}: tier must be 0 (the journal's own database) or 2 (a marker "
                "in a database of its own)"
            )
        if not isinstance(time_limit, timedelta) or time_limit <= timedelta(0):
            raise TargetDeclarationError(f"target {name}: time_limit must be a positive timedelta")
        if not isinstance(marker_table, str) or not _IDENTIFIER.match(marker_table):
            raise TargetDeclarationError(
                f"target {name}: marker_table must be a plain SQL identifier"
            )
        self._marker_ready = False

    def __repr__(self) -> str:
        return f"SqlTarget({self.name!r}, database={redacted(self.database)!r}, tier={self.tier})"

    # -- what the gate asks ----------------------------------------------------------------

    def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        return {}

    async def query(self, effect_id: str, args: Any) -> Found | None:
        """The effect's marker, with the result the body returned, if it committed."""
        return await asyncio.to_thread(self.find, effect_id)

    def classify(self, error: BaseException) -> Classification:
        if isinstance(error, CommitInDoubt):
            return "in_doubt"
        if isinstance(error, TimeLimitExceeded):
            return "not_sent"
        if {c.__name__ for c in type(error).__mro__} & _TRANSIENT:
            return "not_sent"  # a lock, a timeout, a lost connection: rolled back, may pass
        return "rejected"  # a constraint, bad SQL, the body's own error: it would fail again

    # -- running a body --------------------------------------------------------------------

    def transact(
        self, body: Callable[..., Any], db: Any, args: tuple[Any, ...], effect_id: str
    ) -> Any:
        """Tier 0: run ``body`` and write its marker on ``db``, inside the journal's transaction
        (the gate commits it, with COMMITTED, or rolls it all back)."""
        if not self._marker_ready:
            db.execute(self._marker_ddl())
        return self._body_and_marker(body, db, args, effect_id, tier_zero=True)

    def run(self, body: Callable[..., Any], args: tuple[Any, ...], effect_id: str) -> Any:
        """Run ``body`` and write its marker in one transaction of the target's own database
        (blocking: call it from a thread). A marker already there means the effect happened:
        its recorded result is returned and the body's work rolled back."""
        self.prepare()
        db = self._connect()
        try:
            if self.dialect == "sqlite":
                db.execute("BEGIN IMMEDIATE")
            try:
                result = self._body_and_marker(body, db, args, effect_id, tier_zero=False)
            except MarkerExists:
                db.rollback()
                found = self.find(effect_id)
                assert found is not None
                return found.result
            except BaseException:
                with suppress(Exception):
                    db.rollback()
                raise
            try:
                db.commit()
            except Exception as err:
                raise CommitInDoubt(
                    f"target {self.name}: the COMMIT failed ({type(err).__name__}); the "
                    "marker tells whether it took"
                ) from err
            return result
        finally:
            db.close()

    def _body_and_marker(
        self,
        body: Callable[..., Any],
        db: Any,
        args: tuple[Any, ...],
        effect_id: str,
        *,
        tier_zero: bool,
    ) -> Any:
        with self._limit(db):
            result = body(SqlTransaction(db, self.dialect), *args)
            data = canonical(jsonable(result)).decode()
            try:
                SqlTransaction(db, self.dialect).execute(
                    f"INSERT INTO {self.marker_table} (effect_id, target, result, created_ts) "
                    "VALUES (?, ?, ?, ?)",
                    (effect_id, self.name, data, time.time()),
                )
            except Exception as err:
                if "IntegrityError" not in {c.__name__ for c in type(err).__mro__}:
                    raise
                raise MarkerExists(
                    f"target {self.name}: effect {effect_id[:16]} already has a marker"
                    + (
                        ": the journal has no record of it (was either edited?)"
                        if tier_zero
                        else ""
                    )
                ) from err
        return result

    @contextmanager
    def _limit(self, db: Any) -> Iterator[None]:
        """The body's statements under ``time_limit``: SQLite's progress handler interrupts a
        statement past it, PostgreSQL's ``statement_timeout`` cancels one; a body that took
        longer in Python is refused when it returns. Either way the transaction rolls back."""
        limit_s = self.time_limit.total_seconds()
        deadline = time.monotonic() + limit_s
        if self.dialect == "sqlite":
            db.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        else:
            db.execute(f"SET LOCAL statement_timeout = {max(1, round(limit_s * 1000))}")
        try:
            yield
        except Exception as err:
            if time.monotonic() > deadline:
                raise self._late() from err
            raise
        finally:
            if self.dialect == "sqlite":
                db.set_progress_handler(None, 0)
        if self.dialect == "postgresql":
            db.execute("SET LOCAL statement_timeout TO DEFAULT")
        if time.monotonic() > deadline:
            raise self._late()

    def _late(self) -> TimeLimitExceeded:
        return TimeLimitExceeded(
            f"target {self.name}: the body ran past its time limit ({self.time_limit}); its "
            "transaction was rolled back, nothing was written"
        )

    # -- the marker ------------------------------------------------------------------------

    def _marker_ddl(self) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {self.marker_table} (effect_id TEXT PRIMARY KEY, "
            "target TEXT NOT NULL, result TEXT NOT NULL, created_ts DOUBLE PRECISION NOT NULL)"
        )

    def prepare(self) -> None:
        """Create the marker table if it is missing (at worker start for tier 0; before the
        first body or query otherwise)."""
        if self._marker_ready:
            return
        for attempt in range(3):
            db = self._connect()
            try:
                db.execute(self._marker_ddl())
                db.commit()
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.05)  # another process created it at the same moment
            finally:
                db.close()
        self._marker_ready = True

    def find(self, effect_id: str) -> Found | None:
        """The effect's marker (blocking)."""
        self.prepare()
        db = self._connect()
        try:
            row = SqlTransaction(db, self.dialect).fetchone(
                f"SELECT result FROM {self.marker_table} WHERE effect_id = ?", (effect_id,)
            )
        finally:
            db.close()
        if row is None:
            return None
        return Found(result=json.loads(row[0]), confirmation=f"{self.marker_table} row")

    def _connect(self) -> Any:
        limit_s = self.time_limit.total_seconds()
        if self.dialect == "sqlite":
            return sqlite3.connect(self._path, isolation_level=None, timeout=limit_s)
        with needs_extra("postgres", "a SqlTarget on PostgreSQL"):
            import psycopg
        return psycopg.connect(self.database, connect_timeout=max(2, round(limit_s)))
