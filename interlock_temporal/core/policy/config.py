"""The policy: limits and rules under an id and an epoch, and what follows a changing one."""

from __future__ import annotations

import fnmatch
import hashlib
import logging
from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

from ..identity import canonical_json
from .breaker import Limits
from .rules import Rule, rule_name

log = logging.getLogger("interlock_temporal.policy")

Mode = Literal["enforce", "monitor"]
#: where a policy keeps the flow marks of a call's results: its session, or its workflow run
FlowScope = Literal["session", "run"]
#: the glob that matches every activity: a rule or limit under it names none of them in particular
CATCH_ALL = "*"


class Policy:
    """Limits and rules, under an id and an epoch (a content hash that changes with them).

    ``mode="monitor"`` records what would have happened (``observed=true``) and never blocks;
    any other mode string enforces. ``result_rules`` decide on what an activity returned: a
    rewrite is validated into its return type (``evaluate_rules``' ``result_check``), and one
    it does not return denies, naming the rule; unchecked where the return type is unknown.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        rules: Sequence[Rule] = (),
        *,
        result_rules: Sequence[Rule] = (),
        mode: str = "enforce",
        policy_id: str = "interlock",
        cost_field: str | None = "cost_usd",
        secret_arguments: Iterable[str] = (),
        epoch: str | None = None,
        unknown_activities: Literal["warn", "refuse"] = "warn",
        flow_scope: FlowScope = "session",
    ) -> None:
        self.limits = limits or Limits()
        self.rules = tuple(rules)
        self.result_rules = tuple(result_rules)
        if mode not in ("enforce", "monitor"):
            log.warning("policy %s: unknown mode %r: enforcing", policy_id, mode)
        self.mode: Mode = "monitor" if mode == "monitor" else "enforce"
        self.policy_id = policy_id
        self.cost_field = cost_field
        self.secret_arguments = frozenset(secret_arguments)
        #: a policy file's rule that names no activity of the worker: warned, or refused (see
        #: ``file.check_activities``)
        self.unknown_activities = unknown_activities
        if flow_scope not in ("session", "run"):
            raise ValueError("Policy: flow_scope is 'session' or 'run'")
        #: where flow marks are kept and looked up (``flow``): the call's session (its workflow
        #: id unless ``act_as`` names one), or its workflow run
        self.flow_scope: FlowScope = flow_scope
        #: the rules that read ``CallEvent.origins``: a declarative ``flow`` condition, or a
        #: Python rule that says which origins it looks for (``flow_sources``). While there is
        #: none, no result is fingerprinted and no call looked up.
        self.flow_rules = tuple(r for r in self.rules if getattr(r, "flow_sources", ()))
        self.epoch = epoch or self._epoch()

    def naming(self, activity: str) -> list[str]:
        """What in this policy names ``activity`` (for the worker's start line and ``interlock
        doctor``): each rule whose ``activities`` (a declarative rule's ``activity``, a
        ``deny_activity``'s names, or an ``activities`` attribute any rule may carry) match it,
        and each ``limits.costs`` and ``limits.hitl_activities`` glob that does.

        Every activity passes the policy, so the question is which ones somebody thought
        about: a glob that is the catch-all ``*`` names none, and a Python rule that declares
        no ``activities`` cannot be read (its body decides), so neither counts here."""

        def named(globs: Iterable[str]) -> list[str]:
            return [g for g in globs if g != CATCH_ALL and fnmatch.fnmatchcase(activity, g)]

        found = [
            f"rule {rule_name(rule)}"
            for rule in (*self.rules, *self.result_rules)
            if named(getattr(rule, "activities", ()))
        ]
        found += [f"limits.costs[{g!r}]" for g in named(self.limits.costs)]
        found += [f"limits.hitl_activities[{g!r}]" for g in named(self.limits.hitl_activities)]
        return found

    def looks_up_flow(self, activity: str) -> bool:
        """Whether a flow rule may fire on ``activity`` (its ``activities``, default all), so
        its call's arguments are looked up in the flow marks first."""
        return any(
            any(fnmatch.fnmatchcase(activity, g) for g in getattr(r, "activities", (CATCH_ALL,)))
            for r in self.flow_rules
        )

    def _epoch(self) -> str:
        # a setting added later is left out while unset, so an upgrade keeps a policy's epoch
        # (and the approvals granted under it)
        unset_later = {"hitl_mode"} if self.limits.hitl_mode is None else set()
        doc = {
            "limits": self.limits.model_dump(mode="json", exclude=unset_later),
            "rules": [rule_name(r) for r in self.rules],
            "result_rules": [rule_name(r) for r in self.result_rules],
            "mode": self.mode,
            "policy_id": self.policy_id,
            "cost_field": self.cost_field,
            "secret_arguments": sorted(self.secret_arguments),
        }
        if self.flow_scope != "session":
            doc["flow_scope"] = self.flow_scope
        return hashlib.sha256(canonical_json(doc)).hexdigest()[:16]


class PolicyFollower(Protocol):
    """A policy that can change while a worker runs (``PolicySource`` follows a file).
    ``current()`` is called on the worker's event loop and must not block; a follower that
    loads its policy slowly may also have ``async refresh(now) -> Policy``, which the worker
    awaits before the policy decides a call (``PolicyGuard.refreshed``)."""

    def current(self, now: float) -> Policy: ...
