"""What the policy's building blocks say to the agent and to operators: the rule helpers' codes,
reasons and names, the breaker's reason texts and edges, error signals, masking, reported costs,
why an approval does not cover a call, and what a denial or an escalation raises."""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from pydantic import BaseModel

from interlock_temporal._worker.gated import result_check, return_type_of
from interlock_temporal.core.errors import Denied, NeedsApproval
from interlock_temporal.core.policy import (
    MASK,
    Accounts,
    Approval,
    CallEvent,
    CallFacts,
    Circuit,
    Decision,
    Limits,
    PolicyState,
    Reason,
    SessionState,
    Verdict,
    allow,
    call_binding,
    cost_in,
    decide,
    deny,
    deny_activity,
    deny_when,
    enforce,
    escalate,
    evaluate_rules,
    has_error_signal,
    input_digest,
    modify,
    redact,
)


class Refund(BaseModel):
    order_id: str
    amount_cents: int


def refund(amount: int = 500, activity: str = "refund") -> CallEvent:
    return CallEvent(activity=activity, args=(Refund(order_id="A-1", amount_cents=amount),))


# -- the rule helpers: what a denial says, and which rule it names ----------------------------


def test_the_rule_helpers_say_their_code_and_reason_and_name_the_rule() -> None:
    d, _ = evaluate_rules([deny_when(lambda e: True)], refund())
    assert (d.verdict, d.code, d.reason, d.policy_id) == (
        Verdict.DENY,
        "DENIED",
        "",
        "deny_when(<lambda>)",
    )
    d, _ = evaluate_rules([deny_when(lambda e: True, reason="too big", argument="x")], refund())
    assert (d.reason, d.argument) == ("too big", "x")

    # a predicate without a name (a partial) is named as such
    def over(limit: int, e: CallEvent) -> bool:
        return bool(e.argument("amount_cents") > limit)

    d, _ = evaluate_rules([deny_when(functools.partial(over, 100))], refund())
    assert d.policy_id == "deny_when(predicate)"

    d, _ = evaluate_rules([deny_activity("delete_*", "drop_*")], refund(activity="drop_db"))
    assert (d.code, d.reason, d.policy_id) == (
        "ACTIVITY_DENIED",
        "drop_db may not be called",
        "deny_activity(delete_*, drop_*)",
    )
    d, _ = evaluate_rules(
        [deny_activity("drop_*", code="NO_DROP", reason="never")], refund(1, "drop_x")
    )
    assert (d.code, d.reason) == ("NO_DROP", "never")

    assert deny("B") == Decision(Verdict.DENY, "B", "")
    assert deny("B", "why").reason == "why"
    assert escalate() == Decision(Verdict.ESCALATE, "RULE_ESCALATE", "")
    assert escalate("BIG", "a big refund").reason == "a big refund"
    assert modify(1) == Decision(Verdict.MODIFY, "MODIFIED", "", args=(1,))
    assert modify(1, reason="capped").reason == "capped"
    # an explicit allow lets the call through like no opinion at all
    assert evaluate_rules([lambda e: allow()], refund())[0].verdict is Verdict.ALLOW


def test_a_denial_has_one_name_and_the_old_ones_still_work_with_a_warning() -> None:
    """``Verdict.DENY`` is the verdict's only member (stored as "DENY"); ``Verdict.BLOCK``,
    ``block()`` and ``CallFacts(delivery=...)``, which a user of ``interlock_temporal.policy``
    could have written, still work and warn."""
    from interlock_temporal import policy as public

    assert list(Verdict.__members__) == ["ALLOW", "DENY", "MODIFY", "ESCALATE"]
    assert Verdict("DENY") is Verdict.DENY
    with pytest.warns(DeprecationWarning, match=r"Verdict\.BLOCK is deprecated: use Verdict\.DENY"):
        assert public.Verdict.BLOCK is Verdict.DENY
    with pytest.warns(DeprecationWarning, match=r"Verdict\.BLOCK is deprecated"):
        assert Verdict["BLOCK"] is Verdict.DENY
    with pytest.warns(DeprecationWarning, match=r"block\(\) is deprecated: use deny\(\)"):
        assert public.block("B", "why", argument="x") == deny("B", "why", argument="x")
    with pytest.warns(DeprecationWarning, match=r"CallFacts\(delivery=\.\.\.\) is deprecated"):
        given = CallFacts("llm", "x", now=0.0, delivery="run/1/1")
    assert given == CallFacts("llm", "x", now=0.0)
    with pytest.raises(AttributeError, match="PERMIT"):
        _ = Verdict.PERMIT  # type: ignore[attr-defined]


def _deprecated_uses() -> dict[str, Callable[[], object]]:
    """Each old name a user of ``interlock_temporal.policy`` may have written, used by a function
    whose body is that one line."""
    from interlock_temporal import policy as public

    def verdict_block() -> object:
        return public.Verdict.BLOCK

    def verdict_by_name() -> object:
        return Verdict["BLOCK"]

    def old_block() -> object:
        return public.block("B")

    def facts_with_delivery() -> object:
        return CallFacts("llm", "x", now=0.0, delivery="run/1/1")

    return {f.__name__: f for f in (verdict_block, verdict_by_name, old_block, facts_with_delivery)}


def _warned(use: Callable[[], object]) -> tuple[warnings.WarningMessage, object]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        value = use()
    assert len(seen) == 1 and seen[0].category is DeprecationWarning
    return seen[0], value


def test_each_deprecation_says_what_to_use() -> None:
    """The whole text a user reads, and what the old name still gives."""
    uses = _deprecated_uses()
    for name in ("verdict_block", "verdict_by_name"):
        warned, value = _warned(uses[name])
        assert str(warned.message) == (
            "Verdict.BLOCK is deprecated: use Verdict.DENY (the same verdict); removed in 0.3.0"
        )
        assert value is Verdict.DENY
    warned, value = _warned(uses["old_block"])
    assert str(warned.message) == (
        "block() is deprecated: use deny() (the same verdict, DENY); removed in 0.3.0"
    )
    assert value == deny("B") and deny("B").reason == ""
    warned, _ = _warned(uses["facts_with_delivery"])
    assert str(warned.message) == (
        "CallFacts(delivery=...) is deprecated and ignored: decide never reads it; the "
        "delivery goes to PolicyGuard.check, whose store records it; removed in 0.3.0"
    )


def test_each_deprecation_points_at_the_callers_line() -> None:
    """The warning is attributed to the line that used the old name, not to the package's own
    code, so a user can find and fix it. (Not run by ``make mutants``: mutmut's trampoline adds a
    frame between a caller and the function, so every location moves by one there.)"""
    for use in _deprecated_uses().values():
        warned, _ = _warned(use)
        assert (warned.filename, warned.lineno) == (__file__, use.__code__.co_firstlineno + 1)


def test_a_rule_is_named_by_its_policy_id_else_its_name_else_its_type() -> None:
    def named(e: CallEvent) -> Decision:
        return deny("NO")

    named.policy_id = "refund-cap"  # type: ignore[attr-defined]

    class Callable:
        def __call__(self, e: CallEvent) -> Decision:
            return deny("NO")

    assert evaluate_rules([named], refund())[0].policy_id == "refund-cap"
    assert evaluate_rules([Callable()], refund())[0].policy_id == "Callable"


def test_the_first_escalation_is_the_one_a_person_sees() -> None:
    d, _ = evaluate_rules([lambda e: escalate("FIRST"), lambda e: escalate("SECOND")], refund())
    assert (d.verdict, d.code) == (Verdict.ESCALATE, "FIRST")


def test_an_allow_or_an_empty_modify_does_not_stop_the_later_rules() -> None:
    later = deny_when(lambda e: True, code="LATER")
    for first in (lambda e: allow(), lambda e: modify()):
        d, _ = evaluate_rules([first, later], refund())
        assert (d.verdict, d.code) == (Verdict.DENY, "LATER")


def test_composed_modifies_say_modified() -> None:
    d, rewritten = evaluate_rules([lambda e: modify(refund(1).args[0])], refund())
    assert (d.verdict, d.code) == (Verdict.MODIFY, "MODIFIED")
    assert rewritten.argument("amount_cents") == 1


def test_a_result_rewrite_is_what_later_rules_see_and_what_is_returned() -> None:
    seen: list[Any] = []

    def mask(e: CallEvent) -> Decision:
        return modify({**e.result, "ssn": "***"})

    def look(e: CallEvent) -> None:
        seen.append(dict(e.result))
        e.result["ssn"] = "edited in place"

    after = CallEvent("lookup", ("c-1",), phase="result", result={"ssn": "078-05-1120", "n": [1]})
    d, rewritten = evaluate_rules([mask, look, look], after)
    assert d.verdict is Verdict.MODIFY
    # each rule sees the rewrite; an edit in place by one is seen by the next, never returned
    assert seen == [{"ssn": "***", "n": [1]}, {"ssn": "edited in place", "n": [1]}]
    assert rewritten.result == {"ssn": "***", "n": [1]}


def test_a_rule_result_edited_in_place_deep_down_reaches_nothing_returned() -> None:
    def edits(e: CallEvent) -> None:
        e.result["rows"][0]["ssn"] = "***"

    result = {"rows": [{"ssn": "078-05-1120"}]}
    after = CallEvent("lookup", ("c-1",), phase="result", result=result)
    d, _ = evaluate_rules([edits], after)
    assert d.verdict is Verdict.ALLOW and result == {"rows": [{"ssn": "078-05-1120"}]}

    rewrite = {"rows": [{"ssn": "x"}]}
    d, rewritten = evaluate_rules([lambda e: modify(rewrite), edits], after)
    assert rewritten.result == {"rows": [{"ssn": "x"}]} and rewrite == {"rows": [{"ssn": "x"}]}


def test_a_result_rewrite_is_validated_into_what_the_activity_returns() -> None:
    """As a call's rewrite is validated into the body's parameter types: a rewrite the
    activity does not return denies, naming the rule, the field and never its value; one that
    validates is coerced, and later rules see the coerced value."""
    check = result_check(Refund)
    assert check is not None
    returned = Refund(order_id="A-1", amount_cents=500)
    after = CallEvent("refund", (returned,), phase="result", result=returned)

    def drop(e: CallEvent) -> Decision:
        return modify(None)

    d, rewritten = evaluate_rules([drop], after, result_check=check)
    assert (d.verdict, d.code, d.policy_id) == (Verdict.DENY, Reason.RULE_ERROR, "drop")
    assert d.reason == (
        "rule drop rewrote the result of refund into one it does not return (result: model_type)"
    )
    assert rewritten.result is returned
    assert str(Denied(d.code, d.reason, d.policy_id)) == f"RULE_ERROR: {d.reason} (policy drop)"

    def secret_amount(e: CallEvent) -> Decision:
        return modify({"order_id": "A-1", "amount_cents": "card-4111"})

    d, _ = evaluate_rules([secret_amount], after, result_check=check)
    assert d.verdict is Verdict.DENY and "result.amount_cents: int_parsing" in d.reason
    assert "card-4111" not in d.reason

    seen: list[Any] = []

    def halve(e: CallEvent) -> Decision:
        return modify({"order_id": "A-1", "amount_cents": "250"})

    def look(e: CallEvent) -> None:
        seen.append(e.result)

    d, rewritten = evaluate_rules([halve, look], after, result_check=check)
    assert d.verdict is Verdict.MODIFY
    assert rewritten.result == seen[0] == Refund(order_id="A-1", amount_cents=250)
    # a later rule's None is checked too: the rule that wrote it is the one named
    d, _ = evaluate_rules([halve, drop], after, result_check=check)
    assert (d.verdict, d.policy_id) == (Verdict.DENY, "drop")


def test_a_result_rewrite_of_an_unknown_type_is_taken_as_it_is() -> None:
    """No annotation, or ``Any``: nothing to validate against, so a rewrite stands as before;
    an activity that returns None may be rewritten only to None."""

    def plain(x):  # type: ignore[no-untyped-def]
        return x

    def anything(x: int) -> Any:
        return x

    def nothing(x: int) -> None:
        return None

    assert return_type_of(plain) is None and result_check(None) is None
    assert return_type_of(anything) is Any and result_check(Any) is None
    after = CallEvent("lookup", ("c-1",), phase="result", result={"customer": "c-1"})
    d, rewritten = evaluate_rules([lambda e: modify(None)], after, result_check=None)
    assert d.verdict is Verdict.MODIFY and rewritten.result is None
    returns_none = result_check(return_type_of(nothing))
    assert returns_none is not None and returns_none(None) is None
    d, _ = evaluate_rules([lambda e: modify({})], after, result_check=returns_none)
    assert d.verdict is Verdict.DENY and "(result: none_required)" in d.reason


def test_a_result_type_that_cannot_be_validated_refuses_every_rewrite() -> None:
    class Opaque:
        pass

    check = result_check(Opaque)
    assert check is not None
    with pytest.raises(ValueError, match=r"^its return type cannot be validated \(Pydantic"):
        check(Opaque())
    unhashable = result_check(Annotated[int, ["metadata"]])  # not cached, still checked
    assert unhashable is not None and unhashable("5") == 5


class Uncopyable:
    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("no copies")


def test_what_cannot_be_copied_blocks_naming_the_rule_and_the_error_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "interlock_temporal.policy")

    def rewrites(e: CallEvent) -> Decision:
        return modify(Uncopyable())

    for phase in ("call", "result"):
        caplog.clear()
        e = CallEvent("lookup", ("c-1",), phase=phase, result={})  # type: ignore[arg-type]
        d, _ = evaluate_rules([rewrites], e)
        assert (d.verdict, d.code, d.policy_id) == (Verdict.DENY, Reason.RULE_ERROR, "rewrites")
        assert d.reason == "rule rewrites returned a rewrite that cannot be copied (TypeError)"
        assert [r.getMessage() for r in caplog.records] == [
            "policy rule rewrites: rule rewrites returned a rewrite that cannot be copied"
        ]

    caplog.clear()
    d, _ = evaluate_rules([lambda e: None], CallEvent("lookup", (Uncopyable(),)))
    assert (d.code, d.policy_id) == (Reason.RULE_ERROR, None)
    assert d.reason == "the call cannot be copied for the rules (TypeError)"
    assert [r.getMessage() for r in caplog.records] == [
        "the call to lookup cannot be copied for the policy rules"
    ]
    caplog.clear()
    result = CallEvent("lookup", ("c-1",), phase="result", result=Uncopyable())
    assert evaluate_rules([lambda e: None], result)[0].code == Reason.RULE_ERROR


def test_a_broken_rule_is_logged_for_operators_by_name_and_error_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "interlock_temporal.policy")

    def broken(e: CallEvent) -> None:
        raise KeyError("card-4111")

    def sloppy(e: CallEvent) -> Any:
        return "DENY"

    def empty(e: CallEvent) -> Decision:
        return modify()

    d, _ = evaluate_rules([broken], refund())
    assert (d.reason, d.policy_id) == ("rule broken raised KeyError", "broken")
    evaluate_rules([sloppy], refund())
    evaluate_rules([empty], refund())
    assert [r.getMessage() for r in caplog.records] == [
        "policy rule broken raised KeyError: the call is blocked",
        "policy rule sloppy returned a str, not a Decision: the call is blocked",
        "policy rule empty returned MODIFY without a value: ignored",
    ]


# -- what a rule reads of the call ------------------------------------------------------------


def test_an_argument_not_named_falls_back_to_the_input_then_the_default() -> None:
    two = CallEvent("wire", ("ACME", 500), param_names=("to", "amount_cents"))
    assert two.argument("amount_cents") == 500
    assert two.argument("currency", "usd") == "usd"
    mapping = CallEvent("wire", ({"to": "ACME"},))
    assert mapping.argument("amount_cents", 7) == 7
    model = refund()
    assert model.argument("currency", "usd") == "usd"


# -- the breaker's words and edges -------------------------------------------------------------


def test_each_budget_is_named_when_spent_or_overrun() -> None:
    call = CallFacts("llm", "x", now=0.0, cost_usd=0.6)
    for scope, limits, state in (
        ("principal", Limits(principal_budget_usd=1.0), PolicyState(principal_spent_usd=1.0)),
        ("namespace", Limits(namespace_budget_usd=1.0), PolicyState(namespace_spent_usd=1.0)),
    ):
        d = decide(state, call, limits, 0.5)
        assert (d.code, d.reason) == (Reason.BUDGET_EXHAUSTED, f"the {scope} budget is spent")
    # the namespace is charged with each call allowed, and its budget then holds
    limits = Limits(namespace_budget_usd=1.0)
    first = decide(PolicyState(), call, limits, 0.5)
    assert first.verdict is Verdict.ALLOW and first.state is not None
    assert first.state.namespace_spent_usd == pytest.approx(0.6)
    second = decide(first.state, dataclasses.replace(call, digest="y"), limits, 0.5)
    assert second.reason == "the call's cost exceeds what remains of the namespace budget"


def test_a_cost_equal_to_what_remains_is_allowed() -> None:
    limits = Limits(session_budget_usd=1.0)
    d = decide(
        PolicyState(SessionState(spent_usd=0.5)), CallFacts("llm", "x", 0.0, 0.5), limits, 0.5
    )
    assert d.verdict is Verdict.ALLOW


def test_the_threshold_names_the_lowest_budget() -> None:
    call = CallFacts("llm", "x", now=0.0, cost_usd=0.001)
    # a threshold of 1.0 asks from the first call, naming the budget
    fresh = decide(
        PolicyState(), call, Limits(session_budget_usd=1.0, escalate_below_fraction=1.0), 0.5
    )
    assert fresh.reason == "the session budget fell to its escalation threshold"
    # the lowest of several budgets is the one at its threshold
    limits = Limits(session_budget_usd=1.0, principal_budget_usd=1.0, escalate_below_fraction=0.25)
    state = PolicyState(SessionState(spent_usd=0.5), principal_spent_usd=0.9)
    d = decide(state, call, limits, 0.5)
    assert (d.verdict, d.reason) == (
        Verdict.ESCALATE,
        "the principal budget fell to its escalation threshold",
    )
    # of two budgets equally low, the narrower (the session's) is named
    state = PolicyState(SessionState(spent_usd=0.9), principal_spent_usd=0.9)
    assert decide(state, call, limits, 0.5).reason.startswith("the session budget")


def test_the_random_denial_at_its_edges() -> None:
    limits = Limits(session_budget_usd=10.0, probabilistic_deny=True, deny_jitter_ratio=0.5)
    call = CallFacts("llm", "x", now=0.0, cost_usd=0.01)
    # exactly a fifth of the budget left: never
    at_fifth = decide(PolicyState(SessionState(spent_usd=8.0)), call, limits, 0.0)
    assert at_fifth.verdict is Verdict.ALLOW
    # a tenth left: denied with probability 0.5 * 0.9 = 0.45, so a draw of exactly 0.45 runs
    tenth = PolicyState(SessionState(spent_usd=9.0))
    assert decide(tenth, call, limits, 0.45).verdict is Verdict.ALLOW
    assert decide(tenth, call, limits, 0.4499).verdict is Verdict.DENY


def test_the_breaker_explains_a_replay_and_an_escalation() -> None:
    call = CallFacts("wire", "x", now=0.0)
    replay = decide(PolicyState(), dataclasses.replace(call, replayed=True), Limits(), 0.5)
    assert replay.reason == "this delivery was already allowed once"
    asks = decide(PolicyState(), call, Limits(hitl_activities=("wire",)), 0.5)
    assert (asks.code, asks.reason) == (Reason.HITL_REQUIRED, "a person must approve this call")


def test_a_denial_keeps_the_sessions_counts_and_opens_its_circuit() -> None:
    limits = Limits(window_s=10.0, window_max_calls=1)
    first = decide(PolicyState(), CallFacts("search", "a", now=1.0, cost_usd=0.2), limits, 0.5)
    assert first.state is not None
    denied = decide(first.state, CallFacts("search", "b", now=2.0), limits, 0.5)
    assert denied.verdict is Verdict.DENY and denied.state is not None
    assert denied.state.session == dataclasses.replace(
        first.state.session, circuit=Circuit(Reason.WINDOW_EXCEEDED.value, "search", 2.0)
    )


# -- error signals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["502", "500 internal error", "500 after o-3a500f1c", "o-3a500f1c then 500 then x500y"],
)
def test_a_status_code_is_found_at_the_start_and_after_lookalikes(text: str) -> None:
    assert has_error_signal([text])


def test_a_none_or_a_flag_does_not_hide_a_signal_after_it() -> None:
    assert has_error_signal(["timeout", None])
    assert has_error_signal({"error": "timeout", "retry": True})


# -- what a person is shown, what a call reports, what names a call ---------------------------


def test_secrets_are_masked_at_any_depth_and_nothing_else() -> None:
    data = {"card": "4111", "rows": [{"card": "4242", "n": 1}], "to": "ACME"}
    assert redact(data, frozenset({"card"})) == {
        "card": MASK,
        "rows": [{"card": MASK, "n": 1}],
        "to": "ACME",
    }
    assert redact(data, frozenset()) is data


class Metered(BaseModel):
    cost_usd: float


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"cost_usd": 0.25}, 0.25),
        (Metered(cost_usd=0.25), 0.25),
        ({"cost_usd": 0}, 0.0),
        ({"cost_usd": -1.0}, None),
        ({"cost_usd": float("inf")}, None),
        ({"cost_usd": float("nan")}, None),
        ({"cost_usd": True}, None),
    ],
)
def test_a_reported_cost_is_a_finite_non_negative_number(
    value: Any, expected: float | None
) -> None:
    assert cost_in(value, "cost_usd") == expected


def test_an_exact_cost_wins_over_a_glob_and_an_unlisted_activity_costs_nothing() -> None:
    limits = Limits(costs={"search*": 0.1, "search_web": 0.3})
    assert limits.cost_of("search_web") == 0.3
    assert limits.cost_of("search_db") == 0.1
    assert limits.cost_of("refund") == 0.0


def test_calls_without_a_canonical_input_are_told_apart_by_type() -> None:
    class A:
        pass

    class B:
        pass

    assert input_digest([A()]) == input_digest([A()]) != input_digest([B()])


def test_scopes_stand_in_for_what_is_unknown() -> None:
    assert Accounts.of(CallEvent("x", ()), "run/1") == Accounts("-", "-", "-", "run/1")
    assert call_binding("wire", "d", "bot").startswith("call:")


# -- approvals and what a verdict raises ---------------------------------------------------------


def test_an_approval_says_why_it_does_not_cover_a_call() -> None:
    granted = Approval(
        binding="call:x",
        activity="wire",
        principal="bot",
        session="wf-1",
        payload_digest="d",
        epoch="e",
        requested_at=0.0,
        status="approved",
        scope="session",
        expires_at=100.0,
    )
    call = {"digest": "d", "principal": "bot", "epoch": "e", "session": "wf-1", "now": 99.0}
    assert granted.covers(**call) is None  # type: ignore[arg-type]
    cases = {
        "digest": ("other", "the input changed since it was approved"),
        "principal": ("eve", "another principal asks"),
        "epoch": ("e2", "the policy changed since it was approved"),
        "session": ("wf-2", "it was granted for another session"),
        "now": (100.0, "it expired"),
    }
    for key, (value, why) in cases.items():
        assert granted.covers(**{**call, key: value}) == why, key  # type: ignore[arg-type]
    pending = granted.model_copy(update={"status": "pending"})
    assert pending.covers(**call) == "the approval is pending"  # type: ignore[arg-type]


def test_a_denial_raises_with_its_circuit_and_an_escalation_with_its_policy() -> None:
    tripped = decide(
        PolicyState(SessionState(total=1)), CallFacts("x", "d", 0.0), Limits(max_total_calls=1), 0.5
    )
    with pytest.raises(Denied) as denied:
        enforce(tripped, session="wf-1", binding="b")
    assert (denied.value.code, denied.value.circuit_open) == (Reason.GLOBAL_LIMIT, True)
    asks = dataclasses.replace(escalate("BIG", "big"), policy_id="refund-cap")
    with pytest.raises(NeedsApproval) as needs:
        enforce(asks, session="wf-1", binding="b")
    assert (needs.value.code, needs.value.binding, needs.value.policy_id) == (
        "BIG",
        "b",
        "refund-cap",
    )
