"""Keys that sign journal entries, and the keyring that verifies them after rotation.

HMAC-SHA256 by default: fast, but whoever verifies holds the secret that signs. Ed25519 (through
``cryptography``) lets an auditor verify with the public key alone. Keys are written in
configuration as hex (HMAC), ``ed25519:<hex seed>`` (a signing key) or ``ed25519-public:<hex>``
(a key that only verifies).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import JournalConfigError


class HashObject(Protocol):
    """What a ``hashlib`` hash object does that the HMAC pads use (``hashlib`` names no
    public type for it)."""

    def copy(self) -> HashObject: ...

    def update(self, data: bytes, /) -> None: ...

    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class HmacKey:
    """HMAC-SHA256 over an entry's hash. ``key_id`` is derived, so it names this secret only."""

    secret: bytes = field(repr=False)
    key_id: str = field(init=False)
    _pads: tuple[HashObject, HashObject] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise JournalConfigError("signing key: at least 16 bytes are required")
        key_id = "hmac-" + hashlib.sha256(b"interlock key id\x00" + self.secret).hexdigest()[:16]
        object.__setattr__(self, "key_id", key_id)
        # keyed once: each signature copies the hashed pads (two sha256 copies, no HMAC object:
        # half the time of copying an ``hmac.HMAC``)
        block = hashlib.sha256().block_size
        secret = self.secret if len(self.secret) <= block else hashlib.sha256(self.secret).digest()
        secret = secret.ljust(block, b"\0")
        inner = hashlib.sha256(bytes(b ^ 0x36 for b in secret))
        outer = hashlib.sha256(bytes(b ^ 0x5C for b in secret))
        object.__setattr__(self, "_pads", (inner, outer))

    def sign(self, entry_hash: bytes) -> str:
        inner, outer = self._pads
        mac = inner.copy()
        mac.update(entry_hash)
        out = outer.copy()
        out.update(mac.digest())
        return out.hexdigest()

    def verify(self, entry_hash: bytes, sig: str) -> bool:
        return hmac.compare_digest(self.sign(entry_hash), sig)

    def pads(self) -> tuple[HashObject, HashObject]:
        """The key's inner and outer pads, hashed (RFC 2104): ``hexdigest`` of ``outer`` after
        ``digest`` of ``inner`` after the message is the HMAC; copy them, never update them."""
        return self._pads

    def verifier(self) -> Callable[[bytes, str], bool]:
        """``verify`` for many entries in a row: HMAC from the key's hashed pads (two
        ``sha256`` copies per entry, no HMAC object)."""
        inner, outer = self.pads()
        compare = hmac.compare_digest

        def verify(entry_hash: bytes, sig: str) -> bool:
            mac = inner.copy()
            mac.update(entry_hash)
            out = outer.copy()
            out.update(mac.digest())
            return compare(out.hexdigest(), sig)

        return verify


ED25519_PREFIX = "ed25519:"
ED25519_PUBLIC_PREFIX = "ed25519-public:"


class Ed25519Key:
    """Ed25519 over an entry's hash. Holds the private key to sign, or only the public key to
    verify. ``key_id`` is derived from the public key, so a verifier can name it."""

    def __init__(self, private: bytes | None = None, *, public: bytes | None = None) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (
            Ed25519PrivateKey,
            Ed25519PublicKey,
        )
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        if private is not None:
            if len(private) != 32:
                raise JournalConfigError("an Ed25519 signing key is a 32-byte seed (64 hex)")
            self._private: Any = Ed25519PrivateKey.from_private_bytes(private)
            self._public: Any = self._private.public_key()
        elif public is not None:
            if len(public) != 32:
                raise JournalConfigError("an Ed25519 public key is 32 bytes (64 hex)")
            self._private = None
            self._public = Ed25519PublicKey.from_public_bytes(public)
        else:
            raise JournalConfigError("an Ed25519 key needs its private seed or its public key")
        self.public_bytes: bytes = self._public.public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = "ed25519-" + hashlib.sha256(self.public_bytes).hexdigest()[:16]

    @classmethod
    def generate(cls) -> Ed25519Key:
        return cls(secrets.token_bytes(32))

    @property
    def can_sign(self) -> bool:
        return self._private is not None

    def seed_hex(self) -> str:
        """The private seed, in hex: a secret."""
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
        )

        if self._private is None:
            raise JournalConfigError(f"key {self.key_id} is a public key: it has no seed")
        raw: bytes = self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return raw.hex()

    @property
    def public_text(self) -> str:
        return ED25519_PUBLIC_PREFIX + self.public_bytes.hex()

    def public_only(self) -> Ed25519Key:
        return Ed25519Key(public=self.public_bytes)

    def sign(self, entry_hash: bytes) -> str:
        if self._private is None:
            raise JournalConfigError(
                f"key {self.key_id} is a public key: it verifies entries but cannot sign them"
            )
        return str(self._private.sign(entry_hash).hex())

    def verify(self, entry_hash: bytes, sig: str) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._public.verify(bytes.fromhex(sig), entry_hash)
        except (InvalidSignature, ValueError):
            return False
        return True

    def verifier(self) -> Callable[[bytes, str], bool]:
        """``verify`` for many entries in a row (``cryptography`` verifies one signature per
        call: it has no batch verification; it lets other threads run during the call, so a
        verify checks signatures on several threads, ``verifying.EntryPass.prechecked``)."""
        from cryptography.exceptions import InvalidSignature

        check = self._public.verify
        fromhex = bytes.fromhex

        def verify(entry_hash: bytes, sig: str) -> bool:
            try:
                check(fromhex(sig), entry_hash)
            except (InvalidSignature, ValueError):
                return False
            return True

        return verify


SigningKey = HmacKey | Ed25519Key


def parse_key(text: str) -> SigningKey:
    """A key written in configuration: ``ed25519:<hex seed>``, ``ed25519-public:<hex>``, else
    an HMAC secret (hex, or any other string as UTF-8 bytes)."""
    text = text.strip()
    for prefix, kind in ((ED25519_PREFIX, "private"), (ED25519_PUBLIC_PREFIX, "public")):
        if text.startswith(prefix):
            try:
                raw = bytes.fromhex(text[len(prefix) :])
            except ValueError:
                raise JournalConfigError(f"{prefix} keys are written in hex") from None
            return Ed25519Key(raw) if kind == "private" else Ed25519Key(public=raw)
    return HmacKey(parse_secret(text))


class Keyring:
    """The key that signs new entries, plus older keys that still verify old ones. A keyring
    without a signing key verifies only (an auditor's, holding public keys)."""

    def __init__(self, signing: SigningKey | None, older: Iterable[SigningKey] = ()) -> None:
        if isinstance(signing, Ed25519Key) and not signing.can_sign:
            older = (signing, *older)
            signing = None
        self._signing = signing
        self._keys = {k.key_id: k for k in (*([signing] if signing else []), *older)}

    @property
    def signing(self) -> SigningKey:
        if self._signing is None:
            raise JournalConfigError(
                "this journal was opened with public keys only: it can be verified, not written"
            )
        return self._signing

    @property
    def can_sign(self) -> bool:
        return self._signing is not None

    def get(self, key_id: str) -> SigningKey | None:
        return self._keys.get(key_id)

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def verifying_keys(self) -> list[tuple[str, bytes]]:
        """What checks this keyring's signatures, as plain values another process can be sent
        (``verify_jobs``): each HMAC key's secret (it is what checks an HMAC), each Ed25519
        key's public key alone (never its seed)."""
        return [
            ("hmac", key.secret) if isinstance(key, HmacKey) else ("ed25519", key.public_bytes)
            for key in self._keys.values()
        ]

    @classmethod
    def of_verifying_keys(cls, keys: Iterable[tuple[str, bytes]]) -> Keyring:
        """A keyring that verifies with ``keys`` (``verifying_keys``) and signs nothing."""
        return cls(
            None,
            [HmacKey(raw) if kind == "hmac" else Ed25519Key(public=raw) for kind, raw in keys],
        )


def parse_secret(text: str) -> bytes:
    """A key given in configuration: hex, or any other string taken as UTF-8 bytes."""
    text = text.strip()
    try:
        return bytes.fromhex(text)
    except ValueError:
        return text.encode()


def load_or_create_key_file(path: Path) -> SigningKey:
    """Read the journal's key file, creating it (mode 0600, atomically) if it does not exist.

    Several worker processes may race to create it: the key is written to a private temporary
    file and hard-linked into place, so every process ends up with the same complete key.
    """
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise JournalConfigError(
            f"signing key file {path} is readable by others (mode {mode:o}); chmod 600 it"
        )
    return parse_key(path.read_text())


KeyLike = str | bytes | SigningKey


def as_key(k: KeyLike) -> SigningKey:
    """A key object from configuration (see ``parse_key``); bytes are an HMAC secret."""
    if isinstance(k, HmacKey | Ed25519Key):
        return k
    return parse_key(k) if isinstance(k, str) else HmacKey(k)
