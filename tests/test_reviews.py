"""The EffectReview workflow on a real server: a person's decision checked, counted once,
recorded in the journal, and heard by every workflow waiting on the effect."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError

from interlock_temporal._reviews.workflow import RESOLUTION_SIGNAL
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.models import Kind
from interlock_temporal.core.receipts import receipt
from interlock_temporal.core.review import ReviewRules, review_id
from interlock_temporal.targets.payments import RefundRequest
from interlock_temporal.testing import DevServer
from workers.scenarios import ORDER
from workflows.activities import refund_key
from workflows.support_case import CaseFile, CaseOutcome, SupportCase

from .server_workflows import CallActivity
from .test_server import Rig, rig
from .waiting import until

pytestmark = pytest.mark.server

CASE = "4471"


@pytest.fixture(autouse=True)
def fresh_case() -> None:
    """A case id of its own per test: the dev server outlives tests, and review ids derive from
    the effect id, so two tests on one case would meet each other's reviews."""
    global CASE, EFFECT, REVIEW
    CASE = f"4471-{uuid.uuid4().hex[:8]}"
    EFFECT = effect_id(
        "refund", refund_key(RefundRequest(case_id=CASE, order_id=ORDER, amount_cents=2000))
    )
    REVIEW = review_id("ambiguous", EFFECT)


EFFECT = ""
REVIEW = ""


async def start_case(r: Rig, **kw: Any) -> WorkflowHandle[Any, CaseOutcome]:
    fields: dict[str, Any] = {"maximum_attempts": 1, "wait_for_review": True, **kw}
    case = CaseFile(case_id=CASE, order_id=ORDER, amount_cents=2000, lease_id=r.lease_id, **fields)
    return await r.client.start_workflow(
        SupportCase.run,
        case,
        id=f"case-{uuid.uuid4().hex[:8]}",
        task_queue=r.task_queue,
    )


async def review_running(r: Rig) -> WorkflowHandle[Any, Any]:
    handle = r.client.get_workflow_handle(REVIEW)

    async def running() -> bool:
        try:
            return (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        except RPCError:
            return False

    await until(running)
    return handle


async def ambiguous(r: Rig, fault: str = "after_commit", **kw: Any) -> tuple[Any, Any]:
    """A refund whose send fails in doubt on the last attempt: AMBIGUOUS, a review open, the
    support case waiting on it."""
    r.payments.arm(fault, "reset")  # type: ignore[arg-type]
    case = await start_case(r, **kw)
    review = await review_running(r)
    return case, review


def resolved_count(r: Rig) -> int:
    return sum(1 for e in r.journal.read(EFFECT) if e.kind is Kind.RESOLVED)


async def test_the_update_validator_refuses_with_a_message(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        case, review = await ambiguous(r)
        for bad, says in [
            ({"decision": "approve", "operator": "carol"}, "not a decision for ambiguous reviews"),
            ({"decision": "happened", "operator": "  "}, "operator must name"),
            ({"decision": "happened", "operator": "refund-bot"}, "no self-approval"),
            ({"decision": "happened"}, "operator"),
        ]:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await review.execute_update("decide", bad)
            assert says in str(refused.value.cause), (bad, refused.value.cause)
        assert r.journal.row(EFFECT).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        status = await review.execute_update(
            "decide", {"decision": "happened", "operator": "carol", "note": "in the dashboard"}
        )
        assert status["state"] == "resolved" and status["operators"] == ["carol"]
        outcome = await case.result()
        assert outcome.status == "RESOLVED"
        shown = receipt(EFFECT, journal=r.journal)
        assert (shown.final, shown.executed, shown.operator) == ("RESOLVED", True, "carol")
        assert r.payments.refunded_cents(ORDER) == 2000


async def test_allow_list_and_minimum_approvals(dev_server: DevServer, tmp_path: Path) -> None:
    rules = ReviewRules(allowed_operators=["carol", "dave"], min_approvals=2)
    async with rig(dev_server, tmp_path, tier=3, plugin_options={"review": rules}) as r:
        case, review = await ambiguous(r)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await review.execute_update("decide", {"decision": "happened", "operator": "mallory"})
        assert "not on this review's list" in str(refused.value.cause)
        first = await review.execute_update("decide", {"decision": "happened", "operator": "carol"})
        assert first["state"] == "open" and len(first["votes"]) == 1
        with pytest.raises(WorkflowUpdateFailedError) as twice:
            await review.execute_update("decide", {"decision": "happened", "operator": "carol"})
        assert "already decided" in str(twice.value.cause)
        assert resolved_count(r) == 0
        second = await review.execute_update("decide", {"decision": "happened", "operator": "dave"})
        assert second["state"] == "resolved" and second["operators"] == ["carol", "dave"]
        assert (await case.result()).status == "RESOLVED"
        resolved = [e for e in r.journal.read(EFFECT) if e.kind is Kind.RESOLVED]
        assert [e.data["operators"] for e in resolved] == [["carol", "dave"]]


async def test_a_second_resolve_changes_nothing_and_is_reported(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        case, review = await ambiguous(r)
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        await review.signal("resolve", {"decision": "not_happened", "operator": "dave"})
        assert (await case.result()).status == "RESOLVED"
        status = await review.result()
        assert status["state"] == "resolved" and status["decision"] == "happened"
        assert any("dave" in line and "already" in line for line in status["reported"])
        assert resolved_count(r) == 1
        # once the review has ended, the server itself refuses another signal
        with pytest.raises(RPCError):
            await review.signal("resolve", {"decision": "not_happened", "operator": "erin"})
        assert resolved_count(r) == 1
        assert r.payments.refunded_cents(ORDER) == 2000 and r.payments.calls() == 1


async def test_eight_waiting_workflows_continue_after_one_resolution(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        first, review = await ambiguous(r)
        others = [await start_case(r) for _ in range(7)]

        async def all_subscribed() -> bool:
            return int((await review.query("status"))["subscribers"]) == 8

        await until(all_subscribed)
        # two AMBIGUOUS raises (eight, here) leave one review
        listed = [
            w
            async for w in r.client.list_workflows(
                f"WorkflowId = '{REVIEW}' AND ExecutionStatus = 'Running'"
            )
        ]
        assert len(listed) == 1
        refund = {"refund_id": "re_seen_by_carol", "order_id": ORDER, "amount_cents": 2000}
        await review.execute_update(
            "decide", {"decision": "happened", "operator": "carol", "result": refund}
        )
        outcomes = await asyncio.gather(*[h.result() for h in [first, *others]])
        assert {o.status for o in outcomes} == {"REFUNDED"}
        assert {o.refund.refund_id for o in outcomes if o.refund} == {"re_seen_by_carol"}
        assert r.payments.refunded_cents(ORDER) == 2000 and r.payments.calls() == 1
        assert resolved_count(r) == 1


async def test_an_attested_result_is_checked_against_the_return_type(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        case, review = await ambiguous(r)
        bad = {"refund_id": "re_1", "order_id": ORDER, "amount_cents": "a-secret-figure"}
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await review.execute_update(
                "decide", {"decision": "happened", "operator": "carol", "result": bad}
            )
        message = str(refused.value.cause)
        assert "does not match" in message and "amount_cents" in message
        assert "a-secret-figure" not in message
        assert (await review.query("status"))["state"] == "open"
        assert resolved_count(r) == 0
        await review.execute_update("decide", {"decision": "happened", "operator": "carol"})
        assert (await case.result()).status == "RESOLVED"


async def test_not_happened_resends_after_the_checks(dev_server: DevServer, tmp_path: Path) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        case, review = await ambiguous(r, fault="before_send")
        assert r.payments.refunded_cents(ORDER) == 0
        await review.signal("resolve", {"decision": "not_happened", "operator": "carol"})
        outcome = await case.result()
        assert outcome.status == "REFUNDED"
        shown = receipt(EFFECT, journal=r.journal)
        assert (shown.final, shown.via) == ("COMMITTED", "recovery-reapply")
        assert r.payments.refunded_cents(ORDER) == 2000
        assert len(r.payments.refund_records(ORDER)) == 1


async def test_not_happened_still_refuses_a_revoked_lease(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        case, review = await ambiguous(r, fault="before_send")
        r.journal.leases.revoke(r.lease_id)
        await review.signal("resolve", {"decision": "not_happened", "operator": "carol"})
        outcome = await case.result()
        assert outcome.status == "REFUSED"
        assert outcome.receipt is not None and outcome.receipt.code == "lease_at_recovery"
        assert r.payments.refunded_cents(ORDER) == 0


async def test_a_late_commit_closes_the_review(dev_server: DevServer, tmp_path: Path) -> None:
    """Attempt 1 stalls inside the send past its timeout; the last attempt finds it still in
    flight and declares AMBIGUOUS; then attempt 1's refund lands and its COMMITTED arrives late,
    closing the review with no person involved."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        r.payments.arm("before_send", "stall", arg=4.0)
        case = await start_case(
            r, maximum_attempts=2, start_to_close_s=1.0, heartbeat_s=None, initial_interval_s=0.2
        )
        review = await review_running(r)
        outcome = await asyncio.wait_for(case.result(), 30)
        status = await review.result()
        assert outcome.status == "REFUNDED" and outcome.refund is not None
        assert status["state"] == "closed"
        entries = r.journal.read(EFFECT)
        kinds = [e.kind for e in entries]
        assert kinds[-2:] == [Kind.AMBIGUOUS, Kind.COMMITTED]
        assert entries[-1].data["late"] is True and entries[-1].data["after"] == "AMBIGUOUS"
        assert receipt(EFFECT, journal=r.journal).executed is True
        assert r.payments.refunded_cents(ORDER) == 2000 and r.payments.calls() == 1


async def test_an_ambiguous_review_past_its_deadline_escalates_and_stays_open(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """Nobody may guess whether an effect in doubt happened: at its deadline the review is
    marked escalated and stays open (an approval expires: tests/test_notify.py)."""
    rules = ReviewRules(deadline_s=1.0)
    async with rig(dev_server, tmp_path, tier=3, plugin_options={"review": rules}) as r:
        case, review = await ambiguous(r)

        async def escalated() -> bool:
            return bool((await review.query("status"))["escalated"])

        await until(escalated, timeout=15)
        status = await review.query("status")
        assert status["state"] == "open" and status["reason"].startswith("escalated: ")
        assert r.journal.row(EFFECT).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        outcome = await asyncio.wait_for(case.result(), 30)
        assert outcome.status == "RESOLVED"


async def test_a_thread_pool_activity_opens_its_review(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        r.payments.arm("after_commit", "reset")
        request = r.request().model_copy(update={"case_id": CASE})
        handle = await r.client.start_workflow(
            CallActivity.run,
            {
                "activity": "refund_sync",
                "arg": request,
                "principal": "refund-bot",
                "lease": r.lease_id,
                "maximum_attempts": 1,
            },
            id=f"call-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        with pytest.raises(Exception):  # noqa: B017 - the workflow fails with AmbiguousEffect
            await handle.result()
        (row,) = r.journal.effects()
        assert row.status is Kind.AMBIGUOUS
        sync_review = r.client.get_workflow_handle(review_id("ambiguous", row.effect_id))
        assert (await sync_review.describe()).status == WorkflowExecutionStatus.RUNNING
        assert (await sync_review.query("status"))["subscribers"] == 1


async def test_a_decision_on_a_corrupt_effect_is_refused_and_records_nothing(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """The operator edits a signed field of the effect in doubt while its review is open: the
    person's decision is refused naming the corrupt entry, and the journal gets nothing."""
    import sqlite3

    async with rig(dev_server, tmp_path, tier=3) as r:
        case, review = await ambiguous(r)
        (dispatched,) = [e for e in r.journal.read(EFFECT) if e.kind is Kind.DISPATCHED]
        edited = dispatched.body.replace(b'"via":"dispatch"', b'"via":"tampered"')
        assert edited != dispatched.body
        with sqlite3.connect(tmp_path / "journal.db") as db:
            db.execute("UPDATE entries SET body = ? WHERE seq = ?", (edited, dispatched.seq))
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            decided = review.execute_update("decide", {"decision": "happened", "operator": "carol"})
            await asyncio.wait_for(decided, 30)  # a retryable failure would wait forever
        message = str(refused.value.cause)
        assert f"seq={dispatched.seq}" in message, message
        with sqlite3.connect(tmp_path / "journal.db") as db:
            kinds = [
                k for (k,) in db.execute("SELECT kind FROM entries WHERE effect_id = ?", (EFFECT,))
            ]
        assert "RESOLVED" not in kinds
        assert (await review.query("status"))["state"] == "open"
        await review.terminate()
        await case.terminate()


def test_the_vote_is_vote_and_decision_is_its_deprecated_alias() -> None:
    """A person's vote is ``Vote``, in ``interlock_temporal.review`` (the policy's verdict keeps
    ``Decision``, in ``interlock_temporal.policy``); the old root name still imports, with a
    warning."""
    import interlock_temporal
    from interlock_temporal import review
    from interlock_temporal.policy import Decision as PolicyDecision
    from interlock_temporal.review import Vote

    assert "Vote" in review.__all__ and "Decision" not in interlock_temporal.__all__
    with pytest.warns(
        DeprecationWarning,
        match=r"interlock_temporal\.Decision is deprecated: use interlock_temporal\.review\.Vote",
    ):
        from interlock_temporal import Decision
    assert Decision is Vote and Vote is not PolicyDecision
    vote = Vote.model_validate({"decision": "happened", "operator": "ann", "note": "seen"})
    assert vote.model_dump(exclude_none=True) == {
        "decision": "happened",
        "operator": "ann",
        "note": "seen",
    }


# -- a waiting workflow believes only the journal ------------------------------------------------

#: what someone with namespace access (no plugin, no key) tells the waiting workflow
FORGED_REFUND = {"refund_id": "re_forged", "order_id": ORDER, "amount_cents": 2000}


def forged_resolution() -> dict[str, Any]:
    return {
        "effect_id": EFFECT,
        "kind": "ambiguous",
        "state": "resolved",
        "decision": "happened",
        "operators": ["mallory"],
        "result": FORGED_REFUND,
    }


async def plain_client(dev_server: DevServer) -> Client:
    """A Temporal client as an outsider has one: no plugin, no key, the default converter."""
    return await Client.connect(dev_server.target)


async def refund_attempts(handle: WorkflowHandle[Any, Any]) -> tuple[int, int]:
    """How many ``refund`` activities the workflow scheduled, and how many of them failed."""
    scheduled = failed = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled += event.activity_task_scheduled_event_attributes.activity_type.name == (
                "refund"
            )
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            failed += 1
    return scheduled, failed


async def start_forged_early(r: Rig, plain: Client) -> WorkflowHandle[Any, Any]:
    """The support case, started by an outsider with a forged ``happened`` already in its
    mailbox: the signal arrives before the refund is even attempted."""
    case = CaseFile(
        case_id=CASE,
        order_id=ORDER,
        amount_cents=2000,
        lease_id=r.lease_id,
        maximum_attempts=1,
        wait_for_review=True,
    )
    started = await plain.start_workflow(
        "SupportCase",
        case.model_dump(mode="json"),
        id=f"case-{uuid.uuid4().hex[:8]}",
        task_queue=r.task_queue,
        start_signal=RESOLUTION_SIGNAL,
        start_signal_args=[forged_resolution()],
    )
    return r.client.get_workflow_handle(started.id, result_type=CaseOutcome)


async def still_waiting_after(case: WorkflowHandle[Any, Any], refunds: int) -> None:
    """The case ran ``refund`` ``refunds`` times, each ending AMBIGUOUS (a wake-up runs it
    again and the journal still says AMBIGUOUS), and it still waits."""

    async def ran() -> bool:
        scheduled, failed = await refund_attempts(case)
        return scheduled >= refunds and failed >= refunds

    await until(ran, f"{refunds} refund attempts", timeout=30)
    await asyncio.sleep(0.5)  # a workflow that believed the signal would be done by now
    assert (await case.describe()).status == WorkflowExecutionStatus.RUNNING


async def test_a_forged_resolution_changes_nothing_and_the_journal_decides(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """An outsider's ``happened`` with a forged refund, sent early (before the effect is in
    doubt) and again while the case waits: the case keeps waiting while the journal says
    AMBIGUOUS; after a person's decision it returns the result the journal records."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        plain = await plain_client(dev_server)
        r.payments.arm("after_commit", "reset")
        case = await start_forged_early(r, plain)
        review = await review_running(r)
        await still_waiting_after(case, 2)  # the first attempt, and the forged early wake-up
        await plain.get_workflow_handle(case.id).signal(RESOLUTION_SIGNAL, forged_resolution())
        await still_waiting_after(case, 3)
        assert r.journal.row(EFFECT).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        assert (await review.query("status"))["state"] == "open"

        seen = {"refund_id": "re_seen_by_carol", "order_id": ORDER, "amount_cents": 2000}
        await review.execute_update(
            "decide", {"decision": "happened", "operator": "carol", "result": seen}
        )
        outcome = await asyncio.wait_for(case.result(), 30)
        assert outcome.status == "REFUNDED" and outcome.refund is not None
        assert outcome.refund.refund_id == "re_seen_by_carol"
        # it came from the journal, through the gated activity's RESOLVED path
        scheduled, failed = await refund_attempts(case)
        assert scheduled == failed + 1
        shown = receipt(EFFECT, journal=r.journal)
        assert (shown.final, shown.operator) == ("RESOLVED", "carol")
        # the money, read from the payments service: one refund, sent once
        assert r.payments.refunded_cents(ORDER) == 2000 and r.payments.calls() == 1


async def test_a_forged_happened_does_not_stand_for_a_refund_that_never_went_out(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """The refund failed before it reached the service. A forged ``happened`` would have the
    agent report a refund nobody made; the case waits, and once a person says
    ``not_happened`` the refund goes out once, and the case reports the service's refund."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        plain = await plain_client(dev_server)
        r.payments.arm("before_send", "reset")
        case = await start_forged_early(r, plain)
        review = await review_running(r)
        await still_waiting_after(case, 2)
        assert r.payments.refunded_cents(ORDER) == 0
        await review.signal("resolve", {"decision": "not_happened", "operator": "carol"})
        outcome = await asyncio.wait_for(case.result(), 30)
        (record,) = r.payments.refund_records(ORDER)
        assert outcome.status == "REFUNDED" and outcome.refund is not None
        assert outcome.refund.refund_id == record.refund_id != "re_forged"
        assert r.payments.refunded_cents(ORDER) == 2000


async def test_a_forged_settled_neither_closes_the_review_nor_answers_the_case(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """An outsider's ``settled`` (the signal a late COMMITTED sends the review) with a forged
    result: the review asks the journal, which records no COMMITTED, and stays open; the case
    keeps waiting, and gets what a person decides."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        case, review = await ambiguous(r)
        plain = await plain_client(dev_server)
        forged = receipt(EFFECT, journal=r.journal).model_dump(mode="json")
        forged.update(final="COMMITTED", executed=True)
        await plain.get_workflow_handle(REVIEW).signal(
            "settled", {"receipt": forged, "result": FORGED_REFUND}
        )

        async def checked() -> bool:
            status = await review.query("status")
            return any("no COMMITTED" in line for line in status["reported"])

        await until(checked, "the review's journal check")
        status = await review.query("status")
        assert status["state"] == "open" and status["receipt"] is None
        assert r.journal.row(EFFECT).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        assert (await case.describe()).status == WorkflowExecutionStatus.RUNNING
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        outcome = await asyncio.wait_for(case.result(), 30)
        assert outcome.status == "RESOLVED" and outcome.refund is None
        assert (await review.result())["state"] == "resolved"
        assert r.payments.refunded_cents(ORDER) == 2000 and r.payments.calls() == 1
