"""The record of notifications that failed to reach people (a review opened, nearing its
deadline, expired, escalated, resolved): kept in the journal's database, in a table of its own,
never in an effect's chain. What ``interlock report`` counts per notifier and review."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import BaseModel


class NotificationFailure(BaseModel):
    """One failed delivery attempt of a notification."""

    notifier: str
    review_id: str
    event: str
    attempt: int
    #: what went wrong, as the notifier said it (never its URL, secret or password)
    error: str
    ts: float


class NotificationFailures(BaseModel):
    """The failures one notifier had delivering one review's notifications."""

    notifier: str
    review_id: str
    count: int
    last_event: str
    last_error: str
    last_ts: float


class NotificationLog(ABC):
    """Where failed deliveries are recorded, and read back."""

    @abstractmethod
    def record_failure(self, failure: NotificationFailure) -> None: ...

    @abstractmethod
    def failures(self, *, since: float | None = None) -> list[NotificationFailures]:
        """Failures per notifier and review (since ``since``), the most recent first."""
