"""One call as the policy sees it: ``CallEvent`` (the call as the activity would receive it,
and who makes it: what the rules read), and what is derived from its input (its digest, the
cost it reports, a masked copy for a person)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..identity import UnserializableInput, canonical_json, jsonable


@dataclass(frozen=True)
class CallEvent:
    """One call as the policy's rules see it: the arguments the activity would receive, and
    who makes it. The gate sees the same call as a ``Call``; the breaker reads the
    ``CallFacts`` derived from it."""

    activity: str
    args: tuple[Any, ...]
    principal: str | None = None
    session: str | None = None
    namespace: str | None = None
    attempt: int = 1
    workflow_id: str | None = None
    effect_id: str | None = None
    #: "call" before the body runs; "result" after, with what it returned
    phase: Literal["call", "result"] = "call"
    result: Any = None
    #: the activity's parameter names, when known
    param_names: tuple[str, ...] = ()
    #: where the text of each argument came from (argument path -> origin labels such as
    #: ``activity:fetch_page``), found in the policy store's flow marks (``flow``); empty
    #: unless the policy has a flow rule for this activity
    origins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the workflow run the call belongs to (a ``flow_scope: run`` policy's scope)
    run_id: str | None = None

    @property
    def input(self) -> Any:
        """The single argument, or the tuple of them."""
        return self.args[0] if len(self.args) == 1 else self.args

    def argument(self, name: str, default: Any = None) -> Any:
        """An argument by its parameter name, else a field of the single input (a model, a
        dataclass or a mapping)."""
        if name in self.param_names and len(self.param_names) == len(self.args):
            return self.args[self.param_names.index(name)]
        value = self.input
        if isinstance(value, Mapping):
            return value.get(name, default)
        return getattr(value, name, default)


def input_digest(args: Sequence[Any]) -> str:
    """The digest of a call's input as proposed (argument values never leave as themselves)."""
    try:
        data = jsonable(list(args))
        return hashlib.sha256(canonical_json(data)).hexdigest()
    except (UnserializableInput, TypeError, ValueError):
        # no canonical form: digest the types, so such calls still count as one kind of call
        return hashlib.sha256(repr([type(a).__qualname__ for a in args]).encode()).hexdigest()


MASK = "**********"


def redact(data: Any, secret: frozenset[str]) -> Any:
    """``data`` with the value of every field named in ``secret`` masked, at any depth."""
    if not secret:
        return data
    if isinstance(data, dict):
        return {k: MASK if k in secret else redact(v, secret) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v, secret) for v in data]
    return data


def cost_in(value: Any, field_name: str | None) -> float | None:
    """A cost the input or result reports in ``field_name``: a finite, non-negative number."""
    if field_name is None:
        return None
    if isinstance(value, Mapping):
        found = value.get(field_name)
    else:
        found = getattr(value, field_name, None)
    if isinstance(found, bool) or not isinstance(found, int | float):
        return None
    number = float(found)
    return number if math.isfinite(number) and number >= 0 else None
