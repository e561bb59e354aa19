"""interlock-temporal: make the side effects of AI agents on Temporal safe to retry.

Register ``InterlockPlugin`` on the client, wrap each effectful activity with ``gated(...)``, and
call it from a workflow under ``act_as(principal, lease)`` (``interlock_temporal.workflow``).

These are the names a user needs. The rest lives in ``interlock_temporal.policy`` (limits and
rules), ``interlock_temporal.review`` (a person's vote, the review workflow, the reconciler),
``interlock_temporal.targets`` (writing a target), ``interlock_temporal.workflow`` and
``interlock_temporal.testing``; everything else is internal (docs/architecture.md). Each name is
imported on first use, so importing the package stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.deprecated import install_moved_modules
from .core.exports import lender

if TYPE_CHECKING:
    from ._worker.coverage import no_effects
    from ._worker.errors import (
        AmbiguousEffect,
        ApprovalRequired,
        AuthorityRejected,
        EffectInFlight,
        EffectRefused,
        InterlockDenied,
        InterlockNotInstalled,
        InvalidEffectInput,
    )
    from ._worker.gated import EffectContext, current_effect, gated, report_cost
    from ._worker.interceptor import InterlockInterceptor
    from ._worker.plugin import InterlockPlugin
    from ._worker.running import run_worker
    from ._worker.telemetry import Telemetry
    from .core.journal import Journal, open_journal
    from .core.models import Kind, Lease, Receipt
    from .core.receipts import receipt
    from .core.review_rules import ReviewRules
    from .core.targets import BaseTarget, EffectTarget, TargetDeclarationError

__all__ = [
    "AmbiguousEffect",
    "ApprovalRequired",
    "AuthorityRejected",
    "BaseTarget",
    "EffectContext",
    "EffectInFlight",
    "EffectRefused",
    "EffectTarget",
    "InterlockDenied",
    "InterlockInterceptor",
    "InterlockNotInstalled",
    "InterlockPlugin",
    "InvalidEffectInput",
    "Journal",
    "Kind",
    "Lease",
    "Receipt",
    "ReviewRules",
    "TargetDeclarationError",
    "Telemetry",
    "current_effect",
    "gated",
    "no_effects",
    "open_journal",
    "receipt",
    "report_cost",
    "run_worker",
]

_ERRORS = (
    "AmbiguousEffect",
    "ApprovalRequired",
    "AuthorityRejected",
    "EffectInFlight",
    "EffectRefused",
    "InterlockDenied",
    "InterlockNotInstalled",
    "InvalidEffectInput",
)

__getattr__ = lender(
    __name__,
    {
        **dict.fromkeys(_ERRORS, "._worker.errors"),
        **dict.fromkeys(
            ("EffectContext", "current_effect", "gated", "report_cost"), "._worker.gated"
        ),
        "no_effects": "._worker.coverage",
        "InterlockInterceptor": "._worker.interceptor",
        "InterlockPlugin": "._worker.plugin",
        "run_worker": "._worker.running",
        "Telemetry": "._worker.telemetry",
        "Journal": ".core.journal",
        "open_journal": ".core.journal",
        "Kind": ".core.models",
        "Lease": ".core.models",
        "Receipt": ".core.models",
        "receipt": ".core.receipts",
        "ReviewRules": ".core.review_rules",
        "BaseTarget": ".core.targets",
        "EffectTarget": ".core.targets",
        "TargetDeclarationError": ".core.targets",
    },
)

# the adapter's old module paths, one more release (core/deprecated.py)
install_moved_modules()
