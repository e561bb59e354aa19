"""The policy layer: the limits of the circuit breaker and the rules a call must pass.

```python
from interlock_temporal import InterlockPlugin
from interlock_temporal.policy import Limits, Policy, deny_when

policy = Policy(
    Limits(max_repeat_calls=3, session_budget_usd=1.00, costs={"search": 0.01}),
    rules=[deny_when(lambda e: e.argument("amount_cents", 0) > 50_000, code="TOO_LARGE",
                     argument="amount_cents")],
)
client = await Client.connect("localhost:7233", plugins=[InterlockPlugin(policy=policy)])
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.exports import lender

if TYPE_CHECKING:
    from .core.policy import (
        CallEvent,
        Decision,
        Limits,
        Policy,
        Rule,
        Verdict,
        allow,
        deny,
        deny_activity,
        deny_when,
        escalate,
        modify,
    )
    from .core.policy.file import PolicyError, load_policy, parse_policy

__all__ = [
    "CallEvent",
    "Decision",
    "Limits",
    "Policy",
    "PolicyError",
    "Rule",
    "Verdict",
    "allow",
    "deny",
    "deny_activity",
    "deny_when",
    "escalate",
    "load_policy",
    "modify",
    "parse_policy",
]

__getattr__ = lender(
    __name__,
    {
        # ``block`` is ``deny``'s old name: it stays out of __all__, and warns when called
        "block": ".core.policy",
        **dict.fromkeys(
            (
                "CallEvent",
                "Decision",
                "Limits",
                "Policy",
                "Rule",
                "Verdict",
                "allow",
                "deny",
                "deny_activity",
                "deny_when",
                "escalate",
                "modify",
            ),
            ".core.policy",
        ),
        **dict.fromkeys(("PolicyError", "load_policy", "parse_policy"), ".core.policy.file"),
    },
    moved={
        # internal since 0.2 (the policy's engine, not what a user configures)
        "ERROR_SIGNALS": ("interlock_temporal.core.policy", "ERROR_SIGNALS"),
        "Approval": ("interlock_temporal.core.policy", "Approval"),
        "CallFacts": ("interlock_temporal.core.policy", "CallFacts"),
        "Circuit": ("interlock_temporal.core.policy", "Circuit"),
        "PolicyGuard": ("interlock_temporal.core.policy", "PolicyGuard"),
        "PolicyState": ("interlock_temporal.core.policy", "PolicyState"),
        "Reason": ("interlock_temporal.core.policy", "Reason"),
        "SessionState": ("interlock_temporal.core.policy", "SessionState"),
        "admit": ("interlock_temporal.core.policy", "admit"),
        "decide": ("interlock_temporal.core.policy", "decide"),
        "evaluate_rules": ("interlock_temporal.core.policy", "evaluate_rules"),
        "has_error_signal": ("interlock_temporal.core.policy", "has_error_signal"),
        "reset_circuit": ("interlock_temporal.core.policy", "reset_circuit"),
        "PolicySource": ("interlock_temporal.core.policy.file", "PolicySource"),
        "report_cost": ("interlock_temporal", "report_cost"),
    },
)
