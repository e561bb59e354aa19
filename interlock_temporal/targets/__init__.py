"""Target adapters. Each declares what it can honestly promise (its tier)."""

from ..core.models import Change, Found
from ..core.targets import Capabilities, EffectTarget, capabilities

__all__ = ["Capabilities", "Change", "EffectTarget", "Found", "capabilities"]
