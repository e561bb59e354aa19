"""The worker's side of notifications: the ``interlock.notify`` activity the ``EffectReview``
workflow runs for each event and notifier. It builds the ``Notification`` from the event and
what the journal knows (no argument values unless the notifier asks for them; secret arguments
masked always), delivers it in a thread, and records a failed attempt in the journal's
``notification_failures`` table before Temporal retries it.

Where the journal has an operator roster, ``opened`` and ``reminder`` also send each operator
their one-time codes, one per decision of the review's kind, to their own channels on the
roster that the activity's notifier reaches (``Notifier.to_operator``). The codes are derived
here, in the activity, and go nowhere else: not into the activity's input or result, an
exception's message, a log line or the failures table (all of which reach Temporal's history
or a log). A failed delivery to an operator fails the attempt like any other, and the retry
sends again (at least once)."""

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
from ..core.operators import Roster, roster_of
from ..core.policy import redact
from ..core.receipts import fold
from ..core.review_rules import DECISIONS, ReviewRules
from ..core.vote_codes import VoteCodes
from ..core.vote_proofs import ballot_of
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

#: the events that send operators their one-time codes (a review open for a decision)
CODE_EVENTS = frozenset({"opened", "reminder"})


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
        self._codes: VoteCodes | None = None
        #: operators already warned of (no channel this worker's notifiers reach)
        self._unreachable: set[str] = set()

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
        """Deliver one event to one notifier, and (``opened``, ``reminder``, with a roster)
        each operator's one-time codes to the operator's channels it reaches. A failed attempt
        is recorded, then raised for Temporal to retry with backoff."""
        notifier = self._runtime.notifiers.get(told.notifier)
        if notifier is None:
            raise ApplicationError(
                f"no notifier named {told.notifier!r} on this worker: give the same "
                "notify=[...] to every worker of the review's task queue",
                type="NotifierMissing",
                non_retryable=True,
            )
        failed: list[str] = []
        notification: Notification | None = None
        try:
            notification = self.notification(notifier, told)
            await asyncio.to_thread(notifier.deliver, notification)
        except Exception as err:
            failed.append(_said(err))
        if notification is not None:
            failed += await self._send_codes(notifier, told, notification)
        if failed:
            said = "; ".join(failed)
            attempt = activity.info().attempt
            self._record(told, attempt, said)
            log.warning(
                "notification %s of %s (attempt %d): %s", told.event, told.review_id, attempt, said
            )
            raise ApplicationError(said, type="NotificationFailed") from None

    async def _send_codes(
        self, notifier: Notifier, told: NotifyEvent, notification: Notification
    ) -> list[str]:
        """Each operator's codes, to their channels ``notifier`` reaches; what failed (never a
        code: an error's text is scrubbed of them, and only a ``NotifyError``'s is kept)."""
        if told.event not in CODE_EVENTS:
            return []
        codes: list[str] = []
        try:
            letters = self._letters(notifier, told, notification)
        except Exception as err:
            return [f"one-time codes not derived: {type(err).__name__}"]
        failed: list[str] = []
        for name, reach, letter in letters:
            codes += (letter.codes or {}).values()
            try:
                await asyncio.to_thread(reach.deliver, letter)
            except Exception as err:
                failed.append(f"{_said(err, codes)} (one-time codes to operator {name!r})")
        return failed

    def _letters(
        self, notifier: Notifier, told: NotifyEvent, notification: Notification
    ) -> list[tuple[str, Notifier, Notification]]:
        """(operator, the notifier aimed at one of their channels, their notification with
        their codes) for each roster operator and channel ``notifier`` reaches."""
        journal = self._runtime.gate.journal
        roster = roster_of(journal)
        if not roster.exists:
            return []
        ballot = ballot_of(journal, roster, told.kind, told.effect_id)
        if ballot is None:
            return []  # nothing awaits a decision any more
        if self._codes is None:
            self._codes = VoteCodes(journal.keyring)
        letters: list[tuple[str, Notifier, Notification]] = []
        for name in self._deciders(roster, told):
            operator = roster.operator(name)
            assert operator is not None  # _deciders names operators only
            codes = {
                decision: self._codes.code(ballot, name, decision)
                for decision in DECISIONS.get(told.kind, ())
            }
            letter = notification.model_copy(update={"for_operator": name, "codes": codes})
            for channel in operator.notify:
                reach = notifier.to_operator(channel)
                if reach is not None:
                    letters.append((name, reach, letter))
        return letters

    def _deciders(self, roster: Roster, told: NotifyEvent) -> list[str]:
        """The roster's operators who may decide this review (not attesters, not the agent's
        own principal); warns once of one that no notifier of this worker reaches."""
        names = []
        for name in sorted(roster.operators):
            operator = roster.operator(name)
            if operator is None or name == told.principal:
                continue
            names.append(name)
            reached = any(
                n.to_operator(c) is not None
                for n in self._runtime.notifiers.values()
                for c in operator.notify
            )
            if not reached and name not in self._unreachable:
                self._unreachable.add(name)
                log.warning(
                    "operator %r has no channel on the roster that a notifier of this worker "
                    "reaches (an Email reaches mailto:, a Webhook https://): they get no "
                    "one-time codes, and decide with a key (`interlock reviews resolve --key`)",
                    name,
                )
        return names

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


def _said(err: Exception, codes: Sequence[str] = ()) -> str:
    """What a failure is recorded and raised as: a ``NotifyError``'s message (which names no
    URL or secret), else the error's type alone; any of ``codes`` in it blanked out."""
    said = str(err) if isinstance(err, NotifyError) else type(err).__name__
    for code in codes:
        said = said.replace(code, "[one-time code]")
    return said


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
