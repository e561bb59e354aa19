"""What escapes the gate: the worker's start line, on a real Temporal dev server and a real SQLite
journal. A worker with ``send_email`` (it sends, and is neither gated nor named by a policy)
names it when it starts."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from interlock_temporal.policy import Limits, Policy, deny_activity, parse_policy
from interlock_temporal.testing import DevServer

from . import doctor_workers
from .waiting import until

pytestmark = pytest.mark.server


# -- what a policy names -----------------------------------------------------------------------


def test_a_policy_names_an_activity_by_a_glob_other_than_the_catch_all() -> None:
    policy = Policy(
        Limits(costs={"llm_*": 0.02}, hitl_activities=("refund_*",)),
        rules=[deny_activity("send_*")],
    )
    assert policy.naming("send_email") == ["rule deny_activity(send_*)"]
    assert policy.naming("llm_call") == ["limits.costs['llm_*']"]
    assert policy.naming("refund_card") == ["limits.hitl_activities['refund_*']"]
    assert policy.naming("lookup") == []
    everything = parse_policy(
        "rules:\n  - id: all\n    verdict: block\n  - id: mail\n    activity: send_email\n"
        "    verdict: escalate\n",
        "p.yaml",
    )
    # a rule with no `activity` (the catch-all) names nothing in particular
    assert everything.naming("send_email") == ["rule mail"]
    assert everything.naming("lookup") == []
    assert Policy(rules=[deny_activity("*")]).naming("send_email") == []


# -- the start line ----------------------------------------------------------------------------


def _env(dev_server: DevServer, workdir: Path, task_queue: str) -> dict[str, str]:
    return {
        "TEMPORAL_ADDRESS": dev_server.target,
        "INTERLOCK_JOURNAL": f"sqlite:///{workdir / 'journal.db'}",
        "DOCTOR_DIR": str(workdir),
        "DOCTOR_TASK_QUEUE": task_queue,
    }


def _queue() -> str:
    return f"doctor-{uuid.uuid4().hex[:10]}"


async def test_the_start_line_counts_each_class_and_names_the_ungated_activity(
    dev_server: DevServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name, value in _env(dev_server, tmp_path, _queue()).items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.INFO, logger="interlock_temporal")
    worker = await doctor_workers.unguarded()

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "interlock: activities:" in r.message]

    async with worker:
        await until(lambda: bool(said()), timeout=10)
    (line,) = said()  # one line per worker
    assert line.startswith(
        "interlock: activities: 2 gated (tier 1: 1, tier 2: 1), 1 policed only, 1 neither "
        "(send_email: may have side effects nobody guards"
    ), line
    # the gate's own activities (review desk, reconciler, notifier) are not the user's
    assert "record_decision" not in line and "reconcile" not in line
