"""Keys that sign journal entries, and the keyring that verifies them after rotation."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import JournalConfigError


@dataclass(frozen=True)
class HmacKey:
    """HMAC-SHA256 over an entry's hash. ``key_id`` is derived, so it names this secret only."""

    secret: bytes = field(repr=False)
    key_id: str = field(init=False)

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise JournalConfigError("signing key: at least 16 bytes are required")
        key_id = "hmac-" + hashlib.sha256(b"interlock key id\x00" + self.secret).hexdigest()[:16]
        object.__setattr__(self, "key_id", key_id)

    def sign(self, entry_hash: bytes) -> str:
        return hmac.new(self.secret, entry_hash, hashlib.sha256).hexdigest()

    def verify(self, entry_hash: bytes, sig: str) -> bool:
        return hmac.compare_digest(self.sign(entry_hash), sig)


class Keyring:
    """The key that signs new entries, plus older keys that still verify old ones."""

    def __init__(self, signing: HmacKey, older: Iterable[HmacKey] = ()) -> None:
        self.signing = signing
        self._keys = {k.key_id: k for k in (signing, *older)}

    def get(self, key_id: str) -> HmacKey | None:
        return self._keys.get(key_id)

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)


def parse_secret(text: str) -> bytes:
    """A key given in configuration: hex, or any other string taken as UTF-8 bytes."""
    text = text.strip()
    try:
        return bytes.fromhex(text)
    except ValueError:
        return text.encode()


def load_or_create_key_file(path: Path) -> HmacKey:
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
    return HmacKey(parse_secret(path.read_text()))
