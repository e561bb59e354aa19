"""What a target of effects can honestly promise, declared by its adapter.

Tier 1: dedupes a resend that carries the effect id as its idempotency key, inside a window.
Tier 2: can be asked whether an effect happened (``query``). Tier 3: neither.
Methods may be sync or async; the gate awaits coroutines.

A tier-1 resend is only as safe as the window is long: the resend may still be processed up to
``settle_time`` after it leaves (a request in a queue, the client library's own retries), and
clocks drift. So the gate relies on the window only until ``first dispatch + dedupe_window -
settle_time - dedupe_margin``; past that it asks the target, or says AMBIGUOUS.
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
#: how long before a dedupe window's end (less ``settle_time``) the gate stops resending into it
DEFAULT_DEDUPE_MARGIN = timedelta(minutes=5)

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
    - ``dedupe_margin: timedelta``: how long before the window's end, less ``settle_time``, a
      resend stops relying on the window (default 5 minutes).
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
    dedupe_margin: timedelta = DEFAULT_DEDUPE_MARGIN

    @property
    def tier(self) -> int:
        if self.dedupe_window is not None:
            return 1
        return 2 if self.queryable else 3

    def resend_deduped(self, first_dispatch_ts: float | None, now: float) -> bool:
        """Whether a resend sent at ``now`` (the target's clock) is still sure to be deduped:
        it must land, ``settle_time`` later at worst, ``dedupe_margin`` before the window that
        opened at the first dispatch closes."""
        if self.dedupe_window is None or first_dispatch_ts is None:
            return False
        usable = self.dedupe_window - self.settle_time - self.dedupe_margin
        return now < first_dispatch_ts + usable.total_seconds()


class TargetDeclarationError(ValueError):
    """A target declares what it cannot honestly promise (raised when ``gated`` is applied)."""


def capabilities(target: EffectTarget) -> Capabilities:
    window = getattr(target, "dedupe_window", None)
    settle = getattr(target, "settle_time", timedelta(0))
    return Capabilities(
        dedupe_window=window if window and window > timedelta(0) else None,
        queryable=callable(getattr(target, "query", None)),
        settle_time=settle,
        dedupe_margin=getattr(target, "dedupe_margin", DEFAULT_DEDUPE_MARGIN),
    )


def check_declaration(target: EffectTarget) -> Capabilities:
    """The target's capabilities, refused when they do not add up: durations that are not
    ``timedelta`` or are negative, or a dedupe window too short to rely on at all."""
    name = getattr(target, "name", type(target).__name__)
    for attr, optional in (("dedupe_window", True), ("settle_time", False)):
        value = getattr(target, attr, None if optional else timedelta(0))
        if value is None and optional:
            continue
        if not isinstance(value, timedelta) or value < timedelta(0):
            raise TargetDeclarationError(
                f"target {name}: {attr} must be a non-negative timedelta"
                + (" or None" if optional else "")
            )
    margin = getattr(target, "dedupe_margin", DEFAULT_DEDUPE_MARGIN)
    if not isinstance(margin, timedelta) or margin < timedelta(0):
        raise TargetDeclarationError(
            f"target {name}: dedupe_margin must be a non-negative timedelta"
        )
    caps = capabilities(target)
    if caps.dedupe_window is not None and caps.dedupe_window <= caps.settle_time + margin:
        raise TargetDeclarationError(
            f"target {name}: dedupe_window must exceed settle_time + dedupe_margin "
            f"({caps.settle_time + margin}): a resend near the window's end could be processed "
            "after the target forgot its key. Lower dedupe_margin or settle_time, or declare "
            "no dedupe_window"
        )
    return caps


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
