"""Keys derived from the journal's signing keys, one family per purpose, so that a secret only
workers hold can MAC what crosses Temporal without the journal key itself ever MACing anything
but entries: HKDF-SHA256 (RFC 5869) of a journal key's secret material (an HMAC secret, an
Ed25519 seed) under a label naming the purpose (``interlock-authority-v1``,
``interlock-review-request-v1``, ...). A key that only verifies (an Ed25519 public key) derives
nothing.

A family is a keyring of its own (``DerivedKeys``): the key derived from the journal's signing
key signs, and those derived from its older keys still verify, so a rotated journal key
rotates every family and a retired key kept as an older key still verifies what it MACed.

Only the standard library, with no time and no randomness: workflow code signs with it (the
authority header) and must replay. Cost: one HKDF (two HMACs) per journal key and family, when
the family is made; each MAC is one HMAC-SHA256.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field

from .journal.signing import Ed25519Key, HmacKey, Keyring, SigningKey


def hkdf_sha256(ikm: bytes, info: bytes, length: int = 32, salt: bytes = b"") -> bytes:
    """HKDF (RFC 5869) with SHA-256: extract, then expand to ``length`` bytes."""
    if not 0 < length <= 255 * 32:
        raise ValueError("hkdf_sha256: length must be 1 to 8160 bytes")
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


def secret_material(key: SigningKey) -> bytes | None:
    """What a journal key derives from: an HMAC secret, an Ed25519 seed; None for a key that
    only verifies."""
    if isinstance(key, HmacKey):
        return key.secret
    if isinstance(key, Ed25519Key) and key.can_sign:
        return bytes.fromhex(key.seed_hex())
    return None


@dataclass(frozen=True)
class DerivedKey:
    """An HMAC-SHA256 key of one family (``name``); ``key_id`` names this secret only."""

    secret: bytes = field(repr=False)
    name: str
    key_id: str = field(init=False)

    def __post_init__(self) -> None:
        tag = f"interlock {self.name} key id\x00".encode()
        object.__setattr__(
            self, "key_id", f"{self.name}-" + hashlib.sha256(tag + self.secret).hexdigest()[:16]
        )

    @classmethod
    def derive(cls, journal_key: SigningKey, label: bytes, name: str) -> DerivedKey | None:
        """The family's key derived from ``journal_key``; None for a key that only verifies."""
        material = secret_material(journal_key)
        return None if material is None else cls(hkdf_sha256(material, label), name)

    def mac(self, message: bytes) -> str:
        # the one-shot C function: about a third of hmac.new's cost for a short message
        return hmac.digest(self.secret, message, "sha256").hex()

    def matches(self, message: bytes, mac: str) -> bool:
        return hmac.compare_digest(self.mac(message), mac)


class DerivedKeys:
    """One family's keys: the one that signs now, and every one that still verifies."""

    def __init__(self, signing: DerivedKey | None, older: Iterable[DerivedKey] = ()) -> None:
        self.signing = signing
        self._keys = {k.key_id: k for k in (*([signing] if signing else []), *older)}

    @classmethod
    def of(cls, keyring: Keyring, label: bytes, name: str) -> DerivedKeys:
        signing = DerivedKey.derive(keyring.signing, label, name) if keyring.can_sign else None
        older: list[DerivedKey] = []
        for key_id in keyring.key_ids:
            key = keyring.get(key_id)
            derived = None if key is None else DerivedKey.derive(key, label, name)
            if derived is not None:
                older.append(derived)
        return cls(signing, older)

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def get(self, key_id: str) -> DerivedKey | None:
        return self._keys.get(key_id)
