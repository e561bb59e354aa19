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
  to have no side effects with ``no_effects(activity)``;
- **neither**: the rest: an activity that may have side effects nobody guards.

The gate's own activities (the review desk's, the reconciler's, the notifier's) are not the
user's and are not counted; the Temporal SDK registers none of its own on a worker. The cost:
the classification reads declarations, not behaviour. ``no_effects`` on an activity that does
send something is believed, and a Python rule that decides on an activity without declaring
``activities`` leaves it "neither" (a false alarm, never a false all-clear from the policy).
"""

from __future__ import annotations

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
        found.append(
            ActivityCoverage(
                name=name,
                coverage="policed" if named or quiet else "neither",
                named_by=named,
                no_effects=quiet,
            )
        )
    return WorkerCoverage(activities=sorted(found, key=lambda a: a.name))
