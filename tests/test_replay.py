"""Workflows already waiting on a review must keep replaying after an upgrade: recorded
histories of the support case (resolved happened; resolved not_happened and re-run) replay
against today's ``SupportCase`` and ``execute_effect``. Regenerate them only with the care
``tests/histories/record.py`` describes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from interlock_temporal import InterlockPlugin
from workflows.support_case import CaseFile, CaseOutcome, SupportCase

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    doc = json.loads(path.read_text())
    return WorkflowHistory.from_json("recorded", doc)


def replayer(*workflows: type) -> Replayer:
    # the plugin brings the interceptors (act_as headers), the converter and the review workflows
    return Replayer(workflows=list(workflows), plugins=[InterlockPlugin("sqlite:///unused.db")])


def test_there_are_histories_to_replay() -> None:
    assert {p.name for p in HISTORIES} >= {
        "support_case_review_happened.json",
        "support_case_review_not_happened.json",
        # a waiting workflow that believes only the journal (WAKE_PATCH)
        "support_case_review_happened.sealed.json",
        "support_case_review_not_happened.sealed.json",
    }


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_a_recorded_history_replays(path: Path) -> None:
    result = await replayer(SupportCase).replay_workflow(load(path), raise_on_replay_failure=True)
    assert result.replay_failure is None


@workflow.defn(name="SupportCase")
class SupportCaseThatForgotTheAgent:
    """A careless change: the refund no longer waits for the agent's decision activity."""

    @workflow.run
    async def run(self, case: CaseFile) -> CaseOutcome:
        await workflow.execute_activity(
            "refund", case, start_to_close_timeout=timedelta(seconds=10)
        )
        return CaseOutcome(case_id=case.case_id, status="REFUNDED")


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_a_changed_workflow_fails_to_replay(path: Path) -> None:
    """The check has teeth: the same histories do not replay against a changed workflow."""
    result = await replayer(SupportCaseThatForgotTheAgent).replay_workflow(
        load(path), raise_on_replay_failure=False
    )
    assert result.replay_failure is not None
