"""Moved to ``interlock_temporal._worker.codec``: this module is only an import shim for code
outside the package that imports the old path, and is removed in 0.3.0. Import from the new path.

Every name of the new module reads here as the same object, its private names included; importing
this module warns once (``DeprecationWarning``)."""

import warnings as _warnings
from typing import Any as _Any

from ._worker import codec as _moved
from ._worker.codec import *  # noqa: F403

_warnings.warn(
    f"{__name__} moved to {_moved.__name__}; the old path is removed in 0.3.0",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> _Any:
    return getattr(_moved, name)
