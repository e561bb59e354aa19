"""Temporal's record of who sent each vote: the recording worker reads, from the review's own
history, the client identity Temporal recorded for the ``resolve`` signal or ``decide`` Update
that carried each vote, and journals it beside the operator the vote claims. Evidence, never
proof: a client sets its identity (here: ``temporal --identity``, ``Client.connect(identity=)``).

The identities differ from the operators' names and from the worker's own client, and a vote
cannot carry one: a recorded identity can only have come from the history event."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from interlock_temporal._reviews.desk import _matched
from interlock_temporal._reviews.workflow import Arrival, ReviewStatus
from interlock_temporal.cli._render import render_receipt, render_review_status
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.models import Kind
from interlock_temporal.core.policy import Limits, Policy
from interlock_temporal.core.receipts import receipt
from interlock_temporal.core.review import ReviewRules, review_id
from interlock_temporal.core.review_rules import SENT_BY_CAVEAT, Vote
from interlock_temporal.targets.payments import RefundRequest
from interlock_temporal.testing import DevServer, temporal_cli
from workers.scenarios import ORDER
from workflows.activities import refund_key
from workflows.support_case import CaseFile, CaseOutcome, SupportCase

from . import test_policy_server as policy_tests
from .test_server import Rig, rig
from .waiting import until


class Review:
    """A refund left AMBIGUOUS (tier 3, the connection reset after the send), its review open
    and the support case waiting on it; the case id is the test's own."""

    def __init__(self) -> None:
        self.case_id = f"ident-{uuid.uuid4().hex[:8]}"
        request = RefundRequest(case_id=self.case_id, order_id=ORDER, amount_cents=2000)
        self.effect = effect_id("refund", refund_key(request))
        self.workflow_id = review_id("ambiguous", self.effect)

    async def open(self, r: Rig) -> tuple[WorkflowHandle[Any, CaseOutcome], Any]:
        r.payments.arm("after_commit", "reset")
        case = await r.client.start_workflow(
            SupportCase.run,
            CaseFile(
                case_id=self.case_id,
                order_id=ORDER,
                amount_cents=2000,
                lease_id=r.lease_id,
                maximum_attempts=1,
                wait_for_review=True,
            ),
            id=f"case-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        handle = r.client.get_workflow_handle(self.workflow_id)

        async def running() -> bool:
            try:
                return (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
            except RPCError:
                return False

        await until(running, "the review opened")
        return case, handle


async def temporal(address: str, *args: str) -> None:
    """The ``temporal`` CLI, as a person at a terminal runs it."""
    process = await asyncio.create_subprocess_exec(
        temporal_cli(),
        *args,
        "--address",
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, out.decode()


def resolved(r: Rig, eid: str) -> dict[str, Any]:
    (entry,) = [e for e in r.journal.read(eid) if e.kind is Kind.RESOLVED]
    return entry.data


async def person(dev_server: DevServer, identity: str) -> Client:
    """Someone else's Temporal client (no plugin), which names itself ``identity``."""
    return await Client.connect(
        dev_server.target, data_converter=pydantic_data_converter, identity=identity
    )


@pytest.mark.server
async def test_each_vote_records_the_identity_temporal_recorded_for_its_signal_or_update(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """Two operators must agree. Before carol's signal, one that the review ignores (counted
    among its ``resolve`` signals) and one it could not even decode (dropped before its
    handler); carol signals with the ``temporal`` CLI as ``someone@desk``; dave decides with
    the SDK as ``dave-sdk@laptop``. The journal, the receipt, the review's status and page and
    the CLI's rendering show each operator with the identity of their own signal or Update."""
    rules = ReviewRules(allowed_operators=["carol", "dave"], min_approvals=2)
    review = Review()
    async with rig(dev_server, tmp_path, tier=3, plugin_options={"review": rules}) as r:
        case, handle = await review.open(r)
        signal = ["workflow", "signal", "--workflow-id", review.workflow_id, "--name", "resolve"]
        # 1. ignored by the review (not a decision for it, not an allowed operator)
        await temporal(
            dev_server.target,
            *signal,
            "--identity",
            "mallory@elsewhere",
            "--input",
            '{"decision": "happened", "operator": "mallory"}',
        )
        # 2. input the workflow cannot decode: dropped before the handler ever sees it
        await temporal(
            dev_server.target,
            *signal,
            "--identity",
            "garbled@elsewhere",
            "--input-meta",
            "encoding=binary/garbled",
            "--input",
            '{"decision": "happened", "operator": "carol"}',
        )
        # 3. carol's vote
        await temporal(
            dev_server.target,
            *signal,
            "--identity",
            "someone@desk",
            "--input",
            '{"decision": "happened", "operator": "carol", "note": "on the statement"}',
        )

        async def voted() -> Any:
            status = await handle.query("status")
            return status if status["votes"] else None

        status = await until(voted, "carol's vote counted")
        assert [v["operator"] for v in status["votes"]] == ["carol"]
        assert any("mallory" in line for line in status["reported"])

        dave = (await person(dev_server, "dave-sdk@laptop")).get_workflow_handle(review.workflow_id)
        # a vote cannot carry an identity of its own (nor an arrival): it is refused whole
        for claim in ({"sent_by": "carol@trusted"}, {"identity": "x"}, {"arrival": {"signal": 1}}):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await dave.execute_update(
                    "decide", {"decision": "happened", "operator": "dave", **claim}
                )
            assert "extra_forbidden" in str(refused.value.cause), claim
        decided = await dave.execute_update(
            "decide", {"decision": "happened", "operator": "dave"}, result_type=ReviewStatus
        )
        assert decided.state == "resolved" and decided.operators == ["carol", "dave"]
        assert (await asyncio.wait_for(case.result(), 30)).status == "RESOLVED"

        expected = {"carol": "someone@desk", "dave": "dave-sdk@laptop"}
        data = resolved(r, review.effect)
        assert data["operators"] == ["carol", "dave"] and data["operator"] == "carol"
        assert data["sent_by"] == expected
        found = receipt(review.effect, journal=r.journal)
        assert found.sent_by == expected and found.operator == "carol"

        # the review's status and its page in the Web UI, beside the claimed operator
        assert {v["operator"]: v.get("sent_by") for v in decided.votes} == expected
        page = (await handle.query("__temporal_workflow_metadata")).current_details
        assert "`happened` by carol (sent by someone@desk)" in page
        assert "`happened` by dave (sent by dave-sdk@laptop)" in page
        assert SENT_BY_CAVEAT in page

        # the CLI's renderings (``reviews resolve``, ``effects show``)
        for shown in (render_review_status(decided), render_receipt(found)):
            (line,) = [x for x in shown.splitlines() if x.startswith("sent by:")]
            assert "carol: someone@desk, dave: dave-sdk@laptop" in line, shown
            assert SENT_BY_CAVEAT in line


@pytest.mark.server
async def test_an_update_with_start_records_its_identity(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """erin decides with update-with-start (attaching to the running review): the identity
    Temporal recorded for that Update is journaled."""
    review = Review()
    async with rig(dev_server, tmp_path, tier=3) as r:
        case, _ = await review.open(r)
        erin = await person(dev_server, "erin-uws@desk")
        start = WithStartWorkflowOperation(
            "EffectReview",
            {"kind": "ambiguous", "effect_id": review.effect, "activity": "refund"},
            id=review.workflow_id,
            task_queue=r.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        status = await erin.execute_update_with_start_workflow(
            "decide",
            {"decision": "happened", "operator": "erin"},
            start_workflow_operation=start,
            result_type=ReviewStatus,
        )
        assert status.state == "resolved"
        assert (await asyncio.wait_for(case.result(), 30)).status == "RESOLVED"
        assert resolved(r, review.effect)["sent_by"] == {"erin": "erin-uws@desk"}
        assert receipt(review.effect, journal=r.journal).sent_by == {"erin": "erin-uws@desk"}


@pytest.mark.server
async def test_an_approval_and_a_circuit_reset_record_the_identity(
    dev_server: DevServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approval's decision and a circuit's reset keep the identity beside the operators:
    on the approval, and in the signed policy entries."""
    monkeypatch.setattr(policy_tests, "PAYEE", f"ACME-{uuid.uuid4().hex[:8]}")
    policy = Policy(
        Limits(max_repeat_calls=1), rules=[policy_tests.over_threshold], policy_id="payments"
    )
    async with policy_tests.policy_rig(
        dev_server, tmp_path, policy, extra_more=[policy_tests.wire]
    ) as r:
        call = await policy_tests.start_approved(r, 6_000)
        review, binding = await policy_tests.approval_review(r, 6_000)
        approver = (await person(dev_server, "approver@desk")).get_workflow_handle(review.id)
        await approver.execute_update("decide", {"decision": "approve", "operator": "carol"})
        assert await call.result() == {"ok": {"wired": 6_000}}
        approval = r.journal.policy.approval(binding)
        assert approval is not None and approval.sent_by == {"carol": "approver@desk"}
        (granted,) = [
            e.data for e in r.journal.policy.events() if e.data["event"] == "approval_granted"
        ]
        assert granted["operators"] == ["carol"]
        assert granted["sent_by"] == {"carol": "approver@desk"}

        wf, outcomes = await policy_tests.session(r, [("search", "again")] * 2)
        assert policy_tests.codes(outcomes) == ["ok", "InterlockDenied:MAX_REPEAT_EXCEEDED"]
        circuit = r.client.get_workflow_handle(review_id("circuit", wf))
        await until(lambda: policy_tests._is_open(circuit), "the circuit's review opened")
        await temporal(
            dev_server.target,
            "workflow",
            "signal",
            "--workflow-id",
            circuit.id,
            "--name",
            "resolve",
            "--identity",
            "resetter@desk",
            "--input",
            '{"decision": "reset", "operator": "dave"}',
        )
        assert (await circuit.result())["state"] == "resolved"
        (reset,) = [e.data for e in r.journal.policy.events() if e.data["event"] == "circuit_reset"]
        assert reset["operator"] == "dave" and reset["sent_by"] == {"dave": "resetter@desk"}


def test_an_arrival_names_where_to_look_and_the_event_must_carry_that_very_vote() -> None:
    """What the review says of a vote's arrival is only where to look (a workflow task anyone
    polling the queue may run could say anything): the identity counts only when the event
    there carries that very vote. Each operator's first vote is the one that counts."""
    carol = Vote(decision="happened", operator="carol")
    dave = Vote(decision="happened", operator="dave", note="seen")
    erin = Vote(decision="happened", operator="erin")
    signals = [("mallory@elsewhere", Vote(decision="happened", operator="mallory"))]
    signals += [("someone@desk", carol), ("nobody@desk", None)]
    updates = {"u-1": ("dave-sdk@laptop", dave), "u-2": ("", erin)}
    votes = [carol, dave, erin, Vote(decision="not_happened", operator=" carol ")]
    arrivals: list[Arrival | None] = [
        Arrival(signal=2),
        Arrival(update="u-1"),
        Arrival(update="u-2"),
        Arrival(signal=1),
    ]
    found, unmatched = _matched(votes, arrivals, signals, updates)
    # a client that set no identity is recorded as such (""): its event was found
    assert found == {"carol": "someone@desk", "dave": "dave-sdk@laptop", "erin": ""}
    assert unmatched == []

    # pointed at someone else's event (mallory's signal, another Update), or at nothing
    wrong: list[Arrival | None] = [
        Arrival(signal=1),
        Arrival(update="u-2"),
        Arrival(signal=9),
        None,
    ]
    found, unmatched = _matched(votes, wrong, signals, updates)
    assert found == {} and unmatched == ["carol", "dave"]
    # a vote that differs in any field from what the event carried gets no identity
    edited = dave.model_copy(update={"note": "edited"})
    found, unmatched = _matched([edited], [Arrival(update="u-1")], signals, updates)
    assert found == {} and unmatched == ["dave"]
