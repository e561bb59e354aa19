"""The effect protocol (DESIGN section 4), with no Temporal import.

Every attempt runs under the effect's claim: claim, then read, then decide. ``begin`` returns
either the recorded outcome (``Done``) or a ``Ticket``: the dispatch is durably recorded and the
send may go out. The caller sends, then calls ``commit`` or ``fail``, which record the outcome and
release the claim. ``run`` strings the three together for callers with nothing to add.

The rooms, each one job: ``calls`` (the call, its delivery, what the gate answers, the effect's
name), ``recorder`` (recording the send's outcome, refusals, ambiguities, receipts),
``admission`` (the policy's say, the dispatch record), ``recovery`` (an effect in doubt, and
settling one whose owner is gone), ``gate`` (the attempt path, and ``Gate`` itself).
"""

from .calls import (
    ATOMIC_POINTS,
    IN_FLIGHT_RETRY_S,
    NO_LEASE,
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
    proposed_payload,
    to_the_end,
)
from .gate import Gate

__all__ = [
    "ATOMIC_POINTS",
    "IN_FLIGHT_RETRY_S",
    "NOT_OWNER_RETRY_S",
    "NO_LEASE",
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
    "proposed_payload",
    "to_the_end",
]
