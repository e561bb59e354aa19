"""The errors a gated activity raises, as Temporal ``ApplicationError`` types.

A workflow sees them as ``ActivityError`` whose ``cause`` is an ``ApplicationError`` with
``.type`` set to the class name; ``receipt_from(error)`` reads the receipt in the details.

The gate's expected decisions (``EffectRefused``, ``ApprovalRequired``, ``InterlockDenied``) are
``BENIGN`` application errors: the worker logs them at DEBUG, without a traceback, and does
not count them as activity failures in its metrics. ``AmbiguousEffect`` stays a failure that
counts: a person must act.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio.exceptions import ActivityError, ApplicationError, ApplicationErrorCategory

from ..core.errors import (
    APPROVAL_REJECTED,
    Ambiguous,
    CaptureFailed,
    Denied,
    InFlight,
    InvalidCall,
    JournalCorrupt,
    JournalUnavailable,
    NeedsApproval,
    Refused,
    RowCorrupt,
    UnstableEffectKey,
)
from ..core.identity import dotted_path
from ..core.models import Receipt


class AmbiguousEffect(ApplicationError):
    """Nobody can know whether the effect happened: a person must decide. Not retryable."""

    def __init__(self, message: str, receipt: Receipt) -> None:
        super().__init__(
            message, receipt.model_dump(mode="json"), type="AmbiguousEffect", non_retryable=True
        )
        self.receipt = receipt


class EffectRefused(ApplicationError):
    """The effect must not be sent: authority or facts changed, the payload conflicts, or a
    person rejected it (an approval rejected before any proposal carries no receipt)."""

    def __init__(self, message: str, receipt: Receipt | None) -> None:
        details = () if receipt is None else (receipt.model_dump(mode="json"),)
        super().__init__(
            message,
            *details,
            type="EffectRefused",
            non_retryable=True,
            category=ApplicationErrorCategory.BENIGN,
        )
        self.receipt = receipt


class UnstableEffectKeyError(ApplicationError):
    """The effect key changed between attempts of one activity with one input: nothing was sent
    under the new id. Not retryable; the receipt in ``details[0]`` is the first effect's."""

    def __init__(self, message: str, receipt: Receipt | None) -> None:
        details = () if receipt is None else (receipt.model_dump(mode="json"),)
        super().__init__(message, *details, type="UnstableEffectKey", non_retryable=True)
        self.receipt = receipt


class EffectInFlight(ApplicationError):
    """A live attempt holds the effect, or the target may still be executing it. Retryable."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(
            message, type="EffectInFlight", next_retry_delay=timedelta(seconds=retry_after)
        )


class InterlockNotInstalled(ApplicationError):
    """A gated activity ran where the gate cannot run it: on a worker without the interceptor,
    or (a plain ``def`` one) on an activity executor that is not a thread pool. Its body never
    runs. ``reason`` says which, and what to do (default: the interceptor is missing)."""

    def __init__(self, activity_name: str, reason: str | None = None) -> None:
        super().__init__(
            f"gated activity {activity_name!r} "
            + (
                reason
                or "ran on a worker without the Interlock interceptor; register InterlockPlugin "
                "(or InterlockInterceptor) on this worker"
            ),
            type="InterlockNotInstalled",
            non_retryable=True,
        )


class TargetNotBound(ApplicationError):
    """A gated activity declared no target and this worker binds none under its name: nothing
    was journaled or sent. Not retryable (workers refuse to start like this; this is the
    interceptor's last word where no worker setup ran, e.g. an activity-only worker)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type="TargetNotBound", non_retryable=True)


class AuthorityRejected(ApplicationError):
    """The activity's authority header grants nothing: unsigned (set from outside a worker),
    signed with a key no worker holds, altered, or made for another workflow run. Nothing was
    journaled and nothing sent. Not retryable. ``details[0]`` is ``{"code": ...}``: one of
    ``unsigned``, ``malformed``, ``unknown_key``, ``bad_signature``, ``wrong_binding``,
    ``refused`` (the workflow's own start header was refused; the message says why)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(
            f"authority rejected ({code}): {reason}",
            {"code": code},
            type="AuthorityRejected",
            non_retryable=True,
        )
        self.code = code
        self.reason = reason


class InvalidEffectInput(ApplicationError):
    """The activity input does not validate: names the fields, never their values."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type="InvalidEffectInput", non_retryable=True)


class InterlockDenied(ApplicationError):
    """The policy denied the call; its body never ran. Not retryable.

    The details hold ``{"code", "policy_id", "argument", "session", "circuit_open",
    "rejected_by"}``: the reason code, the policy that denied, the offending argument's name
    (never its value), whether the session's circuit is now open (a person must reset it), and
    for ``APPROVAL_REJECTED`` (a person rejected this very request) who rejected it.
    ``execute_effect`` turns an ``APPROVAL_REJECTED`` denial into ``EffectRefused``.
    """

    def __init__(self, denied: Denied) -> None:
        super().__init__(
            str(denied),
            {
                "code": denied.code,
                "policy_id": denied.policy_id,
                "argument": denied.argument,
                "session": denied.session,
                "circuit_open": denied.circuit_open,
                "rejected_by": list(denied.rejected_by),
            },
            type="InterlockDenied",
            non_retryable=True,
            category=ApplicationErrorCategory.BENIGN,
        )
        self.code = denied.code
        self.policy_id = denied.policy_id
        self.argument = denied.argument
        self.session = denied.session
        self.circuit_open = denied.circuit_open
        self.rejected_by = denied.rejected_by


class ApprovalRequired(ApplicationError):
    """The policy wants a person to approve this call first; its body never ran."""

    def __init__(self, code: str, reason: str, binding: str, policy_id: str | None = None) -> None:
        super().__init__(
            f"{code}: {reason}",
            {"code": code, "binding": binding, "policy_id": policy_id},
            type="ApprovalRequired",
            non_retryable=True,
            category=ApplicationErrorCategory.BENIGN,
        )
        self.code = code
        self.binding = binding


class JournalCorruptError(ApplicationError):
    """The effect's journal entries, or a row the gate reads to allow it (a lease, what its
    budget has reserved), do not verify: nothing was decided or sent on it. Not retryable; the
    details name the effect and the entry, or the row (``{"effect_id", "seq", "row"}``)."""

    def __init__(
        self, message: str, effect_id: str | None, seq: int | None, row: str | None = None
    ) -> None:
        super().__init__(
            message,
            {"effect_id": effect_id, "seq": seq, "row": row},
            type="JournalCorrupt",
            non_retryable=True,
        )
        self.effect_id = effect_id
        self.seq = seq


class JournalMismatch(ApplicationError):
    """One task queue, one journal: a poller of this worker's task queue, or an earlier
    attempt's heartbeat, names another journal. Nothing was written or sent. Not retryable; the
    details name both journals (``{"journal_id", "other_journal_id"}``)."""

    def __init__(self, message: str, journal_id: str, other_journal_id: str) -> None:
        super().__init__(
            message,
            {"journal_id": journal_id, "other_journal_id": other_journal_id},
            type="JournalMismatch",
            non_retryable=True,
        )
        self.journal_id = journal_id
        self.other_journal_id = other_journal_id


class PremiseCaptureFailed(ApplicationError):
    """A target's ``capture`` raised: nothing was recorded or sent. Retryable: the facts are
    read from the target, which is most often unreachable for a while; the activity's retry
    policy bounds the retries, as for any failing activity. The message names the target, the
    error's type and where it was raised (never its message, which may hold an argument
    value); ``details[0]`` is ``{"target", "error"}``."""

    def __init__(self, message: str, target: str, error: str) -> None:
        super().__init__(message, {"target": target, "error": error}, type="PremiseCaptureFailed")
        self.target = target


class JournalUnavailableError(ApplicationError):
    """The journal cannot be written: nothing was sent. Retryable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type="InterlockJournalUnavailable")


def receipt_from(error: BaseException) -> Receipt | None:
    """The receipt carried by an Interlock error, seen from the workflow or the client."""
    cause: Any = error.cause if isinstance(error, ActivityError) else error
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    if cause is None or cause.type not in ("AmbiguousEffect", "EffectRefused", "UnstableEffectKey"):
        return None
    details = list(cause.details)
    return Receipt.model_validate(details[0]) if details else None


def rejected_by(error: BaseException | None) -> list[str] | None:
    """Who rejected the call, when ``error`` (as a workflow sees it) is the policy's denial of a
    request a person rejected (``InterlockDenied`` with code ``APPROVAL_REJECTED``); None for
    any other error."""
    cause: Any = error.cause if isinstance(error, ActivityError) else error
    if not isinstance(cause, ApplicationError) or cause.type != "InterlockDenied":
        return None
    details = list(cause.details)
    first = details[0] if details and isinstance(details[0], dict) else {}
    if first.get("code") != APPROVAL_REJECTED:
        return None
    return [str(name) for name in first.get("rejected_by") or []]


#: how many of an input's problems a message names (it counts the rest)
PROBLEMS_SHOWN = 5


def describe_invalid(err: BaseException, param: str) -> str:
    """Which fields are wrong and how, without echoing any input value: the first
    ``PROBLEMS_SHOWN``, each path cut in the middle when it is long (``dotted_path``), and how
    many more, so the message stays short whatever the input."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ValidationError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return f"argument {param!r} could not be decoded ({type(err).__name__})"
    errors = cause.errors(include_url=False, include_input=False, include_context=False)
    problems = [f"{dotted_path(param, e['loc'])}: {e['type']}" for e in errors[:PROBLEMS_SHOWN]]
    if len(errors) > PROBLEMS_SHOWN:
        problems.append(f"and {len(errors) - PROBLEMS_SHOWN:,} more")
    return "; ".join(problems)


def _stamped(receipt: Receipt | None, journal_id: str | None) -> Receipt | None:
    if receipt is None or journal_id is None or receipt.journal_id is not None:
        return receipt
    return receipt.model_copy(update={"journal_id": journal_id})


@contextlib.contextmanager
def as_temporal_errors(journal_id: str | None = None) -> Iterator[None]:
    """Core outcomes become the ``ApplicationError`` types workflows and operators see; their
    receipts name ``journal_id``, the journal that holds the effect, when given."""
    try:
        yield
    except Refused as r:
        # a target's refusal reaches the workflow with the target's own error as its cause (an
        # API's message: the journal keeps only what ``refusal_detail`` says)
        cause = r.__context__ if r.code == "target_rejected" and r.refused_at is None else None
        raise EffectRefused(str(r), _stamped(r.receipt, journal_id)) from cause
    except Ambiguous as a:
        receipt = _stamped(a.receipt, journal_id)
        assert receipt is not None
        raise AmbiguousEffect(a.reason, receipt) from None
    except InFlight as f:
        raise EffectInFlight(str(f), f.retry_after) from None
    except InvalidCall as e:
        raise InvalidEffectInput(str(e)) from None
    except CaptureFailed as e:
        raise PremiseCaptureFailed(str(e), e.target, type(e.error).__name__) from None
    except JournalUnavailable as e:
        raise JournalUnavailableError(str(e)) from None
    except RowCorrupt as e:
        raise JournalCorruptError(str(e), None, None, f"{e.table}[{e.key}]") from None
    except JournalCorrupt as e:
        raise JournalCorruptError(str(e), e.effect_id, e.seq) from None
    except UnstableEffectKey as e:
        raise UnstableEffectKeyError(str(e), _stamped(e.receipt, journal_id)) from None
    except Denied as d:
        raise InterlockDenied(d) from None
    except NeedsApproval as n:
        raise ApprovalRequired(n.code, n.reason, n.binding, n.policy_id) from None
