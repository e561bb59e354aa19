"""Values the journal stores sealed by the user's codec, and the keyed digests that go with them.

The core never encodes anything itself: a ``Sealer`` (the Temporal adapter's, around the
client's ``PayloadCodec``) turns a value's canonical JSON into opaque text and back. A sealed
value is stored as the JSON object ``{"$sealed": <scheme>, "data": <opaque text>}``, so a reader
knows it is encoded; the entry that stores it signs the digest of those stored bytes, so the
chain and the signatures cover the encoded bytes and verify without the codec.

An unkeyed sha256 of a small value (``{order, amount}``) can be found by trying values, so an
effect whose values are sealed digests its payload, input, approved input and result with
HMAC-SHA256 under a key derived (HKDF, label ``interlock-value-digests-v1``) from the journal's
signing key. Its ``PROPOSED`` entry records the scheme (``digests``: ``hmac-sha256:<key id>``,
absent: plain sha256), and every later digest of that effect uses the same scheme, so an
effect recorded before the codec was configured keeps its plain digests and still verifies
and compares. Effect ids are keyed per journal, not per effect (``Values.ids``; the journal's
``effect_ids`` setting), because every worker must name one decision the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any, Protocol

from .derived_keys import hkdf_sha256, secret_material
from .errors import JournalConfigError
from .identity import canonical
from .journal.signing import Keyring

#: the key that marks a stored value as sealed
SEALED = "$sealed"
#: the scheme of a value whose encoding failed after the send: nothing of it is stored
UNAVAILABLE = "unavailable"
#: the prefix of a keyed digest scheme (the key id follows)
KEYED = "hmac-sha256:"
_LABEL = b"interlock-value-digests-v1"
_ID_LABEL = b"interlock-effect-ids-v1"
ENCRYPTED = "encrypted"


class Sealer(Protocol):
    """Encodes stored values (the adapter's, around a Temporal ``PayloadCodec``)."""

    #: names the encoding in each sealed value (e.g. ``temporal-codec/v1``)
    scheme: str

    async def seal(self, data: bytes) -> str:
        """The opaque text stored for ``data`` (a value's canonical JSON)."""
        ...

    async def unseal(self, scheme: str, data: str) -> bytes:
        """The canonical JSON ``seal`` encoded as ``data``."""
        ...


class ValueSealed(JournalConfigError):
    """A sealed value is needed and nothing here can decode it."""


def is_sealed(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get(SEALED), str)


class Values:
    """How the gate stores and reads the values of effects, and digests them: plain (no
    sealer), or sealed with keyed digests."""

    def __init__(self, keyring: Keyring, sealer: Sealer | None = None) -> None:
        self.keyring = keyring
        self.sealer = sealer
        self._keys: dict[tuple[str, bytes], bytes] = {}

    @property
    def scheme(self) -> str | None:
        """The digest scheme of a new effect: keyed when values are sealed."""
        if self.sealer is None or not self.keyring.can_sign:
            return None
        return KEYED + self.keyring.signing.key_id

    def _key(self, scheme: str, label: bytes = _LABEL) -> bytes:
        key_id = scheme.removeprefix(KEYED)
        found = self._keys.get((key_id, label))
        if found is None:
            signing = self.keyring.get(key_id) if scheme.startswith(KEYED) else None
            material = None if signing is None else secret_material(signing)
            if material is None:
                what = "effect ids are" if label == _ID_LABEL else "effect's digests are"
                raise JournalConfigError(
                    f"the {what} keyed with journal key {key_id}, which this worker does not "
                    "hold: add it to older_keys"
                )
            found = self._keys[(key_id, label)] = hkdf_sha256(material, label)
        return found

    def ids(self, scheme: str | None) -> Callable[[bytes], str] | None:
        """How a journal whose effect ids are ``scheme`` (``hmac-sha256:<key id>``; None: plain
        sha256, the default) digests an id's document. The key is derived (HKDF, label
        ``interlock-effect-ids-v1``) from the journal key the scheme names, which stays in the
        keyring after a rotation (``older_keys``), so ids never change."""
        if scheme is None:
            return None
        key = self._key(scheme, _ID_LABEL)
        return lambda document: hmac.new(key, document, hashlib.sha256).hexdigest()

    def id_scheme(self) -> str:
        """The scheme a journal keyed now gets: its current signing key's."""
        if not self.keyring.can_sign or secret_material(self.keyring.signing) is None:
            raise JournalConfigError("keying effect ids needs the journal's signing key")
        return KEYED + self.keyring.signing.key_id

    def digest(self, data: bytes, scheme: str | None) -> str:
        """The digest of ``data`` (canonical JSON) in ``scheme`` (None: plain sha256)."""
        if scheme is None:
            return hashlib.sha256(data).hexdigest()
        return hmac.new(self._key(scheme), data, hashlib.sha256).hexdigest()

    async def store(self, data: bytes) -> bytes:
        """What the journal stores for a value's canonical JSON ``data``: itself, or sealed.
        A codec's error propagates (before a send, nothing is recorded nor sent)."""
        if self.sealer is None:
            return data
        return canonical({SEALED: self.sealer.scheme, "data": await self.sealer.seal(data)})

    async def store_outcome(self, data: bytes) -> bytes:
        """``store`` for what already happened (a result): if the codec fails, the outcome is
        still recorded, with an unavailable marker in place of the value (never plaintext)."""
        try:
            return await self.store(data)
        except Exception as err:
            return canonical(
                {
                    SEALED: UNAVAILABLE,
                    "reason": f"the codec failed to encode it ({type(err).__name__})",
                }
            )

    async def open(self, value: Any) -> Any:
        """A stored value as JSON data: decoded if sealed (an unavailable one is None).
        ``ValueSealed`` when it is sealed and there is no sealer."""
        if not is_sealed(value):
            return value
        scheme = value[SEALED]
        if scheme == UNAVAILABLE:
            return None
        if self.sealer is None:
            raise ValueSealed(
                "a value in the journal is encoded by a codec this worker lacks: give the "
                "worker's client the payload codec that encoded it"
            )
        return json.loads(await self.sealer.unseal(scheme, str(value.get("data", ""))))

    async def shown(self, value: Any) -> Any:
        """A stored value for people: decoded where possible, else the word ``encrypted``."""
        try:
            return await self.open(value)
        except Exception:
            return ENCRYPTED
