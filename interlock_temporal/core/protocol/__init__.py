"""The effect protocol, with no Temporal import: an effect's states (PROPOSED → AUTHORIZED →
DISPATCHED → COMMITTED, or REFUSED / AMBIGUOUS; RESOLVED or REOPENED after a person) and the
steps every attempt takes through them.

Every attempt runs under the effect's claim: claim, then read, then decide. ``begin`` returns
either the recorded outcome (``Done``) or a ``Ticket``: the dispatch is durably recorded and the
send may go out. The caller sends, then calls ``commit`` or ``fail``, which record the outcome and
release the claim. ``run`` strings the three together for callers with nothing to add.

``Gate`` is built by composition: it holds one of each part (``Dispatch``, ``Admission``,
``Atomic``, ``Recovery``, ``Recorder``), each built with an explicit constructor from what it
needs, and no part inherits another. The rooms, each one job: ``calls`` (the call, its delivery,
what the gate answers, the effect's name), ``gate`` (``Gate``: claim, read, decide, and the
public surface), ``dispatch`` (a new effect proposed, authorised and dispatched in one
transaction; a reopened one authorised afresh, and one refused for the caller's configuration
decided again; a retry whose effect key changed refused),
``admission`` (the policy's say, the DISPATCHED draft), ``atomic`` (tier 0: the dispatch, the
body's write and the commit in one journal transaction), ``recovery`` (an effect in doubt, and
closing out one whose owner is gone), ``recorder`` (recording the send's outcome, refusals,
ambiguities; stored values and receipts).
"""

from .calls import (
    ATOMIC_POINTS,
    IN_FLIGHT_RETRY_S,
    NOT_OWNER_RETRY_S,
    POINTS,
    Call,
    Delivery,
    Done,
    Measure,
    OwnerEnded,
    Ticket,
    Transaction,
    decision_premises,
    no_lease,
    proposed_payload,
    to_the_end,
)
from .gate import Gate

__all__ = [
    "ATOMIC_POINTS",
    "IN_FLIGHT_RETRY_S",
    "NOT_OWNER_RETRY_S",
    "POINTS",
    "Call",
    "Delivery",
    "Done",
    "Gate",
    "Measure",
    "OwnerEnded",
    "Ticket",
    "Transaction",
    "decision_premises",
    "no_lease",
    "proposed_payload",
    "to_the_end",
]
