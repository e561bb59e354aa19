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
effect recorded before the codec was configured keeps its plain digests (and its id, which is
never keyed: it is the idempotency key targets dedupe on) and still verifies and compares.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Protocol

from .authority import hkdf_sha256
from .errors import JournalConfigError
from .identity import canonical
from .journal.signing import Ed25519Key, HmacKey, Keyring, SigningKey

#: the key that marks a stored value as sealed
SEALED = "$sealed"
#: the scheme of a value whose encoding failed after the send: nothing of it is stored
UNAVAILABLE = "unavailable"
#: the prefix of a keyed digest scheme (the key id follows)
KEYED = "hmac-sha256:"
_LABEL = b"interlock-value-digests-v1"
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


def _material(key: SigningKey) -> bytes | None:
    if isinstance(key, HmacKey):
        return key.secret
    if isinstance(key, Ed25519Key) and key.can_sign:
        return bytes.fromhex(key.seed_hex())
    return None


class Values:
    """How the gate stores and reads the values of effects, and digests them: plain (no
    sealer), or sealed with keyed digests."""

    def __init__(self, keyring: Keyring, sealer: Sealer | None = None) -> None:
        self.keyring = keyring
        self.sealer = sealer
        self._keys: dict[str, bytes] = {}

    @property
    def scheme(self) -> str | None:
        """The digest scheme of a new effect: keyed when values are sealed."""
        if self.sealer is None or not self.keyring.can_sign:
            return None
        return KEYED + self.keyring.signing.key_id

    def _key(self, scheme: str) -> bytes:
        key_id = scheme.removeprefix(KEYED)
        found = self._keys.get(key_id)
        if found is None:
            signing = self.keyring.get(key_id) if scheme.startswith(KEYED) else None
            material = None if signing is None else _material(signing)
            if material is None:
                raise JournalConfigError(
                    f"the effect's digests are keyed with journal key {key_id}, which this "
                    "worker does not hold: add it to older_keys"
                )
            found = self._keys[key_id] = hkdf_sha256(material, _LABEL)
        return found

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
