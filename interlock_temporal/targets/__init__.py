"""Targets: where an effect lands. Each declares what it can honestly promise (its tier);
``BaseTarget`` is the class to start a new one from, ``EffectTarget`` the protocol a duck-typed
one matches. ``payments`` (the reference target), ``stripe``, ``repo``, ``http`` (any HTTP API
that honours an idempotency key) and ``email`` (SMTP) are ready-made."""

from ..core.exports import lender
from ..core.models import Change, Found
from ..core.targets import BaseTarget, EffectTarget, TargetDeclarationError

__all__ = ["BaseTarget", "Change", "EffectTarget", "Found", "TargetDeclarationError"]

__getattr__ = lender(__name__, {})
