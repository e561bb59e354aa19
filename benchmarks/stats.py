"""Distributions: nearest-rank percentiles over raw samples."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


def percentile(ordered: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``ordered`` (sorted ascending, not empty)."""
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class Dist:
    """A summary of one series of samples, in the series' unit."""

    n: int
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    min: float
    mean: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Dist:
        ordered = sorted(values)
        if not ordered:
            raise ValueError("no samples")
        return cls(
            n=len(ordered),
            p50=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p95=percentile(ordered, 95),
            p99=percentile(ordered, 99),
            max=ordered[-1],
            min=ordered[0],
            mean=sum(ordered) / len(ordered),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
