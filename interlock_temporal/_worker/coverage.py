"""What escapes the gate: which of a worker's activities are gated, which only policed, and which
neither, said in one line when the worker starts and reported by ``interlock doctor``.

The problem: an activity with side effects that is neither wrapped by ``gated()`` nor named by
the policy runs unguarded, and nothing says so; a missing guard is assumed present. Every
activity passes the policy layer when a policy is configured, so "policed" cannot mean "the
policy saw it": it means somebody thought about this activity.

The three classes, for each activity the user registered on the worker:

- **gated**: wrapped by ``gated()`` (its target's tier is reported);
- **policed**: not gated, and either the worker's policy names it (``Policy.naming``: a rule
  whose ``activity`` glob, or a ``deny_activity`` name, matches it, or a ``limits.costs`` or
  ``limits.hitl_activities`` glob does; the catch-all ``*`` names nothing), or it is declared
  to have no side effects with ``no_effects(activity)``, or it is one of the activities a
  Temporal agent integration registers to ask a model or to list a server's tools
  (``INTEGRATION_READS``);
- **neither**: the rest: an activity that may have side effects nobody guards.

The gate's own activities (the review desk's, the reconciler's, the notifier's) are not the
user's and are not counted; the Temporal SDK registers none of its own on a worker. The cost:
the classification reads declarations, not behaviour. ``no_effects`` on an activity that does
send something is believed, and a Python rule that decides on an activity without declaring
``activities`` leaves it "neither" (a false alarm, never a false all-clear from the policy).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ..core.coverage import ActivityCoverage, WorkerCoverage
from ..core.policy import Policy
from ..core.targets import capabilities
from .gated import GateSpec

F = TypeVar("F", bound=Callable[..., Any])

#: the attribute ``no_effects`` sets on an activity's function
NO_EFFECTS_ATTR = "__interlock_no_effects__"


def no_effects(fn: F) -> F:
    """Declare that an activity has no side effects (it reads, computes, or asks a model), so the
    worker's start line and ``interlock doctor`` count it as policed rather than as an activity
    nobody guards. Above or below ``@activity.defn``; the function is returned unchanged and
    nothing is checked when it runs: the declaration is the author's word."""
    setattr(fn, NO_EFFECTS_ATTR, True)
    return fn


def declared_no_effects(fn: object) -> bool:
    """Whether ``no_effects`` marked ``fn`` (a bound method reads its function's mark)."""
    return getattr(fn, NO_EFFECTS_ATTR, False) is True


#: the functions Temporal's agent integrations register as activities that ask a model, or read
#: a server's listings, and send nothing a person would gate: by module, their function names.
#: Known by where the function was defined (its ``__module__``), not by the activity's name,
#: which anyone can choose. Their tool-call activities are not here: a tool is what sends.
INTEGRATION_READS: Mapping[str, tuple[str, frozenset[str]]] = {
    "temporalio.openai_agents._invoke_model_activity": (
        "the OpenAI Agents integration's model call",
        frozenset({"invoke_model_activity", "invoke_model_activity_streaming"}),
    ),
    "temporalio.openai_agents._mcp": (
        "the OpenAI Agents integration's MCP listing",
        frozenset({"list_tools", "list_prompts", "get_prompt", "get_prompt_deprecated"}),
    ),
    "temporalio.mcp._activities": (
        "temporalio-mcp's listing or read",
        frozenset(
            {
                "list_tools",
                "list_prompts",
                "get_prompt",
                "list_resources",
                "list_resource_templates",
                "read_resource",
            }
        ),
    ),
    "pydantic_ai.durable_exec.temporal._model": (
        "Pydantic AI's model call",
        frozenset(
            {"request_activity", "request_stream_activity", "cancel_suspended_response_activity"}
        ),
    ),
    "pydantic_ai.durable_exec.temporal._function_toolset": (
        "Pydantic AI's tool listing",
        frozenset({"get_tools_activity"}),
    ),
    "pydantic_ai.durable_exec.temporal._dynamic_toolset": (
        "Pydantic AI's tool listing",
        frozenset({"get_tools_activity"}),
    ),
    "pydantic_ai.durable_exec.temporal._mcp_toolset": (
        "Pydantic AI's MCP listing",
        frozenset({"get_tools_activity", "get_instructions_activity"}),
    ),
}


def integration_read(fn: Callable[..., Any]) -> str | None:
    """What ``fn`` is if a Temporal agent integration registered it to ask a model or read a
    listing (``INTEGRATION_READS``); else None. Pydantic AI's event-stream activity counts only
    when its agent has no handler (then it never runs user code); with one, it runs the user's
    handler, which may send anything."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    if module == "pydantic_ai.durable_exec.temporal._agent" and (
        name == "event_stream_handler_activity"
    ):
        owners = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
        handled = [o for o in owners if hasattr(o, "event_stream_handler")]
        if handled and all(o.event_stream_handler is None for o in handled):
            return "Pydantic AI's event stream (no handler set)"
        return None
    known = INTEGRATION_READS.get(module or "")
    return known[0] if known is not None and name in known[1] else None


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def classify(
    activities: Iterable[tuple[str, Callable[..., Any]]],
    specs: Mapping[str, GateSpec],
    policy: Policy | None,
) -> WorkerCoverage:
    """Classify ``activities`` (name, function) given the worker's bound gates (``specs``, by
    name: their targets resolved) and its policy (None: no policy)."""
    found: list[ActivityCoverage] = []
    for name, fn in activities:
        spec = specs.get(name)
        target = spec.target if spec is not None else None
        if target is not None:
            found.append(
                ActivityCoverage(
                    name=name,
                    coverage="gated",
                    tier=capabilities(target).tier,
                    target=str(getattr(target, "name", type(target).__name__)),
                )
            )
            continue
        named = policy.naming(name) if policy is not None else []
        quiet = declared_no_effects(fn)
        reads = integration_read(fn)
        found.append(
            ActivityCoverage(
                name=name,
                coverage="policed" if named or quiet or reads else "neither",
                named_by=named,
                no_effects=quiet,
                integration=reads,
            )
        )
    return WorkerCoverage(activities=sorted(found, key=lambda a: a.name))
