"""The policy layer end to end on a real Temporal server: every activity of the worker is
checked, denied bodies never run, the session's circuit stays open until a person resets it
with the CLI, budgets are charged once and then with the actual cost, once."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr
from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)

from interlock_temporal import current_effect, gated, receipt, report_cost
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.models import Found
from interlock_temporal.core.policy import (
    CallEvent,
    Decision,
    HitlMode,
    Limits,
    Policy,
    call_binding,
    deny,
    deny_when,
    escalate,
    input_digest,
    modify,
)
from interlock_temporal.core.policy.file import MAX_POLICY_BYTES, PolicyError
from interlock_temporal.core.review import review_id
from interlock_temporal.targets.payments import RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer, temporal_cli
from workers.scenarios import ORDER

from .review_rig import interlock
from .server_workflows import ApprovedCall, CallActivity, RunCalls
from .test_policy_file import NO_ANCHORS, alias_bomb
from .test_reviews import until
from .test_server import Rig, cause_of, rig

pytestmark = pytest.mark.server

#: what the bodies ran, by (session, activity, input): what the tests count, not the gate
RAN: list[tuple[str, str, Any]] = []


def _ran(name: str, arg: Any) -> None:
    RAN.append((activity.info().workflow_id, name, arg))


@activity.defn
async def search(query: str) -> str:
    _ran("search", query)
    return f"{len(query)} results"


@activity.defn
async def llm(request: dict[str, Any]) -> dict[str, Any]:
    """Declares its estimate in ``cost_usd``; reports what it really cost when told to."""
    _ran("llm", request.get("prompt"))
    if "actual_usd" in request:
        report_cost(request["actual_usd"])
    return {"text": "ok"}


@activity.defn
async def flaky(query: str) -> str:
    _ran("flaky", query)
    if activity.info().attempt == 1:
        raise RuntimeError("the first attempt fails")
    return "done"


#: how many times ``fails_once`` ran, by workflow
FAILS_ONCE: dict[str, int] = {}


@activity.defn
async def fails_once(query: str) -> str:
    _ran("fails_once", query)
    wf = activity.info().workflow_id
    FAILS_ONCE[wf] = FAILS_ONCE.get(wf, 0) + 1
    if FAILS_ONCE[wf] == 1:
        raise RuntimeError("the first run fails")
    return "done"


EXTRA = [search, llm, flaky, fails_once]


def ran(workflow_id: str, name: str | None = None) -> list[Any]:
    return [arg for wf, n, arg in RAN if wf == workflow_id and (name is None or n == name)]


async def session(r: Rig, calls: list[tuple[str, Any]], **spec: Any) -> tuple[str, list[Any]]:
    workflow_id = f"agent-{uuid.uuid4().hex[:8]}"
    outcomes = await r.client.execute_workflow(
        RunCalls.run,
        {
            "principal": "support-agent",
            "calls": [{"activity": a, "arg": arg} for a, arg in calls],
            **spec,
        },
        id=workflow_id,
        task_queue=r.task_queue,
    )
    return workflow_id, outcomes


def codes(outcomes: list[dict[str, Any]]) -> list[str]:
    return ["ok" if "ok" in o else f"{o['error']}:{o.get('code')}" for o in outcomes]


def policy_rig(
    dev_server: DevServer, tmp_path: Path, policy: Policy, extra_more: list[Any] = (), **kw: Any
) -> Any:
    return rig(
        dev_server,
        tmp_path,
        extra=[*EXTRA, *extra_more],
        plugin_options={"policy": policy},
        **kw,
    )


async def test_the_fourth_identical_call_is_denied_and_the_circuit_stays_open(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(Limits(max_repeat_calls=3), policy_id="agents")
    async with policy_rig(dev_server, tmp_path, policy) as r:
        wf, outcomes = await session(r, [("search", "refund policy")] * 4 + [("search", "x")])
        assert codes(outcomes) == [
            "ok",
            "ok",
            "ok",
            "InterlockDenied:MAX_REPEAT_EXCEEDED",
            "InterlockDenied:CIRCUIT_OPEN",
        ]
        assert ran(wf) == ["refund policy"] * 3
        denied = outcomes[3]["message"]
        assert "policy agents" in denied and "refund policy" not in denied

        # the circuit outlives the workflow: the same session stays denied until a person
        # resets it, with the command an operator runs
        _, again = await session(r, [("search", "y")], session=wf)
        assert codes(again) == ["InterlockDenied:CIRCUIT_OPEN"]
        journal = ["--journal", r.journal.url]
        env = {"INTERLOCK_SIGNING_KEY": "11" * 32}
        shown = await interlock("circuit", "show", wf, *journal, cwd=tmp_path, env=env)
        assert shown.code == 0 and "OPEN" in shown.out and "MAX_REPEAT" in shown.out
        reset = await interlock(
            "circuit",
            "reset",
            wf,
            "--operator",
            "carol",
            "--note",
            "loop fixed",
            *journal,
            cwd=tmp_path,
            env=env,
        )
        assert reset.code == 0, reset.err
        wf2, after = await session(r, [("search", "y")], session=wf)
        assert codes(after) == ["ok"] and ran(wf2) == ["y"]
        again_reset = await interlock(
            "circuit", "reset", wf, "--operator", "carol", *journal, cwd=tmp_path, env=env
        )
        assert again_reset.code == 1 and "not open" in again_reset.err
        events = [e.data for e in r.journal.policy.events()]
        assert [(e["event"], e.get("code")) for e in events] == [
            ("deny", "MAX_REPEAT_EXCEEDED"),
            ("deny", "CIRCUIT_OPEN"),
            ("deny", "CIRCUIT_OPEN"),
            ("circuit_reset", "MAX_REPEAT_EXCEEDED"),
        ]
        assert events[-1]["operator"] == "carol"
        assert r.journal.verify().ok


async def test_an_error_signal_lowers_the_repeat_limit_by_one(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(Limits(max_repeat_calls=3))
    async with policy_rig(dev_server, tmp_path, policy) as r:
        looping = "retry: HTTP 401 Unauthorized"
        wf, outcomes = await session(r, [("search", looping)] * 3)
        assert codes(outcomes) == ["ok", "ok", "InterlockDenied:MAX_REPEAT_EXCEEDED"]
        assert len(ran(wf)) == 2


async def test_a_call_over_the_remaining_budget_is_denied_and_its_body_never_runs(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(Limits(session_budget_usd=1.00))
    async with policy_rig(dev_server, tmp_path, policy) as r:
        wf, outcomes = await session(
            r,
            [
                ("llm", {"prompt": "draft the reply", "cost_usd": 0.90}),
                ("llm", {"prompt": "polish it", "cost_usd": 0.15}),
            ],
        )
        assert codes(outcomes) == ["ok", "InterlockDenied:BUDGET_EXHAUSTED"]
        assert ran(wf) == ["draft the reply"]
        state = r.journal.policy.session(wf)
        assert state is not None and state.spent_usd == pytest.approx(0.90)
        assert state.circuit is not None and state.circuit.code == "BUDGET_EXHAUSTED"


async def test_an_operators_activity_reset_is_not_a_replay(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """``temporal activity reset`` starts an activity's attempts again at 1: the delivery
    (run, activity id, attempt) repeats, but it is a person's retry, not a replay. It runs, is
    charged once, and trips nothing (SP/1.0 would deny it: docs/shackle-conformance.md)."""
    policy = Policy(Limits(session_budget_usd=1.0, costs={"fails_once": 0.30}))
    async with policy_rig(dev_server, tmp_path, policy) as r:
        workflow_id = f"agent-{uuid.uuid4().hex[:8]}"
        handle = await r.client.start_workflow(
            RunCalls.run,
            {
                "principal": "support-agent",
                "calls": [{"activity": "fails_once", "arg": "q"}],
                # the next attempt would wait an hour: only the reset runs it again
                "retry_interval_s": 3600,
            },
            id=workflow_id,
            task_queue=r.task_queue,
        )

        async def failed_once() -> bool:
            return FAILS_ONCE.get(workflow_id) == 1

        await until(failed_once)
        await asyncio.sleep(0.5)  # the failure reaches the server: the retry is scheduled
        process = await asyncio.create_subprocess_exec(
            temporal_cli(),
            *("activity", "reset", "--address", dev_server.target),
            *("--workflow-id", workflow_id, "--activity-id", "1"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate()
        assert process.returncode == 0, out.decode()
        outcomes = await asyncio.wait_for(handle.result(), 60)
        assert codes(outcomes) == ["ok"]
        assert ran(workflow_id) == ["q", "q"]
        state = r.journal.policy.session(workflow_id)
        assert state is not None
        assert (state.total, state.circuit) == (1, None)
        assert state.spent_usd == pytest.approx(0.30)
        assert r.journal.policy.events() == []


async def test_hitl_on_deny_asks_a_person_before_a_call_over_the_budget(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """SP/1.0's HITL on_deny: a call that costs more than what remains of the session's budget
    waits for a person instead of opening the circuit; approved, it runs once, and the spent
    budget then denies the next call."""
    policy = Policy(Limits(session_budget_usd=1.00, hitl_mode=HitlMode.ON_DENY))
    async with policy_rig(dev_server, tmp_path, policy) as r:
        session_id = f"s-{uuid.uuid4().hex[:6]}"
        _, outcomes = await session(
            r, [("llm", {"prompt": "draft", "cost_usd": 0.90})], session=session_id
        )
        assert codes(outcomes) == ["ok"]
        request = {"prompt": "polish", "cost_usd": 0.15}
        case = await r.client.start_workflow(
            ApprovedCall.run,
            {
                "principal": "support-agent",
                "activity": "llm",
                "arg": request,
                "session": session_id,
            },
            id=f"over-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        binding = call_binding("llm", input_digest((request,)), "support-agent")
        review = r.client.get_workflow_handle(review_id("approval", binding))

        async def open_() -> bool:
            try:
                return (await review.query("status"))["state"] == "open"
            except Exception:
                return False

        await until(open_)
        assert ran(case.id) == []
        state = r.journal.policy.session(session_id)
        assert state is not None and state.circuit is None
        pending = r.journal.policy.approval(binding)
        assert pending is not None and pending.code == "BUDGET_EXHAUSTED"
        await review.signal("resolve", {"decision": "approve", "operator": "carol"})
        assert await case.result() == {"ok": {"text": "ok"}}
        assert ran(case.id) == ["polish"]
        state = r.journal.policy.session(session_id)
        assert state is not None and state.spent_usd == pytest.approx(1.05)
        _, after = await session(
            r, [("llm", {"prompt": "more", "cost_usd": 0.01})], session=session_id
        )
        assert codes(after) == ["InterlockDenied:BUDGET_EXHAUSTED"]


async def test_the_budget_is_charged_the_reported_cost_once(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(Limits(session_budget_usd=1.00))
    async with policy_rig(dev_server, tmp_path, policy) as r:
        wf, outcomes = await session(
            r,
            [
                # estimated at $0.50, it reports $0.20: $0.80 remain, so $0.75 fits
                ("llm", {"prompt": "a", "cost_usd": 0.50, "actual_usd": 0.20}),
                ("llm", {"prompt": "b", "cost_usd": 0.75}),
            ],
        )
        assert codes(outcomes) == ["ok", "ok"]
        state = r.journal.policy.session(wf)
        assert state is not None and state.spent_usd == pytest.approx(0.95)
        assert r.journal.policy.spent("principal:support-agent") == pytest.approx(0.95)


async def test_temporal_retries_are_neither_repeats_nor_charged_twice(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(Limits(max_repeat_calls=1, session_budget_usd=1.0, costs={"flaky": 0.30}))
    async with policy_rig(dev_server, tmp_path, policy) as r:
        wf, outcomes = await session(r, [("flaky", "q")])
        assert codes(outcomes) == ["ok"]
        assert ran(wf) == ["q", "q"]  # two attempts of one execution
        state = r.journal.policy.session(wf)
        assert state is not None
        assert (state.total, state.streak, state.circuit) == (1, 1, None)
        assert state.spent_usd == pytest.approx(0.30)


async def test_a_rule_denial_names_the_argument_never_its_value(
    dev_server: DevServer, tmp_path: Path
) -> None:
    def dangerous(e: CallEvent) -> bool:
        return "drop table" in str(e.input).lower()

    policy = Policy(rules=[deny_when(dangerous, code="SQL_IN_QUERY", argument="query")])
    async with policy_rig(dev_server, tmp_path, policy) as r:
        secret_query = "x'; DROP TABLE customers; --"
        wf, outcomes = await session(r, [("search", secret_query), ("search", "fine")])
        assert codes(outcomes) == ["InterlockDenied:SQL_IN_QUERY", "ok"]
        message = outcomes[0]["message"]
        assert "argument 'query'" in message and "deny_when(dangerous)" in message
        assert "DROP" not in message
        assert ran(wf) == ["fine"]  # a rule's block does not open the circuit


async def test_monitor_mode_runs_what_a_rule_would_block_and_the_receipt_says_so(
    dev_server: DevServer, tmp_path: Path
) -> None:
    big = deny_when(
        lambda e: e.argument("amount_cents", 0) > 1000, code="OVER_10_USD", argument="amount_cents"
    )
    policy = Policy(rules=[big], mode="monitor")
    async with policy_rig(dev_server, tmp_path, policy) as r:
        result = await r.call(
            "refund",
            r.request(2000).model_dump(mode="json"),
            principal="refund-bot",
            lease=r.lease_id,
        )
        assert result["amount_cents"] == 2000
        assert r.payments.refunded_cents(ORDER) == 2000  # read from the service
        (effect,) = r.journal.effects()
        shown = receipt(effect.effect_id, journal=r.journal)
        assert (shown.final, shown.observed, shown.policy_code) == (
            "COMMITTED",
            True,
            "OVER_10_USD",
        )
        assert shown.policy_epoch == policy.epoch


# -- rules that misbehave ------------------------------------------------------------------------


def open_refund(payments: SimulatedPayments) -> Any:
    """A gated refund whose input is a plain dict: a rule can reach into it."""

    @activity.defn(name="refund_open")
    @gated(
        target=payments,
        key=lambda r: {"case": r["case_id"], "order": r["order_id"]},
        amount=lambda r: r["amount_cents"],
    )
    async def refund_open(r: dict[str, Any]) -> RefundResult:
        return await payments.refund(
            r["order_id"], r["amount_cents"], idempotency_key=current_effect().idempotency_key
        )

    return refund_open


def raises_refunds_in_place(e: CallEvent) -> None:
    """A rule that edits the call instead of returning ``modify(...)``."""
    if e.activity == "refund_open":
        e.input["amount_cents"] = 4_000
    if e.activity == "llm":
        e.input["prompt"] = "edited by a rule"


async def test_a_rules_in_place_edit_of_a_gated_refund_changes_nothing_sent(
    dev_server: DevServer, tmp_path: Path
) -> None:
    service = SimulatedPayments(tmp_path / "payments.db", tier=2)
    policy = Policy(rules=[raises_refunds_in_place])
    async with policy_rig(dev_server, tmp_path, policy, extra_more=[open_refund(service)]) as r:
        lease = r.journal.leases.issue("refund-bot", activities=["refund_open"])
        request = {"case_id": "4471", "order_id": ORDER, "amount_cents": 2_000}
        result = await r.call(
            "refund_open", request, principal="refund-bot", lease=lease, maximum_attempts=2
        )
        # the money, from the service: the amount the agent asked for, once
        (record,) = r.payments.refund_records(ORDER)
        assert record.amount_cents == 2_000 and result["amount_cents"] == 2_000
        # and the journal recorded as approved exactly what was sent
        (effect,) = r.journal.effects()
        assert r.journal.blob(effect.effect_id, "approved") == [request]
        shown = receipt(effect.effect_id, journal=r.journal)
        assert (shown.final, shown.via) == ("COMMITTED", "dispatch")
        assert r.journal.verify().ok
    service.close()


async def test_a_rules_in_place_edit_of_an_ungated_call_changes_nothing_the_body_sees(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(rules=[raises_refunds_in_place])
    async with policy_rig(dev_server, tmp_path, policy) as r:
        wf, outcomes = await session(r, [("llm", {"prompt": "draft the reply"})])
        assert codes(outcomes) == ["ok"]
        assert ran(wf, "llm") == ["draft the reply"]


def string_verdict(e: CallEvent) -> Decision:
    """Looks like a denial, but its verdict is a str, not a ``Verdict``."""
    return Decision("DENY", "TOO_LARGE", "refunds are capped")  # type: ignore[arg-type]


async def test_a_rule_with_a_verdict_the_engine_does_not_know_blocks(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(rules=[string_verdict], policy_id="refunds")
    async with policy_rig(dev_server, tmp_path, policy) as r:
        with pytest.raises(WorkflowFailureError) as failure:
            await r.call(
                "refund",
                r.request(2_000).model_dump(mode="json"),
                principal="refund-bot",
                lease=r.lease_id,
                maximum_attempts=2,
            )
        cause = cause_of(failure.value)
        assert cause.type == "InterlockDenied" and cause.non_retryable
        assert "RULE_ERROR" in cause.message and "string_verdict" in cause.message
        assert "verdict the engine does not know" in cause.message
        # the body never ran: the service saw no request at all
        assert r.payments.calls() == 0 and r.payments.refunded_cents(ORDER) == 0
        assert r.journal.effects() == []

        # an activity that is not gated: its body never ran either
        wf, outcomes = await session(r, [("search", "refund policy")])
        assert codes(outcomes) == ["InterlockDenied:RULE_ERROR"]
        assert ran(wf) == []


# -- approvals ---------------------------------------------------------------------------------

PAID: list[int] = []


class Transfer(BaseModel):
    to: str
    amount_cents: int


@activity.defn
async def wire(transfer: dict[str, Any]) -> dict[str, Any]:
    _ran("wire", transfer["amount_cents"])
    PAID.append(transfer["amount_cents"])
    return {"wired": transfer["amount_cents"]}


def over_threshold(e: CallEvent) -> Any:
    if e.activity == "wire" and e.argument("amount_cents", 0) > 5_000:
        return escalate("OVER_THRESHOLD", "wires over $50 need a person")
    return None


#: the payee, unique per test: review ids derive from the call, and the dev server outlives
#: each test, so two tests must not propose the same wire
PAYEE = ""


@pytest.fixture(autouse=True)
def fresh_payee() -> None:
    global PAYEE
    PAYEE = f"ACME-{uuid.uuid4().hex[:8]}"


async def start_approved(r: Rig, amount: int, session: str | None = None) -> Any:
    return await r.client.start_workflow(
        ApprovedCall.run,
        {
            "principal": "payments-agent",
            "activity": "wire",
            "arg": {"to": PAYEE, "amount_cents": amount},
            "session": session,
        },
        id=f"wire-{uuid.uuid4().hex[:8]}",
        task_queue=r.task_queue,
    )


async def approval_review(r: Rig, amount: int) -> Any:
    digest = input_digest(({"to": PAYEE, "amount_cents": amount},))
    binding = call_binding("wire", digest, "payments-agent")
    handle = r.client.get_workflow_handle(review_id("approval", binding))

    async def open_() -> bool:
        try:
            return (await handle.query("status"))["state"] == "open"
        except Exception:
            return False

    await until(open_)
    return handle, binding


async def test_an_escalated_call_runs_only_after_an_approval_and_exactly_once(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(rules=[over_threshold], policy_id="payments")
    async with policy_rig(dev_server, tmp_path, policy, extra_more=[wire]) as r:
        case = await start_approved(r, 6_000)
        review, binding = await approval_review(r, 6_000)
        assert ran(case.id) == []  # escalated: the body never ran
        status = await review.query("status")
        assert status["kind"] == "approval" and status["state"] == "open"
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await review.execute_update(
                "decide", {"decision": "approve", "operator": "payments-agent"}
            )
        assert "no self-approval" in str(refused.value.cause)
        await review.signal("resolve", {"decision": "approve", "operator": "carol"})
        assert await case.result() == {"ok": {"wired": 6_000}}
        assert ran(case.id) == [6_000]
        events = [(e.data["event"], e.data.get("code")) for e in r.journal.policy.events()]
        assert events == [
            ("escalate", "OVER_THRESHOLD"),
            ("approval_granted", None),
            ("approval_used", "APPROVED"),
        ]
        assert r.journal.policy.approval(binding).status == "consumed"  # type: ignore[union-attr]

        # the approval was used once: the same call again needs a person again
        again = await start_approved(r, 6_000)
        review2, _ = await approval_review(r, 6_000)
        await review2.signal("resolve", {"decision": "reject", "operator": "dave"})
        outcome = await again.result()
        assert outcome["error"] == "EffectRefused" and "dave" in outcome["message"]
        assert ran(again.id) == []
        assert r.journal.verify().ok


async def test_an_approval_does_not_cover_a_changed_amount(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(rules=[over_threshold])
    async with policy_rig(dev_server, tmp_path, policy, extra_more=[wire]) as r:
        session_id = f"s-{uuid.uuid4().hex[:6]}"
        first = await start_approved(r, 6_000, session=session_id)
        review, _ = await approval_review(r, 6_000)
        await review.signal(
            "resolve", {"decision": "approve", "operator": "carol", "scope": "session"}
        )
        assert (await first.result())["ok"] == {"wired": 6_000}
        # the session's approval covers the same call again...
        same = await start_approved(r, 6_000, session=session_id)
        assert (await same.result())["ok"] == {"wired": 6_000}
        # ...but not a changed amount: that escalates, and runs nothing until decided
        changed = await start_approved(r, 9_000, session=session_id)
        review_changed, _ = await approval_review(r, 9_000)
        assert ran(changed.id) == []
        await review_changed.signal("resolve", {"decision": "reject", "operator": "carol"})
        assert (await changed.result())["error"] == "EffectRefused"
        assert PAID.count(9_000) == 0


async def test_a_rejected_approval_ends_the_wait_in_effect_refused_read_from_the_journal(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """The journal says a person rejected the wire; the only signal the waiting workflow gets
    is an outsider's ``approve``. It wakes, runs the activity again, and the policy reads the
    rejection: ``EffectRefused`` naming who rejected it (not another ``ApprovalRequired``, not
    the wire). The same call asked again is refused at once, nobody is asked again, and the
    session's circuit stays closed: its next call runs."""
    policy = Policy(Limits(max_repeat_calls=2), rules=[over_threshold], policy_id="payments")
    async with policy_rig(dev_server, tmp_path, policy, extra_more=[wire]) as r:
        session_id = f"s-{uuid.uuid4().hex[:6]}"
        paid_before = PAID.count(6_000)  # PAID is the module's: other tests wire 6,000 too
        waiting = await start_approved(r, 6_000, session=session_id)
        review, binding = await approval_review(r, 6_000)
        r.journal.policy.decide_approval(
            binding, approve=False, operators=["dave"], note="not this payee"
        )
        plain = await Client.connect(dev_server.target)  # no plugin, no key
        await plain.get_workflow_handle(waiting.id).signal(
            "interlock.resolution",
            {
                "effect_id": binding,
                "kind": "approval",
                "state": "resolved",
                "decision": "approve",
                "operators": ["mallory"],
            },
        )
        outcome = await asyncio.wait_for(waiting.result(), 30)
        assert outcome == {"error": "EffectRefused", "message": "rejected by dave"}
        rejected = r.journal.policy.approval(binding)
        assert rejected is not None and rejected.status == "rejected"

        # the same call again: refused at once, and no person is asked again
        again = await start_approved(r, 6_000, session=session_id)
        assert await asyncio.wait_for(again.result(), 30) == outcome
        assert r.journal.policy.approval(binding).status == "rejected"  # type: ignore[union-attr]
        # the wire never ran: the payee was paid nothing
        assert ran(waiting.id) == ran(again.id) == [] and PAID.count(6_000) == paid_before
        # a person's no is not the agent misbehaving: the circuit is closed, the session goes on
        assert session_id not in r.journal.policy.open_circuits()
        small = await start_approved(r, 100, session=session_id)
        assert await small.result() == {"ok": {"wired": 100}}
        events = [(e.data["event"], e.data.get("code")) for e in r.journal.policy.events()]
        assert events == [
            ("escalate", "OVER_THRESHOLD"),
            ("approval_rejected", None),
            ("deny", "APPROVAL_REJECTED"),
            ("deny", "APPROVAL_REJECTED"),
        ]
        # the review, decided late, says what the journal holds
        late = await review.execute_update("decide", {"decision": "reject", "operator": "erin"})
        assert late["state"] == "resolved" and "already rejected by dave" in late["reason"]


# -- a policy file -------------------------------------------------------------------------------

WIRE_POLICY = """\
policy_id: payments
rules:
  - id: big-wires
    activity: wire
    when:
      amount_cents: {gt: 5000}
    verdict: escalate
    code: OVER_THRESHOLD
    reason: wires over $50 need a person
"""


async def test_an_approval_does_not_cover_a_new_policy_epoch(
    dev_server: DevServer, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(WIRE_POLICY)
    async with policy_rig(dev_server, tmp_path, str(path), extra_more=[wire]) as r:  # type: ignore[arg-type]
        session_id = f"s-{uuid.uuid4().hex[:6]}"
        first = await start_approved(r, 6_000, session=session_id)
        review, binding = await approval_review(r, 6_000)
        await review.signal(
            "resolve", {"decision": "approve", "operator": "carol", "scope": "session"}
        )
        assert (await first.result())["ok"] == {"wired": 6_000}
        granted_epoch = r.journal.policy.approval(binding).epoch  # type: ignore[union-attr]
        # the file changes (one word of a reason): a new epoch, and the old approval is void
        path.write_text(WIRE_POLICY.replace("a person", "a human"))
        await asyncio.sleep(0.7)  # the plugin looks at the file at most every 0.5 s
        again = await start_approved(r, 6_000, session=session_id)
        review2, _ = await approval_review(r, 6_000)
        assert ran(again.id) == []
        pending = r.journal.policy.approval(binding)
        assert pending is not None and pending.status == "pending"
        assert pending.epoch != granted_epoch
        await review2.signal("resolve", {"decision": "reject", "operator": "carol"})
        assert (await again.result())["error"] == "EffectRefused"
        assert PAID.count(6_000) >= 1 and ran(again.id) == []


async def test_a_policy_naming_an_argument_no_activity_has_stops_the_worker(
    dev_server: DevServer, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(WIRE_POLICY.replace("amount_cents: {gt", "amount_cent: {gt"))

    @activity.defn(name="wire")
    async def typed_wire(transfer: Transfer) -> str:
        return "never"

    with pytest.raises(PolicyError) as refused:
        async with policy_rig(dev_server, tmp_path, str(path), extra_more=[typed_wire]):  # type: ignore[arg-type]
            pass
    assert f"{path}:6: rules[0].when.amount_cent: wire has no argument 'amount_cent'" in str(
        refused.value
    )


SEARCH_POLICY = """\
policy_id: searches
rules:
  - id: no-forbidden-searches
    activity: search
    when: {query: forbidden}
    verdict: block
    code: FORBIDDEN_QUERY
"""


@activity.defn
async def ticker(seconds: float) -> float:
    """Heartbeats every 0.1 s for ``seconds`` on the worker's event loop and returns the longest
    gap between two beats: how long the loop was kept from it."""
    _ran("ticker", seconds)
    longest, last = 0.0, time.monotonic()
    end = last + seconds
    while (now := time.monotonic()) < end:
        longest, last = max(longest, now - last), now
        activity.heartbeat()
        await asyncio.sleep(0.1)
    return longest


def edit(path: Path, text: str) -> None:
    """Replace the file at once, as an operator's deploy does (a new inode)."""
    draft = path.with_suffix(".draft")
    draft.write_text(text)
    os.replace(draft, path)


async def test_a_policy_file_edited_into_an_alias_bomb_or_10_mb_under_a_running_worker(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file a worker follows is edited, while an activity heartbeats every 0.1 s under a
    2 s heartbeat timeout, into the 338-byte alias bomb and then into 10 MB: each is refused
    on the reload's thread (its line, its size), the activity's beats go on, and the last good
    policy goes on deciding. A good edit afterwards is followed, so the file was looked at."""
    path = tmp_path / "policy.yaml"
    path.write_text(SEARCH_POLICY)
    caplog.set_level(logging.WARNING, logger="interlock_temporal.policy")
    refused = "policy file changed but is not used (the last good one stays): "

    async def refusal(says: str) -> None:
        await until(lambda: refused + says in caplog.messages, f"the refusal {says!r}")

    async with policy_rig(dev_server, tmp_path, str(path), extra_more=[ticker]) as r:  # type: ignore[arg-type]
        beating = await r.client.start_workflow(
            CallActivity.run,
            {
                "activity": "ticker",
                "arg": 8.0,  # within CallActivity's 10 s start-to-close
                "principal": "support-agent",
                "heartbeat_s": 2,
                "maximum_attempts": 1,
            },
            id=f"ticker-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        await until(lambda: ran(beating.id, "ticker"), "the ticker's start")
        _, outcomes = await session(r, [("search", "forbidden"), ("search", "fine")])
        assert codes(outcomes) == ["InterlockDenied:FORBIDDEN_QUERY", "ok"]

        edit(path, alias_bomb())
        await asyncio.sleep(0.7)  # the plugin looks at the file at most every 0.5 s
        _, outcomes = await session(r, [("search", "forbidden"), ("search", "fine")])
        assert codes(outcomes) == ["InterlockDenied:FORBIDDEN_QUERY", "ok"]
        await refusal(f"{path}:2: a YAML anchor (&): {NO_ANCHORS}")

        edit(path, SEARCH_POLICY + ("# " + "x" * 97 + "\n") * 100_000)
        assert path.stat().st_size > 10_000_000
        await asyncio.sleep(0.7)
        _, outcomes = await session(r, [("search", "forbidden"), ("search", "fine")])
        assert codes(outcomes) == ["InterlockDenied:FORBIDDEN_QUERY", "ok"]
        await refusal(
            f"{path}: larger than {MAX_POLICY_BYTES} bytes, the most a policy file may be"
        )

        described = await beating.describe()
        assert described.status == WorkflowExecutionStatus.RUNNING  # beating all along
        # a good edit is followed, from the first call that notices it (which waits, off the
        # loop, for its parse)
        edit(path, SEARCH_POLICY.replace("{query: forbidden}", "{query: {in: [forbidden, fine]}}"))
        await asyncio.sleep(0.7)
        _, outcomes = await session(r, [("search", "fine")])
        assert codes(outcomes) == ["InterlockDenied:FORBIDDEN_QUERY"]
        longest = await beating.result()
        assert 0.1 <= longest < 1.0, longest
        assert len(ran(beating.id, "ticker")) == 1  # one attempt, never timed out


# -- secrets -------------------------------------------------------------------------------------

CANARY_CARD = "4111-CANARY-7734"
CANARY_KEY = "sk_live_CANARY_93aa"


class Charge(BaseModel):
    order_id: str
    amount_cents: int
    card_number: str
    api_key: SecretStr


class Ledger:
    """A minimal target: remembers what it charged, can be asked (tier 2)."""

    name = "ledger"
    dedupe_window = None
    settle_time = timedelta(0)

    def __init__(self) -> None:
        self.charged: dict[str, int] = {}

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {"open": True}

    def query(self, effect_id: str, args: Any) -> Found | None:
        amount = self.charged.get(effect_id)
        return None if amount is None else Found(result={"charged": amount})


LEDGER = Ledger()


@activity.defn
@gated(target=LEDGER, key=lambda c: {"order": c.order_id})
async def charge(c: Charge) -> dict[str, int]:
    _ran("charge", c.amount_cents)
    LEDGER.charged[current_effect().effect_id] = c.amount_cents
    return {"charged": c.amount_cents}


async def _is_open(handle: Any) -> bool:
    try:
        return (await handle.query("status"))["state"] == "open"
    except Exception:
        return False


async def test_secret_arguments_reach_no_receipt_review_journal_entry_or_log(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = Policy(
        Limits(hitl_activities=("charge",)), secret_arguments=["card_number"], policy_id="cards"
    )
    caplog.set_level(logging.DEBUG)
    async with policy_rig(dev_server, tmp_path, policy, extra_more=[charge]) as r:
        order = f"o-{uuid.uuid4().hex[:8]}"
        lease = r.journal.leases.issue("billing-agent", activities=["charge"])
        arg = {
            "order_id": order,
            "amount_cents": 4_200,
            "card_number": CANARY_CARD,
            "api_key": CANARY_KEY,
        }
        case = await r.client.start_workflow(
            ApprovedCall.run,
            {"principal": "billing-agent", "activity": "charge", "arg": arg, "lease": lease},
            id=f"charge-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        eid = effect_id("charge", {"order": order})
        review = r.client.get_workflow_handle(review_id("approval", eid))
        await until(lambda: _is_open(review))
        await review.signal("resolve", {"decision": "approve", "operator": "carol"})
        assert await case.result() == {"ok": {"charged": 4_200}}

        shown = receipt(eid, journal=r.journal)
        assert shown.final == "COMMITTED" and "approver:carol" in shown.decided_by
        everything = [
            shown.model_dump_json(),
            *(e.body.decode() for e in r.journal.read(eid)),
            *(e.body.decode() for e in r.journal.policy.events()),
            json.dumps(r.journal.policy.approval(eid).proposal),  # type: ignore[union-attr]
            *[str(ev) for ev in (await review.fetch_history()).events],
            caplog.text,
        ]
        for text in everything:
            assert CANARY_CARD not in text and CANARY_KEY not in text
        # the person deciding still saw what was asked, with the secrets masked
        proposal = r.journal.policy.approval(eid).proposal  # type: ignore[union-attr]
        assert proposal["amount_cents"] == 4_200 and proposal["card_number"] == "**********"
        # and no argument value reaches the receipt or the journal's signed entries
        for text in everything[:3]:
            assert order not in text.replace(eid, "")


async def test_an_operator_approves_from_the_command_line(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(rules=[over_threshold])
    async with policy_rig(dev_server, tmp_path, policy, extra_more=[wire]) as r:
        case = await start_approved(r, 8_000)
        _, binding = await approval_review(r, 8_000)
        ran_cli = await interlock(
            "reviews",
            "resolve",
            binding,
            "--kind",
            "approval",
            "--decision",
            "approve",
            "--operator",
            "erin",
            "--address",
            dev_server.target,
            cwd=tmp_path,
        )
        assert ran_cli.code == 0, ran_cli.err
        assert await case.result() == {"ok": {"wired": 8_000}}
        assert ran(case.id) == [8_000]


async def test_a_tripped_circuit_opens_a_review_a_person_resets_it_from(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(Limits(max_repeat_calls=1))
    async with policy_rig(dev_server, tmp_path, policy) as r:
        wf, outcomes = await session(r, [("search", "again")] * 2)
        assert codes(outcomes) == ["ok", "InterlockDenied:MAX_REPEAT_EXCEEDED"]
        review = r.client.get_workflow_handle(review_id("circuit", wf))
        await until(lambda: _is_open(review))
        status = await review.query("status")
        assert status["kind"] == "circuit"
        await review.signal("resolve", {"decision": "reset", "operator": "carol", "note": "ok"})
        decided = await review.result()
        assert decided["state"] == "resolved" and decided["operators"] == ["carol"]
        state = r.journal.policy.session(wf)
        assert state is not None and state.circuit is None
        reset = [e.data for e in r.journal.policy.events() if e.data["event"] == "circuit_reset"]
        assert [(e["operator"], e["note"]) for e in reset] == [("carol", "carol: ok")]
        wf2, after = await session(r, [("search", "something else")], session=wf)
        assert codes(after) == ["ok"] and ran(wf2) == ["something else"]


@activity.defn
async def lookup(customer: str) -> dict[str, Any]:
    _ran("lookup", customer)
    return {"customer": customer, "ssn": "078-05-1120", "leaked": customer == "bad"}


def redact_ssn(e: CallEvent) -> Any:
    if isinstance(e.result, dict) and "ssn" in e.result:
        return modify({**e.result, "ssn": "***"})
    return None


def no_leaks(e: CallEvent) -> Any:
    if isinstance(e.result, dict) and e.result.get("leaked"):
        return deny("LEAK", "the result carries data the agent must not see", argument="leaked")
    return None


async def test_result_rules_see_what_an_activity_returned(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(result_rules=[redact_ssn, no_leaks])
    async with policy_rig(dev_server, tmp_path, policy, extra_more=[lookup]) as r:
        wf, outcomes = await session(r, [("lookup", "c-1"), ("lookup", "bad")])
        assert outcomes[0] == {"ok": {"customer": "c-1", "ssn": "***", "leaked": False}}
        assert codes(outcomes)[1] == "InterlockDenied:LEAK"
        assert ran(wf) == ["c-1", "bad"]  # result rules run after the body


def drops_refund_results(e: CallEvent) -> Decision | None:
    """Replaces what a refund returned with None: a ``RefundResult`` cannot be None."""
    return modify(None) if e.activity == "refund" else None


#: the results a result rule saw after the rewrite
SEEN_RESULTS: list[Any] = []


def masks_refund_ids(e: CallEvent) -> Decision | None:
    """Rewrites a refund's result as a dict, its id masked and its amount a string: it is
    validated into the ``RefundResult`` the activity returns (the amount an int again)."""
    if e.activity != "refund" or not isinstance(e.result, RefundResult):
        return None
    rewrite = e.result.model_dump(mode="json")
    return modify({**rewrite, "refund_id": "re_***", "amount_cents": str(e.result.amount_cents)})


def looks_after(e: CallEvent) -> None:
    SEEN_RESULTS.append(e.result)


async def test_a_result_rules_modify_to_none_of_a_refund_result_blocks_naming_the_rule(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """``refund`` returns a ``RefundResult``: a rule's ``modify(None)`` of it is refused like a
    call's rewrite the body does not take, naming the rule; the refund was made, once (the
    denial withholds its result, never undoes it)."""
    policy = Policy(result_rules=[drops_refund_results])
    async with policy_rig(dev_server, tmp_path, policy) as r:
        with pytest.raises(WorkflowFailureError) as failure:
            await r.call(
                "refund",
                r.request(2_000).model_dump(mode="json"),
                principal="refund-bot",
                lease=r.lease_id,
                maximum_attempts=3,
            )
        cause = cause_of(failure.value)
        assert cause.type == "InterlockDenied" and cause.non_retryable
        assert cause.message == (
            "RULE_ERROR: rule drops_refund_results rewrote the result of refund into one it "
            "does not return (result: model_type) (policy drops_refund_results)"
        )
        (details,) = cause.details
        assert (details["code"], details["policy_id"]) == ("RULE_ERROR", "drops_refund_results")
        # the money, from the service: one refund of 20.00, one request
        (record,) = r.payments.refund_records(ORDER)
        assert record.amount_cents == 2_000 and r.payments.calls() == 1
        (effect,) = r.journal.effects()
        assert receipt(effect.effect_id, journal=r.journal).final == "COMMITTED"


async def test_a_result_rules_modify_that_validates_is_applied_as_the_return_type(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = Policy(result_rules=[masks_refund_ids, looks_after])
    SEEN_RESULTS.clear()
    async with policy_rig(dev_server, tmp_path, policy) as r:
        result = await r.call(
            "refund",
            r.request(2_000).model_dump(mode="json"),
            principal="refund-bot",
            lease=r.lease_id,
        )
        (record,) = r.payments.refund_records(ORDER)
        assert record.amount_cents == 2_000 and record.refund_id != "re_***"
        # the rewrite, coerced: its amount an int again, and a RefundResult to the next rule
        assert result == {
            "refund_id": "re_***",
            "order_id": ORDER,
            "amount_cents": 2_000,
            "replayed": False,
        }
        (seen,) = SEEN_RESULTS
        assert seen == RefundResult.model_validate(result)
