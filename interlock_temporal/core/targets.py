"""What a target of effects can honestly promise, declared by its adapter.

Tier 1: dedupes a resend that carries the effect id as its idempotency key, inside a window.
Tier 2: can be asked whether an effect happened (``query``). Tier 3: neither.
Methods may be sync or async; the gate awaits coroutines.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from .models import Found

Classification = Literal["not_sent", "rejected", "in_doubt"]
CLASSIFICATIONS: frozenset[str] = frozenset({"not_sent", "rejected", "in_doubt"})

T = TypeVar("T")


@runtime_checkable
class EffectTarget(Protocol):
    """The required part of a target adapter. Optional methods:

    - ``query(effect_id[, args]) -> Found | None``: tier 2, does the effect exist, and its
      result (``args``: the effect's approved input, for targets that look effects up through
      it).
    - ``validate(recorded, current, payload) -> list[Change]``: premise comparison (default:
      field-by-field equality). Prefer predicates ("refundable remainder >= amount") where
      equality is too strict.
    - ``classify(error) -> "not_sent" | "rejected" | "in_doubt"`` (default: in_doubt).
    - ``clock() -> float``: the clock the dedupe window is measured on (default: time.time).
    - ``confirmation(result) -> str | None``: the target's reference for what it did (a refund
      id), cited by the receipt.
    """

    @property
    def name(self) -> str: ...

    @property
    def dedupe_window(self) -> timedelta | None: ...

    @property
    def settle_time(self) -> timedelta: ...

    def capture(
        self, args: Any, effect_id: str
    ) -> Mapping[str, Any] | Awaitable[Mapping[str, Any]]:
        """The facts the effect relies on, excluding this effect's own contribution."""
        ...


@dataclass(frozen=True)
class Capabilities:
    dedupe_window: timedelta | None
    queryable: bool
    settle_time: timedelta

    @property
    def tier(self) -> int:
        if self.dedupe_window is not None:
            return 1
        return 2 if self.queryable else 3


def capabilities(target: EffectTarget) -> Capabilities:
    window = getattr(target, "dedupe_window", None)
    settle = getattr(target, "settle_time", timedelta(0))
    return Capabilities(
        dedupe_window=window if window and window > timedelta(0) else None,
        queryable=callable(getattr(target, "query", None)),
        settle_time=settle,
    )


async def resolve(value: T | Any) -> T:
    return await value if inspect.isawaitable(value) else value  # type: ignore[no-any-return]


def _takes_input(fn: Any) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


async def query(target: EffectTarget, effect_id: str, args: Any = None) -> Found | None:
    """Ask a queryable target whether the effect happened. A ``query(effect_id, args)`` is
    given the effect's approved input too (Stripe finds refunds through their charge)."""
    fn = getattr(target, "query", None)
    if not callable(fn):
        return None
    found = await resolve(fn(effect_id, args) if _takes_input(fn) else fn(effect_id))
    if found is None or isinstance(found, Found):
        return found
    return Found.model_validate(found)


def classify(target: EffectTarget, error: BaseException) -> Classification:
    fn = getattr(target, "classify", None)
    if not callable(fn):
        return "in_doubt"
    try:
        verdict = fn(error)
    except Exception:
        return "in_doubt"
    return verdict if verdict in CLASSIFICATIONS else "in_doubt"


def confirmation_of(target: EffectTarget, result: Any) -> str | None:
    """The target's own reference for what it did (a refund id), if it names one."""
    fn = getattr(target, "confirmation", None)
    if not callable(fn):
        return None
    try:
        value = fn(result)
    except Exception:
        return None
    return value if isinstance(value, str) else None


def target_clock(target: EffectTarget) -> float:
    fn = getattr(target, "clock", None)
    return float(fn()) if callable(fn) else time.time()
