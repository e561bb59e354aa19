"""Seals on the rows the gate reads to allow something: a lease's document, what its budget
has reserved.

The problem: every effect's chain is signed and checked when read, but the rows that say what
the gate may do were plain: whoever could write the journal's database could un-revoke a
lease, raise its limits or lower what its budget had reserved, and the dispatch transaction
trusted it. Each such row is now the product of signed entries (a lease's chain, the charges
DISPATCHED signs), and carries a **seal**: a keyed BLAKE2b MAC under a key derived from the
journal's keys (``derived_keys``, label ``interlock-control-row-v1``), which only workers and
operators' tools hold, over the table, the row's key and its values. The transaction that reads
a row checks its seal first; a row whose seal does not match was written by someone without
the keys, and nothing is decided on it (``RowCorrupt``, non-retryable: nothing is sent).

A seal proves who wrote a row, not that it is the latest: an older sealed row put back passes.
So a row that follows a chain seals the chain's head with it, and the reader compares that
with the chain's head as the journal indexes it (a lease's document sealed before its
revocation is refused); ``interlock journal verify`` derives every row from the signed entries
again, with no secret, and names a row (or a dispatch) that disagrees with them.

The message is a domain tag, the table, the key and the values (strings, whole numbers, None),
each length-prefixed, so it reads the same whichever backend stores the row. Cost: one keyed
BLAKE2b (about 1.5 µs here; HMAC-SHA256 took 4.6) per seal made or checked; a lease's
document, which changes rarely, is checked once per version per process.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Sequence

from .derived_keys import DerivedKey, DerivedKeys
from .errors import JournalConfigError, RowCorrupt
from .journal.signing import Keyring

LABEL = b"interlock-control-row-v1"
#: the family's name, the prefix of its key ids (``row-...``)
NAME = "row"
DOMAIN = "interlock-row/1"

Value = str | int | None


def _mac(key: DerivedKey, message: bytes) -> str:
    """Keyed BLAKE2b (a MAC in its own right, RFC 7693), 256 bits: a third of HMAC-SHA256's
    cost here for a short message, and a seal is made or checked on every budgeted dispatch."""
    return hashlib.blake2b(message, key=key.secret, digest_size=32).hexdigest()


def _message(table: str, key: str, values: Sequence[Value]) -> bytes:
    """The domain tag, the table, the key and the values, each as ``<length>:<text>`` (None as
    ``-``): one reading only, whatever the text holds, and cheaper than JSON's encoder."""
    texts = (DOMAIN, table, key, *values)
    return "".join("-" if t is None else f"{len(str(t))}:{t}" for t in texts).encode()


class RowSeals:
    """Seals rows with the journal's keys, and checks them."""

    def __init__(self, keyring: Keyring) -> None:
        self._keys = DerivedKeys.of(keyring, LABEL, NAME)
        self.can_check = bool(self._keys.key_ids)

    def seal(self, table: str, key: str, *values: Value) -> str:
        """The seal of row ``key`` of ``table`` holding ``values``."""
        signing = self._keys.signing
        if signing is None:
            raise JournalConfigError("writing the journal's control rows needs its signing key")
        return f"{signing.key_id}:{_mac(signing, _message(table, key, values))}"

    def problem(self, table: str, key: str, seal: str | None, *values: Value) -> str | None:
        """Why row ``key`` of ``table`` holding ``values`` with ``seal`` was not written by
        this journal's keys; None when its seal matches."""
        if not seal or ":" not in seal:
            return "it carries no seal (written without the journal's keys)"
        key_id, _, mac = seal.partition(":")
        derived = self._keys.get(key_id)
        if derived is None:
            return f"it is sealed with key {key_id!r}, which this journal's keyring does not hold"
        if not hmac.compare_digest(_mac(derived, _message(table, key, values)), mac):
            return "its seal does not match its values (edited without the journal's keys)"
        return None

    def check(self, table: str, key: str, seal: str | None, *values: Value) -> None:
        """``problem``, raised as ``RowCorrupt``."""
        found = self.problem(table, key, seal, *values)
        if found is not None:
            raise RowCorrupt.of(table, key, found)

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one per journal, which lives as long)
    def check_cached(self, table: str, key: str, seal: str | None, *values: Value) -> None:
        """``check`` for a row that changes rarely (a lease's document): each version once."""
        self.check(table, key, seal, *values)
