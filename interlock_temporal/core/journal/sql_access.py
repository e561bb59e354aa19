"""The narrow API the SQL journal gives the stores that keep their state in its database (the
leases, the policy's state): run a read or a write transaction, run a statement inside one,
append to a chain inside one, and read an effect's checked entries. They see nothing else of
the journal."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ..models import Draft, Entry

T = TypeVar("T")


class SqlAccess(Protocol):
    """What a store may do in the journal's database. Connections are the backend's; SQL is
    written with ``?`` placeholders and in the SQL both SQLite and PostgreSQL run."""

    #: the suffix that locks the rows a transaction read (none where the transaction holds
    #: the whole database, as SQLite's ``BEGIN IMMEDIATE`` does)
    for_update: str
    #: the suffix that keeps rows a transaction read from changing until it ends (a lease read
    #: by the dispatch transaction: a revoke waits for the dispatch to be recorded)
    for_share: str
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
