"""What escapes the gate: the worker's start line and ``interlock doctor``, on a real Temporal dev
server and real SQLite journals. A worker with ``send_email`` (it sends, and is neither gated nor
named by a policy) is named by both and makes the doctor exit 1; a worker whose activities are
all gated or declared ``no_effects`` exits 0; ``--json`` holds the fields docs/operator-guide.md
documents; ``--task-queue`` names a poller of another journal."""

from __future__ import annotations

import logging
import re
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalAgent
from pydantic_ai.models.test import TestModel
from temporalio import activity
from temporalio.activity import _Definition
from temporalio.mcp import MCPPlugin

from interlock_temporal._worker.coverage import classify
from interlock_temporal.cli.doctor import DoctorReport, JournalHealth, PolicySummary, Poller
from interlock_temporal.core import open_journal
from interlock_temporal.core.coverage import ActivityCoverage
from interlock_temporal.core.journal_identity import journal_id_of
from interlock_temporal.policy import Limits, Policy, deny_activity, parse_policy
from interlock_temporal.testing import DevServer

from . import doctor_workers
from .review_rig import interlock
from .waiting import until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]


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


def _named(functions: list[Any]) -> list[tuple[str, Any]]:
    return [(_Definition.must_from_callable(fn).name or "", fn) for fn in functions]


def test_agent_integrations_model_calls_and_listings_are_policed_their_tool_calls_not() -> None:
    """The activities Pydantic AI's and temporalio-mcp's integrations register, built for real:
    a model request or a listing sends nothing a person gates (policed, saying by whom), a tool
    call is what sends (neither, until it is gated); Pydantic AI's event-stream activity counts
    only without a handler; a function of the user's with the integration's name does not."""

    def lookup_order(order_id: str) -> str:
        return order_id

    async def handler(ctx: Any, events: Any) -> None:
        async for _ in events:
            pass

    with warnings.catch_warnings():  # TemporalAgent: the older wrapper, the same activities
        warnings.simplefilter("ignore")
        plain = TemporalAgent(Agent(TestModel(), name="plain", tools=[lookup_order]))
        handled = TemporalAgent(Agent(TestModel(), name="handled"), event_stream_handler=handler)
    mcp = MCPPlugin({"files": lambda: None})  # the factory is called only when a call runs

    async def request_activity() -> None:  # the integration's function name, the user's code
        return None

    functions = [
        *plain.temporal_activities,
        *handled.temporal_activities,
        *mcp.activities,
        activity.defn(name="request_activity")(request_activity),
    ]
    found = {a.name: a for a in classify(_named(functions), {}, None).activities}
    assert found["agent__plain__model_request"].coverage == "policed"
    assert found["agent__plain__model_request"].integration == "Pydantic AI's model call"
    assert found["agent__plain__event_stream_handler"].coverage == "policed"
    assert found["agent__handled__event_stream_handler"].coverage == "neither"
    tool_calls = [n for n in found if n.endswith("call_tool") or n.endswith("call-tool")]
    assert tool_calls and all(found[n].coverage == "neither" for n in tool_calls), tool_calls
    assert (
        found["temporalio.mcp.files.list-tools"].integration == "temporalio-mcp's listing or read"
    )
    assert found["request_activity"].coverage == "neither"
    assert {a.integration for a in found.values() if a.coverage == "neither"} == {None}


# -- interlock doctor --worker ---------------------------------------------------------------


async def test_doctor_names_the_ungated_activity_and_exits_1(
    dev_server: DevServer, tmp_path: Path
) -> None:
    env = _env(dev_server, tmp_path, _queue())
    ran = await interlock(
        "doctor", "--worker", "tests.doctor_workers:unguarded", cwd=tmp_path, env=env
    )
    assert ran.code == 1, (ran.out, ran.err)
    assert re.search(r"^  send_email +NEITHER +may have side effects", ran.out, re.M), ran.out
    assert re.search(r"^  refund_card +gated +tier 1, target cards$", ran.out, re.M), ran.out
    assert re.search(r"^  lookup_order +policed +declared no_effects$", ran.out, re.M), ran.out
    assert "PROBLEM: activity send_email is neither gated nor policed" in ran.out
    assert "Traceback" not in ran.err


async def test_doctor_on_a_clean_worker_exits_0_and_its_json_holds_the_documented_fields(
    dev_server: DevServer, tmp_path: Path
) -> None:
    task_queue = _queue()
    env = _env(dev_server, tmp_path, task_queue)
    argv = ("doctor", "--worker", "tests.doctor_workers:clean")
    plain = await interlock(*argv, cwd=tmp_path, env=env)
    assert plain.code == 0, (plain.out, plain.err)
    assert plain.out.rstrip().endswith("\nok"), plain.out
    ran = await interlock(*argv, "--json", cwd=tmp_path, env=env)
    assert ran.code == 0, (ran.out, ran.err)
    doc = ran.json()
    report = DoctorReport.model_validate(doc)
    assert set(doc) == set(DoctorReport.model_fields)
    assert (report.worker, report.task_queue) == ("tests.doctor_workers:clean", task_queue)
    assert [(a.name, a.coverage, a.tier) for a in report.activities] == [
        ("lookup_order", "policed", None),
        ("refund_bank", "gated", 2),
        ("refund_card", "gated", 1),
    ]
    assert (report.gated, report.gated_by_tier, report.policed) == (2, {"1": 1, "2": 1}, 1)
    assert report.neither == [] and report.problems == []
    with open_journal(tmp_path / "journal.db") as journal:
        journal_id = journal_id_of(journal, create=False)
    assert report.journal is not None and journal_id is not None
    assert report.journal.journal_id == journal_id
    assert report.journal.last_entry_ok and report.journal.can_sign
    assert report.journal.url.endswith("journal.db")
    assert report.server_version  # the dev server says its version
    assert report.pollers == []  # built, never started: nothing polls the fresh queue


async def test_a_policy_file_that_names_the_activity_polices_it_and_its_warnings_are_shown(
    dev_server: DevServer, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "policy_id: mail\n"
        "rules:\n"
        "  - id: mail-needs-a-person\n"
        "    activity: send_email\n"
        "    verdict: escalate\n"
        "  - id: typo\n"
        "    activity: send_emial\n"
        "    verdict: block\n"
    )
    env = {**_env(dev_server, tmp_path, _queue()), "DOCTOR_POLICY": str(policy)}
    ran = await interlock(
        "doctor", "--worker", "tests.doctor_workers:unguarded", "--json", cwd=tmp_path, env=env
    )
    assert ran.code == 0, (ran.out, ran.err)
    report = DoctorReport.model_validate(ran.json())
    by_name = {a.name: a for a in report.activities}
    assert by_name["send_email"].coverage == "policed"
    assert by_name["send_email"].named_by == ["rule mail-needs-a-person"]
    assert report.neither == [] and report.problems == []
    assert report.policy is not None and report.policy.policy_id == "mail"
    (warning,) = [w for w in report.warnings if "send_emial" in w]
    assert "names no activity of this worker (did you mean 'send_email'?)" in warning
    assert ran.err == ""  # the worker's warnings are in the report, not on stderr


async def test_doctor_refuses_what_is_not_a_worker(dev_server: DevServer, tmp_path: Path) -> None:
    env = _env(dev_server, tmp_path, _queue())
    for spec in ("tests.doctor_workers:not_a_worker", "tests.no_such_module:x", "nocolon"):
        ran = await interlock("doctor", "--worker", spec, cwd=tmp_path, env=env)
        assert ran.code == 2, (spec, ran.out, ran.err)
        assert ran.err.startswith("interlock: --worker "), ran.err
    both = await interlock("doctor", "--worker", "m:x", "--task-queue", "q", cwd=tmp_path, env=env)
    assert both.code == 2 and "not allowed with argument" in both.err, both.err
    away = await interlock(
        "doctor", "--task-queue", "q", "--address", "127.0.0.1:1", cwd=tmp_path, env=env
    )
    assert away.code == 3 and "cannot be reached" in away.err, away.err


# -- interlock doctor --task-queue -------------------------------------------------------------


async def test_doctor_task_queue_names_a_poller_of_another_journal(
    dev_server: DevServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_queue = _queue()
    env = _env(dev_server, tmp_path, task_queue)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker = await doctor_workers.clean()
    with open_journal(tmp_path / "journal.db") as journal:
        ours = journal_id_of(journal, create=False)
    other = tmp_path / "other.db"
    open_journal(other).close()
    async with worker:
        argv = ("doctor", "--task-queue", task_queue, "--address", dev_server.target, "--json")
        same = await until_polled(argv, tmp_path, env)
        assert same.code == 0, (same.out, same.err)
        report = DoctorReport.model_validate(same.json())
        assert {p.journal_id for p in report.pollers} == {ours}
        assert report.server_version and report.problems == []
        wrong = await interlock(*argv, "--journal", f"sqlite:///{other}", cwd=tmp_path, env=env)
    assert wrong.code == 1, (wrong.out, wrong.err)
    (problem,) = DoctorReport.model_validate(wrong.json()).problems
    assert f"has a poller of journal {ours}" in problem


async def until_polled(argv: tuple[str, ...], cwd: Path, env: dict[str, str]) -> Any:
    """The doctor's answer once the in-process worker's pollers are listed."""

    async def polled() -> Any:
        ran = await interlock(*argv, cwd=cwd, env=env)
        return ran if ran.code == 0 and ran.json()["pollers"] else None

    return await until(polled, "the worker's pollers listed", timeout=30)


# -- the documented JSON -----------------------------------------------------------------------


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_every_json_field_is_documented_in_the_operator_guide() -> None:
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    section = guide.split("## What escapes the gate", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_.\[\]]+)` \|", section, re.M))
    expected = _fields(DoctorReport)
    for prefix, model in (
        ("activities[]", ActivityCoverage),
        ("journal", JournalHealth),
        ("policy", PolicySummary),
        ("pollers[]", Poller),
    ):
        expected |= {f"{prefix}.{name}" for name in _fields(model)}
    assert documented == expected
