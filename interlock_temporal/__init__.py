"""interlock-temporal: make the side effects of AI agents on Temporal safe to retry.

Register ``InterlockPlugin`` on the client, wrap each effectful activity with ``gated(...)``, and
call it from a workflow under ``act_as(principal, lease)`` (``interlock_temporal.workflow``).

The core (``interlock_temporal.core``) imports no Temporal module; the names below that need
Temporal are imported on first use, so tools and the core stay light.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from .core.journal import Journal, open_journal
from .core.models import Change, Found, Kind, Lease, Receipt
from .core.policy import Limits, Policy
from .core.receipts import receipt
from .core.review import ReviewRules, Vote
from .core.targets import EffectTarget, TargetDeclarationError

if TYPE_CHECKING:
    from ._errors import (
        AmbiguousEffect,
        ApprovalRequired,
        AuthorityRejected,
        EffectInFlight,
        EffectRefused,
        InterlockDenied,
        InterlockNotInstalled,
        InvalidEffectInput,
        receipt_from,
    )
    from ._gated import EffectContext, current_effect, gated, report_cost
    from ._interceptor import InterlockInterceptor
    from ._plugin import InterlockPlugin
    from ._reconciler import Reconciler, ReconcileReport, ReconcileRequest
    from ._review_workflow import EffectReview, Resolution, ReviewStatus
    from ._telemetry import Telemetry

_LAZY = {
    "AmbiguousEffect": "._errors",
    "ApprovalRequired": "._errors",
    "AuthorityRejected": "._errors",
    "InterlockDenied": "._errors",
    "EffectInFlight": "._errors",
    "EffectRefused": "._errors",
    "InterlockNotInstalled": "._errors",
    "InvalidEffectInput": "._errors",
    "receipt_from": "._errors",
    "EffectContext": "._gated",
    "current_effect": "._gated",
    "gated": "._gated",
    "report_cost": "._gated",
    "InterlockInterceptor": "._interceptor",
    "InterlockPlugin": "._plugin",
    "Telemetry": "._telemetry",
    "EffectReview": "._review_workflow",
    "Reconciler": "._reconciler",
    "ReconcileRequest": "._reconciler",
    "ReconcileReport": "._reconciler",
    "Resolution": "._review_workflow",
    "ReviewStatus": "._review_workflow",
}

__all__ = [
    "AmbiguousEffect",
    "ApprovalRequired",
    "AuthorityRejected",
    "Change",
    "EffectContext",
    "EffectInFlight",
    "EffectRefused",
    "EffectReview",
    "EffectTarget",
    "Found",
    "InterlockDenied",
    "InterlockInterceptor",
    "InterlockNotInstalled",
    "InterlockPlugin",
    "InvalidEffectInput",
    "Journal",
    "Kind",
    "Lease",
    "Limits",
    "Policy",
    "Receipt",
    "ReconcileReport",
    "ReconcileRequest",
    "Reconciler",
    "Resolution",
    "ReviewRules",
    "ReviewStatus",
    "TargetDeclarationError",
    "Telemetry",
    "Vote",
    "current_effect",
    "gated",
    "open_journal",
    "receipt",
    "receipt_from",
    "report_cost",
]


def __getattr__(name: str) -> Any:
    if name == "Decision":  # the vote's old name; the policy's ``Decision`` is another class
        warnings.warn(
            "interlock_temporal.Decision is deprecated: use interlock_temporal.Vote",
            DeprecationWarning,
            stacklevel=2,
        )
        return Vote
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'interlock_temporal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
