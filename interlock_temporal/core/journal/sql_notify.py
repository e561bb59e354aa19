"""Failed notification deliveries, kept in the journal's database (``SqlAccess``), in the
``notification_failures`` table: no chain, no signature (a record of the messenger, not of an
effect)."""

from __future__ import annotations

from typing import Any

from ..notifications import NotificationFailure, NotificationFailures, NotificationLog
from .sql_access import SqlAccess


class SqlNotifications(NotificationLog):
    def __init__(self, access: SqlAccess) -> None:
        self._access = access

    def record_failure(self, failure: NotificationFailure) -> None:
        access = self._access

        def run(db: Any) -> None:
            access.execute(
                db,
                "INSERT INTO notification_failures "
                "(notifier, review_id, event, attempt, error, ts) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    failure.notifier,
                    failure.review_id,
                    failure.event,
                    failure.attempt,
                    failure.error[:2000],
                    failure.ts,
                ),
            )

        access.writing(run)

    def failures(self, *, since: float | None = None) -> list[NotificationFailures]:
        access = self._access

        def run(db: Any) -> list[Any]:
            rows = access.execute(
                db,
                "SELECT notifier, review_id, event, error, ts FROM notification_failures "
                "WHERE ts >= ? ORDER BY id",
                (since if since is not None else 0.0,),
            ).fetchall()
            return list(rows)

        by: dict[tuple[str, str], NotificationFailures] = {}
        for notifier, review_id, event, error, ts in access.reading(run):
            seen = by.get((notifier, review_id))
            by[(notifier, review_id)] = NotificationFailures(
                notifier=notifier,
                review_id=review_id,
                count=(seen.count if seen else 0) + 1,
                last_event=event,
                last_error=error,
                last_ts=float(ts),
            )
        return sorted(by.values(), key=lambda f: f.last_ts, reverse=True)
