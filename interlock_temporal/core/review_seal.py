"""A review's request, sealed by the worker that opened it.

The problem: anyone with Temporal namespace access can start an ``EffectReview`` workflow under
any id, with any rules, details and notifiers, and the review's request is all its workflow
knows. A worker that opens a review therefore MACs the request it starts the review with, bound
to the review's workflow id, under a key derived from the journal's keys (``derived_keys``,
label ``interlock-review-request-v1``), which only workers hold. Whoever reads the request back
from the review's history (the activity that records a decision, the desk before it joins a
running review) checks the seal, and a review whose request does not verify is not genuine: its
decisions are never recorded, and the desk replaces it.

The seal covers the request as JSON data (every field but ``seal``), in canonical form, so it
checks the request as its history holds it, whatever release reads it. Cost: one HMAC-SHA256
when a review opens, one per check; the check reads the review's start event from Temporal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .derived_keys import DerivedKeys
from .errors import JournalConfigError
from .identity import canonical_json
from .journal.signing import Keyring

LABEL = b"interlock-review-request-v1"
#: the family's name, the prefix of its key ids (``review-...``)
NAME = "review"
#: the request's field that carries its seal
FIELD = "seal"


def _message(workflow_id: str, request: Mapping[str, Any]) -> bytes:
    sealed = {k: v for k, v in request.items() if k != FIELD}
    return canonical_json({"v": 1, "review": workflow_id, "request": sealed})


class ReviewSeals:
    """Seals review requests with the journal's keys, and checks them."""

    def __init__(self, keyring: Keyring) -> None:
        self._keys = DerivedKeys.of(keyring, LABEL, NAME)

    def seal(self, workflow_id: str, request: Mapping[str, Any]) -> str:
        """The seal of ``request`` (JSON data) as the review ``workflow_id`` is started with."""
        key = self._keys.signing
        if key is None:
            raise JournalConfigError("sealing a review needs the journal's signing key")
        return f"{key.key_id}:{key.mac(_message(workflow_id, request))}"

    def problem(self, workflow_id: str, request: Mapping[str, Any]) -> str | None:
        """Why the review ``workflow_id`` started with ``request`` (JSON data, as its history
        holds it) is not genuine; None when its seal checks out."""
        seal = request.get(FIELD)
        if not isinstance(seal, str) or ":" not in seal:
            return (
                "its request carries no seal: no Interlock worker of this journal opened it (or "
                "a release from before sealed reviews did)"
            )
        key_id, _, mac = seal.partition(":")
        key = self._keys.get(key_id)
        if key is None:
            return (
                f"its request is sealed with key {key_id!r}, which this worker does not hold (a "
                "forgery, another journal's worker, or a journal key retired without being kept "
                "as an older key)"
            )
        if not key.matches(_message(workflow_id, request), mac):
            return "its seal does not match its request or its workflow id (forged or altered)"
        return None
