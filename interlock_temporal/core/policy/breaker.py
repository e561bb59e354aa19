"""The circuit breaker: its configuration (``Limits``), what it knows of a
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
from bisect import bisect_right, insort
from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..deprecated import warn_ignored
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

    @cached_property
    def _plan(self) -> _Plan:
        # kept in the instance's __dict__, where pydantic does not dump it (equality falls back
        # to the fields: plans compare by identity); a copy (model_copy) carries its
        # original's, which ``plan_of`` tells by its owner
        return _Plan.of(self)


@dataclass(frozen=True, slots=True, eq=False)
class _Plan:
    """What ``decide`` reads of a ``Limits``, worked out once per ``Limits`` (``plan_of``): a
    field of a pydantic model costs several times a slot to read, and the HITL mode, the
    budgets set and the repeat limits are derived from several fields. Compared by identity
    (``eq=False``): it refers to its owner, whose equality compares its ``__dict__``."""

    #: the ``Limits`` it was made from (``is`` costs a fraction of ``id()``): a copy of a
    #: ``Limits``, shallow or deep, carries its original's plan (copying a plan gives the same
    #: plan), which this tells apart; a pickled ``Limits`` comes back with its own plan
    owner: Limits
    #: (account, limit, which spend: 0 the session's, 1 the principal's, 2 the namespace's), in
    #: the order the budget layer reads them
    budgets: tuple[tuple[str, float, int], ...]
    #: the session's budget when it is the only one set (``budgets`` holds it too), else None
    session_alone: float | None
    #: the fraction ``on_threshold`` escalates at or below; None in any other mode
    threshold: float | None
    #: ``on_deny`` or ``always``: a cost over what remains asks a person
    escalate_over: bool
    #: the repeat limit, and the same with an error signal in the input
    repeat: int | None
    repeat_amplified: int
    window_s: float | None
    window_max_calls: int | None
    max_total_calls: int | None
    #: ``deny_jitter_ratio`` with ``probabilistic_deny``, else None
    jitter: float | None
    #: every call needs a person (``always``), else those of ``hitl_activities``
    always_person: bool
    hitl_activities: tuple[str, ...]
    #: ``always_person`` or ``hitl_activities``: the last layer has something to ask
    person_layer: bool
    #: whether an activity matches ``hitl_activities``, by activity (a memo of ``fnmatch``)
    person: dict[str, bool]

    def __copy__(self) -> _Plan:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Plan:
        # itself, its owner with it: a deep copy of a Limits (``model_copy(deep=True)`` maps
        # the original to the copy in its memo) must not carry a plan that names the copy
        return self

    @classmethod
    def of(cls, limits: Limits) -> _Plan:
        mode = hitl_mode_of(limits)
        budgets = (
            ("session", limits.session_budget_usd, 0),
            ("principal", limits.principal_budget_usd, 1),
            ("namespace", limits.namespace_budget_usd, 2),
        )
        repeat = limits.max_repeat_calls
        amplified = repeat or 0
        if limits.error_amplification:
            amplified = max(1, amplified - 1)
        budgets_set = tuple((account, b, i) for account, b, i in budgets if b is not None)
        always_person = limits.hitl_always or limits.hitl_mode is HitlMode.ALWAYS
        return cls(
            owner=limits,
            budgets=budgets_set,
            session_alone=(
                budgets_set[0][1] if len(budgets_set) == 1 and budgets_set[0][2] == 0 else None
            ),
            threshold=(
                (limits.escalate_below_fraction or 0.0) if mode is HitlMode.ON_THRESHOLD else None
            ),
            escalate_over=mode in (HitlMode.ON_DENY, HitlMode.ALWAYS),
            repeat=repeat,
            repeat_amplified=amplified,
            window_s=limits.window_s,
            window_max_calls=limits.window_max_calls,
            max_total_calls=limits.max_total_calls,
            jitter=limits.deny_jitter_ratio if limits.probabilistic_deny else None,
            always_person=always_person,
            hitl_activities=limits.hitl_activities,
            person_layer=always_person or bool(limits.hitl_activities),
            person={},
        )

    def asks_person(self, call: CallFacts) -> bool:
        """The last layer: a rule asked for a person (``escalate``), or these settings do for
        this call (``always``, or its activity matches one of ``hitl_activities``, remembered
        per name), and no approval covers it."""
        if call.approved:
            return False
        if call.escalate or self.always_person:
            return True
        activity = call.activity
        known = self.person.get(activity)
        if known is None:
            if len(self.person) >= _PERSON_MEMO:
                self.person.clear()
            known = any(fnmatch.fnmatchcase(activity, p) for p in self.hitl_activities)
            self.person[activity] = known
        return known


#: activity names remembered per plan (past this, the memo starts again)
_PERSON_MEMO = 4096


def plan_of(limits: Limits) -> _Plan:
    """The plan of ``limits``, made once (``decide`` does the same inline)."""
    plan = limits._plan
    if plan.owner is not limits:
        plan = limits.__dict__["_plan"] = _Plan.of(limits)
    return plan


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
            warn_ignored("CallFacts(delivery=...)", stacklevel=3)

    @property
    def signature(self) -> str:
        return f"{self.activity}\x00{self.digest}"


# -- the breaker ------------------------------------------------------------------------------

# read once: an enum member costs a lookup through its class's metaclass at each use
_ALLOW = Verdict.ALLOW
_DENY = Verdict.DENY
_ESCALATE = Verdict.ESCALATE
#: the states and the decision of an allowed call are made with this and filled slot by slot:
#: a dataclass's ``__init__`` costs more than the object it makes (``decide``'s whole budget is
#: about a microsecond). tests/test_policy.py checks they equal the ones the constructors make,
#: so a field added to one of those classes and not set here fails there. This fast path and
#: the plan cached on ``Limits`` (read inline in ``decide``) are why ``decide`` runs at
#: SHACKLE's speed (docs/benchmarks.md, figure 4): keep both through any refactor
_new = object.__new__


def _deny(
    state: PolicyState, call: CallFacts, code: Reason, reason: str, probabilistic: bool = False
) -> Decision:
    if code in _NO_TRIP:
        return Decision(_DENY, code.value, reason, state=state)
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
    return Decision(_DENY, code.value, reason, state=after, probabilistic=probabilistic)


def admit(state: PolicyState, call: CallFacts, limits: Limits) -> PolicyState:
    """The state after ``call`` is allowed: counted, and charged its estimated cost."""
    if call.admitted:
        return state
    signature = f"{call.activity}\x00{call.digest}"
    return _admit(state, call, plan_of(limits), signature, signature == state.session.last_call)


def _admit(
    state: PolicyState, call: CallFacts, plan: _Plan, signature: str, same: bool
) -> PolicyState:
    """``admit``'s state after ``call``; ``same``: ``signature`` is the session's last call's.
    ``decide`` makes the same state inline (the call costs a tenth of it), read alike."""
    s = state.session
    windows = s.windows if plan.window_s is None else _slid(s.windows, call, plan)
    cost = call.cost_usd
    session = _new(SessionState)  # every field set (see _new)
    session.circuit = s.circuit
    session.last_call = signature
    session.streak = s.streak + 1 if same else 1
    session.total = s.total + 1
    session.spent_usd = s.spent_usd + cost
    session.windows = windows
    after = _new(PolicyState)
    after.session = session
    after.principal_spent_usd = state.principal_spent_usd + cost
    after.namespace_spent_usd = state.namespace_spent_usd + cost
    return after


def _slid(
    windows: Mapping[str, tuple[float, ...]], call: CallFacts, plan: _Plan, cut: int = -1
) -> Mapping[str, tuple[float, ...]]:
    """``windows`` with ``call`` in its activity's window (``plan.window_s`` is set). Given where
    the window's calls start (``cut``, the first inside), as ``decide``'s window layer found it,
    the usual call, the newest, is appended without a new search."""
    # sorted times; only the newest ``window_max_calls`` inside the window can matter
    now = call.now
    times = windows.get(call.activity, ())
    if cut >= 0 and type(times) is tuple and (not times or now >= times[-1]):
        kept = times[cut:] + (now,)  # noqa: RUF005 (the unpacking form costs a third more)
    else:
        listed = list(times)
        insort(listed, now)
        del listed[: bisect_right(listed, now - (plan.window_s or 0.0))]
        kept = tuple(listed)
    cap = plan.window_max_calls
    if cap is not None and len(kept) > cap:
        kept = kept[-cap:]
    return {**windows, call.activity: kept}


def _escalate(state: PolicyState, code: Reason, reason: str) -> Decision:
    return Decision(_ESCALATE, code.value, reason, state=state)


def _over(account: str) -> str:
    return f"the call's cost exceeds what remains of the {account} budget"


def _threshold(account: str) -> str:
    return f"the {account} budget fell to its escalation threshold"


def _budgets(
    state: PolicyState, call: CallFacts, plan: _Plan
) -> tuple[Decision | None, float, str]:
    """The budget layer over every budget set (``decide`` unrolls it for the session's alone):
    its denial or escalation, if any, and the lowest fraction left and whose it is."""
    s = state.session
    lowest = 1.0
    lowest_account = over = ""
    for account, limit, which in plan.budgets:
        remaining = limit - (
            s.spent_usd
            if which == 0
            else state.principal_spent_usd
            if which == 1
            else state.namespace_spent_usd
        )
        if remaining <= 0:
            spent = f"the {account} budget is spent"
            return _deny(state, call, Reason.BUDGET_EXHAUSTED, spent), lowest, ""
        if not over and call.cost_usd > remaining:
            over = account
        fraction = remaining / limit
        if fraction < lowest or not lowest_account:
            lowest, lowest_account = fraction, account
    if not call.approved:
        if plan.threshold is not None and lowest <= plan.threshold:
            why = _threshold(lowest_account)
            return _escalate(state, Reason.BUDGET_THRESHOLD, why), lowest, lowest_account
        if over and plan.escalate_over:
            return _escalate(state, Reason.BUDGET_EXHAUSTED, _over(over)), lowest, over
    if over and not (call.approved and plan.escalate_over):
        return _deny(state, call, Reason.BUDGET_EXHAUSTED, _over(over)), lowest, over
    return None, lowest, lowest_account


def _window(
    state: PolicyState, call: CallFacts, window_s: float, max_calls: int
) -> tuple[Decision | None, int]:
    """The window layer: its denial, if any, and where the calls of the activity inside its
    window start (-1: ``window_s`` is not positive, and the call itself is outside)."""
    times = state.session.windows.get(call.activity, ())
    cut = -1
    if window_s > 0:  # always, validated
        cut = bisect_right(times, call.now - window_s)
        recent = len(times) - cut
    else:
        recent = len(times) - bisect_right(times, call.now - window_s)
    if recent >= max_calls:
        why = f"{recent} calls of {call.activity} in {window_s:g} s"
        return _deny(state, call, Reason.WINDOW_EXCEEDED, why), cut
    return None, cut


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
        return Decision(_ALLOW, "RETRY", state=state)
    # the plan cached on the limits, read inline (a call to plan_of costs a frame): see _new
    plan = limits._plan
    if plan.owner is not limits:
        plan = plan_of(limits)

    lowest, lowest_account = 1.0, ""
    budget = plan.session_alone
    if budget is not None:  # _budgets for the session's budget alone (the usual), unrolled
        remaining = budget - s.spent_usd
        if remaining <= 0:
            return _deny(state, call, Reason.BUDGET_EXHAUSTED, "the session budget is spent")
        lowest = remaining / budget
        lowest_account = "session"
        if not call.approved and plan.threshold is not None and lowest <= plan.threshold:
            return _escalate(state, Reason.BUDGET_THRESHOLD, _threshold("session"))
        if call.cost_usd > remaining:
            if not plan.escalate_over:
                return _deny(state, call, Reason.BUDGET_EXHAUSTED, _over("session"))
            if not call.approved:
                return _escalate(state, Reason.BUDGET_EXHAUSTED, _over("session"))
    elif plan.budgets:
        denied, lowest, lowest_account = _budgets(state, call, plan)
        if denied is not None:
            return denied

    signature = f"{call.activity}\x00{call.digest}"
    same = signature == s.last_call
    if same and plan.repeat is not None:
        limit = plan.repeat_amplified if call.error_signal else plan.repeat
        if s.streak >= limit:
            why = f"{s.streak} identical calls of {call.activity} in a row (limit {limit})"
            return _deny(state, call, Reason.MAX_REPEAT_EXCEEDED, why)
    window_s = plan.window_s
    cut = -1
    if window_s is not None and plan.window_max_calls is not None:
        denied, cut = _window(state, call, window_s, plan.window_max_calls)
        if denied is not None:
            return denied
    if plan.max_total_calls is not None and s.total >= plan.max_total_calls:
        return _deny(state, call, Reason.GLOBAL_LIMIT, f"{s.total} calls in this session")
    jitter = plan.jitter
    if jitter is not None and lowest_account and lowest < 0.2 and rng < jitter * (1.0 - lowest):
        # worded as a real over-budget denial on purpose: the agent cannot tell them apart
        return _deny(
            state, call, Reason.BUDGET_EXHAUSTED, _over(lowest_account), probabilistic=True
        )
    if (call.escalate or plan.person_layer) and plan.asks_person(call):
        return _escalate(state, Reason.HITL_REQUIRED, "a person must approve this call")

    # allowed: the state after it as ``_admit`` makes it, and the decision, filled slot by slot
    cost = call.cost_usd
    session = _new(SessionState)
    session.circuit = None
    session.last_call = signature
    session.streak = s.streak + 1 if same else 1
    session.total = s.total + 1
    session.spent_usd = s.spent_usd + cost
    session.windows = s.windows if window_s is None else _slid(s.windows, call, plan, cut)
    after = _new(PolicyState)
    after.session = session
    after.principal_spent_usd = state.principal_spent_usd + cost
    after.namespace_spent_usd = state.namespace_spent_usd + cost
    d = _new(Decision)
    d.verdict = _ALLOW
    d.code = d.reason = ""
    d.policy_id = d.argument = d.args = d.epoch = None
    d.state = after
    d.observed = d.probabilistic = False
    d.approvers = d.rejected_by = ()
    return d


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
