"""Policy files that say what is wrong and what was meant (issue 35): an unknown ``when``
operator is refused listing the operators there are, with the closest as a suggestion (an
unknown key likewise, with the keys there are); a rule whose ``activity`` names no activity of
the worker is a warning with a suggestion when the worker starts (one file may serve workers
with different activities), and refuses the worker where the file says
``unknown_activities: refuse``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal.core.policy.file import (
    OPERATORS,
    PolicyError,
    check_activities,
    load_policy,
    parse_policy,
)
from interlock_temporal.testing import DevServer

KEY = "11" * 32
KNOWN = "eq, ne, gt, ge, lt, le, in, not_in, contains, glob, present"

SMS_POLICY = """\
policy_id: onboarding
rules:
  - id: no-sms-at-night
    activity: send_welcom_sms
    when: {hour: {lt: 7}}
    verdict: block
  - id: everything-is-logged
    verdict: allow
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"policy-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(text)
    return path


# -- the loader ---------------------------------------------------------------------------------


def test_the_operators_are_the_ones_the_conditions_know() -> None:
    """The list the messages give is the one the conditions take: each operator loads."""
    assert ", ".join(OPERATORS) == KNOWN
    values = {"in": "[1]", "not_in": "[1]", "glob": "'a*'", "present": "true"}
    when = "\n".join(f"      a{i}: {{{op}: {values.get(op, 1)}}}" for i, op in enumerate(OPERATORS))
    parse_policy(f"rules:\n  - id: r\n    when:\n{when}\n    verdict: block\n")


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("greater_than", "gt"),
        ("gte", "ge"),
        ("lte", "le"),
        ("equals", "eq"),
        ("not_int", "not_in"),
        ("glbo", "glob"),
        ("exists", "present"),
        ("contain", "contains"),
    ],
)
def test_an_unknown_operator_lists_the_operators_and_suggests_the_closest(
    tmp_path: Path, written: str, meant: str
) -> None:
    path = write(
        tmp_path,
        "rules:\n  - id: big-refunds\n    activity: refund\n    when:\n"
        f"      amount_cents: {{{written}: 5000}}\n    verdict: escalate\n",
    )
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert str(refused.value) == (
        f"{path}:5: rules[0].when.amount_cents.{written}: unknown operator {written!r} "
        f"(did you mean {meant!r}?); the operators are {KNOWN}"
    )


def test_an_operator_like_none_of_them_lists_them_without_a_guess() -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy("rules:\n  - id: r\n    when: {amount_cents: {zzz: 1}}\n    verdict: block\n")
    assert str(refused.value) == (
        f"<policy>:3: rules[0].when.amount_cents.zzz: unknown operator 'zzz'; the operators are "
        f"{KNOWN}"
    )


def test_an_unknown_key_of_a_rule_suggests_the_closest_and_lists_them() -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy("rules:\n  - id: r\n    activty: refund\n    verdict: block\n")
    assert str(refused.value) == (
        "<policy>:3: rules[0].activty: unknown key (did you mean 'activity'?); the keys there "
        "are id, activity, principals, when, verdict, code, reason, argument"
    )


def test_a_rule_naming_no_activity_of_the_worker_warns_with_a_suggestion(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, SMS_POLICY)
    policy = load_policy(path)
    with caplog.at_level(logging.WARNING, logger="interlock_temporal.policy"):
        found = check_activities(policy, ["refund", "send_welcome_sms"])
    problem = (
        f"{path}:3: rules[0].activity: 'send_welcom_sms' (rule 'no-sms-at-night') names no "
        "activity of this worker (did you mean 'send_welcome_sms'?), so the rule never fires "
        "here; its activities are refund, send_welcome_sms"
    )
    assert found == [problem]  # the default rule ("*") matches: only the typo is named
    assert [r.getMessage() for r in caplog.records] == [
        problem + " (a policy file may serve workers with other activities; "
        "`unknown_activities: refuse` in the file refuses it instead)"
    ]
    # a rule for the right name, or a glob that matches one, is not named; nor is a worker
    # that runs no activity at all
    assert check_activities(load_policy(path), ["send_welcom_sms"]) == []
    fixed = load_policy(write(tmp_path, SMS_POLICY.replace("send_welcom_sms", "send_welcome_*")))
    assert check_activities(fixed, ["send_welcome_sms_v2"]) == []
    assert check_activities(policy, []) == []


def test_unknown_activities_refuse_refuses_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "unknown_activities: refuse\n" + SMS_POLICY)
    with pytest.raises(PolicyError) as refused:
        check_activities(load_policy(path), ["refund", "send_welcome_sms"])
    assert str(refused.value) == (
        f"{path}:4: rules[0].activity: 'send_welcom_sms' (rule 'no-sms-at-night') names no "
        "activity of this worker (did you mean 'send_welcome_sms'?), so the rule never fires "
        "here; its activities are refund, send_welcome_sms (the file says "
        "unknown_activities: refuse)"
    )
    with pytest.raises(PolicyError) as mistyped:
        load_policy(write(tmp_path, "unknown_activities: strict\n"))
    assert "unknown_activities: Input should be 'warn' or 'refuse'" in str(mistyped.value)


# -- on a worker --------------------------------------------------------------------------------


@activity.defn
async def refund(order_id: str) -> str:
    return order_id


@activity.defn
async def send_welcome_sms(hour: int) -> str:
    return "sent"


@activity.defn(name="send_welcom_sms")
async def send_welcom_sms(hour: int) -> str:
    return "sent"


@pytest.fixture
async def client(dev_server: DevServer) -> AsyncIterator[Client]:
    yield await Client.connect(dev_server.target, data_converter=pydantic_data_converter)


@pytest.mark.server
async def test_a_worker_warns_of_a_rule_naming_none_of_its_activities_when_it_starts(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, SMS_POLICY)
    plugin = InterlockPlugin(f"sqlite:///{tmp_path / 'j.db'}", signing_key=KEY, policy=path)
    with caplog.at_level(logging.WARNING, logger="interlock_temporal.policy"):
        Worker(
            client, task_queue="never-runs", activities=[refund, send_welcome_sms], plugins=[plugin]
        )
    (line,) = [r.getMessage() for r in caplog.records if "never fires" in r.getMessage()]
    assert "'send_welcom_sms' (rule 'no-sms-at-night') names no activity of this worker" in line
    assert "(did you mean 'send_welcome_sms'?)" in line


@pytest.mark.server
async def test_a_worker_refuses_to_start_where_the_file_says_unknown_activities_refuse(
    client: Client, tmp_path: Path
) -> None:
    path = write(tmp_path, "unknown_activities: refuse\n" + SMS_POLICY)
    plugin = InterlockPlugin(f"sqlite:///{tmp_path / 'j.db'}", signing_key=KEY, policy=path)
    with pytest.raises(PolicyError) as refused:
        Worker(
            client, task_queue="never-runs", activities=[refund, send_welcome_sms], plugins=[plugin]
        )
    assert "(did you mean 'send_welcome_sms'?)" in str(refused.value)
    # the same file serves a worker that does run send_welcom_sms
    Worker(
        client,
        task_queue="never-runs",
        activities=[send_welcom_sms],
        plugins=[InterlockPlugin(f"sqlite:///{tmp_path / 'k.db'}", signing_key=KEY, policy=path)],
    )
