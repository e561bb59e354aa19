"""Declarative policies: loaded from YAML or JSON, refused with the file, line and key when
wrong, an epoch that follows the content, and a file that is followed when it changes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from pydantic import BaseModel

from interlock_temporal.core.policy import (
    CallEvent,
    CallFacts,
    HitlMode,
    Policy,
    PolicyState,
    SessionState,
    Verdict,
    decide,
    deny_activity,
    evaluate_rules,
)
from interlock_temporal.core.policy.file import (
    MAX_POLICY_BYTES,
    MAX_POLICY_DEPTH,
    FileRule,
    PolicyError,
    PolicySource,
    RuleSpec,
    check_arguments,
    load_policy,
    parse_policy,
)

#: what a misspelled ``mode`` at the top of a file reads
TOP_KEYS = (
    "unknown key (did you mean 'mode'?); the keys there are policy_id, mode, limits, "
    "cost_field, secret_arguments, unknown_activities, flow_scope, rules"
)

GOOD = """\
# the support agents' policy
policy_id: support-agents
mode: enforce
limits:
  max_repeat_calls: 3
  session_budget_usd: 5.0
  costs: {"llm_*": 0.02}
secret_arguments: [api_key]
rules:
  - id: big-refunds
    activity: refund
    principals: ["refund-*"]
    when:
      amount_cents: {gt: 5000}
    verdict: escalate
    code: OVER_50_USD
    reason: refunds over $50 need a person
  - id: no-deletes
    activity: "delete_*"
    verdict: block
    reason: agents never delete
  - id: blocked-country
    activity: refund
    when:
      country: {in: [XX, YY]}
    verdict: block
"""


class Refund(BaseModel):
    order_id: str
    amount_cents: int
    country: str = "DE"


def event(activity: str = "refund", principal: str = "refund-bot", **fields: object) -> CallEvent:
    r = Refund.model_validate({"order_id": "A-1", "amount_cents": 2000, **fields})
    return CallEvent(activity=activity, args=(r,), principal=principal)


NO_ANCHORS = "a policy file has no anchors or aliases (write the value out where it is used)"


def reloaded(source: PolicySource, now: float | None = None) -> Policy:
    """What ``current()`` gives once the reload it started, if any, has ended (a worker's call
    is decided by the last good policy meanwhile: it never waits for a parse)."""
    at = time.time() if now is None else now
    source.current(at)
    assert source.wait_reload(timeout=30)
    return source.current(at)


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_policy_file_loads_and_its_rules_decide(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, GOOD))
    assert policy.policy_id == "support-agents" and policy.mode == "enforce"
    assert policy.limits.max_repeat_calls == 3 and policy.limits.cost_of("llm_chat") == 0.02
    assert policy.secret_arguments == {"api_key"}
    d, _ = evaluate_rules(policy.rules, event(amount_cents=6000))
    assert (d.verdict, d.code, d.policy_id, d.argument) == (
        Verdict.ESCALATE,
        "OVER_50_USD",
        "big-refunds",
        "amount_cents",
    )
    # another principal is not matched by the glob; a small amount is not either
    assert evaluate_rules(policy.rules, event(amount_cents=6000, principal="ops"))[0].verdict is (
        Verdict.ALLOW
    )
    assert evaluate_rules(policy.rules, event(amount_cents=100))[0].verdict is Verdict.ALLOW
    d, _ = evaluate_rules(policy.rules, event("delete_user"))
    assert (d.verdict, d.code, d.policy_id) == (Verdict.DENY, "POLICY_BLOCK", "no-deletes")
    d, _ = evaluate_rules(policy.rules, event(country="XX"))
    assert (d.verdict, d.argument) == (Verdict.DENY, "country")


def test_json_is_accepted_too(tmp_path: Path) -> None:
    doc = {"policy_id": "j", "rules": [{"id": "r", "activity": "x", "verdict": "block"}]}
    policy = load_policy(write(tmp_path, json.dumps(doc, indent=2), "policy.json"))
    assert policy.policy_id == "j" and len(policy.rules) == 1


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("mode: enforce", "mode: enforce\nmodes: monitor"), ":4: modes: unknown key"),
        (("    verdict: escalate", "    verdit: escalate"), ":15: rules[0].verdit: unknown key"),
        (("  max_repeat_calls: 3", "  max_repeat_calls: -1"), ":5: limits.max_repeat_calls"),
        (("  max_repeat_calls: 3", "  max_repeats: 3"), ":5: limits.max_repeats: unknown key"),
        (("{gt: 5000}", "{greater: 5000}"), ":14: rules[0].when.amount_cents.greater: unknown"),
        (("    verdict: escalate", "    verdict: maybe"), ":15: rules[0].verdict"),
        (("  - id: no-deletes", "  - id: big-refunds"), ":18: rules[1].id: 'big-refunds' is used"),
        (("policy_id: support-agents", "policy_id: [unclosed"), ":3: not valid YAML"),
    ],
)
def test_errors_name_the_file_line_and_key(
    tmp_path: Path, change: tuple[str, str], says: str
) -> None:
    old, new = change
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert str(refused.value).startswith(str(path)), refused.value
    assert says in str(refused.value), refused.value


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"missing\.yaml: cannot be read"):
        load_policy(tmp_path / "missing.yaml")


def test_misspelled_argument_names_are_refused_against_the_activities(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, GOOD))
    activities = {
        "refund": frozenset({"r", "order_id", "amount_cents", "country"}),
        "delete_user": frozenset({"user_id"}),
        "untyped": None,
    }
    check_arguments(policy, activities)
    typo = load_policy(write(tmp_path, GOOD.replace("amount_cents: {gt", "amount_cent: {gt")))
    with pytest.raises(PolicyError) as refused:
        check_arguments(typo, activities)
    message = str(refused.value)
    assert ":14: rules[0].when.amount_cent: refund has no argument 'amount_cent'" in message
    assert "amount_cents" in message  # what it does have


def test_the_epoch_follows_the_content_not_its_layout(tmp_path: Path) -> None:
    a = parse_policy(GOOD, "a")
    b = parse_policy("# a comment\n" + GOOD.replace("[api_key]", "\n    - api_key"), "b")
    c = parse_policy(GOOD.replace("$50", "fifty dollars"), "c")
    assert a.epoch == b.epoch != c.epoch


def test_a_followed_file_reloads_and_a_broken_edit_keeps_the_last_good_policy(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, GOOD)
    source = PolicySource(path, min_interval_s=0.0)
    first = source.current(time.time())
    assert source.current(time.time()) is first  # unchanged: not reloaded
    path.write_text(GOOD.replace("max_repeat_calls: 3", "max_repeat_calls: 5"))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    second = reloaded(source)
    assert second.limits.max_repeat_calls == 5 and second.epoch != first.epoch
    path.write_text(GOOD.replace("verdict: block", "verdict: nope"))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2_000_000))
    assert reloaded(source) is second
    assert source.last_error is not None and "rules[1].verdict" in source.last_error
    # a reload the worker's check refuses (a misspelled argument) keeps the last good one too
    checked: list[str] = []

    def check(p: object) -> None:
        checked.append("x")
        if len(checked) > 1:
            raise PolicyError("refused by the worker's check")

    source.on_load(check)
    path.write_text(GOOD.replace("max_repeat_calls: 3", "max_repeat_calls: 7"))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 3_000_000))
    assert reloaded(source) is second
    assert source.last_error == "refused by the worker's check"


def test_every_hitl_mode_of_sp1_can_be_written(tmp_path: Path) -> None:
    """SP/1.0's HITL modes in a file: ``on_deny`` escalates a cost over what remains; the
    threshold takes SP/1.0's whole range, 1.0 included."""
    on_deny = "limits:\n  session_budget_usd: 1.0\n  hitl_mode: on_deny\n"
    policy = load_policy(write(tmp_path, on_deny))
    assert policy.limits.hitl is HitlMode.ON_DENY
    state = PolicyState(SessionState(spent_usd=0.9))
    d = decide(state, CallFacts("llm", "x", now=0.0, cost_usd=0.5), policy.limits, 0.5)
    assert (d.verdict, d.code) == (Verdict.ESCALATE, "BUDGET_EXHAUSTED")
    for mode in HitlMode:
        text = f"limits:\n  hitl_mode: {mode.value}\n"
        if mode is HitlMode.ON_THRESHOLD:
            text += "  escalate_below_fraction: 1.0\n"
        assert load_policy(write(tmp_path, text)).limits.hitl is mode


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        ("  hitl_mode: sometimes\n", ":2: limits.hitl_mode: Input should be 'never'"),
        ("  hitl_mode: on_threshold\n", ":1: limits: Value error, hitl_mode on_threshold needs"),
        (
            "  hitl_mode: on_deny\n  escalate_below_fraction: 0.2\n",
            ":1: limits: Value error, escalate_below_fraction is read only with hitl_mode "
            "on_threshold, not on_deny",
        ),
        ("  escalate_below_fraction: 1.5\n", ":2: limits.escalate_below_fraction: Input should"),
        ("  window_s: 60\n", ":1: limits: Value error, a time window needs both"),
        # SP/1.0 writes "off" as 0; here a limit of 0 is refused (leave the key out for off)
        ("  max_total_calls: 0\n", ":2: limits.max_total_calls: Input should be greater"),
        ("  session_budget_usd: 0\n", ":2: limits.session_budget_usd: Input should be greater"),
    ],
)
def test_settings_that_cannot_work_are_refused(tmp_path: Path, limits: str, says: str) -> None:
    path = write(tmp_path, "limits:\n" + limits)
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert says in str(refused.value), refused.value


# -- what YAML can write but a policy cannot hold: refused with the file, line and key ----------

RULE_WHEN = "rules:\n  - id: r\n    verdict: block\n    when:\n      day: {eq: %s}\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # a date, NaN, an integer past 2**53, bytes, a lone surrogate: no JSON form, no epoch
        (RULE_WHEN % "2024-01-01", ":5: rules[0].when.day.eq: a value with no canonical JSON form"),
        (RULE_WHEN % ".nan", ":5: rules[0].when.day.eq: a float that is NaN or infinite"),
        (
            RULE_WHEN % "12345678901234567890",
            ":5: rules[0].when.day.eq: an integer outside the interoperable JSON range (2**53)",
        ),
        (
            RULE_WHEN % "!!binary aGk=",
            ":5: rules[0].when.day.eq: a value with no canonical JSON form",
        ),
        (
            RULE_WHEN % '"\\ud800"',
            ":5: rules[0].when.day.eq: a string that is not valid Unicode (a lone surrogate)",
        ),
        # a tag safe_load does not know is named where it is written, not on "line 1"
        (
            "policy_id: p\nrules:\n  - id: !Ref other\n",
            ":3: rules[0].id: could not determine a constructor for the tag '!Ref'",
        ),
        (
            "policy_id: !!python/name:os.system\n",
            ":1: policy_id: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/name:os.system'",
        ),
        # keys are text: a list as a key, a number as a key where any value is allowed
        ("mode: enforce\n? [a, b]\n: 1\n", ":2: (top level): key ['a', 'b'] is not text"),
        (RULE_WHEN % "{1: one}", ":5: rules[0].when.day.eq: key 1 is not text"),
        # anchors and aliases are refused where they are written, before anything expands (an
        # alias inside what its anchor names would be data without end)
        ("policy_id: p\nrules: &all\n  - *all\n", ":2: a YAML anchor (&): " + NO_ANCHORS),
        ("policy_id: p\nmode: *undefined\n", ":2: a YAML alias (*): " + NO_ANCHORS),
        ("policy_id: p\nlimits:\n  <<: *base\n", ":3: a YAML alias (*): " + NO_ANCHORS),
        # nesting deeper than a policy can is refused at its line, not by a RecursionError
        (
            "policy_id: p\nreason:\n  " + "[" * 5000 + "]" * 5000 + "\n",
            f":3: nested deeper than {MAX_POLICY_DEPTH} levels, the most a policy file may",
        ),
        # characters YAML does not allow
        (
            "policy_id: p\nmode: enforce\nreason: a\x00b\n",
            ":3: not valid YAML or JSON: character #x0000: special characters are not allowed",
        ),
        (
            "\npolicy_id: \x07\n",
            ":2: not valid YAML or JSON: character #x0007: special characters are not allowed",
        ),
    ],
    ids=[
        "date",
        "nan",
        "big-int",
        "bytes",
        "surrogate",
        "custom-tag",
        "python-tag",
        "list-key",
        "number-key",
        "recursive-alias",
        "alias",
        "merge-key",
        "deep",
        "nul",
        "bell",
    ],
)
def test_what_yaml_can_write_but_a_policy_cannot_hold_is_refused_with_its_line_and_key(
    tmp_path: Path, text: str, says: str
) -> None:
    """These escaped as the YAML library's own errors (or a TypeError, or the canonical JSON
    refusal while hashing the epoch), naming neither the file nor the line, and a followed file
    edited into one of them broke the call that reloaded it."""
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert str(refused.value) == f"{path}{says}"


def test_a_key_left_empty_is_null_as_yaml_reads_it(tmp_path: Path) -> None:
    """``cost_field:`` with nothing after it is YAML's null (it was a crash: the library could
    not read back the empty value it was asked to serialize)."""
    policy = load_policy(write(tmp_path, "policy_id: p\ncost_field:\n"))
    assert policy.cost_field is None
    assert policy.epoch == parse_policy("policy_id: p\ncost_field: null\n").epoch
    # every rule commented out leaves `rules:` empty: null, which is no list of rules
    path = write(tmp_path, "policy_id: p\nrules:\n#  - id: r\n#    verdict: block\n")
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert str(refused.value) == f"{path}:2: rules: Input should be a valid list"


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("\npolicy_id: p\nrules: []\nmode: m\u00f6de\n".encode("latin-1"))
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert str(refused.value) == f"{path}:4: not UTF-8 text (a byte 0xf6)"


def test_a_policy_file_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """A worker whose locale is not UTF-8 (C/POSIX here; Windows' code pages alike) reads the
    same policy: the file is decoded as UTF-8, not in the locale's encoding."""
    path = write(tmp_path, GOOD.replace("need a person", "brauchen eine Pr\u00fcfung \u20ac"))
    here = load_policy(path)
    assert here.rules[0].spec.reason == "refunds over $50 brauchen eine Pr\u00fcfung \u20ac"  # type: ignore[attr-defined]
    code = (
        "import sys, locale\n"
        "from interlock_temporal.core.policy.file import load_policy\n"
        "assert locale.getpreferredencoding(False) != 'UTF-8', locale.getpreferredencoding(False)\n"
        "p = load_policy(sys.argv[1])\n"
        "print(p.epoch, p.rules[0].spec.reason.encode('unicode_escape').decode('ascii'))\n"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    root = Path(__file__).resolve().parents[1]  # this tree's package (mutmut's copy under it)
    there = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert there.returncode == 0, there.stderr
    reason = here.rules[0].spec.reason.encode("unicode_escape").decode("ascii")  # type: ignore[attr-defined]
    assert there.stdout.split(" ", 1) == [here.epoch, reason + "\n"]


def test_a_followed_file_edited_into_a_value_a_policy_cannot_hold_keeps_the_last_good_one(
    tmp_path: Path,
) -> None:
    """The reload is refused like any broken edit: the call that asked is decided under the
    last good policy (it used to raise the canonical JSON refusal out of ``current()``)."""
    path = write(tmp_path, GOOD)
    source = PolicySource(path, min_interval_s=0.0)
    first = source.current(time.time())
    path.write_text(GOOD.replace("{in: [XX, YY]}", "{eq: 2024-01-01}"))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert reloaded(source) is first
    assert source.last_error == (
        f"{path}:25: rules[2].when.country.eq: a value with no canonical JSON form"
    )


# -- what a user reads and what a rule decides, pinned (found by mutation testing the file) -----


def test_each_error_of_a_file_reads_whole(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"

    def refusal(text: str) -> str:
        with pytest.raises(PolicyError) as refused:
            load_policy(write(tmp_path, text))
        return str(refused.value)

    assert refusal(GOOD.replace("mode: enforce", "mode: enforce\nmode: monitor")) == (
        f"{path}: line 4: key 'mode' appears twice"
    )
    assert refusal("- id: r\n  verdict: block\n") == (
        f"{path}:1: a policy is a mapping of keys (policy_id, limits, rules)"
    )
    # a key left out is named at the line of what lacks it (the rule), not of its parent
    no_verdict = GOOD.replace("    verdict: block\n    reason: agents never delete\n", "")
    assert refusal(no_verdict) == f"{path}:18: rules[1].verdict: Field required"
    # every problem, each with its line, in one message
    both = GOOD.replace("mode: enforce", "modes: x").replace("    verdict: escalate\n", "")
    assert refusal(both) == (
        f"{path}:10: rules[0].verdict: Field required; {path}:3: modes: {TOP_KEYS}"
    )


def test_text_without_a_source_is_named_policy() -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy("modes: x\n")
    assert str(refused.value) == f"<policy>:1: modes: {TOP_KEYS}"


def test_each_rule_knows_its_file_and_line_and_the_epoch_is_stable(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    policy = load_policy(path)
    assert [r.where for r in policy.rules] == [f"{path}:10", f"{path}:18", f"{path}:22"]  # type: ignore[attr-defined]
    # the epoch is the content's: the same file gives the same one on every version (an
    # approval granted under it stays valid across an upgrade)
    assert policy.epoch == "f289c479be4a52e3"


def test_the_mode_and_the_cost_field_are_the_files() -> None:
    default = parse_policy("policy_id: p\n")
    assert (default.mode, default.cost_field) == ("enforce", "cost_usd")
    chosen = parse_policy("policy_id: p\nmode: monitor\ncost_field: price_usd\n")
    assert (chosen.mode, chosen.cost_field) == ("monitor", "price_usd")


REFUND_ARGS = frozenset({"r", "order_id", "amount_cents", "country"})
COUNTRY_RULE = "  - id: blocked-country\n    activity: refund"


def test_a_misspelled_argument_is_found_in_any_rule_of_any_matching_activity(
    tmp_path: Path,
) -> None:
    """Rules with nothing to check (no conditions), rules written in Python, and activities
    whose arguments cannot be known (None) are passed over, and the check goes on."""
    typo_text = GOOD.replace("country: {in", "contry: {in")
    path = write(tmp_path, typo_text)
    typo = load_policy(path)
    says = (
        f"{path}:25: rules[2].when.contry: refund has no argument 'contry' "
        "(it has: amount_cents, country, order_id, r)"
    )
    # the second rule names no argument; the third, after it, is still checked
    with pytest.raises(PolicyError) as refused:
        check_arguments(typo, {"refund": REFUND_ARGS})
    assert str(refused.value) == says
    # an untyped activity the glob matches first is skipped, not the end of the check
    path = write(tmp_path, typo_text.replace(COUNTRY_RULE, COUNTRY_RULE + "*"), "glob.yaml")
    with pytest.raises(PolicyError) as refused:
        check_arguments(load_policy(path), {"refund_untyped": None, "refund": REFUND_ARGS})
    assert str(refused.value) == says.replace("policy.yaml", "glob.yaml")
    # a rule written in Python before the file's rules is passed over
    mixed = Policy(typo.limits, [deny_activity("refund"), *typo.rules])
    with pytest.raises(PolicyError) as refused:
        check_arguments(mixed, {"refund": REFUND_ARGS})
    assert str(refused.value) == says


def test_the_argument_a_block_names_is_checked_too_at_its_own_line(tmp_path: Path) -> None:
    path = write(
        tmp_path, GOOD.replace("    reason: agents never delete\n", "    argument: user\n")
    )
    with pytest.raises(PolicyError) as refused:
        check_arguments(load_policy(path), {"refund": REFUND_ARGS, "delete_user": frozenset()})
    assert str(refused.value) == (
        f"{path}:21: rules[1].argument: delete_user has no argument 'user' (it has: none)"
    )


def test_a_source_with_colons_is_named_whole(tmp_path: Path) -> None:
    """A file named with colons (or a Windows drive) keeps them: only the line is split off."""
    path = write(tmp_path, GOOD.replace("amount_cents: {gt", "amount: {gt"), "team:support.yaml")
    with pytest.raises(PolicyError) as refused:
        check_arguments(load_policy(path), {"refund": REFUND_ARGS})
    assert str(refused.value).startswith(f"{path}:14: rules[0].when.amount: refund has no")
    # a rule made in code, with no line for each key, is named at its own line
    rule = FileRule(
        RuleSpec.model_validate({"id": "r", "when": {"amount": {"gt": 1}}, "verdict": "block"}),
        "C:/policies/team:support.yaml:7",
    )
    with pytest.raises(PolicyError) as refused:
        check_arguments(Policy(rules=[rule]), {"refund": REFUND_ARGS})
    assert str(refused.value).startswith(
        "C:/policies/team:support.yaml:7: rules[0].when.amount: refund has no argument 'amount'"
    )


def rule_of(when: str, verdict: str = "block", extra: str = "") -> FileRule:
    text = f"rules:\n  - id: r\n    activity: refund\n    verdict: {verdict}\n{extra}"
    text += f"    when:\n      {when}\n"
    (rule,) = parse_policy(text).rules
    assert isinstance(rule, FileRule)
    return rule


def matches(rule: FileRule, principal: str | None = None, **arguments: object) -> bool:
    return rule(CallEvent("refund", (arguments,), principal=principal)) is not None


def test_present_asks_whether_the_argument_is_given_null_or_not() -> None:
    given = rule_of("coupon: {present: true}")
    assert matches(given, coupon="C-1") and matches(given, coupon=None)
    assert not matches(given, amount_cents=1)
    absent = rule_of("coupon: {present: false}")
    assert matches(absent, amount_cents=1)
    assert not matches(absent, coupon="C-1") and not matches(absent, coupon=None)
    # present with a comparison: both must hold
    both = rule_of("amount_cents: {present: true, gt: 100}")
    assert matches(both, amount_cents=101)
    assert not matches(both, amount_cents=100) and not matches(both, coupon="C-1")


def test_a_condition_on_an_argument_the_call_does_not_have_does_not_hold() -> None:
    for when in ("amount_cents: {gt: 100}", "amount_cents: {ne: 5}", "coupon: null"):
        assert not matches(rule_of(when), order_id="A-1"), when
    # null is a value: an argument given as null equals it, one left out does not
    assert matches(rule_of("coupon: null"), coupon=None)
    assert not matches(rule_of("coupon: {ne: null}"), coupon=None)


def test_a_rule_for_named_callers_does_not_match_a_call_without_a_principal() -> None:
    named = rule_of("amount_cents: {ge: 0}", extra='    principals: ["?*"]\n')
    assert matches(named, "refund-bot", amount_cents=1)
    assert not matches(named, None, amount_cents=1)
    assert matches(
        rule_of("amount_cents: {ge: 0}", extra='    principals: ["*"]\n'), None, amount_cents=1
    )


def test_a_rule_answers_with_its_id_reason_and_code() -> None:
    for verdict, expected, code in (
        ("block", Verdict.DENY, "POLICY_BLOCK"),
        ("escalate", Verdict.ESCALATE, "POLICY_ESCALATE"),
    ):
        rule = rule_of("amount_cents: {gt: 100}", verdict, "    reason: too much\n")
        d = rule(CallEvent("refund", ({"amount_cents": 101},)))
        assert d is not None
        assert (d.verdict, d.code, d.reason, d.policy_id, d.argument) == (
            expected,
            code,
            "too much",
            "r",
            "amount_cents",
        )


def test_an_unreadable_file_says_why(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert str(refused.value) == f"{path}: cannot be read: No such file or directory"


def touch(path: Path, text: str, step: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + step * 1_000_000))


def test_a_followed_file_is_looked_at_once_per_interval(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    source = PolicySource(path, min_interval_s=10.0)
    first = source.current(1000.0)
    touch(path, GOOD.replace("max_repeat_calls: 3", "max_repeat_calls: 5"), 1)
    assert source.current(1009.5) is first  # within the interval: not looked at
    assert reloaded(source, 1010.0).limits.max_repeat_calls == 5  # a whole interval later


def test_what_a_followed_file_logs_and_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, GOOD)
    source = PolicySource(path, min_interval_s=0.0)
    first = source.current(time.time())
    caplog.set_level(logging.WARNING, logger="interlock_temporal.policy")
    # a new layout of the same content: reloaded, same epoch, nothing to say
    touch(path, "# moved\n" + GOOD, 1)
    assert reloaded(source).epoch == first.epoch
    assert caplog.messages == []
    touch(path, GOOD.replace("max_repeat_calls: 3", "max_repeat_calls: 5"), 2)
    second = reloaded(source)
    assert caplog.messages == [
        f"policy support-agents reloaded from {path}: epoch {first.epoch} -> {second.epoch}"
    ]
    caplog.clear()
    touch(path, GOOD.replace("verdict: block", "verdict: nope"), 3)
    assert reloaded(source) is second
    assert source.last_error is not None
    assert caplog.messages == [
        "policy file changed but is not used (the last good one stays): " + source.last_error
    ]
    # mended: the error is gone
    touch(path, GOOD, 4)
    assert reloaded(source).epoch == first.epoch and source.last_error is None
    # removed: the last good one stays, and why is said
    path.unlink()
    assert reloaded(source).epoch == first.epoch
    assert source.last_error == f"{path}: cannot be read: No such file or directory"


# -- a file that cannot hurt the worker that follows it ------------------------------------------


def alias_bomb(levels: int = 7) -> str:
    """A policy file of ``levels`` nested aliases, nine references each (338 bytes at 7): it
    expands into 9**7 = 4.8 million strings. Before anchors were refused it took 45 s and
    1.25 GB to be refused, for unknown keys, after the expansion."""
    lines = ["policy_id: bomb", 'a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_the_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    bomb = alias_bomb()
    assert 300 < len(bomb.encode()) < 400
    path = write(tmp_path, bomb)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(PolicyError) as refused:
            load_policy(path)
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value) == f"{path}:2: a YAML anchor (&): {NO_ANCHORS}"
    assert took < 1.0 and peak < 20_000_000, (took, peak)
    # an alias with no anchor before it is refused the same way, at its own line
    with pytest.raises(PolicyError) as refused:
        parse_policy(GOOD.replace("max_repeat_calls: 3", "max_repeat_calls: *three"), "p")
    assert str(refused.value) == f"p:5: a YAML alias (*): {NO_ANCHORS}"


def test_a_file_over_the_size_cap_is_refused_by_its_size_unparsed(tmp_path: Path) -> None:
    """A 10 MB file is refused having read ``MAX_POLICY_BYTES`` + 1 of it; a file of exactly
    the cap is read and parsed; text over the cap is refused by ``parse_policy`` too."""
    path = tmp_path / "policy.yaml"
    line = "# " + "x" * 97 + "\n"
    path.write_text("policy_id: big\n" + line * 100_000)  # 10 MB of comments after a policy
    assert path.stat().st_size > 10_000_000
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(PolicyError) as refused:
            load_policy(path)
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    says = f"larger than {MAX_POLICY_BYTES} bytes, the most a policy file may be"
    assert str(refused.value) == f"{path}: {says}"
    assert took < 1.0 and peak < 2 * MAX_POLICY_BYTES + 1_000_000, (took, peak)
    at_the_cap = "policy_id: big\n# " + "é" * ((MAX_POLICY_BYTES - 18) // 2) + "\n"
    at_the_cap += " " * (MAX_POLICY_BYTES - len(at_the_cap.encode()))
    path.write_text(at_the_cap, encoding="utf-8")
    assert path.stat().st_size == MAX_POLICY_BYTES
    assert load_policy(path).policy_id == "big"
    path.write_text(at_the_cap + " ", encoding="utf-8")
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert str(refused.value) == f"{path}: {says}"
    # counted in UTF-8 bytes, not characters
    with pytest.raises(PolicyError) as refused:
        parse_policy(at_the_cap.replace("#", "é", 1), "p")
    assert str(refused.value) == f"p: {says}"


async def test_a_followed_file_is_parsed_on_a_thread_and_the_event_loop_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No caller parses: the reload runs on a thread of its own. Meanwhile ``current()`` returns
    the last good policy at once, and ``refresh()`` (what the worker's interceptor awaits) waits
    for the new one without holding the event loop. The reload is held here (its ``on_load``
    check waits) to see what callers get while it runs."""
    path = write(tmp_path, GOOD)
    source = PolicySource(path, min_interval_s=0.0)
    first = source.current(time.time())
    entered, release = threading.Event(), threading.Event()
    loaded_on: list[threading.Thread] = []

    def held(policy: Policy) -> None:
        loaded_on.append(threading.current_thread())
        if len(loaded_on) > 1:
            entered.set()
            assert release.wait(30)

    source.on_load(held)
    touch(path, GOOD.replace("max_repeat_calls: 3", "max_repeat_calls: 5"), 1)
    waiting = asyncio.ensure_future(source.refresh(time.time()))  # notices the change
    ticks = 0
    while not entered.is_set() or ticks < 10:  # the loop runs on while the file is parsed
        await asyncio.sleep(0.01)
        ticks += 1
        assert ticks < 3000, "the reload never reached its check"
    assert loaded_on[1] is not threading.current_thread()
    assert not waiting.done() and not source.wait_reload(timeout=0.01)
    started = time.perf_counter()
    for _ in range(20):  # a caller that does not wait gets the last good policy, at once
        assert source.current(time.time()) is first
    assert time.perf_counter() - started < 0.5
    release.set()
    assert (await asyncio.wait_for(waiting, 30)).limits.max_repeat_calls == 5
    second = source.current(time.time())
    assert second.limits.max_repeat_calls == 5 and len(loaded_on) == 2  # one reload, not 21
    # the alias bomb, edited in: refused on the thread, the last good policy stays
    caplog.set_level(logging.WARNING, logger="interlock_temporal.policy")
    caplog.clear()  # the reload above said its new epoch
    touch(path, alias_bomb(), 2)
    assert await source.refresh(time.time()) is second
    assert source.last_error == f"{path}:2: a YAML anchor (&): {NO_ANCHORS}"
    assert caplog.messages == [
        "policy file changed but is not used (the last good one stays): " + source.last_error
    ]


def test_a_reload_that_fails_unexpectedly_keeps_the_last_good_policy(tmp_path: Path) -> None:
    """Whatever goes wrong on the reload's thread (here a check with a bug) keeps the last good
    policy, and says what by its type, not its message (which may hold a value of the file)."""
    path = write(tmp_path, GOOD)
    source = PolicySource(path, min_interval_s=0.0)
    first = source.current(time.time())

    def buggy(policy: Policy) -> None:
        if policy is not first:
            raise KeyError("amount_cents=9999")

    source.on_load(buggy)
    touch(path, GOOD.replace("max_repeat_calls: 3", "max_repeat_calls: 5"), 1)
    assert reloaded(source) is first
    assert source.last_error == f"{path}: could not be reloaded: KeyError"
