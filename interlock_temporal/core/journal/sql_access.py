"""The narrow API the SQL journal gives the stores that keep their state in its database (the
leases, the policy's state): run a read or a write transaction, run a statement inside one,
append to a chain inside one, and read an effect's checked entries. They see nothing else of
the journal."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..models import Draft, Entry
from .group_commit import AppendArgs
from .interface import Build

if TYPE_CHECKING:
    from .sql import SqlJournal

T = TypeVar("T")


class SqlAccess(Protocol):
    """What a store may do in the journal's database. Connections are the backend's; SQL is
    written with ``?`` placeholders and in the SQL both SQLite and PostgreSQL run."""

    #: the suffix that locks the rows a transaction read (none where the transaction holds
    #: the whole database, as SQLite's ``BEGIN IMMEDIATE`` does)
    for_update: str
    #: the two-argument maximum
    greatest: str

    def reading(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)`` for reads."""
        ...

    def writing(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(connection)`` in one durable write transaction."""
        ...

    def execute(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement on ``db``; returns its cursor."""
        ...

    def settle(self, db: Any) -> None:
        """The statements sent so far have run (a pipelined cursor's ``rowcount`` is known
        only then)."""

    def append_within(
        self, db: Any, chain: str, drafts: Sequence[Draft], *, effect_type: str
    ) -> list[Entry]:
        """Append ``drafts`` to ``chain`` after whatever its head is, inside the caller's write
        transaction (for chains only such transactions write)."""
        ...

    def is_unique_violation(self, err: BaseException) -> bool:
        """Whether ``err`` is the database refusing a duplicate key."""
        ...

    def read(self, effect_id: str) -> list[Entry]:
        """The effect's (or chain's) entries, checked (``Journal.read``)."""
        ...


class SqlTx:
    """One write transaction, as ``transact_async``'s function sees it (``JournalTx``)."""

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


class JournalAccess:
    """The SQL journal's narrow API (``SqlAccess``), as its lease and policy stores use it."""

    def __init__(self, journal: SqlJournal) -> None:
        self._journal = journal
        self.for_update = journal.FOR_UPDATE
        self.greatest = journal.GREATEST

    def reading(self, fn: Callable[[Any], T]) -> T:
        return self._journal._read(fn)

    def writing(self, fn: Callable[[Any], T]) -> T:
        return self._journal._write(fn)

    def execute(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._journal._x(db, sql, params)

    def settle(self, db: Any) -> None:
        """The statements sent so far have run (a pipelined cursor's ``rowcount`` is known
        only then)."""
        self._journal._settle(db)

    def append_within(
        self, db: Any, chain: str, drafts: Sequence[Draft], *, effect_type: str
    ) -> list[Entry]:
        return self._journal._append_tx(db, chain, None, drafts, effect_type=effect_type)

    def is_unique_violation(self, err: BaseException) -> bool:
        return self._journal._is_unique_violation(err)

    def read(self, effect_id: str) -> list[Entry]:
        return self._journal.read(effect_id)
