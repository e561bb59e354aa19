"""The policy layer: may this principal run this activity with this input now?

Its rooms, each plain Python with no I/O but the store's:

- ``breaker``: the circuit breaker, ``Limits`` and the pure ``decide(state, call, limits, rng)``;
  ``state``: the session's state it reads and returns;
- ``call``: the call the rules see (``CallEvent``) and what is derived from its input;
  ``rules``: ``Rule`` and the helpers, composed by ``evaluate_rules``;
- ``verdicts``: ``Verdict``, ``Decision`` and ``enforce``;
- ``config``: the ``Policy`` (limits and rules under an id and an epoch); ``file``: the same
  from a YAML or JSON file, and ``PolicySource``, which follows one;
- ``approvals``: a person's ``Approval``; ``store``: ``Accounts``, ``Evaluation`` and the
  ``PolicyStore`` interface (the journal's database keeps the state, so several worker
  processes share one view);
- ``guard``: ``PolicyGuard``, which strings them together around a store.

``file`` is not imported here (it needs a YAML parser): import it as ``core.policy.file``.

Each name is imported on first use, so importing one module of this package loads only that
module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exports import lender

if TYPE_CHECKING:
    from .approvals import Approval, ApprovalScope, ApprovalStatus, call_binding
    from .breaker import (
        ERROR_SIGNALS,
        CallFacts,
        HitlMode,
        Limits,
        admit,
        decide,
        has_error_signal,
        hitl_mode_of,
    )
    from .call import MASK, CallEvent, cost_in, input_digest, redact
    from .config import Mode, Policy, PolicyFollower
    from .guard import PolicyGuard
    from .rules import (
        Rule,
        allow,
        block,
        deny,
        deny_activity,
        deny_when,
        escalate,
        evaluate_rules,
        modify,
        rule_name,
    )
    from .state import Circuit, PolicyState, SessionState, dump_session, load_session, reset_circuit
    from .store import Accounts, Evaluation, PolicyStore
    from .verdicts import Decision, Reason, Verdict, enforce

__all__ = [
    "ERROR_SIGNALS",
    "MASK",
    "Accounts",
    "Approval",
    "ApprovalScope",
    "ApprovalStatus",
    "CallEvent",
    "CallFacts",
    "Circuit",
    "Decision",
    "Evaluation",
    "HitlMode",
    "Limits",
    "Mode",
    "Policy",
    "PolicyFollower",
    "PolicyGuard",
    "PolicyState",
    "PolicyStore",
    "Reason",
    "Rule",
    "SessionState",
    "Verdict",
    "admit",
    "allow",
    "block",
    "call_binding",
    "cost_in",
    "decide",
    "deny",
    "deny_activity",
    "deny_when",
    "dump_session",
    "enforce",
    "escalate",
    "evaluate_rules",
    "has_error_signal",
    "hitl_mode_of",
    "input_digest",
    "load_session",
    "modify",
    "redact",
    "reset_circuit",
    "rule_name",
]

__getattr__ = lender(
    __name__,
    {
        **dict.fromkeys(
            ("Approval", "ApprovalScope", "ApprovalStatus", "call_binding"), ".approvals"
        ),
        **dict.fromkeys(
            (
                "CallFacts",
                "ERROR_SIGNALS",
                "HitlMode",
                "Limits",
                "admit",
                "decide",
                "has_error_signal",
                "hitl_mode_of",
            ),
            ".breaker",
        ),
        **dict.fromkeys(("CallEvent", "MASK", "cost_in", "input_digest", "redact"), ".call"),
        **dict.fromkeys(("Mode", "Policy", "PolicyFollower"), ".config"),
        **dict.fromkeys(("PolicyGuard",), ".guard"),
        **dict.fromkeys(
            (
                "Rule",
                "allow",
                "block",
                "deny",
                "deny_activity",
                "deny_when",
                "escalate",
                "evaluate_rules",
                "modify",
                "rule_name",
            ),
            ".rules",
        ),
        **dict.fromkeys(
            (
                "Circuit",
                "PolicyState",
                "SessionState",
                "dump_session",
                "load_session",
                "reset_circuit",
            ),
            ".state",
        ),
        **dict.fromkeys(("Evaluation", "PolicyStore", "Accounts"), ".store"),
        **dict.fromkeys(("Decision", "Reason", "Verdict", "enforce"), ".verdicts"),
    },
)
