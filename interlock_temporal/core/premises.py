"""Premises: the facts an effect relies on. Captured when the agent decides (or at the first
attempt), captured afresh before every resend, and compared; what changed is named."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import CaptureFailed
from .identity import jsonable
from .models import Change
from .targets import EffectTarget, default_validate, resolve


async def capture(target: EffectTarget, args: Any, effect_id: str) -> dict[str, Any]:
    """The target's facts now, as JSON data (so they compare equal to what the journal holds).
    A ``capture`` that raises is ``CaptureFailed``, naming the target: nothing is recorded or
    sent, and the attempt is retried."""
    try:
        facts: Mapping[str, Any] = await resolve(target.capture(args, effect_id))
    except Exception as err:
        name = str(getattr(target, "name", None) or type(target).__name__)
        raise CaptureFailed(name, effect_id, err) from err
    return dict(jsonable(dict(facts)))


async def validate(
    target: EffectTarget, recorded: Mapping[str, Any], current: Mapping[str, Any], payload: Any
) -> list[Change]:
    """The premises that no longer hold. A validator that raises counts as a change (fail
    closed): a broken check must not let a resend through."""
    fn = getattr(target, "validate", None)
    if not callable(fn):
        return default_validate(recorded, current)
    try:
        changes: Sequence[Change] = await resolve(fn(recorded, current, payload))
    except Exception as err:
        return [Change(fact="<validate>", rule=f"raised {type(err).__name__}")]
    return list(changes)


def describe(changes: Sequence[Change]) -> str:
    """A sentence naming the facts that changed (names only: values stay in the journal)."""
    names = ", ".join(c.fact for c in changes)
    return f"the facts it relied on changed: {names}"
