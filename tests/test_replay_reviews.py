"""Reviews already open when a worker is upgraded must keep replaying: ``EffectReview``
histories recorded before notifications and default deadlines (a review resolved by a person,
and an approval and an AMBIGUOUS review that reached their deadline) replay against today's
workflow, whose changes are guarded by ``workflow.patched``. See
``tests/histories/record_reviews.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from interlock_temporal import InterlockPlugin
from interlock_temporal._reviews.workflow import ReviewRequest, ReviewStatus

HISTORIES = sorted((Path(__file__).parent / "histories" / "reviews").glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json("recorded", json.loads(path.read_text()))


def test_there_are_review_histories_to_replay() -> None:
    assert {p.name for p in HISTORIES} >= {
        "effect_review_resolved.json",
        "effect_review_approval_deadline.json",
        "effect_review_ambiguous_deadline.json",
        # a sealed review, whose settled signal is checked against the journal
        "effect_review_resolved.sealed.json",
    }


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_a_review_recorded_before_notifications_replays(path: Path) -> None:
    # the plugin brings the EffectReview workflow and the converter, as on a worker
    replayer = Replayer(workflows=[], plugins=[InterlockPlugin("sqlite:///unused.db")])
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=True)
    assert result.replay_failure is None


@workflow.defn(name="EffectReview")
class ReviewThatForgotItsDeadline:
    """A careless change: the review waits for nothing and ends at once."""

    @workflow.run
    async def run(self, req: ReviewRequest) -> ReviewStatus:
        return ReviewStatus(kind=req.kind, effect_id=req.effect_id, state="expired")


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_a_changed_review_fails_to_replay(path: Path) -> None:
    """The check has teeth: the same histories do not replay against a changed workflow."""
    replayer = Replayer(
        workflows=[ReviewThatForgotItsDeadline], data_converter=pydantic_data_converter
    )
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
    assert result.replay_failure is not None
