"""Target adapters. Each declares what it can honestly promise (its tier); ``BaseTarget`` is
the class to start a new one from."""

from ..core.models import Change, Found
from ..core.targets import (
    BaseTarget,
    Capabilities,
    EffectTarget,
    TargetDeclarationError,
    capabilities,
    default_validate,
)

__all__ = [
    "BaseTarget",
    "Capabilities",
    "Change",
    "EffectTarget",
    "Found",
    "TargetDeclarationError",
    "capabilities",
    "default_validate",
]
