"""The seam between the SQL journal (``sql.SqlJournal``) and the modules that keep their records
in its database: what they may ask of it, as two protocols. ``SqlJournal`` implements both; a
module beside it is handed the journal typed as one of them, and sees nothing else of it.

- ``SqlAccess``: the stores (``sql_leases``, ``sql_policy``, ``sql_notify``). Run a read or a
  write transaction, run a statement inside one, append to a chain inside one, read an
  effect's checked entries.
- ``JournalAccess``: what also writes the journal's own records beside the appends
  (``sql_ids``: the effect-id setting; ``sql_archive``: an archive run): besides
  ``SqlAccess``, the journal's seq (held as an append holds it, and moved on), its keyring,
  its effect-id setting and whether an effect is claimed.

This module imports no backend: the journal's modules depend on the seam, never on each other
through it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ..models import Draft, Entry
from .signing import Keyring

T = TypeVar("T")


class SqlAccess(Protocol):
    """What a store may do in the journal's database. Connections are the backend's; SQL is
    written with ``?`` placeholders and in the SQL both SQLite and PostgreSQL run."""

    @property
    def for_update(self) -> str:
        """The suffix that locks the rows a transaction read (none where the transaction holds
        the whole database, as SQLite's ``BEGIN IMMEDIATE`` does)."""
        ...

    @property
    def greatest(self) -> str:
        """The two-argument maximum."""
        ...

    @property
    def json_texts(self) -> str:
        """The texts of a JSON array given as one parameter, as a table of one column
        ``value``, named by formatting it (``json_texts.format("f")``): one statement and one
        parameter, however many values."""
        ...

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


class JournalAccess(SqlAccess, Protocol):
    """``SqlAccess``, and what writing the journal's own records beside its appends takes (the
    effect-id setting, an archive run)."""

    #: where the journal is, as messages show it
    url: str
    keyring: Keyring
    #: the journal's effect-id setting as this process last read it (``Journal.effect_ids``)
    effect_ids: str | None

    def hold_seq(self, db: Any) -> int:
        """Inside a write transaction: the journal's last seq, held until the transaction
        ends, so that appends wait for it and get dense seqs in commit order."""
        ...

    def advance_seq(self, db: Any, seq: int) -> None:
        """Inside the same transaction: ``seq`` is the journal's last seq now."""
        ...

    def is_claimed(self, effect_id: str) -> bool:
        """Whether an attempt (of any process) holds the effect's claim."""
        ...
