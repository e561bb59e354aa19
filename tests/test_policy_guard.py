"""``PolicyGuard`` against a real SQLite journal: what an operator reads in the signed policy
chain for each verdict, what a person is asked, what a rule's escalation or rewrite becomes,
what monitor mode records and charges, and that one decision uses one policy throughout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core.errors import Denied
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.policy import (
    MASK,
    Accounts,
    CallEvent,
    Decision,
    Limits,
    Policy,
    PolicyGuard,
    Reason,
    Verdict,
    call_binding,
    deny_when,
    enforce,
    escalate,
    input_digest,
    modify,
)

from .test_protocol import KEY


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = open_journal(f"sqlite:///{tmp_path / 'j.db'}", signing_key=KEY)
    yield j
    assert j.verify().ok
    j.close()


def wire(amount: int, run: str, principal: str = "bot") -> tuple[CallEvent, Accounts]:
    event = CallEvent(
        "wire", ({"to": "ACME", "amount_cents": amount, "card": "4111"},), principal, "wf-1"
    )
    return event, Accounts.of(event, run)


def big(e: CallEvent) -> bool:
    return bool(e.argument("amount_cents") > 1000)


def notes(journal: Journal) -> list[dict[str, Any]]:
    return [e.data for e in journal.policy.events()]


def test_a_rule_denial_is_journaled_with_what_an_operator_needs(journal: Journal) -> None:
    policy = Policy(
        rules=[deny_when(big, code="TOO_BIG", reason="over 10 USD", argument="amount_cents")],
        policy_id="refunds",
    )
    guard = PolicyGuard(policy, journal.policy, clock=lambda: 1000.0)
    event, accounts = wire(5000, "run/1")
    d = guard.check(event, accounts, delivery="run/1/1")
    assert (d.verdict, d.code, d.argument, d.epoch) == (
        Verdict.DENY,
        "TOO_BIG",
        "amount_cents",
        policy.epoch,
    )
    [note] = notes(journal)
    digest = input_digest(event.args)
    assert note | {"effect_type": None} == {
        "event": "deny",
        "verdict": "DENY",
        "code": "TOO_BIG",
        "reason": "over 10 USD",
        "policy_id": "deny_when(big)",
        "epoch": policy.epoch,
        "argument": "amount_cents",
        "activity": "wire",
        "digest": digest,
        "principal": "bot",
        "session": "wf-1",
        "execution": "run/1",
        "binding": call_binding("wire", digest, "bot"),
        "delivery": "run/1/1",
        "approvers": [],
        "tripped": False,
        "probabilistic": False,
        "effect_type": None,
    }
    # a call checked without a delivery records none, and a digest handed in is the one used
    guard.check(*wire(6000, "run/2"), digest="effect-digest")
    assert notes(journal)[-1]["delivery"] == "" and notes(journal)[-1]["digest"] == "effect-digest"


def test_a_rule_denial_while_the_circuit_is_open_says_so(journal: Journal) -> None:
    policy = Policy(Limits(max_total_calls=1), rules=[deny_when(big, code="TOO_BIG")])
    guard = PolicyGuard(policy, journal.policy)
    assert guard.check(*wire(1, "run/1"), delivery="run/1/1").verdict is Verdict.ALLOW
    tripped = guard.check(*wire(2, "run/2"), delivery="run/2/1")
    assert (tripped.code, tripped.policy_id) == (Reason.GLOBAL_LIMIT, "interlock")
    event, accounts = wire(5000, "run/3")
    with pytest.raises(Denied) as denied:
        enforce(guard.check(event, accounts, delivery="run/3/1"), session="wf-1", binding="b")
    assert (denied.value.code, denied.value.circuit_open) == ("TOO_BIG", True)


def test_a_rule_escalation_asks_a_person_in_the_rules_words(journal: Journal) -> None:
    def review_big(e: CallEvent) -> Decision | None:
        return escalate("BIG_WIRE", "wires over 10 USD need a person") if big(e) else None

    policy = Policy(rules=[review_big], secret_arguments=["card"], policy_id="refunds")
    guard = PolicyGuard(policy, journal.policy, clock=lambda: 1000.0)
    event, accounts = wire(5000, "run/1")
    d = guard.check(event, accounts, delivery="run/1/1")
    assert (d.verdict, d.code, d.reason, d.policy_id) == (
        Verdict.ESCALATE,
        "BIG_WIRE",
        "wires over 10 USD need a person",
        "review_big",
    )
    binding = call_binding("wire", input_digest(event.args), "bot")
    pending = journal.policy.approval(binding)
    assert pending is not None
    assert (pending.code, pending.reason, pending.policy_id, pending.requested_at) == (
        "BIG_WIRE",
        "wires over 10 USD need a person",
        "review_big",
        1000.0,
    )
    assert pending.proposal == {"to": "ACME", "amount_cents": 5000, "card": MASK}
    assert notes(journal)[-1]["event"] == "escalate"
    # asked again before anyone decided: the same request stays pending, from its first time
    later = PolicyGuard(policy, journal.policy, clock=lambda: 2000.0)
    assert later.check(*wire(5000, "run/2"), delivery="run/2/1").verdict is Verdict.ESCALATE
    again = journal.policy.approval(binding)
    assert again is not None and again.requested_at == 1000.0
    # a breaker escalation is not reworded by a rule's
    hitl = Policy(Limits(hitl_activities=("wire",)), rules=[review_big])
    d = PolicyGuard(hitl, journal.policy).check(*wire(5, "run/3"), delivery="run/3/1")
    assert (d.code, d.policy_id) == (Reason.HITL_REQUIRED, "interlock")


def test_a_used_approval_is_journaled_with_its_approvers(journal: Journal) -> None:
    def cap(e: CallEvent) -> Decision:
        return modify({**e.input, "amount_cents": min(e.argument("amount_cents"), 9000)})

    policy = Policy(Limits(hitl_activities=("wire",)), rules=[cap], policy_id="wires")
    guard = PolicyGuard(policy, journal.policy)
    event, accounts = wire(6000, "run/1")
    assert guard.check(event, accounts, delivery="run/1/1").verdict is Verdict.ESCALATE
    journal.policy.decide_approval(
        accounts.binding or call_binding("wire", input_digest(event.args), "bot"),
        approve=True,
        operators=["carol"],
    )
    used = guard.check(*wire(6000, "run/2"), delivery="run/2/1")
    # the rewrite is still sent; the verdict says the approval met it
    assert (used.verdict, used.code, used.reason, used.policy_id, used.approvers) == (
        Verdict.MODIFY,
        "APPROVED",
        "HITL_REQUIRED met by an approval",
        "wires",
        ("carol",),
    )
    assert used.args == ({"to": "ACME", "amount_cents": 6000, "card": "4111"},)
    note = notes(journal)[-1]
    assert (note["event"], note["code"], note["approvers"]) == (
        "approval_used",
        "APPROVED",
        ["carol"],
    )
    # without an approval in play, a rewrite says so and names its rule
    plain = PolicyGuard(Policy(rules=[cap], policy_id="wires"), journal.policy)
    d = plain.check(*wire(20000, "run/3"), delivery="run/3/1")
    assert (d.verdict, d.code) == (Verdict.MODIFY, "MODIFIED")
    assert d.args == ({"to": "ACME", "amount_cents": 9000, "card": "4111"},)


def test_monitor_mode_records_what_would_have_happened_and_still_counts(journal: Journal) -> None:
    policy = Policy(
        Limits(max_total_calls=1, costs={"wire": 0.5}),
        rules=[deny_when(big, code="TOO_BIG", argument="amount_cents")],
        mode="monitor",
        policy_id="shadow",
    )
    guard = PolicyGuard(policy, journal.policy)
    first = guard.check(*wire(1, "run/1"), delivery="run/1/1")
    assert first == Decision(Verdict.ALLOW, epoch=policy.epoch)
    second = guard.check(*wire(2, "run/2"), delivery="run/2/1")
    assert (second.verdict, second.observed, second.code, second.reason, second.policy_id) == (
        Verdict.ALLOW,
        True,
        Reason.GLOBAL_LIMIT,
        "1 calls in this session",
        "shadow",
    )
    ruled = guard.check(*wire(5000, "run/3"), delivery="run/3/1")
    assert (ruled.observed, ruled.code, ruled.argument) == (True, "TOO_BIG", "amount_cents")
    # every call ran, so each was charged and its delivery recorded: a replay is observed
    assert journal.policy.spent("principal:bot") == pytest.approx(1.5)
    for run in ("run/1", "run/2"):
        replay = guard.check(*wire(1, run), delivery=f"{run}/1")
        assert (replay.observed, replay.code) == (True, Reason.REPLAY)
    assert [n["event"] for n in notes(journal)] == ["observed"] * 4


def test_monitor_mode_never_closes_a_circuit_a_person_must_reset(journal: Journal) -> None:
    enforcing = Policy(Limits(max_total_calls=1))
    guard = PolicyGuard(enforcing, journal.policy)
    guard.check(*wire(1, "run/1"), delivery="run/1/1")
    assert guard.check(*wire(2, "run/2"), delivery="run/2/1").circuit_open
    monitor = PolicyGuard(Policy(Limits(max_total_calls=1), mode="monitor"), journal.policy)
    assert monitor.check(*wire(3, "run/3"), delivery="run/3/1").observed
    assert "wf-1" in journal.policy.open_circuits()


def test_one_decision_uses_one_policy_even_when_the_file_changes_meanwhile(
    journal: Journal,
) -> None:
    old = Policy(Limits(costs={"wire": 0.5}), secret_arguments=["card"], cost_field=None)
    new = Policy(Limits(costs={"wire": 0.0}), cost_field=None)

    class Changing:
        """Each read of the policy finds a newer file than the last."""

        def __init__(self) -> None:
            self.reads = 0

        def current(self, now: float) -> Policy:
            self.reads += 1
            return old if self.reads % 2 else new

    hitl = Policy(Limits(hitl_activities=("wire",)), secret_arguments=["card"])

    class ChangingHitl(Changing):
        def current(self, now: float) -> Policy:
            self.reads += 1
            return hitl if self.reads % 2 else Policy(Limits(hitl_activities=("wire",)))

    guard = PolicyGuard(Changing(), journal.policy)
    assert guard.check(*wire(1, "run/1"), delivery="run/1/1").verdict is Verdict.ALLOW
    assert journal.policy.spent("principal:bot") == pytest.approx(0.5)

    asking = PolicyGuard(ChangingHitl(), journal.policy)
    event, accounts = wire(2, "run/2")
    assert asking.check(event, accounts, delivery="run/2/1").verdict is Verdict.ESCALATE
    pending = journal.policy.approval(call_binding("wire", input_digest(event.args), "bot"))
    assert pending is not None and pending.proposal["card"] == MASK


def test_facts_carry_the_cost_and_an_error_signal() -> None:
    guard = PolicyGuard(Policy(Limits(costs={"llm": 0.5})), store=None)  # type: ignore[arg-type]
    e = CallEvent("llm", ({"prompt": "retry: upstream timeout"},))
    facts = guard.facts(e)
    assert (facts.cost_usd, facts.error_signal) == (0.5, True)
    assert not guard.facts(CallEvent("llm", ({"prompt": "hi"},))).error_signal
    assert not guard.facts(CallEvent("llm", (object(),))).error_signal
    assert guard.facts(CallEvent("llm", ({"cost_usd": 0.2},))).cost_usd == 0.2
    two = guard.shown(CallEvent("llm", ("a", "b")))
    assert two == ["a", "b"]


def test_on_decision_is_told_every_decision_with_its_activity(journal: Journal) -> None:
    told: list[tuple[Verdict, str]] = []
    guard = PolicyGuard(
        Policy(), journal.policy, on_decision=lambda d, activity: told.append((d.verdict, activity))
    )
    guard.check(*wire(1, "run/1"), delivery="run/1/1")
    assert told == [(Verdict.ALLOW, "wire")]


def test_result_rules_decide_on_what_an_activity_returned(journal: Journal) -> None:
    def mask(e: CallEvent) -> Decision:
        return modify({**e.result, "ssn": "***"})

    def no_ssn(e: CallEvent) -> bool:
        return "ssn" in e.result

    after = CallEvent("lookup", ("c-1",), phase="result", result={"ssn": "078-05-1120"})
    assert PolicyGuard(Policy(), journal.policy).check_result(after) == Decision(Verdict.ALLOW)
    masked = PolicyGuard(Policy(result_rules=[mask]), journal.policy).check_result(after)
    assert (masked.verdict, masked.args) == (Verdict.MODIFY, ({"ssn": "***"},))
    deny = Policy(result_rules=[deny_when(no_ssn, code="PII")])
    blocked = PolicyGuard(deny, journal.policy).check_result(after)
    assert (blocked.verdict, blocked.code, blocked.observed) == (Verdict.DENY, "PII", False)
    shadow = Policy(result_rules=[deny_when(no_ssn, code="PII")], mode="monitor")
    seen = PolicyGuard(shadow, journal.policy).check_result(after)
    assert (seen.verdict, seen.code, seen.observed) == (Verdict.ALLOW, "PII", True)
    clean = CallEvent("lookup", ("c-1",), phase="result", result={"name": "x"})
    assert PolicyGuard(shadow, journal.policy).check_result(clean) == Decision(Verdict.ALLOW)


def test_monitor_mode_admits_each_execution_once(journal: Journal) -> None:
    """A Temporal retry of a call monitor mode let run is not charged again, whether the first
    attempt was plainly allowed or observed over a limit."""
    policy = Policy(Limits(max_total_calls=1, costs={"wire": 0.5}), mode="monitor")
    guard = PolicyGuard(policy, journal.policy)
    for run in ("run/1", "run/2"):
        for attempt in (1, 2):
            guard.check(*wire(1, run), delivery=f"{run}/{attempt}")
        assert journal.policy.spent("principal:bot") == pytest.approx(
            0.5 if run == "run/1" else 1.0
        )
