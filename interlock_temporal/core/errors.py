"""The core's exceptions. The Temporal adapter turns each into an ``ApplicationError``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import Change, Receipt


class InterlockError(Exception):
    """Base of every error the package raises."""


class JournalConfigError(InterlockError):
    """The journal cannot be opened as configured (bad URL, key, permissions)."""


class JournalCorrupt(InterlockError):
    """The journal's stored entries are not what was signed (torn tail, edited entry, edited
    value). ``effect_id`` and ``seq`` name where, when an effect's read found it."""

    effect_id: str | None = None
    seq: int | None = None
    problem: str | None = None

    @classmethod
    def at(cls, effect_id: str, seq: int, problem: str) -> JournalCorrupt:
        err = cls(
            f"journal entry seq={seq} of effect {effect_id}: {problem}. Nothing was decided on "
            "this effect: run `interlock journal verify` and restore the journal from a copy"
        )
        err.effect_id, err.seq, err.problem = effect_id, seq, problem
        return err


class RowCorrupt(JournalCorrupt):
    """A row the gate reads to allow something (a lease's document, what its budget has
    reserved) was not written by this journal's keys, or is older than the signed entries it
    follows (``row_seals``). ``table`` and ``key`` name it; nothing was decided on it."""

    table: str | None = None
    key: str | None = None

    @classmethod
    def of(cls, table: str, key: str, problem: str) -> RowCorrupt:
        err = cls(
            f"journal row {table}[{key}]: {problem}. Nothing was sent on it: run `interlock "
            "journal verify` and restore the journal from a copy"
        )
        err.table, err.key, err.problem = table, key, problem
        return err


class LeaseOverGrant(InterlockError, ValueError):
    """A lease asked of another (``leases.issue(..., parent=...)``) would grant more than its
    parent: ``field`` names the argument that asks too much (``activities``, ``resources``,
    ``max_amount_cents``, ``budget_cents``, ``ttl``) or ``parent`` when the parent itself
    cannot delegate (unknown, revoked, expired). Nothing was issued. The message names the
    field, never its value. A ``ValueError``, as every other refusal of ``issue`` is."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class DelegationTooDeep(LeaseOverGrant):
    """A lease asked of a parent that already has ``MAX_DELEGATION_DEPTH`` ancestors."""


class JournalUnavailable(InterlockError):
    """The journal cannot be written right now: nothing was sent; retry later."""


class HeadConflict(InterlockError):
    """A conditional append found the effect's chain moved on: another writer appended first."""

    def __init__(self, effect_id: str, expected: str, actual: str) -> None:
        super().__init__(f"effect {effect_id[:16]}: head moved (expected {expected[:12] or '-'})")
        self.effect_id = effect_id
        self.expected = expected
        self.actual = actual


class InvalidCall(InterlockError):
    """The call cannot be gated as given (no key, a key that is not JSON data, ...).

    Messages name the argument or field, never its value.
    """


class GateOutcome(InterlockError):
    """An attempt ended without a result: refused, ambiguous or in flight elsewhere."""


class Refused(GateOutcome):
    """Terminal: the effect must not be (re)sent. ``receipt.executed`` is false.

    ``refused_at`` (seconds since the epoch) is set when the refusal was recorded by an earlier
    attempt and this one only answers it: the message then says when and why it was refused,
    that nothing was sent now, and how a person reopens it. ``code`` and ``reason`` are the
    recorded ones either way."""

    def __init__(
        self,
        code: str,
        reason: str,
        receipt: Receipt,
        changes: list[Change] | None = None,
        *,
        refused_at: float | None = None,
        configuration: str | None = None,
    ) -> None:
        if refused_at is not None:
            message = refused_earlier(receipt.effect_id, code, reason, refused_at, configuration)
        elif configuration is not None:
            message = f"{code}: {reason}. {DECIDED_AGAIN}"
        else:
            message = f"{code}: {reason}"
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.receipt = receipt
        self.changes = changes or []
        self.refused_at = refused_at
        #: set when the refusal is about the caller's own configuration (no act_as, no lease,
        #: an unknown lease, an activity outside the lease): the next attempt decides it again
        self.configuration = configuration


#: what a refusal about the caller's own configuration adds to its message
DECIDED_AGAIN = (
    "This refusal is about the caller's configuration, not the effect: once it is fixed, the "
    "next attempt decides the effect again (recorded as REOPENED); no person needs to reopen it"
)


def refused_earlier(
    effect_id: str, code: str, reason: str, refused_at: float, configuration: str | None = None
) -> str:
    """What a later attempt at an effect refused earlier reads: when (UTC), why, and the way
    out: for a refusal about the caller's configuration, fixing it (this attempt still has
    the configuration that was refused); for any other, a person reopens it."""
    when = datetime.fromtimestamp(refused_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if configuration is not None:
        return (
            f"refused earlier, at {when} ({code}: {reason}); nothing was sent now: this "
            f"attempt has the configuration that was refused. {DECIDED_AGAIN}"
        )
    return (
        f"refused earlier, at {when} ({code}: {reason}); nothing was sent now. It stays "
        "refused on every attempt until a person reopens it (`interlock effects reopen "
        f"{effect_id} --operator NAME`); its next attempt then runs under the lease and the "
        "facts current then"
    )


class CaptureFailed(InterlockError):
    """A target's ``capture`` (the facts an effect relies on) raised: nothing was recorded or
    sent, and the attempt is retried (the facts are usually read from the target itself, so
    the usual cause is the target being unreachable for a while; Temporal's retry policy of
    the activity bounds the retries, as for any activity that fails). The message names the
    target, the error's type and where it was raised, never its message (which may hold an
    argument value); ``error`` is the exception itself."""

    def __init__(self, target: str, effect_id: str, error: BaseException) -> None:
        where = _raised_at(error)
        super().__init__(
            f"target {target} could not capture the premises of effect {effect_id[:16]}: its "
            f"capture raised {type(error).__name__}{where}. Nothing was recorded or sent; the "
            "attempt will be retried (as often as the activity's retry policy allows). Fix "
            "capture if it is a bug, or raise a non-retryable error from it to stop"
        )
        self.target = target
        self.effect_id = effect_id
        self.error = error


def _raised_at(error: BaseException) -> str:
    """`` at file.py:12 in fn``: the innermost frame that raised ``error`` (a place in code, not
    a value), or "" without a traceback."""
    tb = error.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    name = code.co_filename.replace("\\", "/").rsplit("/", 1)[-1]
    return f" at {name}:{tb.tb_lineno} in {code.co_name}"


class Ambiguous(GateOutcome):
    """Terminal until a person decides: nobody can know whether the effect happened."""

    def __init__(self, reason: str, receipt: Receipt) -> None:
        super().__init__(reason)
        self.reason = reason
        self.receipt = receipt


class UnstableEffectKey(GateOutcome):
    """Terminal: a later attempt of the same activity, with the same input, computed another
    effect id than the first attempt did, so the key is not a function of the input alone (it
    reads a clock, a random number, ...). Nothing is sent under the new id. ``receipt`` is the
    first effect's: it is recovered as any effect in doubt (or is in front of a person)."""

    def __init__(self, effect_id: str, first_effect_id: str, receipt: Receipt | None) -> None:
        super().__init__(
            f"the effect key changed between attempts of one activity with one input: this "
            f"attempt names effect {effect_id}, the first named {first_effect_id}. A key must "
            "be a function of the approved decision (no now(), no uuid4()); nothing was sent "
            "under the new id"
        )
        self.effect_id = effect_id
        self.first_effect_id = first_effect_id
        self.receipt = receipt


class InFlight(GateOutcome):
    """Retryable: a live attempt holds the effect, or the target may still be executing it."""

    def __init__(self, effect_id: str, reason: str, retry_after: float) -> None:
        super().__init__(f"effect {effect_id[:16]} is in flight: {reason}")
        self.effect_id = effect_id
        self.reason = reason
        self.retry_after = retry_after


#: a denial's code when a person rejected this very request (``policy.Reason``'s member has this
#: value; here, so that workflow code can name it without loading the policy)
APPROVAL_REJECTED = "APPROVAL_REJECTED"


class Denied(GateOutcome):
    """The policy denied the call: the body did not run. Names the reason code, the policy and
    the offending argument (never its value)."""

    def __init__(
        self,
        code: str,
        reason: str,
        policy_id: str | None = None,
        argument: str | None = None,
        *,
        session: str | None = None,
        circuit_open: bool = False,
        rejected_by: Sequence[str] = (),
    ) -> None:
        where = f" (policy {policy_id}" + (f", argument {argument!r})" if argument else ")")
        super().__init__(f"{code}: {reason}{where if policy_id else ''}")
        self.code = code
        self.reason = reason
        self.policy_id = policy_id
        self.argument = argument
        self.session = session
        #: the session's circuit is open after this denial: a person must reset it
        self.circuit_open = circuit_open
        #: the people who rejected this very request (code ``APPROVAL_REJECTED``)
        self.rejected_by = tuple(rejected_by)


class NeedsApproval(GateOutcome):
    """The policy escalated the call to a person: the body did not run."""

    def __init__(self, code: str, reason: str, binding: str, policy_id: str | None = None) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
        #: what an approval must name: the effect id, or the call's digest for ungated calls
        self.binding = binding
        self.policy_id = policy_id
