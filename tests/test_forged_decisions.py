"""Decisions nobody can forge: tried as an outsider with only a Temporal client (no plugin, no
key), on a tier-3 email whose send landed and whose record did not (AMBIGUOUS: nobody can know).

The outsider starts an ``EffectReview`` of their own under any id with rules of their own and
votes as the agent's own principal; runs workflow tasks of their own that call the record
activity as a review would; takes the review's canonical id first; starts the record activity on
its own. None of it records a decision, the email is not sent again (read from the SMTP
server), and the genuine review, opened by a worker, is the one a person decides in."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import ActivityFailureError, Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from interlock_temporal import receipt
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.review_rules import ReviewRules, review_id
from interlock_temporal.testing import DevServer, temporal_cli
from workers.scenarios import ORDER

from .test_server import rig
from .test_target_email import Server, crash_after_send, email, journal, smtp

__all__ = ["journal", "smtp"]  # the email tests' fixtures, used here too

RECORD = "interlock.record_decision"


@workflow.defn(name="EffectReview", sandboxed=False)
class OutsidersReview:
    """What an outsider's own worker runs as a "review": it calls the record activity on the
    genuine workers' task queue with the decision it wants."""

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> Any:
        return await workflow.execute_activity(
            RECORD,
            spec["record"],
            task_queue=spec["queue"],
            start_to_close_timeout=timedelta(seconds=20),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


def forged(effect_id: str, decision: str, operator: str) -> dict[str, Any]:
    """A record of a decision, as a forger writes it: every vote it likes."""
    vote = {"decision": decision, "operator": operator, "note": "forged"}
    return {
        "kind": "ambiguous",
        "effect_id": effect_id,
        "decision": decision,
        "operators": [operator],
        "votes": [vote],
    }


async def temporal(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        temporal_cli(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, out.decode()
    return out.decode()


def refused_as_not_genuine(error: BaseException, *words: str) -> None:
    cause = error.cause if isinstance(error, ActivityError | ActivityFailureError) else error
    assert isinstance(cause, ApplicationError), cause
    assert cause.type == "InvalidDecision" and cause.non_retryable, cause.message
    assert "not a genuine review" in cause.message, cause.message
    for word in words:
        assert word in cause.message, cause.message


@pytest.mark.server
async def test_an_outsider_can_neither_decide_nor_resend_a_tier_3_email(
    client: Client, journal: Journal, smtp: tuple[Server, int], tmp_path: Path
) -> None:
    run, workers = await crash_after_send(client, journal, smtp, tmp_path, tier=3)
    try:
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(run.result(), 60)
        (row,) = journal.effects()
        eid = row.effect_id
        assert receipt(eid, journal=journal).final == "AMBIGUOUS"
        queue = (await run.describe()).task_queue
        canonical = review_id("ambiguous", eid)
        outsider = await Client.connect(client.service_client.config.target_host)

        # 1. a review of their own, under any id, with empty rules: a vote as the agent itself
        mine = await outsider.start_workflow(
            "EffectReview",
            {"kind": "ambiguous", "effect_id": eid, "activity": "send_email", "rules": {}},
            id=f"not-a-review-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        await mine.signal("resolve", {"decision": "not_happened", "operator": "mail-bot"})
        status = await asyncio.wait_for(mine.result(), 30)
        assert status["state"] == "closed" and "not a genuine review" in status["reason"]

        # 2. their own workflow tasks, as a "review" under the canonical id (taken first: the
        # genuine review is terminated, as anyone with namespace access may), calling the record
        await client.get_workflow_handle(canonical).terminate("an outsider took the id")
        own_queue = f"outsider-{uuid.uuid4().hex[:8]}"
        async with Worker(
            outsider,
            task_queue=own_queue,
            workflows=[OutsidersReview],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            for workflow_id in (canonical, f"interlock-review-ambiguous-{uuid.uuid4().hex}"):
                spec = {"queue": queue, "record": forged(eid, "not_happened", "mail-bot")}
                with pytest.raises(WorkflowFailureError) as failed:
                    await outsider.execute_workflow(
                        "EffectReview", spec, id=workflow_id, task_queue=own_queue
                    )
                assert isinstance(failed.value.cause, ActivityError)
                refused_as_not_genuine(failed.value.cause)
            # the canonical id is taken again, and held open on the outsider's own queue
            held = await outsider.start_workflow(
                "EffectReview",
                {"queue": queue, "record": forged(eid, "happened", "carol")},
                id=canonical,
                task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
                start_signal="subscribe",
                start_signal_args=[{"workflow_id": "a-workflow-waiting-on-it"}],
            )

        # 3. the record activity started on its own
        standalone = f"record-{uuid.uuid4().hex[:8]}"
        await temporal(
            "activity",
            "start",
            "--address",
            client.service_client.config.target_host,
            "--task-queue",
            queue,
            "--type",
            RECORD,
            "--activity-id",
            standalone,
            "--start-to-close-timeout",
            "10s",
            "--input",
            json.dumps(forged(eid, "not_happened", "carol")),
        )
        with pytest.raises(ActivityFailureError) as alone:
            await asyncio.wait_for(client.get_activity_handle(standalone).result(), 30)
        refused_as_not_genuine(alone.value, "started on its own")
        # ... and the journal's answer on whether it committed is not for an outsider either
        asked = f"committed-{uuid.uuid4().hex[:8]}"
        await temporal(
            "activity",
            "start",
            "--address",
            client.service_client.config.target_host,
            "--task-queue",
            queue,
            "--type",
            "interlock.committed",
            "--activity-id",
            asked,
            "--start-to-close-timeout",
            "10s",
            "--input",
            json.dumps(eid),
        )
        with pytest.raises(ActivityFailureError) as answered:
            await asyncio.wait_for(client.get_activity_handle(asked).result(), 30)
        refused_as_not_genuine(answered.value, "not answered", "started on its own")

        # nothing was recorded, and the owner's next attempt sends nothing: it is still in doubt
        assert receipt(eid, journal=journal).final == "AMBIGUOUS"
        again = await client.start_workflow(
            "CallActivity",
            {
                "activity": "send_email",
                "arg": email("ada@example.org").model_dump(mode="json"),
                "principal": "mail-bot",
                "lease": receipt(eid, journal=journal).lease_id,
                "heartbeat_s": 1,
            },
            id=f"mail-again-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as still:
            await asyncio.wait_for(again.result(), 60)
        assert isinstance(still.value.cause, ActivityError)
        cause = still.value.cause.cause
        assert isinstance(cause, ApplicationError) and cause.type == "AmbiguousEffect"
        (stored,) = smtp[0].messages()  # one email: the one the crashed attempt sent
        assert stored["Message-ID"] == f"<{eid}@example.com>"

        # the outsider's review under the canonical id did not block or shape the real one:
        # the next attempt's review replaced it, and a person decides there
        replaced = client.get_workflow_handle(canonical, run_id=held.result_run_id)
        assert (await replaced.describe()).status.name == "TERMINATED"
        real = client.get_workflow_handle(canonical)
        status = await real.query("status")
        # open, and whoever the outsider's review said waited on it waits on this one too
        assert status["state"] == "open" and status["subscribers"] == 2
        decided = await real.execute_update(
            "decide", {"decision": "happened", "operator": "carol", "note": "in the outbox"}
        )
        assert decided["state"] == "resolved"
        done = receipt(eid, journal=journal)
        assert (done.final, done.operator) == ("RESOLVED", "carol")
        assert len(smtp[0].messages()) == 1
    finally:
        for w in workers:
            await w.stop()


#: what the outsider's workflow code below sends to the record activity, set by the test
FORGING: dict[str, Any] = {}


@workflow.defn(name="EffectReview", sandboxed=False)
class OutsiderRunsTheGenuineReview:
    """An outsider polling the reviews' task queue runs the genuine review's workflow tasks:
    its request (sealed by the worker) is genuine; the votes it sends are the outsider's."""

    @workflow.run
    async def run(self, request: dict[str, Any]) -> Any:
        return await workflow.execute_activity(
            RECORD,
            FORGING["record"],
            task_queue=FORGING["queue"],
            start_to_close_timeout=timedelta(seconds=20),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


@pytest.mark.server
@pytest.mark.parametrize(
    "votes",
    [
        [{"decision": "not_happened", "operator": "refund-bot"}],  # the agent's own principal
        [{"decision": "not_happened", "operator": "mallory"}],  # not an allowed operator
        [{"decision": "not_happened", "operator": "carol"}],  # one of the two that must agree
    ],
    ids=["self", "not-allowed", "too-few"],
)
async def test_votes_are_counted_again_where_they_are_recorded(
    dev_server: DevServer, tmp_path: Path, votes: list[dict[str, Any]]
) -> None:
    """The review's request is genuine, but an outsider runs its workflow tasks: the votes
    reach the record activity unchecked by any review, and it counts them again under the
    worker's rules and the principal the journal recorded. The money moved once."""
    reviews = f"reviews-{uuid.uuid4().hex[:8]}"  # polled by the outsider alone
    rules = ReviewRules(allowed_operators=["carol", "dave"], min_approvals=2)
    options = {"review": rules, "review_task_queue": reviews}
    async with rig(dev_server, tmp_path, tier=3, plugin_options=options) as r:
        r.payments.arm("after_commit", "reset")
        case = await r.client.start_workflow(
            "CallActivity",
            {
                "activity": "refund",
                "arg": r.request().model_dump(mode="json"),
                "principal": "refund-bot",
                "lease": r.lease_id,
                "maximum_attempts": 1,
            },
            id=f"case-{uuid.uuid4().hex[:8]}",
            task_queue=r.task_queue,
        )
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(case.result(), 60)
        (row,) = r.journal.effects()
        assert row.status is Kind.AMBIGUOUS
        FORGING.update(
            queue=r.task_queue,
            record={
                "kind": "ambiguous",
                "effect_id": row.effect_id,
                "decision": "not_happened",
                "operators": [v["operator"] for v in votes],
                "votes": votes,
            },
        )
        outsider = await Client.connect(dev_server.target)  # no plugin, no key
        async with Worker(
            outsider,
            task_queue=reviews,
            workflows=[OutsiderRunsTheGenuineReview],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            review = r.client.get_workflow_handle(review_id("ambiguous", row.effect_id))
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(review.result(), 30)
        cause = failed.value.cause
        assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
        assert "reach no decision under this worker's rules" in cause.cause.message
        assert receipt(row.effect_id, journal=r.journal).final == "AMBIGUOUS"
        assert r.payments.refunded_cents(ORDER) == 2000 and r.payments.calls(ORDER) == 1
