"""A session's breaker state (its circuit, streak, counts, spend and windows), as ``decide``
reads it and the store keeps it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import TypeAdapter


@dataclass(frozen=True, slots=True)
class Circuit:
    """Why and when a session's circuit opened. Only a person closes it."""

    code: str
    activity: str
    at: float


# The state records are not frozen only because frozen dataclasses cost four times as much to
# build, and ``decide`` builds them on every call: nothing mutates one once built.
@dataclass(slots=True)
class SessionState:
    circuit: Circuit | None = None
    #: the last allowed call's signature (activity and input digest) and how many in a row
    last_call: str = ""
    streak: int = 0
    total: int = 0
    spent_usd: float = 0.0
    #: per activity type, the times of the calls inside the current window
    windows: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # The deliveries a session has seen (its nonces) are not kept here: the store keeps them in
    # an indexed table and tells ``decide`` whether this one was seen (``CallFacts.replayed``),
    # so the document and ``decide`` stay the same size however long the session runs. A
    # document of an older release may still carry ``deliveries``: it is ignored when loaded
    # (the schema-5 migration moved them into the store's table).


@dataclass(slots=True)
class PolicyState:
    """What ``decide`` reads: the session's state and the spend of the wider budgets."""

    session: SessionState = field(default_factory=SessionState)
    principal_spent_usd: float = 0.0
    namespace_spent_usd: float = 0.0


def reset_circuit(state: SessionState) -> SessionState:
    """A person closed the circuit: the session starts counting afresh (its spend stays)."""
    return SessionState(spent_usd=state.spent_usd)


STATE = TypeAdapter(SessionState)


def dump_session(state: SessionState) -> bytes:
    return STATE.dump_json(state)


def load_session(doc: str | bytes | None) -> SessionState:
    return SessionState() if doc is None else STATE.validate_json(doc)
