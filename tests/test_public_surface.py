"""The public surface a newcomer can hold: each public module's ``__all__`` is exactly what it
is meant to be (so a name is added on purpose), every listed name imports without a warning, the
names that moved still import for one more release with a warning that says where they live now,
and importing the workflow helpers loads no journal, policy or protocol."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

PUBLIC = {
    "interlock_temporal": {
        "InterlockPlugin",
        "InterlockInterceptor",
        "gated",
        "no_effects",
        "current_effect",
        "report_cost",
        "run_worker",
        "EffectContext",
        "receipt",
        "Receipt",
        "Kind",
        "open_journal",
        "Journal",
        "Lease",
        "ReviewRules",
        "Telemetry",
        "BaseTarget",
        "EffectTarget",
        "TargetDeclarationError",
        "AmbiguousEffect",
        "ApprovalRequired",
        "AuthorityRejected",
        "EffectInFlight",
        "EffectRefused",
        "InterlockDenied",
        "InterlockNotInstalled",
        "InvalidEffectInput",
    },
    "interlock_temporal.policy": {
        "Limits",
        "Policy",
        "Rule",
        "CallEvent",
        "Decision",
        "Verdict",
        "allow",
        "deny",
        "modify",
        "escalate",
        "deny_activity",
        "deny_when",
        "flow_matches",
        "load_policy",
        "parse_policy",
        "PolicyError",
    },
    "interlock_temporal.review": {
        "Vote",
        "ReviewRules",
        "review_id",
        "EffectReview",
        "Resolution",
        "ReviewStatus",
        "Reconciler",
        "ReconcileRequest",
        "ReconcileReport",
        "ReviewClient",
        "Waiting",
        "Decided",
        "NotDecided",
    },
    "interlock_temporal.targets": {
        "BaseTarget",
        "EffectTarget",
        "TargetDeclarationError",
        "Change",
        "Found",
    },
    "interlock_temporal.agents": {"effect_as_tool", "refusal_text", "REFUSALS"},
    "interlock_temporal.langgraph": {
        "effect_as_tool",
        "ainvoke",
        "GatedLangGraphTool",
        "GatedToolNode",
        "ReviewRequest",
        "ReviewAnswer",
        "refusal_text",
        "REFUSALS",
    },
    "interlock_temporal.mcp": {
        "META_EFFECT_ID",
        "GatedMCPClient",
        "McpServer",
        "McpTool",
        "McpToolCall",
        "contradictions",
    },
    "interlock_temporal.pydantic_ai": {
        "GatedToolset",
        "run_gated",
        "refusal_text",
        "REFUSALS",
        "DEFERRED",
    },
    "interlock_temporal.workflow": {
        "act_as",
        "current_principal",
        "execute_effect",
        "receipt_from",
    },
}

#: (module, old name) -> (module, name) where it lives now
MOVED = {
    ("interlock_temporal.targets.stripe", "WebhookOutcome"): (
        "interlock_temporal.targets.stripe",
        "WebhookReport",
    ),
    ("interlock_temporal", "Change"): ("interlock_temporal.targets", "Change"),
    ("interlock_temporal", "Found"): ("interlock_temporal.targets", "Found"),
    ("interlock_temporal", "Limits"): ("interlock_temporal.policy", "Limits"),
    ("interlock_temporal", "Policy"): ("interlock_temporal.policy", "Policy"),
    ("interlock_temporal", "Decision"): ("interlock_temporal.review", "Vote"),
    ("interlock_temporal", "EffectReview"): ("interlock_temporal.review", "EffectReview"),
    ("interlock_temporal", "Reconciler"): ("interlock_temporal.review", "Reconciler"),
    ("interlock_temporal", "ReconcileReport"): ("interlock_temporal.review", "ReconcileReport"),
    ("interlock_temporal", "ReconcileRequest"): ("interlock_temporal.review", "ReconcileRequest"),
    ("interlock_temporal", "Resolution"): ("interlock_temporal.review", "Resolution"),
    ("interlock_temporal", "ReviewStatus"): ("interlock_temporal.review", "ReviewStatus"),
    ("interlock_temporal", "receipt_from"): ("interlock_temporal.workflow", "receipt_from"),
    ("interlock_temporal.policy", "report_cost"): ("interlock_temporal", "report_cost"),
    ("interlock_temporal.policy", "decide"): ("interlock_temporal.core.policy", "decide"),
    ("interlock_temporal.policy", "admit"): ("interlock_temporal.core.policy", "admit"),
    ("interlock_temporal.policy", "PolicyGuard"): ("interlock_temporal.core.policy", "PolicyGuard"),
    ("interlock_temporal.policy", "CallFacts"): ("interlock_temporal.core.policy", "CallFacts"),
    ("interlock_temporal.policy", "evaluate_rules"): (
        "interlock_temporal.core.policy",
        "evaluate_rules",
    ),
    ("interlock_temporal.targets", "capabilities"): (
        "interlock_temporal.core.targets",
        "capabilities",
    ),
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_lists_exactly_its_names(module: str) -> None:
    assert set(importlib.import_module(module).__all__) == PUBLIC[module]


def test_the_root_is_close_to_the_design_sketch() -> None:
    # 26 since run_worker (issue 35): the README's worker stops on Ctrl-C or SIGTERM quietly;
    # 27 since no_effects (issue 38): declared where the activity is, beside gated
    assert len(PUBLIC["interlock_temporal"]) <= 27
    internals = {"decide", "admit", "PolicyGuard", "CallFacts", "evaluate_rules", "Gate"}
    assert not internals & set().union(*PUBLIC.values())


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_imports_without_a_warning(module: str) -> None:
    imported = importlib.import_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in imported.__all__:
            assert getattr(imported, name) is not None, name


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()), ids=lambda p: ".".join(p))
def test_a_moved_name_still_imports_with_a_warning_that_says_where_it_lives(
    old: tuple[str, str], new: tuple[str, str]
) -> None:
    module, name = old
    where, new_name = new
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{name} is deprecated: use {where}"):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(where), new_name)
    assert name not in importlib.import_module(module).__all__


def test_the_one_list_of_deprecations_holds_exactly_these_aliases_and_says_when_they_go() -> None:
    """``core/deprecated.py`` is the one place an alias is kept: nothing moved is missing from it,
    nothing is there that this test does not know, and each warning names the removal."""
    from interlock_temporal.core.deprecated import ALIASES, REMOVED_IN

    listed = {(m, n): new for m, names in ALIASES.items() for n, new in names.items()}
    assert {k: listed.get(k) for k in MOVED} == MOVED
    for (module, name), (where, new_name) in listed.items():
        with pytest.warns(DeprecationWarning, match=rf"; removed in {REMOVED_IN}$"):
            value = getattr(importlib.import_module(module), name)
        assert value is getattr(importlib.import_module(where), new_name)


def test_an_unknown_name_is_an_attribute_error_that_names_it() -> None:
    import interlock_temporal

    with pytest.raises(AttributeError, match="'interlock_temporal' has no attribute 'gate'"):
        _ = interlock_temporal.gate  # type: ignore[attr-defined]


def test_importing_the_workflow_helpers_loads_no_journal_policy_or_protocol() -> None:
    """What a workflow imports stays small: the sandbox re-imports it for every workflow."""
    code = (
        "import sys, interlock_temporal.workflow, interlock_temporal.review\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('interlock_temporal'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "interlock_temporal.workflow" in loaded
    heavy = (
        "core.protocol",
        "core.policy",
        "core.journal.sql",
        "core.journal.opening",
        "_worker.plugin",
    )
    assert [m for m in loaded if m.removeprefix("interlock_temporal.").startswith(heavy)] == []
