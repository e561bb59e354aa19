"""The policy layer's pure parts: ``decide`` under Hypothesis, and the rules' composition."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from interlock_temporal.core.policy import (
    CallEvent,
    CallFacts,
    Circuit,
    Decision,
    Limits,
    Policy,
    PolicyState,
    Reason,
    SessionState,
    Verdict,
    block,
    decide,
    deny_activity,
    deny_when,
    escalate,
    evaluate_rules,
    has_error_signal,
    modify,
    reset_circuit,
)

ACTIVITIES = ("search", "refund", "send_email")

limits_st = st.builds(
    Limits,
    session_budget_usd=st.none() | st.sampled_from([0.5, 1.0, 5.0]),
    principal_budget_usd=st.none() | st.sampled_from([1.0, 10.0]),
    namespace_budget_usd=st.none() | st.sampled_from([2.0, 100.0]),
    escalate_below_fraction=st.none() | st.sampled_from([0.1, 0.25]),
    max_repeat_calls=st.none() | st.integers(1, 4),
    error_amplification=st.booleans(),
    window_s=st.none() | st.sampled_from([1.0, 60.0]),
    window_max_calls=st.none() | st.integers(1, 5),
    max_total_calls=st.none() | st.integers(1, 12),
    probabilistic_deny=st.booleans(),
    hitl_always=st.just(False),
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
                delivery=f"run/{i}/1",
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


@settings(max_examples=500, deadline=None)
@given(limits=limits_st, call=calls(n_max=1))
def test_fresh_state_allows_the_first_call(limits: Limits, call: list[CallFacts]) -> None:
    first = call[0]
    budgets = [
        b
        for b in (
            limits.session_budget_usd,
            limits.principal_budget_usd,
            limits.namespace_budget_usd,
        )
        if b is not None
    ]
    if any(first.cost_usd > b for b in budgets):
        first = dataclasses.replace(first, cost_usd=0.0)
    d = decide(PolicyState(), first, limits, rng=0.99)
    assert d.verdict is Verdict.ALLOW, d


@settings(max_examples=500, deadline=None)
@given(limits=limits_st, sequence=calls(), rngs=st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_once_tripped_every_call_is_denied_until_a_reset(
    limits: Limits, sequence: list[CallFacts], rngs: list[float]
) -> None:
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
        fresh = CallFacts("search", "new", now=1e6, delivery="run/new/1")
        assert decide(after_reset, fresh, Limits(), 0.5).verdict is Verdict.ALLOW


@settings(max_examples=500, deadline=None)
@given(limits=limits_st, sequence=calls(), rngs=st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_the_budget_never_goes_negative_and_never_grows(
    limits: Limits, sequence: list[CallFacts], rngs: list[float]
) -> None:
    previous = remaining(PolicyState(), limits)
    for _, d in run(limits, sequence, rngs):
        assert d.state is not None
        now = remaining(d.state, limits)
        assert all(r >= -1e-9 for r in now), now
        assert all(b <= a + 1e-12 for a, b in zip(previous, now, strict=True)), (previous, now)
        previous = now


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 5), error=st.booleans(), amplify=st.booleans())
def test_repeats_at_the_limit_deny(limit: int, error: bool, amplify: bool) -> None:
    limits = Limits(max_repeat_calls=limit, error_amplification=amplify)
    effective = max(1, limit - 1) if (error and amplify) else limit
    state = PolicyState()
    for i in range(effective):
        call = CallFacts("search", "same", now=float(i), delivery=f"r/{i}/1", error_signal=error)
        d = decide(state, call, limits, 0.5)
        assert d.verdict is Verdict.ALLOW, (i, d)
        assert d.state is not None
        state = d.state
    assert state.session.streak == effective
    call = CallFacts("search", "same", now=99.0, delivery="r/last/1", error_signal=error)
    d = decide(state, call, limits, 0.5)
    assert (d.verdict, d.code) == (Verdict.DENY, Reason.MAX_REPEAT_EXCEEDED)
    # a different input would have been allowed at the same point
    other = dataclasses.replace(call, digest="other")
    assert decide(state, other, limits, 0.5).verdict is Verdict.ALLOW


@settings(max_examples=500, deadline=None)
@given(limits=limits_st, sequence=calls(), rng=st.floats(0, 1))
def test_the_same_inputs_give_the_same_decision(
    limits: Limits, sequence: list[CallFacts], rng: float
) -> None:
    state = PolicyState()
    for call in sequence:
        first = decide(state, call, limits, rng)
        again = decide(state, call, limits, rng)
        assert first == again
        assert first.state is not None
        state = first.state


@settings(max_examples=500, deadline=None)
@given(limits=limits_st, sequence=calls(), tripped=st.booleans())
def test_hitl_always_escalates_unless_the_circuit_is_open_or_an_approval_matches(
    limits: Limits, sequence: list[CallFacts], tripped: bool
) -> None:
    limits = limits.model_copy(
        update={
            "hitl_always": True,
            "probabilistic_deny": False,
            "session_budget_usd": None,
            "principal_budget_usd": None,
            "namespace_budget_usd": None,
        }
    )
    circuit = Circuit("MAX_REPEAT_EXCEEDED", "search", 0.0) if tripped else None
    state = PolicyState(SessionState(circuit=circuit))
    for call in sequence:
        d = decide(state, call, limits, 0.5)
        if tripped:
            assert (d.verdict, d.code) == (Verdict.DENY, Reason.CIRCUIT_OPEN)
        elif d.verdict is Verdict.DENY:
            # a breaker layer before the human one denied (repeats, window, cap): it trips
            assert d.code != Reason.HITL_REQUIRED
            return
        elif call.approved:
            assert d.verdict is Verdict.ALLOW, d
        else:
            assert (d.verdict, d.code) == (Verdict.ESCALATE, Reason.HITL_REQUIRED), d
        assert d.state is not None
        state = d.state


@settings(max_examples=300, deadline=None)
@given(limits=limits_st, sequence=calls(n_max=8))
def test_a_replayed_delivery_is_denied(limits: Limits, sequence: list[CallFacts]) -> None:
    limits = limits.model_copy(update={"hitl_always": False})
    state = PolicyState()
    for call in sequence:
        d = decide(state, call, limits, 0.99)
        assert d.state is not None
        if d.code == Reason.CIRCUIT_OPEN:
            return
        replay = decide(d.state, call, limits, 0.99)
        assert (replay.verdict, replay.code) in {
            (Verdict.DENY, Reason.REPLAY),
            (Verdict.DENY, Reason.CIRCUIT_OPEN),
        }
        # a replay says nothing about the agent: it does not trip the circuit
        assert replay.state is not None
        assert replay.state.session.circuit == d.state.session.circuit
        state = d.state


def test_a_retry_attempt_is_neither_a_repeat_nor_charged_again() -> None:
    limits = Limits(max_repeat_calls=1, session_budget_usd=1.0)
    first = CallFacts("search", "q", now=0.0, cost_usd=0.4, delivery="run/a1/1")
    d = decide(PolicyState(), first, limits, 0.5)
    assert d.verdict is Verdict.ALLOW and d.state is not None
    retry = dataclasses.replace(first, delivery="run/a1/2", admitted=True)
    again = decide(d.state, retry, limits, 0.5)
    assert (again.verdict, again.code) == (Verdict.ALLOW, "RETRY")
    assert again.state is not None
    assert again.state.session.spent_usd == pytest.approx(0.4)
    assert again.state.session.streak == 1
    # the same call as a new execution is a repeat past the limit
    repeat = dataclasses.replace(first, delivery="run/a2/1")
    denied = decide(again.state, repeat, limits, 0.5)
    assert (denied.verdict, denied.code) == (Verdict.DENY, Reason.MAX_REPEAT_EXCEEDED)


def test_a_cost_over_what_remains_is_denied_and_the_budget_is_untouched() -> None:
    limits = Limits(session_budget_usd=1.0)
    state = PolicyState(SessionState(spent_usd=0.9))
    d = decide(state, CallFacts("llm", "x", now=0.0, cost_usd=0.15), limits, 0.5)
    assert (d.verdict, d.code) == (Verdict.DENY, Reason.BUDGET_EXCEEDED)
    assert d.state is not None and d.state.session.spent_usd == pytest.approx(0.9)
    ok = decide(state, CallFacts("llm", "y", now=0.0, cost_usd=0.05), limits, 0.5)
    assert ok.verdict is Verdict.ALLOW
    assert ok.state is not None and ok.state.session.spent_usd == pytest.approx(0.95)


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
    # a value in a list rewrites, and the verdicts themselves are known (BLOCK is DENY)
    listed = evaluate_rules(
        [lambda e: Decision(Verdict.MODIFY, args=[Refund(order_id="B", amount_cents=1)])], event()
    )
    assert listed[0].verdict is Verdict.MODIFY and listed[1].argument("order_id") == "B"
    assert evaluate_rules([lambda e: Decision(Verdict.BLOCK, "B")], event())[0].code == "B"


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
    assert Policy(rules=[block.__call__]).epoch != Policy().epoch


def test_limits_reject_unknown_keys() -> None:
    with pytest.raises(ValueError, match="max_repeats"):
        Limits.model_validate({"max_repeats": 3})
