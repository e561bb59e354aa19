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
    from .core.policy.flow import flow_matches

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
    "flow_matches",
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
        "flow_matches": ".core.policy.flow",
    },
)
