"""Workflow-side helpers. Safe to import in workflow code (no I/O modules)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.activity import _Definition  # private: no public API reads an activity's definition
from temporalio.exceptions import ActivityError, ApplicationError

from ._reviews.workflow import RESOLUTION_SIGNAL, Resolution
from ._worker.context import Authority, current_authority
from ._worker.errors import EffectRefused, receipt_from, rejected_by
from .core.models import Receipt

__all__ = ["act_as", "current_principal", "execute_effect", "receipt_from"]

#: the errors after which a workflow may wait for a person instead of failing
WAIT_FOR = ("AmbiguousEffect", "ApprovalRequired")
#: guards what a wait believes since the journal decides it: the resolution signal only wakes
#: the workflow, which runs the activity again and takes the journal's answer; a rejected
#: approval ends in ``EffectRefused``. Checked at each wait (the SDK memoizes it per run, so a
#: run that began waiting under the old code keeps believing signals for all of its waits)
WAKE_PATCH = "interlock-effect-wait-reads-journal"


@contextmanager
def act_as(
    principal: str, lease: str | None = None, *, session: str | None = None
) -> Iterator[None]:
    """Activities (and child workflows) started inside run as ``principal`` under ``lease``.

    The identity travels in a Temporal header, never in arguments a model produced.
    ``session`` defaults to the workflow id.
    """
    if not principal:
        raise ValueError("act_as: principal must be a non-empty string")
    token = current_authority.set(Authority(principal=principal, lease_id=lease, session=session))
    try:
        yield
    finally:
        # a workflow evicted from the cache closes its coroutine in another context
        with suppress(ValueError):
            current_authority.reset(token)


def current_principal() -> Authority | None:
    return current_authority.get()


class _Inbox:
    """The workflow's handler for review outcomes (one per workflow, registered on first use)."""

    def __init__(self) -> None:
        self.resolutions: dict[str, Resolution] = {}

    def __call__(self, payload: Any) -> None:
        try:
            resolution = Resolution.model_validate(payload)
        except ValidationError:
            # anyone with namespace access can send this signal: one that is not a resolution
            # is dropped, rather than failing the workflow task on every retry
            workflow.logger.warning(
                "a %s signal that is not a resolution: ignored", RESOLUTION_SIGNAL
            )
            return
        self.resolutions[resolution.effect_id] = resolution


def _inbox() -> _Inbox:
    handler = workflow.get_signal_handler(RESOLUTION_SIGNAL)
    if isinstance(handler, _Inbox):
        return handler
    inbox = _Inbox()
    workflow.set_signal_handler(RESOLUTION_SIGNAL, inbox)
    return inbox


async def execute_effect(
    activity: Any,
    arg: Any,
    *,
    wait_for_review: bool = True,
    review_timeout: timedelta | None = None,
    **options: Any,
) -> Any:
    """Run a gated activity from a workflow, and let a person decide what the gate cannot.

    On ``AmbiguousEffect`` (and ``ApprovalRequired``) it waits for the effect's review. The
    outcome comes from the journal, never from a signal: the review's ``interlock.resolution``
    signal only wakes the workflow, which runs the activity again, and the gate answers from
    what the journal records. ``happened`` recorded: the attested result (None when the person
    attested none), from the journal; ``not_happened`` recorded, or an approval granted: the
    activity runs (the gate re-checks the lease and the facts before it sends); a late
    COMMITTED: the recorded result; a rejected approval: ``EffectRefused`` naming who rejected
    it; nothing recorded yet (still AMBIGUOUS, still pending): it waits again. A forged signal
    therefore costs one more attempt that sends nothing, and changes nothing. The same call
    asked after a person rejected it ends in ``EffectRefused`` at once; a changed input,
    principal or policy is a new question (a person is asked again).

    A wake-up saying the review ``expired`` (nobody decided in time) ends the wait in the
    original error, as does ``review_timeout`` (it restarts only when the journal's answer
    changes, not at each wake-up). That is the one thing a signal can still do: make the
    workflow fail, which anyone who can send it can do anyway by terminating the workflow. It
    never makes the workflow return a result, or an effect be sent, that the journal does not
    record. With ``wait_for_review=False`` the error is raised at once (the review is opened
    anyway). ``options`` are ``workflow.execute_activity``'s.

    Workflows that were already waiting when their worker was upgraded keep the behaviour
    they began with (``WAKE_PATCH``): they believe the signal, as before. The outcome arrives as
    a signal, so this must be awaited from the workflow's own code.
    """
    waiting: _Waiting | None = None
    while True:
        try:
            return await workflow.execute_activity(activity, arg, **options)
        except ActivityError as err:
            cause = err.cause
            refused = _rejected(cause)
            if refused is not None and workflow.patched(WAKE_PATCH):
                raise refused from None
            receipt = receipt_from(err)
            effect_id = review_awaited(cause, receipt)
            if not wait_for_review or effect_id is None:
                raise
            if workflow.patched(WAKE_PATCH):
                waiting = _Waiting.on(waiting, effect_id, cause, receipt, review_timeout)
                try:
                    woken = await woken_by_review(effect_id, waiting.timeout())
                except TimeoutError:
                    raise err from None
                if woken.state == "expired":
                    raise  # nobody decided in time
                workflow.logger.info(
                    "effect %s: woken (%s); asking the journal", effect_id[:16], woken.state
                )
                continue
            # as before WAKE_PATCH: the signal is believed
            try:
                resolution = await woken_by_review(effect_id, review_timeout)
            except TimeoutError:
                raise err from None
            if resolution.decision == "happened":
                return _as_result(activity, resolution.result, options)
            if resolution.decision == "reject":
                raise EffectRefused(
                    f"rejected by {', '.join(resolution.operators)}", resolution.receipt or receipt
                ) from None
            if resolution.decision not in ("not_happened", "approve"):
                raise  # expired: nobody decided in time
            workflow.logger.info(
                "effect %s: %s by %s; running it again",
                effect_id[:16],
                resolution.decision,
                ", ".join(resolution.operators),
            )


class _Waiting:
    """What a wait is on (the effect, and the journal's answer that made it wait) and until
    when: ``review_timeout`` restarts when the answer changes (a new episode after a resend),
    never because a signal woke the workflow."""

    def __init__(self, answer: tuple[str, str, Receipt | None], until: datetime | None) -> None:
        self.answer = answer
        self.until = until

    @classmethod
    def on(
        cls,
        before: _Waiting | None,
        effect_id: str,
        cause: BaseException | None,
        receipt: Receipt | None,
        timeout: timedelta | None,
    ) -> _Waiting:
        kind = cause.type if isinstance(cause, ApplicationError) else ""
        answer = (effect_id, kind or "", receipt)
        if before is not None and before.answer == answer:
            return before
        return cls(answer, None if timeout is None else workflow.now() + timeout)

    def timeout(self) -> timedelta | None:
        if self.until is None:
            return None
        return max(timedelta(milliseconds=1), self.until - workflow.now())


def _rejected(cause: BaseException | None) -> EffectRefused | None:
    """The ``EffectRefused`` a denial ends in when a person rejected this very request (the
    policy read the rejection from the journal: code ``APPROVAL_REJECTED``); None for any
    other error. Non-retryable, as the denial was; no receipt (nothing was proposed)."""
    who = rejected_by(cause)
    if who is None:
        return None
    return EffectRefused(f"rejected by {', '.join(who) or 'a person'}", None)


def review_awaited(cause: BaseException | None, receipt: Receipt | None) -> str | None:
    """The id of the review a failed attempt waits on: the effect in doubt, or what an
    approval binds to. None: not an error a person decides."""
    if not isinstance(cause, ApplicationError) or cause.type not in WAIT_FOR:
        return None
    if receipt is not None:
        return receipt.effect_id
    details = list(cause.details)
    first = details[0] if details and isinstance(details[0], dict) else {}
    binding = first.get("binding") if cause.type == "ApprovalRequired" else None
    return binding if isinstance(binding, str) and binding else None


async def woken_by_review(effect_id: str, timeout: timedelta | None) -> Resolution:
    """The next wake-up of the review of ``effect_id`` (``TimeoutError`` after ``timeout``): a
    wake-up, never the outcome (the gate reads that from the journal when asked again)."""
    inbox = _inbox()
    await workflow.wait_condition(lambda: effect_id in inbox.resolutions, timeout=timeout)
    return inbox.resolutions.pop(effect_id)


def _as_result(activity: Any, result: Any, options: dict[str, Any]) -> Any:
    """The attested result as the activity's return type."""
    if result is None:
        return None
    result_type = options.get("result_type")
    if result_type is None and not isinstance(activity, str):
        # _Definition is private to the SDK, read here as the SDK's workflow runtime reads it in
        # execute_activity: no public API gives an @activity.defn's return type. The version is
        # pinned (requirements.lock); a rename fails the replay and server tests, never silently
        result_type = _Definition.must_from_callable(activity).ret_type
    if result_type is None:
        return result
    converter = workflow.payload_converter()
    return converter.from_payload(converter.to_payload(result), result_type)
