"""What happened to one-time codes (``core.vote_codes``), kept in the journal's database
(``SqlAccess``), in the ``vote_codes`` table: per question (the episode) and operator, the wrong
codes offered, and the digest of the code that made a decision. No chain, no signature: a
record of the review desk. Whoever can write the table can at most unlock an operator's further
guesses (each still 100 bits) or let a used code be offered again on a question its decision
already closed."""

from __future__ import annotations

from typing import Any

from ..vote_codes import CodeUses
from .sql_access import SqlAccess


class SqlCodeUses(CodeUses):
    def __init__(self, access: SqlAccess) -> None:
        self._access = access

    def failures(self, episode: str, operator: str) -> int:
        access = self._access

        def run(db: Any) -> int:
            row = access.execute(
                db,
                "SELECT failures FROM vote_codes WHERE episode = ? AND operator = ?",
                (episode, operator),
            ).fetchone()
            return int(row[0]) if row else 0

        return access.reading(run)

    def fail(self, episode: str, operator: str) -> int:
        access = self._access

        def run(db: Any) -> int:
            access.execute(
                db,
                "INSERT INTO vote_codes (episode, operator, failures) VALUES (?, ?, 1) "
                "ON CONFLICT (episode, operator) DO UPDATE SET "
                "failures = vote_codes.failures + 1",
                (episode, operator),
            )
            row = access.execute(
                db,
                "SELECT failures FROM vote_codes WHERE episode = ? AND operator = ?",
                (episode, operator),
            ).fetchone()
            return int(row[0])

        return access.writing(run)

    def used(self, digest: str) -> bool:
        access = self._access

        def run(db: Any) -> bool:
            row = access.execute(
                db, "SELECT 1 FROM vote_codes WHERE used = ?", (digest,)
            ).fetchone()
            return row is not None

        return access.reading(run)

    def consume(self, episode: str, operator: str, digest: str) -> bool:
        access = self._access

        def run(db: Any) -> bool:
            if access.execute(db, "SELECT 1 FROM vote_codes WHERE used = ?", (digest,)).fetchone():
                return False
            access.execute(
                db,
                "INSERT INTO vote_codes (episode, operator, failures, used) VALUES (?, ?, 0, ?) "
                "ON CONFLICT (episode, operator) DO UPDATE SET used = excluded.used",
                (episode, operator, digest),
            )
            return True

        return access.writing(run)
