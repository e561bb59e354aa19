"""What the policy answers: a ``Verdict`` with its code and reason (a ``Decision``), and what
a denial or an escalation raises (``enforce``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import EnumType, StrEnum
from typing import Any

from ..deprecated import warn_renamed
from ..errors import APPROVAL_REJECTED, Denied, NeedsApproval
from .state import PolicyState

#: the names an older release gave a verdict, and the one each means now
_RENAMED = {"BLOCK": "DENY"}


class _VerdictType(EnumType):
    """Finds a renamed member by its old name, with a ``DeprecationWarning`` (an alias inside
    the enum would be a second member name for one verdict)."""

    def __getattr__(cls, name: str) -> Any:
        if name in _RENAMED:
            _warn_renamed(name)
            return cls[_RENAMED[name]]
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")

    def __getitem__(cls, name: str) -> Any:
        if name in _RENAMED:
            _warn_renamed(name)
            name = _RENAMED[name]
        return super().__getitem__(name)


def _warn_renamed(name: str) -> None:
    warn_renamed(f"Verdict.{name}", stacklevel=3)


class Verdict(StrEnum, metaclass=_VerdictType):
    """A rule's or the breaker's answer. A rule's block is a ``DENY`` (``Verdict.BLOCK``, its
    older name, still finds it, with a ``DeprecationWarning``)."""

    ALLOW = "ALLOW"
    DENY = "DENY"
    MODIFY = "MODIFY"
    ESCALATE = "ESCALATE"


class Reason(StrEnum):
    """Why a call was denied or escalated (the breaker's codes; rules choose their own)."""

    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    REPLAY = "REPLAY"
    #: a budget is spent, or the call costs more than what remains of it (SP/1.0 has one code
    #: for both; the reason text names the budget)
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    BUDGET_THRESHOLD = "BUDGET_THRESHOLD"
    MAX_REPEAT_EXCEEDED = "MAX_REPEAT_EXCEEDED"
    WINDOW_EXCEEDED = "WINDOW_EXCEEDED"
    GLOBAL_LIMIT = "GLOBAL_LIMIT"
    HITL_REQUIRED = "HITL_REQUIRED"
    RULE_ERROR = "RULE_ERROR"
    #: the guard's, not the breaker's: a person rejected this very request (same input,
    #: principal and policy epoch). It says nothing about the agent's behaviour, so it never
    #: trips the circuit, and nobody is asked again
    APPROVAL_REJECTED = APPROVAL_REJECTED


@dataclass(slots=True)
class Decision:
    """A verdict with its reason. ``decide`` also returns the state after it (``state``);
    a rule's MODIFY carries the rewritten arguments (``args``). Treated as a value: never
    changed once made (``dataclasses.replace`` makes a changed copy)."""

    verdict: Verdict
    code: str = ""
    reason: str = ""
    policy_id: str | None = None
    #: the offending argument's name (never its value)
    argument: str | None = None
    args: tuple[Any, ...] | None = None
    state: PolicyState | None = None
    #: the decision was a monitor's: it was recorded, not enforced
    observed: bool = False
    #: the people whose approval met an escalation
    approvers: tuple[str, ...] = ()
    #: the people who rejected this very request (an ``APPROVAL_REJECTED`` denial)
    rejected_by: tuple[str, ...] = ()
    #: the epoch of the policy that decided
    epoch: str | None = None
    #: a random denial near the end of a budget: told to operators (the journal's note), never
    #: to the agent, to whom it reads as a real exhaustion
    probabilistic: bool = False

    @property
    def denies(self) -> bool:
        return self.verdict is Verdict.DENY

    @property
    def circuit_open(self) -> bool:
        """This denial left the session's circuit open (it opened it, or it was open)."""
        return (
            self.verdict is Verdict.DENY
            and self.state is not None
            and self.state.session.circuit is not None
        )


def enforce(decision: Decision, *, session: str | None, binding: str) -> Decision:
    """Raise what a denial (``Denied``) or an escalation (``NeedsApproval``, naming what an
    approval must bind to) means; return any other decision."""
    if decision.verdict is Verdict.DENY:
        raise Denied(
            decision.code,
            decision.reason,
            decision.policy_id,
            decision.argument,
            session=session,
            circuit_open=decision.circuit_open,
            rejected_by=decision.rejected_by,
        )
    if decision.verdict is Verdict.ESCALATE:
        raise NeedsApproval(decision.code, decision.reason, binding, decision.policy_id)
    return decision
