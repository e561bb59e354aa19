"""The policy layer's pure parts: ``decide`` under Hypothesis, and the rules' composition."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from interlock_temporal.core.policy import (
    CallEvent,
    CallFacts,
    Circuit,
    Decision,
    HitlMode,
    Limits,
    Policy,
    PolicyState,
    Reason,
    SessionState,
    Verdict,
    admit,
    decide,
    deny,
    deny_activity,
    deny_when,
    escalate,
    evaluate_rules,
    has_error_signal,
    modify,
    reset_circuit,
)
from interlock_temporal.core.policy.breaker import plan_of

from .properties import examples

ACTIVITIES = ("search", "refund", "send_email")


@st.composite
def limits_st(draw: Any) -> Limits:
    """Limits with every layer of the breaker in play: consistent ones only (what ``Limits``
    refuses is tested on its own)."""
    mode = draw(st.sampled_from([None, *HitlMode]))
    threshold = None
    if mode is HitlMode.ON_THRESHOLD or (mode is None and draw(st.booleans())):
        threshold = draw(st.sampled_from([0.0, 0.1, 0.25, 1.0]))
    windowed = draw(st.booleans())
    return Limits(
        session_budget_usd=draw(st.none() | st.sampled_from([0.5, 1.0, 5.0])),
        principal_budget_usd=draw(st.none() | st.sampled_from([1.0, 10.0])),
        namespace_budget_usd=draw(st.none() | st.sampled_from([2.0, 100.0])),
        hitl_mode=mode,
        escalate_below_fraction=threshold,
        max_repeat_calls=draw(st.none() | st.integers(1, 4)),
        error_amplification=draw(st.booleans()),
        window_s=draw(st.sampled_from([1.0, 60.0])) if windowed else None,
        window_max_calls=draw(st.integers(1, 5)) if windowed else None,
        max_total_calls=draw(st.none() | st.integers(1, 12)),
        probabilistic_deny=draw(st.booleans()),
    )


@st.composite
def calls(draw: Any, n_max: int = 20) -> list[CallFacts]:
    n = draw(st.integers(1, n_max))
    out = []
    for i in range(n):
        out.append(
            CallFacts(
                activity=draw(st.sampled_from(ACTIVITIES)),
                digest=draw(st.sampled_from(["d1", "d2"])),
                now=float(i),
                cost_usd=draw(st.sampled_from([0.0, 0.05, 0.15, 0.4])),
                error_signal=draw(st.booleans()),
                approved=draw(st.booleans()),
            )
        )
    return out


def remaining(state: PolicyState, limits: Limits) -> list[float]:
    out = []
    if limits.session_budget_usd is not None:
        out.append(limits.session_budget_usd - state.session.spent_usd)
    if limits.principal_budget_usd is not None:
        out.append(limits.principal_budget_usd - state.principal_spent_usd)
    if limits.namespace_budget_usd is not None:
        out.append(limits.namespace_budget_usd - state.namespace_spent_usd)
    return out


def run(
    limits: Limits, sequence: list[CallFacts], rngs: list[float] | None = None
) -> list[tuple[PolicyState, Decision]]:
    state = PolicyState()
    out = []
    for i, call in enumerate(sequence):
        d = decide(state, call, limits, rngs[i % len(rngs)] if rngs else 0.5)
        out.append((state, d))
        assert d.state is not None
        state = d.state
    return out


def budgets_of(limits: Limits) -> list[float]:
    return [
        b
        for b in (
            limits.session_budget_usd,
            limits.principal_budget_usd,
            limits.namespace_budget_usd,
        )
        if b is not None
    ]


# -- SP/1.0's invariants P1-P9 (docs/shackle-conformance.md) ----------------------------------


@pytest.mark.properties
@examples(500)
@given(limits=limits_st(), call=calls(n_max=1))
def test_fresh_state_allows_the_first_call(limits: Limits, call: list[CallFacts]) -> None:
    """P6, where the configuration does not itself ask a person for every call (HITL always,
    or a threshold of 1.0: a fresh budget's whole fraction is at it)."""
    first = call[0]
    if any(first.cost_usd > b for b in budgets_of(limits)):
        first = dataclasses.replace(first, cost_usd=0.0)
    d = decide(PolicyState(), first, limits, rng=0.99)
    asks = limits.hitl is HitlMode.ALWAYS or (
        limits.escalate_below_fraction == 1.0 and budgets_of(limits)
    )
    if asks and not first.approved:
        assert d.verdict is Verdict.ESCALATE, d
    else:
        assert d.verdict is Verdict.ALLOW, d


@pytest.mark.properties
@examples(500)
@given(limits=limits_st(), sequence=calls(), rngs=st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_once_tripped_every_call_is_denied_until_a_reset(
    limits: Limits, sequence: list[CallFacts], rngs: list[float]
) -> None:
    """P3 (until a person's reset), and every DENY but a replay's trips the circuit."""
    tripped = False
    for _before, d in run(limits, sequence, rngs):
        if tripped:
            assert d.verdict is Verdict.DENY and d.code == Reason.CIRCUIT_OPEN, d
        assert d.state is not None
        if d.verdict is Verdict.DENY and d.code != Reason.REPLAY:
            assert d.state.session.circuit is not None
            tripped = True
    if tripped:
        state = d.state
        assert state is not None
        after_reset = PolicyState(
            reset_circuit(state.session), state.principal_spent_usd, state.namespace_spent_usd
        )
        fresh = CallFacts("search", "new", now=1e6)
        assert decide(after_reset, fresh, Limits(), 0.5).verdict is Verdict.ALLOW


@pytest.mark.properties
@examples(500)
@given(limits=limits_st(), sequence=calls(), rngs=st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_the_budget_never_goes_negative_and_never_grows(
    limits: Limits, sequence: list[CallFacts], rngs: list[float]
) -> None:
    """P1 and P4: what remains never grows, and never goes below zero unless a person approved
    that very call over the budget (HITL on_deny or always); after it, nothing more runs."""
    previous = remaining(PolicyState(), limits)
    overspent = False
    for (_, d), call in zip(run(limits, sequence, rngs), sequence, strict=True):
        assert d.state is not None
        now = remaining(d.state, limits)
        assert all(b <= a + 1e-12 for a, b in zip(previous, now, strict=True)), (previous, now)
        if overspent:
            assert d.verdict is Verdict.DENY, d
        elif any(r < -1e-9 for r in now):
            assert call.approved and limits.hitl in (HitlMode.ON_DENY, HitlMode.ALWAYS), d
            assert d.verdict is Verdict.ALLOW
            overspent = True
        previous = now


@pytest.mark.properties
@examples(300)
@given(limits=limits_st(), sequence=calls())
def test_the_call_count_never_decreases_and_identical_calls_count_up(
    limits: Limits, sequence: list[CallFacts]
) -> None:
    """P2 as this breaker reads it: a session's count of calls never decreases, and the streak
    of identical calls grows by one with each identical call allowed (a different call starts
    it again at one: SP/1.0 counts *consecutive* identical calls)."""
    limits = limits.model_copy(update={"max_repeat_calls": None})
    for before, d in run(limits, sequence):
        assert d.state is not None
        after = d.state.session
        assert after.total >= before.session.total
        if d.verdict is Verdict.ALLOW:
            same = after.last_call == before.session.last_call
            assert after.streak == (before.session.streak + 1 if same else 1)
            assert after.total == before.session.total + 1


@pytest.mark.properties
@examples(300)
@given(limit=st.integers(1, 5), error=st.booleans(), amplify=st.booleans())
def test_repeats_at_the_limit_deny(limit: int, error: bool, amplify: bool) -> None:
    """P5, with SP/1.0's error amplification."""
    limits = Limits(max_repeat_calls=limit, error_amplification=amplify)
    effective = max(1, limit - 1) if (error and amplify) else limit
    state = PolicyState()
    for i in range(effective):
        call = CallFacts("search", "same", now=float(i), error_signal=error)
        d = decide(state, call, limits, 0.5)
        assert d.verdict is Verdict.ALLOW, (i, d)
        assert d.state is not None
        state = d.state
    assert state.session.streak == effective
    call = CallFacts("search", "same", now=99.0, error_signal=error)
    d = decide(state, call, limits, 0.5)
    assert (d.verdict, d.code) == (Verdict.DENY, Reason.MAX_REPEAT_EXCEEDED)
    # a different input would have been allowed at the same point
    other = dataclasses.replace(call, digest="other")
    assert decide(state, other, limits, 0.5).verdict is Verdict.ALLOW


@pytest.mark.properties
@examples(500)
@given(limits=limits_st(), sequence=calls(), rng=st.floats(0, 1))
def test_the_same_inputs_give_the_same_decision(
    limits: Limits, sequence: list[CallFacts], rng: float
) -> None:
    """P7, and the state handed in is never changed (the store applies the state after)."""
    state = PolicyState()
    for call in sequence:
        kept = copy.deepcopy(state)
        first = decide(state, call, limits, rng)
        again = decide(state, call, limits, rng)
        assert first == again
        assert state == kept
        assert first.state is not None
        state = first.state


@pytest.mark.parametrize("spelling", [{"hitl_mode": HitlMode.ALWAYS}, {"hitl_always": True}])
@pytest.mark.properties
@examples(300)
@given(limits=limits_st(), sequence=calls(), tripped=st.booleans())
def test_hitl_always_escalates_unless_the_circuit_is_open_or_an_approval_matches(
    spelling: dict[str, Any], limits: Limits, sequence: list[CallFacts], tripped: bool
) -> None:
    """P8, for both spellings of the mode. SP/1.0's own layers 3-7 deny before layer 8 can
    ask (so P8 holds where none of them denies): such a denial is never HITL_REQUIRED."""
    limits = Limits.model_validate(
        {
            **limits.model_dump(exclude={"hitl_mode", "escalate_below_fraction"}),
            **spelling,
            "probabilistic_deny": False,
        }
    )
    circuit = Circuit("MAX_REPEAT_EXCEEDED", "search", 0.0) if tripped else None
    state = PolicyState(SessionState(circuit=circuit))
    for call in sequence:
        d = decide(state, call, limits, 0.5)
        if tripped:
            assert (d.verdict, d.code) == (Verdict.DENY, Reason.CIRCUIT_OPEN)
        elif d.verdict is Verdict.DENY:
            # a breaker layer before the human one denied (spent budget, repeats, window,
            # cap; or a cost over what remains that a person approved: a DENY stays one)
            assert d.code != Reason.HITL_REQUIRED
            return
        elif call.approved:
            assert d.verdict is Verdict.ALLOW, d
        else:
            assert d.verdict is Verdict.ESCALATE, d
            assert d.code in (Reason.HITL_REQUIRED, Reason.BUDGET_EXHAUSTED), d
        assert d.state is not None
        state = d.state


@pytest.mark.properties
@examples(300)
@given(limits=limits_st(), sequence=calls(n_max=8), tripped=st.booleans())
def test_a_replayed_delivery_is_denied(
    limits: Limits, sequence: list[CallFacts], tripped: bool
) -> None:
    """P9: a delivery the store saw allowed before is denied, whatever else holds; a replay
    counts nothing, and trips nothing (a delivery is Temporal's, never the agent's)."""
    circuit = Circuit("GLOBAL_LIMIT", "search", 0.0) if tripped else None
    for before, _ in run(limits, sequence):
        state = dataclasses.replace(before, session=dataclasses.replace(before.session))
        if tripped:
            state.session = dataclasses.replace(state.session, circuit=circuit)
        for call in sequence:
            replay = decide(state, dataclasses.replace(call, replayed=True), limits, 0.0)
            if tripped or state.session.circuit is not None:
                assert (replay.verdict, replay.code) == (Verdict.DENY, Reason.CIRCUIT_OPEN)
            else:
                assert (replay.verdict, replay.code) == (Verdict.DENY, Reason.REPLAY), replay
            assert replay.state == state


# -- the layers: each one does its work, in SP/1.0's order ------------------------------------


def test_a_retry_attempt_is_neither_a_repeat_nor_charged_again() -> None:
    limits = Limits(max_repeat_calls=1, session_budget_usd=1.0)
    first = CallFacts("search", "q", now=0.0, cost_usd=0.4)
    d = decide(PolicyState(), first, limits, 0.5)
    assert d.verdict is Verdict.ALLOW and d.state is not None
    retry = dataclasses.replace(first, admitted=True)
    again = decide(d.state, retry, limits, 0.5)
    assert (again.verdict, again.code) == (Verdict.ALLOW, "RETRY")
    assert again.state is not None
    assert again.state.session.spent_usd == pytest.approx(0.4)
    assert again.state.session.streak == 1
    # the same call as a new execution is a repeat past the limit
    repeat = dataclasses.replace(retry, admitted=False)
    denied = decide(again.state, repeat, limits, 0.5)
    assert (denied.verdict, denied.code) == (Verdict.DENY, Reason.MAX_REPEAT_EXCEEDED)


def test_a_cost_over_what_remains_is_denied_and_the_budget_is_untouched() -> None:
    limits = Limits(session_budget_usd=1.0)
    state = PolicyState(SessionState(spent_usd=0.9))
    d = decide(state, CallFacts("llm", "x", now=0.0, cost_usd=0.15), limits, 0.5)
    # SP/1.0 has one code for a spent budget and a cost over what remains
    assert (d.verdict, d.code) == (Verdict.DENY, Reason.BUDGET_EXHAUSTED)
    assert d.reason == "the call's cost exceeds what remains of the session budget"
    assert d.state is not None and d.state.session.spent_usd == pytest.approx(0.9)
    assert d.state.session.circuit is not None
    ok = decide(state, CallFacts("llm", "y", now=0.0, cost_usd=0.05), limits, 0.5)
    assert ok.verdict is Verdict.ALLOW
    assert ok.state is not None and ok.state.session.spent_usd == pytest.approx(0.95)


@pytest.mark.properties
@examples(400)
@given(
    limits=limits_st(),
    windows=st.dictionaries(
        st.sampled_from(ACTIVITIES), st.lists(st.floats(0, 20), max_size=6).map(sorted)
    ),
    last=st.sampled_from(["", "search\x00d1", "refund\x00d2"]),
    streak=st.integers(0, 3),
    now=st.floats(0, 20),
    activity=st.sampled_from(ACTIVITIES),
    digest=st.sampled_from(["d1", "d2"]),
    cost=st.sampled_from([0.0, 0.05, 0.4]),
)
def test_an_allowed_calls_state_is_admits_and_its_window_slides_by_the_spec(
    limits: Limits,
    windows: dict[str, list[float]],
    last: str,
    streak: int,
    now: float,
    activity: str,
    digest: str,
    cost: float,
) -> None:
    """``decide`` makes an allowed call's state inline (appending the usual call, the newest,
    to its window without a new search); ``admit`` makes it on its own: both must be the same
    state, and the window what the spec says: the calls of the activity inside ``window_s``
    with this one, sorted, the newest ``window_max_calls`` of them."""
    before = PolicyState(
        SessionState(None, last, streak, 3, 0.1, {a: tuple(t) for a, t in windows.items()}),
        principal_spent_usd=0.2,
        namespace_spent_usd=0.3,
    )
    call = CallFacts(activity, digest, now=now, cost_usd=cost)
    d = decide(before, call, limits, 0.9)
    if d.verdict is not Verdict.ALLOW:
        return
    assert d.state == admit(before, call, limits)
    assert dataclasses.astuple(d.state) == dataclasses.astuple(admit(before, call, limits))
    after = d.state.session
    assert after.last_call == f"{activity}\x00{digest}"
    assert after.streak == (streak + 1 if last == after.last_call else 1)
    if limits.window_s is None or limits.window_max_calls is None:
        assert after.windows == before.session.windows
        return
    inside = sorted([*windows.get(activity, ()), now])
    inside = [t for t in inside if t > now - limits.window_s][-limits.window_max_calls :]
    assert after.windows == {**before.session.windows, activity: tuple(inside)}
    # a window given as a list (not the state's type, which a loaded state never has) too
    listed = dataclasses.replace(before.session, windows=windows)
    d = decide(dataclasses.replace(before, session=listed), call, limits, 0.9)
    assert d.state is not None and d.state.session.windows[activity] == tuple(inside)


def test_the_window_denies_the_call_past_its_limit_per_activity_and_slides() -> None:
    """Layer 5: a sliding window of ``window_s`` per activity type."""
    limits = Limits(window_s=10.0, window_max_calls=2)
    state = PolicyState()
    for i, now in enumerate([0.0, 4.0]):
        d = decide(state, CallFacts("search", f"q{i}", now=now), limits, 0.5)
        assert d.verdict is Verdict.ALLOW and d.state is not None
        state = d.state
    # another activity has a window of its own
    other = decide(state, CallFacts("refund", "r", now=5.0), limits, 0.5)
    assert other.verdict is Verdict.ALLOW
    third = decide(state, CallFacts("search", "q2", now=9.9), limits, 0.5)
    assert (third.verdict, third.code) == (Verdict.DENY, Reason.WINDOW_EXCEEDED)
    assert third.reason == "2 calls of search in 10 s"
    assert third.state is not None and third.state.session.circuit is not None
    # ten seconds after the first call, it has left the window
    later = decide(state, CallFacts("search", "q3", now=10.0), limits, 0.5)
    assert later.verdict is Verdict.ALLOW and later.state is not None
    assert later.state.session.windows["search"] == (4.0, 10.0)


@pytest.mark.parametrize(
    ("spent", "rng", "denied"),
    [
        # below a fifth of the budget: denied with probability jitter * (1 - fraction)
        (0.9, 0.449, True),  # fraction 0.1: probability 0.5 * 0.9 = 0.45
        (0.9, 0.451, False),
        (0.95, 0.47, True),  # fraction 0.05: probability 0.475
        (0.95, 0.48, False),
        # at a fifth or more of the budget: never
        (0.75, 0.0, False),
        (0.5, 0.0, False),
    ],
)
def test_the_random_denial_fires_below_a_fifth_of_a_budget_with_its_probability(
    spent: float, rng: float, denied: bool
) -> None:
    """Layer 7, and an agent cannot tell it from a real exhaustion: the same code, the same
    words. Operators can (``probabilistic``, in the journal's note)."""
    limits = Limits(session_budget_usd=1.0, probabilistic_deny=True, deny_jitter_ratio=0.5)
    state = PolicyState(SessionState(spent_usd=spent))
    call = CallFacts("llm", "x", now=0.0, cost_usd=0.01)
    d = decide(state, call, limits, rng)
    if denied:
        real = decide(state, dataclasses.replace(call, cost_usd=0.5), limits, rng)
        assert (d.verdict, d.code, d.reason) == (Verdict.DENY, real.code, real.reason)
        assert d.probabilistic and not real.probabilistic
        assert d.state is not None and d.state.session.circuit is not None
    else:
        assert d.verdict is Verdict.ALLOW, d
    off = decide(state, call, limits.model_copy(update={"probabilistic_deny": False}), 0.0)
    assert off.verdict is Verdict.ALLOW


@pytest.mark.parametrize(
    ("threshold", "spent", "escalates"),
    [
        (0.25, 0.74, False),
        (0.25, 0.75, True),  # a quarter remains: at the threshold
        (0.25, 0.9, True),
        (1.0, 0.0, True),  # the whole range SP/1.0 allows: 1.0 asks for every call
        (0.0, 0.99, False),  # and 0.0 never asks before the budget is spent
    ],
)
def test_the_budget_threshold_escalates_and_an_approval_meets_it(
    threshold: float, spent: float, escalates: bool
) -> None:
    """Layer 3's threshold (HITL on_threshold), at the edges of its range."""
    limits = Limits(session_budget_usd=1.0, escalate_below_fraction=threshold)
    assert limits.hitl is HitlMode.ON_THRESHOLD
    state = PolicyState(SessionState(spent_usd=spent))
    call = CallFacts("llm", "x", now=0.0, cost_usd=0.001)
    d = decide(state, call, limits, 0.5)
    if escalates:
        assert (d.verdict, d.code) == (Verdict.ESCALATE, Reason.BUDGET_THRESHOLD), d
        assert d.state == state  # an escalation counts nothing and records nothing
        approved = decide(state, dataclasses.replace(call, approved=True), limits, 0.5)
        assert approved.verdict is Verdict.ALLOW
    else:
        assert d.verdict is Verdict.ALLOW, d


@pytest.mark.parametrize(
    ("mode", "verdict"),
    [
        (HitlMode.NEVER, Verdict.DENY),
        (HitlMode.ON_THRESHOLD, Verdict.DENY),
        (HitlMode.ON_DENY, Verdict.ESCALATE),
        (HitlMode.ALWAYS, Verdict.ESCALATE),
    ],
    ids=[mode.value for mode in HitlMode],
)
def test_a_cost_over_what_remains_escalates_with_hitl_on_deny_or_always(
    mode: HitlMode, verdict: Verdict
) -> None:
    threshold = 0.01 if mode is HitlMode.ON_THRESHOLD else None
    limits = Limits(session_budget_usd=1.0, hitl_mode=mode, escalate_below_fraction=threshold)
    state = PolicyState(SessionState(spent_usd=0.9))
    call = CallFacts("llm", "x", now=0.0, cost_usd=0.15)
    d = decide(state, call, limits, 0.5)
    assert (d.verdict, d.code) == (verdict, Reason.BUDGET_EXHAUSTED), d
    assert d.reason == "the call's cost exceeds what remains of the session budget"
    approved = decide(state, dataclasses.replace(call, approved=True), limits, 0.5)
    if verdict is Verdict.ESCALATE:
        # a person let it run over the budget: charged in full, and the budget is spent
        assert approved.verdict is Verdict.ALLOW and approved.state is not None
        assert approved.state.session.spent_usd == pytest.approx(1.05)
        after = decide(approved.state, CallFacts("llm", "y", now=1.0), limits, 0.5)
        assert (after.verdict, after.code) == (Verdict.DENY, Reason.BUDGET_EXHAUSTED)
        assert after.reason == "the session budget is spent"
    else:
        # an approval meets an escalation, never a denial
        assert (approved.verdict, approved.code) == (Verdict.DENY, Reason.BUDGET_EXHAUSTED)
    # a budget already spent is denied in every mode
    spent = PolicyState(SessionState(spent_usd=1.0))
    for approval in (False, True):
        gone = decide(spent, dataclasses.replace(call, approved=approval), limits, 0.5)
        assert (gone.verdict, gone.code) == (Verdict.DENY, Reason.BUDGET_EXHAUSTED)


def _ordered(layer: str) -> tuple[PolicyState, CallFacts, Limits, float]:
    """A state, call, limits and rng where ``layer`` and the next layer both fire."""
    s = SessionState
    call = CallFacts("search", "q", now=100.0, cost_usd=0.1)
    spent_budget = {"session_budget_usd": 1.0}
    if layer == "circuit":  # and a replay
        state = s(circuit=Circuit("GLOBAL_LIMIT", "search", 0.0))
        return PolicyState(state), dataclasses.replace(call, replayed=True), Limits(), 0.5
    if layer == "replay":  # and a spent budget
        return (
            PolicyState(s(spent_usd=1.0)),
            dataclasses.replace(call, replayed=True),
            Limits(**spent_budget),
            0.5,
        )
    if layer == "spent":  # and the threshold
        limits = Limits(**spent_budget, escalate_below_fraction=0.5)
        return PolicyState(s(spent_usd=1.0)), call, limits, 0.5
    if layer == "threshold":  # and a cost over what remains
        limits = Limits(**spent_budget, escalate_below_fraction=0.5)
        return PolicyState(s(spent_usd=0.95)), call, limits, 0.5
    if layer == "over":  # and a repeat
        limits = Limits(**spent_budget, max_repeat_calls=1)
        state = s(spent_usd=0.95, last_call=call.signature, streak=1)
        return PolicyState(state), call, limits, 0.5
    repeat = {"last_call": call.signature, "streak": 1}
    full_window = {"windows": {"search": (99.0,)}, "total": 1}
    if layer == "repeat":  # and the window
        limits = Limits(max_repeat_calls=1, window_s=10.0, window_max_calls=1)
        return PolicyState(s(**repeat, **full_window)), call, limits, 0.5
    if layer == "window":  # and the global cap
        limits = Limits(window_s=10.0, window_max_calls=1, max_total_calls=1)
        return PolicyState(s(**full_window)), call, limits, 0.5
    near_end = {"session_budget_usd": 1.0, "probabilistic_deny": True}
    if layer == "global":  # and the random denial
        limits = Limits(**near_end, max_total_calls=1)
        return PolicyState(s(total=1, spent_usd=0.85)), call, limits, 0.0
    assert layer == "random"  # and HITL always
    limits = Limits(**near_end, hitl_mode=HitlMode.ALWAYS)
    return PolicyState(s(spent_usd=0.85)), call, limits, 0.0


LAYERS = [
    ("circuit", Verdict.DENY, Reason.CIRCUIT_OPEN),
    ("replay", Verdict.DENY, Reason.REPLAY),
    ("spent", Verdict.DENY, Reason.BUDGET_EXHAUSTED),
    ("threshold", Verdict.ESCALATE, Reason.BUDGET_THRESHOLD),
    ("over", Verdict.DENY, Reason.BUDGET_EXHAUSTED),
    ("repeat", Verdict.DENY, Reason.MAX_REPEAT_EXCEEDED),
    ("window", Verdict.DENY, Reason.WINDOW_EXCEEDED),
    ("global", Verdict.DENY, Reason.GLOBAL_LIMIT),
    ("random", Verdict.DENY, Reason.BUDGET_EXHAUSTED),
]


@pytest.mark.parametrize(("layer", "verdict", "code"), LAYERS, ids=[row[0] for row in LAYERS])
def test_the_layers_run_in_the_specs_order(layer: str, verdict: Verdict, code: Reason) -> None:
    """SP/1.0 section 3.2: where a layer and the one after it both fire, the earlier decides.
    (The threshold comes before a cost over what remains, as the spec and the design
    order them.)"""
    state, call, limits, rng = _ordered(layer)
    d = decide(state, call, limits, rng)
    assert (d.verdict, d.code) == (verdict, code), d


def test_hitl_modes_follow_the_older_settings_and_contradictions_are_refused() -> None:
    assert Limits().hitl is HitlMode.NEVER
    assert Limits(hitl_always=True).hitl is HitlMode.ALWAYS
    assert Limits(escalate_below_fraction=0.2).hitl is HitlMode.ON_THRESHOLD
    assert Limits(hitl_mode="on_deny").hitl is HitlMode.ON_DENY  # type: ignore[arg-type]
    # a policy written before hitl_mode existed keeps its epoch (and its approvals)
    assert Policy(Limits(max_repeat_calls=3)).epoch == "b97e07af4e32b0c7"
    assert Policy(Limits(hitl_mode="never")).epoch != Policy().epoch  # type: ignore[arg-type]
    refused = {
        "hitl_always": {"hitl_always": True, "hitl_mode": "on_deny"},
        "needs escalate_below_fraction": {"hitl_mode": "on_threshold"},
        "escalate_below_fraction is read only": {
            "hitl_mode": "always",
            "escalate_below_fraction": 0.2,
        },
        "needs both window_s and window_max_calls: window_max_calls": {"window_s": 5},
        "needs both window_s and window_max_calls: window_s": {"window_max_calls": 5},
        "hitl_mode": {"hitl_mode": "sometimes"},
        "escalate_below_fraction\n  Input should be less than or equal to 1": {
            "escalate_below_fraction": 1.01
        },
    }
    for words, data in refused.items():
        with pytest.raises(ValueError, match=words):
            Limits.model_validate(data)


def test_error_signals_are_found_without_regular_expressions() -> None:
    assert has_error_signal({"status": 401})
    assert has_error_signal(["retry after: Connection Refused by host"])
    assert not has_error_signal({"status": 200, "text": "fine", "flag": True, "n": None})
    assert not has_error_signal({"count": 4010})


def test_a_status_code_is_an_error_signal_only_as_a_number_of_its_own() -> None:
    assert has_error_signal(["HTTP 500 Internal Server Error"])
    assert has_error_signal(["status=503;", "(401)", "502"])
    # ids and numbers that merely contain the digits are not errors
    assert not has_error_signal(["o-3a500f1c", "ref_a403b", "15023", "order 4010"])
    # words still match inside longer text
    assert has_error_signal(["you are being rate limited"])


# -- rules -----------------------------------------------------------------------------------


class Refund(BaseModel):
    order_id: str
    amount_cents: int


def event(amount: int = 500, activity: str = "refund") -> CallEvent:
    return CallEvent(activity=activity, args=(Refund(order_id="A-1", amount_cents=amount),))


def test_a_block_wins_over_everything_before_and_after_it() -> None:
    rules = [
        lambda e: escalate("BIG", "big refund"),
        lambda e: modify(Refund(order_id="A-1", amount_cents=1)),
        deny_when(lambda e: True, code="NOPE", argument="amount_cents"),
        lambda e: modify(Refund(order_id="A-1", amount_cents=2)),
    ]
    d, _ = evaluate_rules(rules, event())
    assert (d.verdict, d.code, d.argument) == (Verdict.DENY, "NOPE", "amount_cents")
    assert d.policy_id and d.policy_id.startswith("deny_when")


def test_modifies_compose_in_order_and_each_rule_sees_the_rewrite() -> None:
    seen: list[int] = []

    def halve(e: CallEvent) -> Decision:
        seen.append(e.argument("amount_cents"))
        return modify(Refund(order_id="A-1", amount_cents=e.argument("amount_cents") // 2))

    d, rewritten = evaluate_rules([halve, halve], event(800))
    assert seen == [800, 400]
    assert d.verdict is Verdict.MODIFY and d.args is not None
    assert d.args[0].amount_cents == 200 and rewritten.argument("amount_cents") == 200


def test_a_rule_that_raises_blocks() -> None:
    def broken(e: CallEvent) -> Decision | None:
        raise KeyError("boom")

    d, _ = evaluate_rules([broken], event())
    assert (d.verdict, d.code) == (Verdict.DENY, Reason.RULE_ERROR)
    predicate_raises = deny_when(lambda e: 1 / 0 > 0, code="X")
    d, _ = evaluate_rules([predicate_raises], event())
    assert (d.verdict, d.code) == (Verdict.DENY, Reason.RULE_ERROR)


def _returning(value: Any) -> Any:
    def sloppy_rule(e: CallEvent) -> Any:
        return value

    return sloppy_rule


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        # a StrEnum member equals its string: the engine must not take "DENY" for a verdict
        (Decision("DENY", "NOPE", "no"), "returned a verdict the engine does not know (a str"),  # type: ignore[arg-type]
        (Decision("ALOW"), "returned a verdict the engine does not know (a str"),  # type: ignore[arg-type]
        (Decision(None), "returned a verdict the engine does not know (a NoneType"),  # type: ignore[arg-type]
        ("DENY", "returned a str, not a Decision"),
        ({"verdict": "ALLOW"}, "returned a dict, not a Decision"),
        (1, "returned a int, not a Decision"),
        (True, "returned a bool, not a Decision"),
        (
            Decision(Verdict.MODIFY, args=Refund(order_id="A-1", amount_cents=1)),  # type: ignore[arg-type]
            "returned MODIFY with args that are a Refund, not a tuple",
        ),
    ],
)
def test_a_result_the_engine_does_not_know_blocks_naming_the_rule(
    returned: Any, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "card-4111-CANARY"

    def also_allows(e: CallEvent) -> None:
        return None

    rule = _returning(returned)
    e = CallEvent(activity="refund", args=({"order_id": secret, "amount_cents": 500},))
    for phase in ("call", "result"):
        e = dataclasses.replace(e, phase=phase, result={"note": secret})  # type: ignore[arg-type]
        d, _ = evaluate_rules([also_allows, rule, also_allows], e)
        assert (d.verdict, d.code) == (Verdict.DENY, Reason.RULE_ERROR)
        assert d.policy_id == "sloppy_rule"
        assert d.reason.startswith(f"rule sloppy_rule {problem}"), d.reason
        assert secret not in d.reason
    assert "policy rule sloppy_rule returned" in caplog.text and secret not in caplog.text


def test_an_in_place_edit_by_a_rule_changes_nothing_the_caller_holds() -> None:
    class Mutable(BaseModel):
        order_id: str
        amount_cents: int
        tags: list[str]

    sent = Mutable(order_id="A-1", amount_cents=500, tags=["a"])
    seen: list[int] = []

    def edits_in_place(e: CallEvent) -> None:
        e.input.amount_cents = 5_000_000
        e.input.tags.append("edited")

    def looks(e: CallEvent) -> None:
        seen.append(e.argument("amount_cents"))

    d, rewritten = evaluate_rules([edits_in_place, looks], CallEvent("refund", (sent,)))
    assert d.verdict is Verdict.ALLOW
    assert (sent.amount_cents, sent.tags) == (500, ["a"])
    assert rewritten.args[0] is sent
    # the copy is one per evaluation: a later rule sees the edit, and it still sends nothing
    assert seen == [5_000_000]

    # nor can a later rule edit a rewrite in place: only its own MODIFY would change it
    rewrite = Mutable(order_id="A-1", amount_cents=300, tags=[])
    d, rewritten = evaluate_rules(
        [lambda e: modify(rewrite), edits_in_place], CallEvent("refund", (sent,))
    )
    assert d.verdict is Verdict.MODIFY and d.args == (rewrite,)
    assert (rewrite.amount_cents, rewrite.tags) == (300, [])

    result = {"ssn": "078-05-1120"}

    def redacts_in_place(e: CallEvent) -> None:
        e.result["ssn"] = "***"

    after = CallEvent("lookup", ("c-1",), phase="result", result=result)
    d, rewritten = evaluate_rules([redacts_in_place], after)
    assert d.verdict is Verdict.ALLOW and result == {"ssn": "078-05-1120"}


def test_a_modify_without_a_value_rewrites_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def empty_modify(e: CallEvent) -> Decision:
        return modify()

    d, rewritten = evaluate_rules([empty_modify], event(700))
    assert d.verdict is Verdict.ALLOW and rewritten.argument("amount_cents") == 700
    after = CallEvent("lookup", ("c-1",), phase="result", result={"customer": "c-1"})
    d, rewritten = evaluate_rules([empty_modify], after)
    assert d.verdict is Verdict.ALLOW and rewritten.result == {"customer": "c-1"}
    # an explicit None is a value: the rule asked for it
    d, rewritten = evaluate_rules([lambda e: modify(None)], after)
    assert d.verdict is Verdict.MODIFY and rewritten.result is None
    assert "empty_modify returned MODIFY without a value" in caplog.text
    # a value in a list rewrites, and the verdicts themselves are known
    listed = evaluate_rules(
        [lambda e: Decision(Verdict.MODIFY, args=[Refund(order_id="B", amount_cents=1)])], event()
    )
    assert listed[0].verdict is Verdict.MODIFY and listed[1].argument("order_id") == "B"
    assert evaluate_rules([lambda e: Decision(Verdict.DENY, "B")], event())[0].code == "B"


def test_deny_activity_matches_globs_and_nothing_else() -> None:
    rule = deny_activity("delete_*")
    assert evaluate_rules([rule], event(activity="delete_user"))[0].verdict is Verdict.DENY
    assert evaluate_rules([rule], event(activity="refund"))[0].verdict is Verdict.ALLOW


def test_an_escalation_survives_later_allows() -> None:
    d, _ = evaluate_rules([lambda e: escalate("BIG"), lambda e: None], event())
    assert (d.verdict, d.code) == (Verdict.ESCALATE, "BIG")


def test_an_unknown_mode_enforces_and_the_epoch_follows_the_content() -> None:
    assert Policy(mode="monitr").mode == "enforce"
    assert Policy(mode="monitor").mode == "monitor"
    a = Policy(Limits(max_repeat_calls=3))
    b = Policy(Limits(max_repeat_calls=3))
    c = Policy(Limits(max_repeat_calls=4))
    assert a.epoch == b.epoch != c.epoch
    assert Policy(rules=[deny.__call__]).epoch != Policy().epoch


def test_limits_reject_unknown_keys() -> None:
    with pytest.raises(ValueError, match="max_repeats"):
        Limits.model_validate({"max_repeats": 3})


def test_an_allowed_decision_is_the_one_the_constructors_make() -> None:
    """``decide`` fills an allowed call's decision and states slot by slot (the constructors
    cost more than the rest of it): every field must be set and equal what the constructors
    would make, so a field added to one of those classes and not filled there fails here."""
    limits = Limits(session_budget_usd=1.0, window_s=60.0, window_max_calls=5)
    before = PolicyState(
        SessionState(None, "search\x00q", 2, 7, 0.25, {"search": (1.0,), "other": (2.0,)}),
        principal_spent_usd=1.5,
        namespace_spent_usd=2.5,
    )
    for digest, streak in (("q", 3), ("r", 1)):
        d = decide(before, CallFacts("search", digest, now=3.0, cost_usd=0.125), limits, 0.5)
        after = SessionState(
            None, f"search\x00{digest}", streak, 8, 0.375, {"search": (1.0, 3.0), "other": (2.0,)}
        )
        assert d == Decision(Verdict.ALLOW, state=PolicyState(after, 1.625, 2.625))
        assert d.state is not None and d.state.session == after
        assert [f.name for f in dataclasses.fields(d)] == [
            f.name for f in dataclasses.fields(Decision)
        ]
        # every field readable (an unset slot raises)
        assert dataclasses.astuple(d.state) == dataclasses.astuple(PolicyState(after, 1.625, 2.625))


@pytest.mark.parametrize(
    "copied",
    [
        lambda x: x.model_copy(update={"max_total_calls": 1}),
        lambda x: x.model_copy(update={"max_total_calls": 1}, deep=True),
        lambda x: Limits.model_validate(x.model_dump() | {"max_total_calls": 1}),
        lambda x: copy.deepcopy(x.model_copy(update={"max_total_calls": 1})),
        lambda x: pickle.loads(pickle.dumps(x.model_copy(update={"max_total_calls": 1}))),
    ],
    ids=["model_copy", "deep model_copy", "validated", "deep copy of a copy", "pickled copy"],
)
def test_a_copy_of_limits_decides_by_its_own_settings(copied: Any) -> None:
    """``decide`` works out what it reads of a ``Limits`` once, kept on the instance; a copy
    carries its original's, and must decide by its own settings all the same."""
    limits = Limits(max_total_calls=1000)
    state = PolicyState(SessionState(total=1))
    call = CallFacts("search", "q", now=0.0)
    assert decide(state, call, limits, 0.5).verdict is Verdict.ALLOW
    capped = copied(limits)
    d = decide(state, call, capped, 0.5)
    assert (d.verdict, d.code) == (Verdict.DENY, Reason.GLOBAL_LIMIT)
    assert decide(state, call, limits, 0.5).verdict is Verdict.ALLOW
    # pickled with what it worked out, it still decides by its settings
    thawed = pickle.loads(pickle.dumps(capped))
    assert thawed == capped and thawed.model_dump() == capped.model_dump()
    assert decide(state, call, thawed, 0.5).code == Reason.GLOBAL_LIMIT
    # each works out its own once, and keeps it
    for each in (limits, capped, thawed):
        assert plan_of(each) is plan_of(each)
        assert plan_of(each).max_total_calls == each.max_total_calls
    # what it keeps changes no equality (a plan refers to its Limits)
    assert limits == Limits(max_total_calls=1000) == copy.deepcopy(limits)
    assert limits != capped and capped == Limits(max_total_calls=1)


def test_hitl_activities_are_matched_by_glob_and_remembered_per_activity() -> None:
    limits = Limits(hitl_activities=("send_*", "refund"))
    for activity, asks in (("send_email", True), ("refund", True), ("search", False)) * 2:
        d = decide(PolicyState(), CallFacts(activity, "q", now=0.0), limits, 0.5)
        assert d.verdict is (Verdict.ESCALATE if asks else Verdict.ALLOW), activity
        assert limits.needs_person(activity) is asks
    for always in (Limits(hitl_mode=HitlMode.ALWAYS), Limits(hitl_always=True)):
        assert always.needs_person("search") is True
        assert decide(PolicyState(), CallFacts("search", "q", now=0.0), always, 0.5).code == (
            Reason.HITL_REQUIRED
        )
    assert Limits(hitl_mode=HitlMode.ON_DENY).needs_person("search") is False
