"""The circuit breaker (DESIGN section 6): its configuration (``Limits``), what it knows of a
call (``CallFacts``) and the pure ``decide(state, call, limits, rng)``.

``decide``'s layers run in SP/1.0's order (docs/shackle-conformance.md names each and the tests
that check it): circuit, replay, budget (spent, threshold, cost over what remains), repeats,
window, global cap, random denial, a person always. A DENY opens the session's circuit (except
a replay, and a call the open circuit denied), and nothing but a person's reset closes it. A
retry attempt of an admitted execution is neither a repeat nor charged again. An approval
satisfies an ESCALATE, never a DENY. It returns the verdict *and* the state after it, so a
store can apply both in one transaction.
"""

from __future__ import annotations

import fnmatch
import warnings
from bisect import bisect_right, insort
from dataclasses import InitVar, dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .state import Circuit, PolicyState, SessionState
from .verdicts import Decision, Reason, Verdict

#: denials that say nothing about the agent's behaviour, so they do not trip the circuit: it is
#: open already, or the same Temporal delivery was checked twice (the delivery is Temporal's,
#: never the agent's: see docs/shackle-conformance.md, layer 2)
_NO_TRIP = frozenset({Reason.CIRCUIT_OPEN, Reason.REPLAY})


class HitlMode(StrEnum):
    """When the breaker asks a person (SP/1.0's HITL modes).

    - ``never``: the breaker never asks (rules and ``hitl_activities`` still may);
    - ``on_deny``: a call that costs more than what remains of a budget is escalated instead of
      denied (a spent budget is still denied);
    - ``on_threshold``: a call is escalated once a budget's remaining fraction is at or below
      ``escalate_below_fraction``;
    - ``always``: every call is escalated, and a cost over what remains too, as with ``on_deny``.
    """

    NEVER = "never"
    ON_DENY = "on_deny"
    ON_THRESHOLD = "on_threshold"
    ALWAYS = "always"


#: SHACKLE's list of error signals, matched without regular expressions (no ReDoS surface)
ERROR_SIGNALS = (
    "401",
    "unauthorized",
    "403",
    "forbidden",
    "500",
    "502",
    "503",
    "504",
    "timeout",
    "connection refused",
    "connection reset",
    "permission denied",
    "rate limit",
    "quota exceeded",
    "invalid api key",
    "token expired",
    "model not found",
    "resource exhausted",
    "deadline exceeded",
)


# -- the breaker's configuration and input ----------------------------------------------------


class Limits(BaseModel):
    """The circuit breaker's configuration. Every limit is off unless set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: per session (default: the workflow id), per principal, per namespace, in USD
    session_budget_usd: float | None = Field(default=None, gt=0)
    principal_budget_usd: float | None = Field(default=None, gt=0)
    namespace_budget_usd: float | None = Field(default=None, gt=0)
    #: escalate once the smallest remaining fraction of a budget falls to this or below
    #: (SP/1.0's ``hitl_budget_threshold``, 0.0-1.0). Read with ``hitl_mode`` ``on_threshold``,
    #: which setting it alone selects.
    escalate_below_fraction: float | None = Field(default=None, ge=0, le=1)
    #: consecutive identical calls (activity and canonical input) allowed in a session
    max_repeat_calls: int | None = Field(default=None, ge=1)
    #: an error signal in the input lowers the repeat limit by one
    error_amplification: bool = True
    #: at most ``window_max_calls`` calls of one activity type per ``window_s`` seconds
    window_s: float | None = Field(default=None, gt=0)
    window_max_calls: int | None = Field(default=None, ge=1)
    #: calls allowed per session in total
    max_total_calls: int | None = Field(default=None, ge=1)
    #: below 20% of a budget, deny at random with probability ``jitter * (1 - fraction)``,
    #: so an agent cannot probe the exact edge
    probabilistic_deny: bool = False
    deny_jitter_ratio: float = Field(default=0.5, ge=0, le=1)
    #: when the breaker asks a person; unset: ``always`` with ``hitl_always``, ``on_threshold``
    #: with ``escalate_below_fraction``, else ``never`` (see ``HitlMode``)
    hitl_mode: HitlMode | None = None
    #: deprecated: ``hitl_mode: always``
    hitl_always: bool = False
    #: calls of these activities (globs) always need a person's approval, whatever the mode
    hitl_activities: tuple[str, ...] = ()
    #: the estimated cost of one call, by activity name (globs); charged when allowed
    costs: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Limits:
        """Refuse settings that contradict each other or would be silently ignored."""
        if self.hitl_always and self.hitl_mode not in (None, HitlMode.ALWAYS):
            raise ValueError(
                f"hitl_always (deprecated) means hitl_mode always, not {self.hitl_mode.value}: "
                "set only hitl_mode"
            )
        mode = self.hitl
        if mode is HitlMode.ON_THRESHOLD and self.escalate_below_fraction is None:
            raise ValueError("hitl_mode on_threshold needs escalate_below_fraction")
        if self.escalate_below_fraction is not None and mode is not HitlMode.ON_THRESHOLD:
            raise ValueError(
                f"escalate_below_fraction is read only with hitl_mode on_threshold, not "
                f"{mode.value}"
            )
        if (self.window_s is None) != (self.window_max_calls is None):
            missing = "window_s" if self.window_s is None else "window_max_calls"
            raise ValueError(f"a time window needs both window_s and window_max_calls: {missing}")
        return self

    @property
    def hitl(self) -> HitlMode:
        """The HITL mode in force (``hitl_mode``, or what the older settings mean)."""
        return hitl_mode_of(self)

    def cost_of(self, activity: str) -> float:
        exact = self.costs.get(activity)
        if exact is not None:
            return exact
        for pattern, cost in self.costs.items():
            if fnmatch.fnmatchcase(activity, pattern):
                return cost
        return 0.0

    def needs_person(self, activity: str) -> bool:
        """Whether a call of ``activity`` always needs a person (the last layer)."""
        if self.hitl_always or self.hitl_mode is HitlMode.ALWAYS:
            return True
        return bool(self.hitl_activities) and any(
            fnmatch.fnmatchcase(activity, p) for p in self.hitl_activities
        )


def hitl_mode_of(limits: Limits) -> HitlMode:
    mode = limits.hitl_mode
    if mode is not None:
        return mode
    if limits.hitl_always:
        return HitlMode.ALWAYS
    if limits.escalate_below_fraction is not None:
        return HitlMode.ON_THRESHOLD
    return HitlMode.NEVER


@dataclass(frozen=True, slots=True)
class CallFacts:
    """One call as the breaker sees it: the facts ``decide`` reads, derived from the call (a
    ``CallEvent``, which the rules see; the gate sees it as a ``Call``) by ``PolicyGuard.facts``
    and from the store's view of the session. Built by the adapter, never from model output.
    Where the call was delivered is not among them: the store records the delivery itself and
    says whether it was seen (``replayed``)."""

    activity: str
    #: sha256 of the canonical input as proposed
    digest: str
    now: float
    cost_usd: float = 0.0
    #: deprecated and never read: pass the delivery to ``PolicyGuard.check`` (the store's
    #: nonce); given here, it warns and is dropped (``dataclasses.replace`` reads it as "")
    delivery: InitVar[str] = ""
    #: the store has seen this delivery allowed before in this session: a replay
    replayed: bool = False
    #: this execution (or effect) was admitted before: a retry attempt, neither a repeat nor
    #: charged again
    admitted: bool = False
    error_signal: bool = False
    #: a rule asked for a person
    escalate: bool = False
    #: a person's approval covers this call
    approved: bool = False

    def __post_init__(self, delivery: str) -> None:
        if delivery:
            warnings.warn(
                "CallFacts(delivery=...) is deprecated and ignored: decide never reads it; the "
                "delivery goes to PolicyGuard.check, whose store records it",
                DeprecationWarning,
                stacklevel=3,
            )

    @property
    def signature(self) -> str:
        return f"{self.activity}\x00{self.digest}"


# -- the breaker ------------------------------------------------------------------------------


def _deny(
    state: PolicyState, call: CallFacts, code: Reason, reason: str, probabilistic: bool = False
) -> Decision:
    if code in _NO_TRIP:
        return Decision(Verdict.DENY, code.value, reason, state=state)
    s = state.session
    session = SessionState(
        Circuit(code.value, call.activity, call.now),
        s.last_call,
        s.streak,
        s.total,
        s.spent_usd,
        s.windows,
    )
    after = PolicyState(session, state.principal_spent_usd, state.namespace_spent_usd)
    return Decision(Verdict.DENY, code.value, reason, state=after, probabilistic=probabilistic)


def _budgets(state: PolicyState, limits: Limits) -> list[tuple[str, float, float]]:
    """(scope, limit, spent) for each configured budget."""
    out: list[tuple[str, float, float]] = []
    if limits.session_budget_usd is not None:
        out.append(("session", limits.session_budget_usd, state.session.spent_usd))
    if limits.principal_budget_usd is not None:
        out.append(("principal", limits.principal_budget_usd, state.principal_spent_usd))
    if limits.namespace_budget_usd is not None:
        out.append(("namespace", limits.namespace_budget_usd, state.namespace_spent_usd))
    return out


def admit(state: PolicyState, call: CallFacts, limits: Limits) -> PolicyState:
    """The state after ``call`` is allowed: counted, and charged its estimated cost."""
    s = state.session
    if call.admitted:
        return state
    signature = call.signature
    windows = s.windows
    if limits.window_s is not None:
        # sorted times; only the newest ``window_max_calls`` inside the window can matter
        times = list(windows.get(call.activity, ()))
        insort(times, call.now)
        del times[: bisect_right(times, call.now - limits.window_s)]
        if limits.window_max_calls is not None:
            del times[: -limits.window_max_calls]
        windows = {**windows, call.activity: tuple(times)}
    session = SessionState(
        s.circuit,
        signature,
        s.streak + 1 if signature == s.last_call else 1,
        s.total + 1,
        s.spent_usd + call.cost_usd,
        windows,
    )
    return PolicyState(
        session,
        state.principal_spent_usd + call.cost_usd,
        state.namespace_spent_usd + call.cost_usd,
    )


def _escalate(state: PolicyState, code: Reason, reason: str) -> Decision:
    return Decision(Verdict.ESCALATE, code.value, reason, state=state)


def _over(scope: str) -> str:
    return f"the call's cost exceeds what remains of the {scope} budget"


def decide(state: PolicyState, call: CallFacts, limits: Limits, rng: float) -> Decision:
    """The circuit breaker's verdict on ``call``, and the state after it, its layers in the
    order the module's docstring gives. Pure: the same (state, call, limits, rng) always give
    the same decision, and ``state`` is never changed."""
    s = state.session
    if s.circuit is not None:
        why = f"the session's circuit opened on {s.circuit.code} and only a person resets it"
        return _deny(state, call, Reason.CIRCUIT_OPEN, why)
    if call.replayed:
        return _deny(state, call, Reason.REPLAY, "this delivery was already allowed once")
    if call.admitted:
        return Decision(Verdict.ALLOW, "RETRY", state=state)

    mode = hitl_mode_of(limits)
    budgets = _budgets(state, limits)
    lowest = 1.0
    lowest_scope = ""
    over = ""
    for scope, limit, spent in budgets:
        remaining = limit - spent
        if remaining <= 0:
            return _deny(state, call, Reason.BUDGET_EXHAUSTED, f"the {scope} budget is spent")
        if not over and call.cost_usd > remaining:
            over = scope
        fraction = remaining / limit
        if fraction < lowest or not lowest_scope:
            lowest, lowest_scope = fraction, scope
    if budgets and not call.approved:
        if mode is HitlMode.ON_THRESHOLD and lowest <= (limits.escalate_below_fraction or 0.0):
            why = f"the {lowest_scope} budget fell to its escalation threshold"
            return _escalate(state, Reason.BUDGET_THRESHOLD, why)
        if over and mode in (HitlMode.ON_DENY, HitlMode.ALWAYS):
            return _escalate(state, Reason.BUDGET_EXHAUSTED, _over(over))
    if over and not (call.approved and mode in (HitlMode.ON_DENY, HitlMode.ALWAYS)):
        return _deny(state, call, Reason.BUDGET_EXHAUSTED, _over(over))

    if limits.max_repeat_calls is not None and call.signature == s.last_call:
        limit = limits.max_repeat_calls
        if limits.error_amplification and call.error_signal:
            limit = max(1, limit - 1)
        if s.streak >= limit:
            why = f"{s.streak} identical calls of {call.activity} in a row (limit {limit})"
            return _deny(state, call, Reason.MAX_REPEAT_EXCEEDED, why)

    if limits.window_s is not None and limits.window_max_calls is not None:
        times = s.windows.get(call.activity, ())
        recent = len(times) - bisect_right(times, call.now - limits.window_s)
        if recent >= limits.window_max_calls:
            why = f"{recent} calls of {call.activity} in {limits.window_s:g} s"
            return _deny(state, call, Reason.WINDOW_EXCEEDED, why)

    if limits.max_total_calls is not None and s.total >= limits.max_total_calls:
        return _deny(state, call, Reason.GLOBAL_LIMIT, f"{s.total} calls in this session")

    if (
        limits.probabilistic_deny
        and budgets
        and lowest < 0.2
        and rng < limits.deny_jitter_ratio * (1.0 - lowest)
    ):
        # worded as a real over-budget denial on purpose: the agent cannot tell them apart
        return _deny(state, call, Reason.BUDGET_EXHAUSTED, _over(lowest_scope), probabilistic=True)

    if (call.escalate or limits.needs_person(call.activity)) and not call.approved:
        return _escalate(state, Reason.HITL_REQUIRED, "a person must approve this call")
    return Decision(Verdict.ALLOW, state=admit(state, call, limits))


def _mentions(text: str, signal: str) -> bool:
    """Whether ``text`` contains ``signal``; a status code only as a number of its own, so an id
    such as ``o-3a500f1c`` or a count such as ``4010`` is not a server error."""
    if not signal.isdigit():
        return signal in text
    start = text.find(signal)
    while start >= 0:
        end = start + len(signal)
        if (start == 0 or not text[start - 1].isalnum()) and (
            end == len(text) or not text[end].isalnum()
        ):
            return True
        start = text.find(signal, start + 1)
    return False


def has_error_signal(data: Any) -> bool:
    """Whether any string (or integer) in ``data`` carries a known error signal."""
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            low = x.lower()
            if any(_mentions(low, signal) for signal in ERROR_SIGNALS):
                return True
        elif isinstance(x, bool) or x is None:
            continue
        elif isinstance(x, int):
            if str(x) in ERROR_SIGNALS:
                return True
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
    return False
