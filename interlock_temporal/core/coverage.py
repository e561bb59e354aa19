"""What escapes the gate, as data: each user activity of a worker, gated, policed only or
neither (``_worker/coverage.py`` classifies them, and says what each class means), and the one
line a worker logs at start. Here, apart from Temporal, so that ``interlock doctor`` can print
it without loading the SDK before it needs to."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Coverage = Literal["gated", "policed", "neither"]

#: the ``extra`` the start line is logged with, so a reader of the log (``interlock doctor``, which
#: reports the same facts itself) can tell it apart from a warning about something else
START_LINE = {"interlock_coverage": True}


class ActivityCoverage(BaseModel):
    """One activity of the worker and how it is guarded."""

    model_config = ConfigDict(frozen=True)

    #: the activity's registered name
    name: str
    #: gated, policed (only), or neither
    coverage: Coverage
    #: a gated activity's target tier (0-3); None otherwise
    tier: int | None = None
    #: a gated activity's target name; None otherwise
    target: str | None = None
    #: what in the policy names it (``rule big-refunds``, ``limits.costs['llm_*']``)
    named_by: list[str] = Field(default_factory=list)
    #: declared with ``no_effects``
    no_effects: bool = False
    #: registered by a Temporal agent integration to ask a model or read a listing (what it is:
    #: ``Pydantic AI's model call``); None otherwise
    integration: str | None = None


class WorkerCoverage(BaseModel):
    """Every user activity of one worker, classified; the counts the start line gives."""

    model_config = ConfigDict(frozen=True)

    activities: list[ActivityCoverage] = Field(default_factory=list)

    def _count(self, coverage: Coverage) -> int:
        return sum(1 for a in self.activities if a.coverage == coverage)

    @property
    def gated(self) -> int:
        return self._count("gated")

    @property
    def policed(self) -> int:
        return self._count("policed")

    @property
    def neither(self) -> list[str]:
        return [a.name for a in self.activities if a.coverage == "neither"]

    @property
    def tiers(self) -> dict[int, int]:
        """How many gated activities are at each tier, by tier."""
        return dict(sorted(Counter(a.tier for a in self.activities if a.tier is not None).items()))

    @property
    def level(self) -> int:
        """The start line's logging level: WARNING when an activity is neither (a guard is
        missing and nobody said so), else INFO."""
        return logging.WARNING if self.neither else logging.INFO

    def line(self) -> str:
        """The start line: ``2 gated (tier 1: 1, tier 2: 1), 1 policed only, 1 neither
        (send_sms: ...)``."""
        tiers = ", ".join(f"tier {t}: {n}" for t, n in self.tiers.items())
        gated = f"{self.gated} gated" + (f" ({tiers})" if tiers else "")
        neither = self.neither
        policed = f"{self.policed} policed only"
        text = f"interlock: activities: {gated}, {policed}, {len(neither)} neither"
        if neither:
            text += (
                f" ({', '.join(neither)}: may have side effects nobody guards; wrap with "
                "gated(...), name in the policy, or declare no_effects(...))"
            )
        return text
