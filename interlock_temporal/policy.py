"""The policy layer's public surface: limits, rules and the pure ``decide``.

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

from ._gated import report_cost
from .core.policy import (
    ERROR_SIGNALS,
    Approval,
    CallEvent,
    CallFacts,
    Circuit,
    Decision,
    Limits,
    Policy,
    PolicyGuard,
    PolicyState,
    Reason,
    Rule,
    SessionState,
    Verdict,
    admit,
    allow,
    block,
    decide,
    deny,
    deny_activity,
    deny_when,
    escalate,
    evaluate_rules,
    has_error_signal,
    modify,
    reset_circuit,
)
from .core.policy.file import PolicyError, PolicySource, load_policy, parse_policy

__all__ = [
    "ERROR_SIGNALS",
    "Approval",
    "CallEvent",
    "CallFacts",
    "Circuit",
    "Decision",
    "Limits",
    "Policy",
    "PolicyError",
    "PolicyGuard",
    "PolicySource",
    "PolicyState",
    "Reason",
    "Rule",
    "SessionState",
    "Verdict",
    "admit",
    "allow",
    "block",
    "decide",
    "deny",
    "deny_activity",
    "deny_when",
    "escalate",
    "evaluate_rules",
    "has_error_signal",
    "load_policy",
    "modify",
    "parse_policy",
    "report_cost",
    "reset_circuit",
]
