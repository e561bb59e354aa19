"""The effect protocol, the journal and its parts: plain Python, no Temporal import."""

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
