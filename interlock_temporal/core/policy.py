"""The policy layer (DESIGN section 6): may this principal run this activity with this input now?

Two parts, both plain Python with no I/O:

- ``decide(state, call, limits, rng)``: the circuit breaker, a pure function whose layers run in
  a fixed order (circuit, replay, budget, repeats, window, global cap, probabilistic denial,
  human-in-the-loop). It returns the verdict *and* the state after it, so a store can apply
  both in one transaction.
- rules: ``Rule = Callable[[CallEvent], Decision | None]``, composed by ``evaluate_rules``: a
  block wins, modifies compose in order (each later rule sees the rewritten call), a rule that
  raises or returns a verdict the engine does not know blocks (fail closed), and rules see a
  copy of the call, so only a MODIFY changes what is sent.

``PolicyGuard`` strings them together around a ``PolicyStore`` (the journal's database keeps
the state, so several worker processes share one view).
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import hashlib
import logging
import math
from abc import ABC, abstractmethod
from bisect import bisect_right, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from .errors import Denied, NeedsApproval
from .identity import UnserializableInput, canonical_json, jsonable

log = logging.getLogger("interlock_temporal.policy")


class Verdict(StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"
    MODIFY = "MODIFY"
    ESCALATE = "ESCALATE"
    #: a rule's denial: the same outcome as DENY
    BLOCK = "DENY"


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


# -- the breaker's configuration, state and input ------------------------------------------


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
class Circuit:
    """Why and when a session's circuit opened. Only a person closes it."""

    code: str
    activity: str
    at: float


# The state records are not frozen only because frozen dataclasses cost four times as much to
# build, and ``decide`` builds them on every call: nothing mutates one once built.
@dataclass(slots=True)
class SessionState:
    circuit: Circuit | None = None
    #: the last allowed call's signature (activity and input digest) and how many in a row
    last_call: str = ""
    streak: int = 0
    total: int = 0
    spent_usd: float = 0.0
    #: per activity type, the times of the calls inside the current window
    windows: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # The deliveries a session has seen (its nonces) are not kept here: the store keeps them in
    # an indexed table and tells ``decide`` whether this one was seen (``CallFacts.replayed``),
    # so the document and ``decide`` stay the same size however long the session runs. A
    # document of an older release may still carry ``deliveries``: it is ignored when loaded
    # (the schema-5 migration moved them into the store's table).


@dataclass(slots=True)
class PolicyState:
    """What ``decide`` reads: the session's state and the spend of the wider budgets."""

    session: SessionState = field(default_factory=SessionState)
    principal_spent_usd: float = 0.0
    namespace_spent_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What the breaker knows of one call. Built by the adapter, never from model output."""

    activity: str
    #: sha256 of the canonical input as proposed
    digest: str
    now: float
    cost_usd: float = 0.0
    #: the call's nonce: ``run_id/activity_id/attempt`` (with the attempt's scheduled time for
    #: an ungated activity); empty when not delivered by Temporal. Recorded by the store when
    #: the call is allowed, and only then.
    delivery: str = ""
    #: the store has seen ``delivery`` allowed before in this session: a replay
    replayed: bool = False
    #: this execution (or effect) was admitted before: a retry attempt, neither a repeat nor
    #: charged again
    admitted: bool = False
    error_signal: bool = False
    #: a rule asked for a person
    escalate: bool = False
    #: a person's approval covers this call
    approved: bool = False

    @property
    def signature(self) -> str:
        return f"{self.activity}\x00{self.digest}"


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


def decide(state: PolicyState, call: CallFacts, limits: Limits, rng: float) -> Decision:
    """The circuit breaker's verdict on ``call``, and the state after it.

    Pure: the same (state, call, limits, rng) always give the same decision, and ``state`` is
    never changed. The layers run in SP/1.0's order (docs/shackle-conformance.md names each
    and the tests that check it): circuit, replay, budget (spent, threshold, cost over what
    remains), repeats, window, global cap, random denial, a person always. A DENY opens the
    session's circuit (except a replay, and a call the open circuit denied), and nothing but a
    person's reset closes it. A retry attempt of an admitted execution is neither a repeat nor
    charged again. An approval satisfies an ESCALATE, never a DENY.
    """
    s = state.session
    if s.circuit is not None:
        return _deny(
            state,
            call,
            Reason.CIRCUIT_OPEN,
            f"the session's circuit opened on {s.circuit.code} and only a person resets it",
        )
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
            return Decision(
                Verdict.ESCALATE,
                Reason.BUDGET_THRESHOLD.value,
                f"the {lowest_scope} budget fell to its escalation threshold",
                state=state,
            )
        if over and mode in (HitlMode.ON_DENY, HitlMode.ALWAYS):
            return Decision(
                Verdict.ESCALATE,
                Reason.BUDGET_EXHAUSTED.value,
                f"the call's cost exceeds what remains of the {over} budget",
                state=state,
            )
    if over and not (call.approved and mode in (HitlMode.ON_DENY, HitlMode.ALWAYS)):
        return _deny(
            state,
            call,
            Reason.BUDGET_EXHAUSTED,
            f"the call's cost exceeds what remains of the {over} budget",
        )

    if limits.max_repeat_calls is not None and call.signature == s.last_call:
        limit = limits.max_repeat_calls
        if limits.error_amplification and call.error_signal:
            limit = max(1, limit - 1)
        if s.streak >= limit:
            return _deny(
                state,
                call,
                Reason.MAX_REPEAT_EXCEEDED,
                f"{s.streak} identical calls of {call.activity} in a row (limit {limit})",
            )

    if limits.window_s is not None and limits.window_max_calls is not None:
        times = s.windows.get(call.activity, ())
        recent = len(times) - bisect_right(times, call.now - limits.window_s)
        if recent >= limits.window_max_calls:
            return _deny(
                state,
                call,
                Reason.WINDOW_EXCEEDED,
                f"{recent} calls of {call.activity} in {limits.window_s:g} s",
            )

    if limits.max_total_calls is not None and s.total >= limits.max_total_calls:
        return _deny(state, call, Reason.GLOBAL_LIMIT, f"{s.total} calls in this session")

    if (
        limits.probabilistic_deny
        and budgets
        and lowest < 0.2
        and rng < limits.deny_jitter_ratio * (1.0 - lowest)
    ):
        # worded as a real over-budget denial on purpose: the agent cannot tell them apart
        return _deny(
            state,
            call,
            Reason.BUDGET_EXHAUSTED,
            f"the call's cost exceeds what remains of the {lowest_scope} budget",
            probabilistic=True,
        )

    if (call.escalate or limits.needs_person(call.activity)) and not call.approved:
        return Decision(
            Verdict.ESCALATE,
            Reason.HITL_REQUIRED.value,
            "a person must approve this call",
            state=state,
        )
    return Decision(Verdict.ALLOW, state=admit(state, call, limits))


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
        )
    if decision.verdict is Verdict.ESCALATE:
        raise NeedsApproval(decision.code, decision.reason, binding, decision.policy_id)
    return decision


def reset_circuit(state: SessionState) -> SessionState:
    """A person closed the circuit: the session starts counting afresh (its spend stays)."""
    return SessionState(spent_usd=state.spent_usd)


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


# -- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallEvent:
    """What a rule sees: the call as the activity would receive it, and who makes it."""

    activity: str
    args: tuple[Any, ...]
    principal: str | None = None
    session: str | None = None
    namespace: str | None = None
    attempt: int = 1
    workflow_id: str | None = None
    effect_id: str | None = None
    #: "call" before the body runs; "result" after, with what it returned
    phase: Literal["call", "result"] = "call"
    result: Any = None
    #: the activity's parameter names, when known
    param_names: tuple[str, ...] = ()

    @property
    def input(self) -> Any:
        """The single argument, or the tuple of them."""
        return self.args[0] if len(self.args) == 1 else self.args

    def argument(self, name: str, default: Any = None) -> Any:
        """An argument by its parameter name, else a field of the single input (a model, a
        dataclass or a mapping)."""
        if name in self.param_names and len(self.param_names) == len(self.args):
            return self.args[self.param_names.index(name)]
        value = self.input
        if isinstance(value, Mapping):
            return value.get(name, default)
        return getattr(value, name, default)


Rule = Callable[[CallEvent], Decision | None]


def allow() -> Decision:
    return Decision(Verdict.ALLOW)


def block(code: str, reason: str = "", *, argument: str | None = None) -> Decision:
    return Decision(Verdict.DENY, code, reason, argument=argument)


def escalate(code: str = "RULE_ESCALATE", reason: str = "") -> Decision:
    return Decision(Verdict.ESCALATE, code, reason)


def modify(*args: Any, reason: str = "") -> Decision:
    """Rewrite the call's arguments (what is sent); identity still uses the proposed input."""
    return Decision(Verdict.MODIFY, "MODIFIED", reason, args=tuple(args))


def deny_activity(*names: str, code: str = "ACTIVITY_DENIED", reason: str = "") -> Rule:
    """Block every call of these activities (globs)."""

    def rule(event: CallEvent) -> Decision | None:
        if any(fnmatch.fnmatchcase(event.activity, n) for n in names):
            return block(code, reason or f"{event.activity} may not be called")
        return None

    rule.__name__ = f"deny_activity({', '.join(names)})"
    return rule


def deny_when(
    predicate: Callable[[CallEvent], bool],
    *,
    code: str = "DENIED",
    reason: str = "",
    argument: str | None = None,
) -> Rule:
    """Block calls the predicate holds for. A predicate that raises blocks too (fail closed)."""

    def rule(event: CallEvent) -> Decision | None:
        if predicate(event):
            return block(code, reason, argument=argument)
        return None

    rule.__name__ = f"deny_when({getattr(predicate, '__name__', 'predicate')})"
    return rule


def rule_name(rule: Rule) -> str:
    return str(getattr(rule, "policy_id", None) or getattr(rule, "__name__", type(rule).__name__))


def _rule_error(reason: str, name: str | None) -> Decision:
    return Decision(Verdict.DENY, Reason.RULE_ERROR.value, reason, policy_id=name)


def _malformed(d: object) -> str | None:
    """What is wrong with a rule's return value (None: it is a decision the engine knows).
    Says which type was wrong, never a value: a rule may build its result from the input."""
    if not isinstance(d, Decision):
        return f"returned a {type(d).__name__}, not a Decision"
    # by type, not equality: a StrEnum member equals its string, so "DENY" == Verdict.DENY
    if not isinstance(d.verdict, Verdict):
        return (
            f"returned a verdict the engine does not know "
            f"(a {type(d.verdict).__name__}, not a Verdict)"
        )
    if d.verdict is Verdict.MODIFY and d.args is not None and not isinstance(d.args, tuple | list):
        return f"returned MODIFY with args that are a {type(d.args).__name__}, not a tuple"
    return None


def evaluate_rules(rules: Sequence[Rule], event: CallEvent) -> tuple[Decision, CallEvent]:
    """Run ``rules`` in order: the composed decision and the call as rewritten.

    A block wins at once. A modify rewrites the arguments every later rule sees. An escalate
    is remembered while later rules may still block. A rule that raises, or returns anything
    but None or a ``Decision`` with a ``Verdict``, blocks (fail closed). A modify with no value
    rewrites nothing.

    Rules see a private copy of the call (made once per evaluation, and again of each
    rewrite), so only a MODIFY changes what is sent: an edit of the arguments in place
    reaches neither the body nor the journal.
    """
    if not rules:
        return Decision(Verdict.ALLOW), event
    result_phase = event.phase == "result"
    rewritten = event  # what would be sent (or returned): never handed to a rule
    try:
        seen = dataclasses.replace(
            event,
            args=copy.deepcopy(event.args),
            result=copy.deepcopy(event.result) if result_phase else event.result,
        )
    except Exception as err:
        log.warning("the call to %s cannot be copied for the policy rules", event.activity)
        return (
            _rule_error(f"the call cannot be copied for the rules ({type(err).__name__})", None),
            event,
        )
    escalation: Decision | None = None
    modified = False
    for rule in rules:
        name = rule_name(rule)
        try:
            d = rule(seen)
        except Exception as err:
            log.warning("policy rule %s raised %s: the call is blocked", name, type(err).__name__)
            return _rule_error(f"rule {name} raised {type(err).__name__}", name), rewritten
        if d is None:
            continue
        problem = _malformed(d)
        if problem is not None:
            log.warning("policy rule %s %s: the call is blocked", name, problem)
            return _rule_error(f"rule {name} {problem}", name), rewritten
        if d.verdict is Verdict.ALLOW:
            continue
        if d.policy_id is None:
            d = dataclasses.replace(d, policy_id=name)
        if d.verdict is Verdict.DENY:
            return d, rewritten
        if d.verdict is Verdict.MODIFY:
            if not d.args:
                log.warning("policy rule %s returned MODIFY without a value: ignored", name)
                continue
            try:
                if result_phase:
                    rewritten = dataclasses.replace(rewritten, result=d.args[0])
                    seen = dataclasses.replace(seen, result=copy.deepcopy(d.args[0]))
                else:
                    rewritten = dataclasses.replace(rewritten, args=tuple(d.args))
                    seen = dataclasses.replace(seen, args=copy.deepcopy(tuple(d.args)))
            except Exception as err:
                reason = f"rule {name} returned a rewrite that cannot be copied"
                log.warning("policy rule %s: %s", name, reason)
                return _rule_error(f"{reason} ({type(err).__name__})", name), rewritten
            modified = True
        elif d.verdict is Verdict.ESCALATE and escalation is None:
            escalation = d
    if escalation is not None:
        return escalation, rewritten
    if modified:
        return Decision(Verdict.MODIFY, "MODIFIED", args=rewritten.args), rewritten
    return Decision(Verdict.ALLOW), rewritten


# -- the policy and its store ----------------------------------------------------------------

Mode = Literal["enforce", "monitor"]


class Policy:
    """Limits and rules, under an id and an epoch (a content hash that changes with them).

    ``mode="monitor"`` records what would have happened (``observed=true``) and never blocks;
    any other mode string enforces.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        rules: Sequence[Rule] = (),
        *,
        result_rules: Sequence[Rule] = (),
        mode: str = "enforce",
        policy_id: str = "interlock",
        cost_field: str | None = "cost_usd",
        secret_arguments: Iterable[str] = (),
        epoch: str | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.rules = tuple(rules)
        self.result_rules = tuple(result_rules)
        if mode not in ("enforce", "monitor"):
            log.warning("policy %s: unknown mode %r: enforcing", policy_id, mode)
        self.mode: Mode = "monitor" if mode == "monitor" else "enforce"
        self.policy_id = policy_id
        self.cost_field = cost_field
        self.secret_arguments = frozenset(secret_arguments)
        self.epoch = epoch or self._epoch()

    def _epoch(self) -> str:
        # a setting added later is left out while unset, so an upgrade keeps a policy's epoch
        # (and the approvals granted under it)
        unset_later = {"hitl_mode"} if self.limits.hitl_mode is None else set()
        doc = {
            "limits": self.limits.model_dump(mode="json", exclude=unset_later),
            "rules": [rule_name(r) for r in self.rules],
            "result_rules": [rule_name(r) for r in self.result_rules],
            "mode": self.mode,
            "policy_id": self.policy_id,
            "cost_field": self.cost_field,
            "secret_arguments": sorted(self.secret_arguments),
        }
        return hashlib.sha256(canonical_json(doc)).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Scopes:
    """Where a call's state lives."""

    session: str
    principal: str
    namespace: str
    #: the execution (``run_id/activity_id``) or the effect (``effect:<id>``) being admitted
    execution: str
    #: what an approval of this call names: the effect id, or ``call:<digest>`` when ungated
    binding: str = ""

    @classmethod
    def of(cls, event: CallEvent, execution: str, binding: str = "") -> Scopes:
        """The session defaults to the workflow id; "-" stands for an unknown principal."""
        return cls(
            session=event.session or event.workflow_id or "-",
            principal=event.principal or "-",
            namespace=event.namespace or "-",
            execution=execution,
            binding=binding,
        )


def call_binding(activity: str, digest: str, principal: str) -> str:
    """What an approval of an ungated call names: the activity, its input and who asks,
    digested (two agents asking the same are two questions)."""
    text = f"{activity}\x00{digest}\x00{principal}"
    return "call:" + hashlib.sha256(text.encode()).hexdigest()


ApprovalStatus = Literal["pending", "approved", "rejected", "consumed"]
ApprovalScope = Literal["once", "session", "ttl"]


class Approval(BaseModel):
    """A request for a person's approval, and what they decided.

    Bound to the effect id (or the call's digest), the payload digest, the principal and the
    policy epoch: a changed input, principal or policy is not covered. Consumed by its first
    use unless granted for the session or for a time.
    """

    model_config = ConfigDict(frozen=True)

    binding: str
    activity: str
    principal: str
    session: str
    payload_digest: str
    epoch: str
    policy_id: str | None = None
    code: str = ""
    reason: str = ""
    #: the input as a person deciding needs to see it (secrets masked); never journaled
    proposal: Any = None
    requested_at: float
    status: ApprovalStatus = "pending"
    scope: ApprovalScope = "once"
    expires_at: float | None = None
    operators: list[str] = Field(default_factory=list)
    note: str = ""
    decided_at: float | None = None

    def covers(
        self, *, digest: str, principal: str, epoch: str, session: str, now: float
    ) -> str | None:
        """Why this approval does not cover the call (None: it does)."""
        if self.status != "approved":
            return f"the approval is {self.status}"
        if self.payload_digest != digest:
            return "the input changed since it was approved"
        if self.principal != principal:
            return "another principal asks"
        if self.epoch != epoch:
            return "the policy changed since it was approved"
        if self.scope == "session" and self.session != session:
            return "it was granted for another session"
        if self.expires_at is not None and now >= self.expires_at:
            return "it expired"
        return None

    def same_request(self, other: Approval) -> bool:
        return (self.payload_digest, self.principal, self.epoch) == (
            other.payload_digest,
            other.principal,
            other.epoch,
        )


class PolicyStore(ABC):
    """Policy state in the journal's database, shared by every worker on it."""

    @abstractmethod
    def evaluate(
        self,
        scopes: Scopes,
        fn: Callable[[PolicyState, bool, Approval | None, bool], Outcome],
        *,
        nonce: str = "",
    ) -> Decision:
        """In one transaction: read the state of ``scopes``, whether ``scopes.execution`` was
        admitted before, the approval of ``scopes.binding`` and whether ``nonce`` (a delivery)
        was recorded in the session before; call ``fn(state, admitted, approval, replayed)``;
        write the state after it, admit the execution at ``charge`` (when not None), record the
        outcome's ``nonce`` for the session (for as long as the session's state is kept), record
        the approval request or consumption, and sign ``note`` into the session's policy chain
        in the journal. Returns the outcome's decision."""

    @abstractmethod
    def approval(self, binding: str) -> Approval | None: ...

    @abstractmethod
    def decide_approval(
        self,
        binding: str,
        *,
        approve: bool,
        operators: Sequence[str],
        note: str = "",
        scope: ApprovalScope = "once",
        ttl_s: float | None = None,
    ) -> tuple[bool, Approval]:
        """Record a person's decision on a pending approval (journaled): (recorded, approval).
        An approval already decided is returned unchanged with recorded False; an unknown
        binding raises ``KeyError``."""

    @abstractmethod
    def settle_cost(self, scopes: Scopes, actual_usd: float) -> bool:
        """Replace the execution's estimated charge with its actual cost, once. False when it
        was settled already (or never admitted)."""

    @abstractmethod
    def session(self, session: str) -> SessionState | None: ...

    @abstractmethod
    def reset(self, session: str, *, operator: str, note: str = "") -> bool:
        """A person closes the session's circuit (journaled). False if it was not open."""

    @abstractmethod
    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        """Approvals (requests and decisions), oldest request first."""

    @abstractmethod
    def open_circuits(self) -> dict[str, SessionState]:
        """Every session whose circuit is open, by session."""

    @abstractmethod
    def spent(self, scope: str) -> float:
        """The spend of ``principal:<name>`` or ``namespace:<name>``."""

    @abstractmethod
    def events(self, since: float | None = None) -> list[Any]:
        """The signed policy entries (denials, escalations, observed verdicts, resets), in
        journal order."""


STATE = TypeAdapter(SessionState)


def dump_session(state: SessionState) -> bytes:
    return STATE.dump_json(state)


def load_session(doc: str | bytes | None) -> SessionState:
    return SessionState() if doc is None else STATE.validate_json(doc)


def input_digest(args: Sequence[Any]) -> str:
    """The digest of a call's input as proposed (argument values never leave as themselves)."""
    try:
        data = jsonable(list(args))
        return hashlib.sha256(canonical_json(data)).hexdigest()
    except (UnserializableInput, TypeError, ValueError):
        # no canonical form: digest the types, so such calls still count as one kind of call
        return hashlib.sha256(repr([type(a).__qualname__ for a in args]).encode()).hexdigest()


MASK = "**********"


def redact(data: Any, secret: frozenset[str]) -> Any:
    """``data`` with the value of every field named in ``secret`` masked, at any depth."""
    if not secret:
        return data
    if isinstance(data, dict):
        return {k: MASK if k in secret else redact(v, secret) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v, secret) for v in data]
    return data


def cost_in(value: Any, field_name: str | None) -> float | None:
    """A cost the input or result reports in ``field_name``: a finite, non-negative number."""
    if field_name is None:
        return None
    if isinstance(value, Mapping):
        found = value.get(field_name)
    else:
        found = getattr(value, field_name, None)
    if isinstance(found, bool) or not isinstance(found, int | float):
        return None
    number = float(found)
    return number if math.isfinite(number) and number >= 0 else None


# -- the guard: rules, then the breaker, against the shared state ----------------------------


class PolicyFollower(Protocol):
    """A policy that can change while a worker runs (``PolicySource`` follows a file)."""

    def current(self, now: float) -> Policy: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one evaluation writes: the decision, the session's state after it, the charge
    that admits the execution (None: not admitted now), and the journal note to sign."""

    decision: Decision
    state: PolicyState
    charge: float | None = None
    note: dict[str, Any] | None = None
    #: an approval to ask a person for (kept while the same request is pending)
    request: Approval | None = None
    #: the approval this call used up (only a once-approval is consumed)
    consumed: Approval | None = None
    #: the delivery to record as seen in the session (only a call that runs records its own)
    nonce: str | None = None


class PolicyGuard:
    """Checks calls against a ``Policy`` with state in a ``PolicyStore``."""

    def __init__(
        self,
        policy: Policy | PolicyFollower,
        store: PolicyStore,
        *,
        clock: Callable[[], float] | None = None,
        rng: Callable[[], float] | None = None,
        on_decision: Callable[[Decision, str], None] | None = None,
    ) -> None:
        import random
        import time

        #: told of every decision with the activity's name (telemetry counts them)
        self.on_decision = on_decision
        self._source = policy
        self.store = store
        self.clock = clock or time.time
        self.rng = rng or random.random

    @property
    def policy(self) -> Policy:
        """The policy in force now (a file-backed one is reloaded when its file changes)."""
        source = self._source
        return source if isinstance(source, Policy) else source.current(self.clock())

    def facts(
        self,
        event: CallEvent,
        *,
        delivery: str = "",
        digest: str | None = None,
        policy: Policy | None = None,
    ) -> CallFacts:
        policy = policy or self.policy
        try:
            data = jsonable(list(event.args))
        except UnserializableInput:
            data = None
        limits = policy.limits
        estimate = cost_in(event.input, policy.cost_field) if len(event.args) == 1 else None
        return CallFacts(
            activity=event.activity,
            digest=digest or input_digest(event.args),
            now=self.clock(),
            cost_usd=limits.cost_of(event.activity) if estimate is None else estimate,
            delivery=delivery,
            error_signal=data is not None and has_error_signal(data),
        )

    def check(
        self,
        event: CallEvent,
        scopes: Scopes,
        *,
        delivery: str = "",
        digest: str | None = None,
    ) -> Decision:
        """The policy's decision on a call about to run (or an effect about to be sent). One
        decision uses one policy from start to end, even if the file changes meanwhile."""
        policy = self.policy
        ruled, rewritten = evaluate_rules(policy.rules, event)
        facts = self.facts(event, delivery=delivery, digest=digest, policy=policy)
        if ruled.verdict is Verdict.ESCALATE:
            facts = dataclasses.replace(facts, escalate=True)
        if not scopes.binding:
            binding = call_binding(event.activity, facts.digest, scopes.principal)
            scopes = dataclasses.replace(scopes, binding=binding)
        monitor = policy.mode == "monitor"
        rng = self.rng()

        def note(d: Decision, event_name: str) -> dict[str, Any]:
            return {
                "event": event_name,
                "verdict": d.verdict.value,
                "code": d.code,
                "reason": d.reason,
                "policy_id": d.policy_id or policy.policy_id,
                "epoch": policy.epoch,
                "argument": d.argument,
                "activity": event.activity,
                "digest": facts.digest,
                "principal": event.principal,
                "session": scopes.session,
                "execution": scopes.execution,
                "binding": scopes.binding,
                "delivery": delivery,
                "approvers": list(d.approvers),
                "tripped": d.state is not None and d.state.session.circuit is not None,
                "probabilistic": d.probabilistic,
            }

        def request(d: Decision) -> Approval:
            return Approval(
                binding=scopes.binding,
                activity=event.activity,
                principal=scopes.principal,
                session=scopes.session,
                payload_digest=facts.digest,
                epoch=policy.epoch,
                policy_id=d.policy_id,
                code=d.code,
                reason=d.reason,
                proposal=self.shown(event, policy),
                requested_at=facts.now,
            )

        # the nonce is recorded only for a call that runs (SP/1.0: only an ALLOW records it)
        nonce = delivery or None

        def evaluate(
            state: PolicyState, admitted: bool, approval: Approval | None, replayed: bool
        ) -> Outcome:
            covered = approval is not None and (
                approval.covers(
                    digest=facts.digest,
                    principal=scopes.principal,
                    epoch=policy.epoch,
                    session=scopes.session,
                    now=facts.now,
                )
                is None
            )
            f = dataclasses.replace(facts, admitted=admitted, approved=covered, replayed=replayed)
            charge = None if admitted else f.cost_usd
            if monitor:
                d = decide(state, f, policy.limits, rng)
                would = ruled if ruled.denies else d
                after = admit(state, f, policy.limits)
                if would.verdict in (Verdict.DENY, Verdict.ESCALATE):
                    seen = dataclasses.replace(would, policy_id=would.policy_id or policy.policy_id)
                    observed = Decision(
                        Verdict.ALLOW,
                        seen.code,
                        seen.reason,
                        policy_id=seen.policy_id,
                        argument=seen.argument,
                        observed=True,
                    )
                    return Outcome(observed, after, charge, note(seen, "observed"), nonce=nonce)
                return Outcome(Decision(Verdict.ALLOW), after, charge, nonce=nonce)
            if ruled.denies:
                blocked = dataclasses.replace(ruled, state=state)
                return Outcome(blocked, state, None, note(ruled, "deny"))
            d = decide(state, f, policy.limits, rng)
            after = d.state or state
            if d.verdict is not Verdict.ALLOW:
                d = dataclasses.replace(d, policy_id=d.policy_id or policy.policy_id)
                if ruled.verdict is Verdict.ESCALATE and d.code == Reason.HITL_REQUIRED.value:
                    d = dataclasses.replace(
                        d, code=ruled.code, reason=ruled.reason, policy_id=ruled.policy_id
                    )
                if d.verdict is Verdict.ESCALATE:
                    return Outcome(d, after, None, note(d, "escalate"), request=request(d))
                return Outcome(d, after, None, note(d, "deny"))
            consumed = None
            if covered and not admitted:
                unapproved = decide(
                    state, dataclasses.replace(f, approved=False), policy.limits, rng
                )
                if unapproved.verdict is Verdict.ESCALATE:
                    assert approval is not None
                    consumed = approval
                    d = dataclasses.replace(
                        d,
                        code="APPROVED",
                        reason=f"{unapproved.code} met by an approval",
                        policy_id=policy.policy_id,
                        approvers=tuple(approval.operators),
                    )
            if ruled.verdict is Verdict.MODIFY:
                d = dataclasses.replace(
                    d,
                    verdict=Verdict.MODIFY,
                    code="MODIFIED" if consumed is None else d.code,
                    args=rewritten.args,
                    policy_id=ruled.policy_id if consumed is None else d.policy_id,
                )
            if consumed is not None:
                return Outcome(
                    d, after, charge, note(d, "approval_used"), consumed=consumed, nonce=nonce
                )
            return Outcome(d, after, charge, nonce=nonce)

        decided = self.store.evaluate(scopes, evaluate, nonce=delivery)
        decision = dataclasses.replace(decided, epoch=policy.epoch)
        if self.on_decision is not None:
            self.on_decision(decision, event.activity)
        return decision

    def shown(self, event: CallEvent, policy: Policy | None = None) -> Any:
        """The call's input as a person deciding sees it: secrets masked."""
        try:
            data = jsonable(list(event.args))
        except UnserializableInput:
            return None
        shown = redact(data, (policy or self.policy).secret_arguments)
        return shown[0] if len(shown) == 1 else shown

    def check_result(self, event: CallEvent) -> Decision:
        """Result-phase rules on what an activity returned (no state)."""
        if not self.policy.result_rules:
            return Decision(Verdict.ALLOW)
        d, rewritten = evaluate_rules(self.policy.result_rules, event)
        if d.verdict is Verdict.MODIFY:
            return dataclasses.replace(d, args=(rewritten.result,))
        if self.policy.mode == "monitor" and d.verdict is not Verdict.ALLOW:
            return dataclasses.replace(d, verdict=Verdict.ALLOW, observed=True)
        return d

    def settle(self, scopes: Scopes, actual_usd: float) -> bool:
        return self.store.settle_cost(scopes, actual_usd)
