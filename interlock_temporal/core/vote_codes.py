"""One-time codes: how a person proves who they are from the Temporal Web UI, which can send a
signal but sign nothing.

The problem: the Web UI's signal form carries whatever JSON a person types, and anyone with
namespace access can type an operator's name. A key proof (``vote_proofs``) needs the person's
tools to sign; a browser has none.

The mechanism: for each operator on the roster and each decision, a worker derives a code from
the journal's keys (HKDF label ``interlock-vote-code-v1``, ``derived_keys``) over the ballot (the
roster's id, the review's kind, what it binds, the episode) the operator and the decision, 20
base-32 characters (100 bits), and sends it, from inside the notifying activity, to that
operator's own channel on the roster (their email address or webhook). It is never in a
workflow's input, an activity's input or result, or any event: all of those are in the
review's history, which anyone with namespace access reads. The person pastes
``{"decision": "approve", "operator": "carol", "code": "..."}`` into the signal form. The worker
that records the decision derives the code again and compares; a wrong code counts against
that operator on that question, and ``MAX_FAILURES`` of them lock the operator out of it. A code
that made a decision is consumed (``CodeUses``), so it is refused if offered again.

A code is issued before any result exists, so it cannot attest a ``happened`` result (that takes
a key); and ``interlock journal verify`` cannot check a code again offline (it is a secret the
worker derives, not a signature): the decision records that a code proved it, by digest.

Cost: one HKDF per worker, one HMAC-SHA256 per code; a row read and written per coded vote.
"""

from __future__ import annotations

import base64
import hashlib
import re
from abc import ABC, abstractmethod

from .derived_keys import DerivedKeys
from .errors import JournalConfigError
from .identity import canonical_json
from .journal.signing import Keyring
from .review_rules import Ballot

LABEL = b"interlock-vote-code-v1"
#: the family's name, the prefix of its key ids
NAME = "vote-code"
#: what a code looks like: five groups of four base-32 characters (100 bits)
FORMAT = re.compile(r"^[A-Z2-7]{4}(-[A-Z2-7]{4}){4}$")
#: wrong codes that lock an operator out of one question
MAX_FAILURES = 5


def _message(ballot: Ballot, operator: str, decision: str) -> bytes:
    return canonical_json(
        {
            "v": 1,
            "journal": ballot.journal,
            "kind": ballot.kind,
            "binding": ballot.binding,
            "episode": ballot.episode,
            "operator": operator,
            "decision": decision,
        }
    )


def _shown(mac_hex: str) -> str:
    text = base64.b32encode(bytes.fromhex(mac_hex)).decode()[:20]
    return "-".join(text[i : i + 4] for i in range(0, 20, 4))


def code_digest(code: str) -> str:
    """What names a used code where it is recorded (never the code itself)."""
    return hashlib.sha256(code.strip().upper().encode()).hexdigest()


class VoteCodes:
    """Derives the one-time codes of the journal's keys, and checks them."""

    def __init__(self, keyring: Keyring) -> None:
        self._keys = DerivedKeys.of(keyring, LABEL, NAME)

    def code(self, ballot: Ballot, operator: str, decision: str) -> str:
        """The code that proves ``operator``'s ``decision`` on ``ballot``."""
        key = self._keys.signing
        if key is None:
            raise JournalConfigError("one-time codes need the journal's signing key")
        return _shown(key.mac(_message(ballot, operator, decision)))

    def matches(self, ballot: Ballot, operator: str, decision: str, code: str) -> bool:
        """Whether ``code`` is that code, under this journal's key or an older one."""
        given = code.strip().upper()
        message = _message(ballot, operator, decision)
        return any(
            _shown(key.mac(message)) == given
            for key_id in self._keys.key_ids
            if (key := self._keys.get(key_id)) is not None
        )


class CodeUses(ABC):
    """Where a journal keeps what happened to codes: the wrong ones counted per operator and
    question, and the ones that made a decision (``vote_codes`` table; no chain: a record of the
    desk, like failed notifications)."""

    @abstractmethod
    def failures(self, episode: str, operator: str) -> int:
        """How many wrong codes ``operator`` offered on this question."""

    @abstractmethod
    def fail(self, episode: str, operator: str) -> int:
        """Count one more wrong code; the count after it."""

    @abstractmethod
    def used(self, digest: str) -> bool:
        """Whether the code with this digest already made a decision."""

    @abstractmethod
    def consume(self, episode: str, operator: str, digest: str) -> bool:
        """Record that the code made a decision; False if it already had."""
