"""How a public module lends its names: imported on first use (so importing the package stays
light, and a workflow sandbox never pulls in the journal), and names that moved kept one more
release as deprecated aliases that say where the name lives now (``deprecated.ALIASES``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .deprecated import ALIASES, warn_alias


def lender(module: str, lazy: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``.

    ``lazy`` maps a public name to the module that defines it (relative to ``module``'s package);
    the value is cached in the module once read. A name ``deprecated.ALIASES`` lists for
    ``module`` is found where it lives now: each use warns (``DeprecationWarning``) and is never
    cached, so every caller hears of it."""
    is_package = hasattr(sys.modules[module], "__path__")
    package = module if is_package else module.rpartition(".")[0]
    moved = ALIASES.get(module, {})

    def __getattr__(name: str) -> Any:
        if name in lazy:
            value = getattr(importlib.import_module(lazy[name], package), name)
            setattr(sys.modules[module], name, value)
            return value
        if name in moved:
            where, new_name = warn_alias(module, name)
            return getattr(importlib.import_module(where), new_name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
