"""Workflow-side helpers. Safe to import in workflow code (no I/O modules)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.activity import _Definition  # private: no public API reads an activity's definition
from temporalio.exceptions import ActivityError, ApplicationError

from ._reviews.workflow import RESOLUTION_SIGNAL, Resolution
from ._worker.context import Authority, current_authority
from ._worker.errors import EffectRefused, receipt_from
from .core.models import Receipt

__all__ = ["act_as", "current_principal", "execute_effect", "receipt_from"]

#: the errors after which a workflow may wait for a person instead of failing
WAIT_FOR = ("AmbiguousEffect", "ApprovalRequired")


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
        resolution = Resolution.model_validate(payload)
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

    On ``AmbiguousEffect`` (and ``ApprovalRequired``) it waits for the effect's review, then:
    ``happened`` returns the attested result (None when the person attested none);
    ``not_happened`` and ``approve`` run the activity again (the gate re-checks the lease and the
    facts before it sends); ``reject`` raises ``EffectRefused``; a review that expired re-raises
    the original error. With ``wait_for_review=False`` the error is raised at once (the review
    is opened anyway). ``options`` are ``workflow.execute_activity``'s.

    The outcome arrives as a signal, so this must be awaited from the workflow's own code.
    """
    while True:
        try:
            return await workflow.execute_activity(activity, arg, **options)
        except ActivityError as err:
            cause = err.cause
            receipt = receipt_from(err)
            effect_id = _awaited(cause, receipt)
            if not wait_for_review or effect_id is None:
                raise
            try:
                resolution = await _resolution_of(effect_id, review_timeout)
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


def _awaited(cause: BaseException | None, receipt: Receipt | None) -> str | None:
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


async def _resolution_of(effect_id: str, timeout: timedelta | None) -> Resolution:
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
