"""How many examples a property test draws.

The property tests (hypothesis) are the suite's slowest in-process tests at their full counts:
about a minute of ``make test`` together. ``make test`` draws a fifth of each full count (at
least 50), enough to catch a broken invariant on most runs; ``make faults`` runs them again,
marked ``properties``, with ``INTERLOCK_FULL_PROPERTIES=1``: the full count each declares."""

from __future__ import annotations

import os

from hypothesis import settings

#: set by ``make faults``: every property test draws its full count
FULL = os.environ.get("INTERLOCK_FULL_PROPERTIES") == "1"


def examples(full: int) -> settings:
    """The settings of a property test whose full count is ``full`` examples."""
    return settings(max_examples=full if FULL else max(50, full // 5), deadline=None)
