"""The worker's side of notifications: the ``interlock.notify`` activity the ``EffectReview``
workflow runs for each event and notifier. It builds the ``Notification`` from the event and
what the journal knows (no argument values unless the notifier asks for them; secret arguments
masked always), delivers it in a thread, and records a failed attempt in the journal's
``notification_failures`` table before Temporal retries it."""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from temporalio import activity
from temporalio.exceptions import ApplicationError

from ..core.models import Kind
from ..core.notifications import NotificationFailure
from ..core.policy import redact
from ..core.receipts import fold
from ..core.review_rules import DECISIONS, ReviewRules
from ..notify import (
    DEFAULT,
    DEFAULT_REMINDER_EVERY,
    DEFAULT_REVIEW_DEADLINE,
    DefaultType,
    Notification,
    Notifier,
    NotifyError,
)
from .workflow import NOTIFY_ACTIVITY, NotifyEvent

if TYPE_CHECKING:
    from .._worker.runtime import WorkerRuntime

__all__ = ["NotifyDesk", "resolve_command", "review_settings", "ui_link"]

log = logging.getLogger("interlock_temporal.notify")


def ui_link(notifier: Notifier, review_id: str) -> str:
    base = notifier.ui_url.rstrip("/")
    return f"{base}/namespaces/{quote(notifier.namespace)}/workflows/{quote(review_id)}"


def resolve_command(notifier: Notifier, review_id: str, kind: str) -> str:
    """The ``temporal`` CLI command that resolves the review (the operator fills in their
    name and picks the decision)."""
    first = DECISIONS.get(kind, ("...",))[0]
    payload = f'{{"decision": "{first}", "operator": "YOUR NAME", "note": "why"}}'
    return (
        f"temporal workflow signal --namespace {shlex.quote(notifier.namespace)} "
        f"--workflow-id {shlex.quote(review_id)} --name resolve --input {shlex.quote(payload)}"
    )


class NotifyDesk:
    """A worker's notifiers, by name, and the activity that delivers to them."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self._runtime = runtime

    def _summary(self, told: NotifyEvent) -> tuple[str, Any]:
        """What is known, without argument values; and the values (masked), for notifiers
        that include them."""
        journal = self._runtime.gate.journal
        who = f" by {told.principal}" if told.principal else ""
        if told.kind == "approval":
            approval = journal.policy.approval(told.effect_id)
            rule = f" (rule {approval.code})" if approval is not None and approval.code else ""
            values = approval.proposal if approval is not None else None
            return f"{told.activity}{who} waits for a person's approval{rule}.", values
        if told.kind == "circuit":
            return f"The circuit of {told.activity} is open: a person must reset it.", None
        view = fold(told.effect_id, journal.read(told.effect_id))
        guard = self._runtime.gate.policy
        secrets = guard.policy.secret_arguments if guard is not None else frozenset()
        approved = redact(journal.blob(told.effect_id, "approved") or [], secrets)
        status = view.status
        now = "" if status in (Kind.AMBIGUOUS, None) else f" (now {status.value})"
        summary = (
            f"{told.activity}{who} is in doubt{now}: its last attempt may or may not have "
            "taken effect, and the target cannot say. A person must check and decide whether "
            "it happened."
        )
        return summary, approved[0] if len(approved) == 1 else approved

    def notification(self, notifier: Notifier, told: NotifyEvent) -> Notification:
        summary, values = self._summary(told)
        if told.event == "escalated":
            summary += " Its deadline passed with no decision: it stays open."
        elif told.event == "expired":
            summary += " Its deadline passed with no decision: the call is refused."
        return Notification(
            event=told.event,
            review_id=told.review_id,
            kind=told.kind,
            effect_id=told.effect_id,
            state=told.state,
            activity=told.activity,
            principal=told.principal,
            summary=summary,
            decisions=list(DECISIONS.get(told.kind, ())),
            decision=told.decision,
            operators=told.operators,
            opened_at=told.opened_at,
            deadline_at=told.deadline_at,
            at=told.at,
            ui_url=ui_link(notifier, told.review_id),
            resolve_command=resolve_command(notifier, told.review_id, told.kind),
            values=values if notifier.include_values else None,
        )

    @activity.defn(name=NOTIFY_ACTIVITY)
    async def notify(self, told: NotifyEvent) -> None:
        """Deliver one event to one notifier. A failed attempt is recorded, then raised for
        Temporal to retry with backoff."""
        notifier = self._runtime.notifiers.get(told.notifier)
        if notifier is None:
            raise ApplicationError(
                f"no notifier named {told.notifier!r} on this worker: give the same "
                "notify=[...] to every worker of the review's task queue",
                type="NotifierMissing",
                non_retryable=True,
            )
        try:
            notification = self.notification(notifier, told)
            await asyncio.to_thread(notifier.deliver, notification)
        except Exception as err:
            said = str(err) if isinstance(err, NotifyError) else type(err).__name__
            attempt = activity.info().attempt
            self._record(told, attempt, said)
            log.warning(
                "notification %s of %s (attempt %d): %s", told.event, told.review_id, attempt, said
            )
            raise ApplicationError(said, type="NotificationFailed") from None

    def _record(self, told: NotifyEvent, attempt: int, error: str) -> None:
        try:
            self._runtime.gate.journal.notifications.record_failure(
                NotificationFailure(
                    notifier=told.notifier,
                    review_id=told.review_id,
                    event=told.event,
                    attempt=attempt,
                    error=error,
                    ts=time.time(),
                )
            )
        except Exception as err:  # the journal down too: the retry still comes
            log.error("could not record a failed notification: %s", type(err).__name__)


def review_settings(
    review: ReviewRules | None,
    notify: Sequence[Notifier],
    review_deadline: timedelta | DefaultType | None,
    reminder_every: timedelta | DefaultType | None,
) -> dict[str, Any]:
    """What ``InterlockPlugin``/``InterlockInterceptor`` pass each worker's runtime: the review
    rules with the deadline in force, the notifiers by name, the reminder interval. Raises
    ``ValueError`` naming the argument that is wrong."""
    rules = review or ReviewRules()
    if "deadline_s" in rules.model_fields_set:
        if review_deadline is not DEFAULT:
            raise ValueError(
                "review_deadline and ReviewRules(deadline_s=...) both set the review deadline: "
                "give one"
            )
        deadline_s = rules.deadline_s
    else:
        deadline = DEFAULT_REVIEW_DEADLINE if review_deadline is DEFAULT else review_deadline
        deadline_s = _seconds("review_deadline", deadline)
    every = DEFAULT_REMINDER_EVERY if reminder_every is DEFAULT else reminder_every
    by_name: dict[str, Notifier] = {}
    for notifier in notify:
        if not isinstance(notifier, Notifier):
            raise ValueError(
                "notify takes notifiers from interlock_temporal.notify (Webhook, Slack, Email, "
                f"or a Notifier of your own), not {type(notifier).__name__}"
            )
        if notifier.name in by_name:
            raise ValueError(
                f"notify: two notifiers are named {notifier.name!r}: give each its own name="
            )
        by_name[notifier.name] = notifier
    return {
        "review_rules": rules.model_copy(update={"deadline_s": deadline_s}),
        "notifiers": by_name,
        "reminder_s": _seconds("reminder_every", every),
    }


def _seconds(argument: str, value: timedelta | None) -> float | None:
    if value is None:
        return None
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(f"{argument} must be a positive timedelta, or None for none")
    return value.total_seconds()
