"""interlock-temporal: make the side effects of AI agents on Temporal safe to retry.

Register ``InterlockPlugin`` on the client, wrap each effectful activity with ``gated(...)``, and
call it from a workflow under ``act_as(principal, lease)``.
"""

from ._errors import (
    AmbiguousEffect,
    EffectInFlight,
    EffectRefused,
    InterlockNotInstalled,
    InvalidEffectInput,
    receipt_from,
)
from ._gated import EffectContext, current_effect, gated
from ._interceptor import InterlockInterceptor
from ._plugin import InterlockPlugin
from .core.journal import Journal, open_journal
from .core.models import Change, Found, Kind, Lease, Receipt
from .core.receipts import receipt
from .core.targets import EffectTarget

__all__ = [
    "AmbiguousEffect",
    "Change",
    "EffectContext",
    "EffectInFlight",
    "EffectRefused",
    "EffectTarget",
    "Found",
    "InterlockInterceptor",
    "InterlockNotInstalled",
    "InterlockPlugin",
    "InvalidEffectInput",
    "Journal",
    "Kind",
    "Lease",
    "Receipt",
    "current_effect",
    "gated",
    "open_journal",
    "receipt",
    "receipt_from",
]
