"""The effect protocol, the journal and its parts: plain Python, no Temporal import.

Internal: no compatibility promise between releases (docs/architecture.md). Each name is imported
on first use, so importing one room (``core.models``, say, from a workflow) loads only that room.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .exports import lender

if TYPE_CHECKING:
    from .errors import (
        Ambiguous,
        GateOutcome,
        HeadConflict,
        InFlight,
        InterlockError,
        InvalidCall,
        JournalConfigError,
        JournalCorrupt,
        JournalUnavailable,
        Refused,
    )
    from .identity import canonical, digest, effect_id, jsonable
    from .journal import Journal, RawEntry, open_journal
    from .journal.claims import Claim, Claims, FileClaims, RangeClaims, host_claims
    from .journal.signing import Ed25519Key, HmacKey, Keyring
    from .leases import Demand, LeaseStore, check_lease
    from .models import (
        Change,
        Draft,
        EffectRow,
        Entry,
        Found,
        JournalHead,
        Kind,
        Lease,
        Receipt,
        VerifyReport,
    )
    from .protocol import Call, Delivery, Done, Gate, Measure, Ticket
    from .receipts import EffectView, fold, receipt, receipt_of
    from .targets import Capabilities, EffectTarget, capabilities

__all__ = [
    "Ambiguous",
    "Call",
    "Capabilities",
    "Change",
    "Claim",
    "Claims",
    "Delivery",
    "Demand",
    "Done",
    "Draft",
    "Ed25519Key",
    "EffectRow",
    "EffectTarget",
    "EffectView",
    "Entry",
    "FileClaims",
    "Found",
    "Gate",
    "GateOutcome",
    "HeadConflict",
    "HmacKey",
    "InFlight",
    "InterlockError",
    "InvalidCall",
    "Journal",
    "JournalConfigError",
    "JournalCorrupt",
    "JournalHead",
    "JournalUnavailable",
    "Keyring",
    "Kind",
    "Lease",
    "LeaseStore",
    "Measure",
    "RangeClaims",
    "RawEntry",
    "Receipt",
    "Refused",
    "Ticket",
    "VerifyReport",
    "canonical",
    "capabilities",
    "check_lease",
    "digest",
    "effect_id",
    "fold",
    "host_claims",
    "jsonable",
    "open_journal",
    "receipt",
    "receipt_of",
]

__getattr__ = lender(
    __name__,
    {
        **dict.fromkeys(
            (
                "Ambiguous",
                "GateOutcome",
                "HeadConflict",
                "InFlight",
                "InterlockError",
                "InvalidCall",
                "JournalConfigError",
                "JournalCorrupt",
                "JournalUnavailable",
                "Refused",
            ),
            ".errors",
        ),
        **dict.fromkeys(("canonical", "digest", "effect_id", "jsonable"), ".identity"),
        **dict.fromkeys(("Journal", "RawEntry", "open_journal"), ".journal"),
        **dict.fromkeys(
            ("Claim", "Claims", "FileClaims", "RangeClaims", "host_claims"), ".journal.claims"
        ),
        **dict.fromkeys(("Ed25519Key", "HmacKey", "Keyring"), ".journal.signing"),
        **dict.fromkeys(("Demand", "LeaseStore", "check_lease"), ".leases"),
        **dict.fromkeys(
            (
                "Change",
                "Draft",
                "EffectRow",
                "Entry",
                "Found",
                "JournalHead",
                "Kind",
                "Lease",
                "Receipt",
                "VerifyReport",
            ),
            ".models",
        ),
        **dict.fromkeys(("Call", "Delivery", "Done", "Gate", "Measure", "Ticket"), ".protocol"),
        **dict.fromkeys(("EffectView", "fold", "receipt", "receipt_of"), ".receipts"),
        **dict.fromkeys(("Capabilities", "EffectTarget", "capabilities"), ".targets"),
    },
)
