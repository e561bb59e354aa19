"""The journal: append-only, one signed entry per transition, hash-chained per effect.

Each entry's signed bytes are the RFC 8785 canonical JSON of
``{v, seq, ts, effect_id, kind, prev, key_id, data[, vals]}``; ``hash`` is sha256 of those bytes
and ``sig`` signs the hash. The bytes are stored as written, so verification hashes what was
signed instead of canonicalising again. ``prev`` is the hash of the previous entry *of the same
effect* (empty for the first), and appends are conditional on it, so no chain can fork.
``seq`` is dense and signed, so a dropped entry leaves a gap.

The values an append stores beside its last entry (the approved input, the result) are bound to
it: ``vals`` is the sha256 of their stored bytes, so an edit of any value is an entry that no
longer verifies. Entries of format 1 (before schema 4) held no such digest; the migration to
schema 4 appends one ``VALUES_BOUND`` entry per effect that binds the values it had then.

Every read of an effect checks that effect's chain (hashes, signatures, links, value digests)
and its index row before returning anything: a corrupt effect raises ``JournalCorrupt`` naming
the entry, and nothing is decided on it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from .claims import Claim
from .errors import JournalConfigError, JournalCorrupt
from .identity import canonical_json, origin_of
from .leases import LeaseStore
from .models import ANNOTATIONS, Draft, EffectRow, Entry, JournalHead, Kind, Lease, VerifyReport
from .policy import PolicyStore
from .signing import (
    Ed25519Key,
    HmacKey,
    Keyring,
    SigningKey,
    load_or_create_key_file,
    parse_key,
)

SCHEMA_VERSION = 5
#: the effect type of policy chains (``policy:<session>``)
POLICY_CHAIN_TYPE = "interlock.policy"
#: 2: the signed bytes hold the digest of the values stored beside the entry (``vals``)
ENTRY_VERSION = 2


def policy_chain(session: str) -> str:
    """The journal chain that records a session's policy events."""
    return f"policy:{session}"


Build = Sequence[Draft] | Callable[[Lease | None], Sequence[Draft]]


@dataclass(frozen=True, slots=True)
class RawEntry:
    """An entry as stored: what verification reads. ``vals``: the values stored beside it."""

    seq: int
    effect_id: str
    kind: str
    prev: str
    hash: str
    key_id: str
    sig: str
    body: bytes
    vals: str | None = None


def values_digest(vals: str) -> str:
    """The digest an entry signs of the values stored beside it: sha256 of their stored text."""
    return hashlib.sha256(vals.encode()).hexdigest()


def encode_entry(
    *,
    seq: int,
    ts: float,
    effect_id: str,
    kind: Kind,
    prev: str,
    key: SigningKey,
    data: Mapping[str, Any],
    vals: str | None = None,
) -> Entry:
    """Build and sign one entry; ``vals``, the values to store beside it, are bound by digest."""
    if type(data) is not dict:
        data = dict(data)
    doc: dict[str, Any] = {
        "v": ENTRY_VERSION,
        "seq": seq,
        "ts": ts,
        "effect_id": effect_id,
        "kind": kind.value,
        "prev": prev,
        "key_id": key.key_id,
        "data": data,
    }
    if vals is not None:
        doc["vals"] = values_digest(vals)
    body = canonical_json(doc)
    digest = hashlib.sha256(body).digest()
    # validated (the entry gets its own copy of ``data``): faster than model_construct
    return Entry(
        seq=seq,
        ts=ts,
        effect_id=effect_id,
        kind=kind,
        prev=prev,
        data=data,
        hash=digest.hex(),
        key_id=key.key_id,
        sig=key.sign(digest),
        body=body,
        values=None if vals is None else json.loads(vals),
    )


def decode_entry(raw: RawEntry) -> Entry:
    """An entry as the gate uses it: only for an entry that verified (``check_chain``)."""
    doc = json.loads(raw.body)
    return Entry(
        seq=raw.seq,
        ts=doc["ts"],
        effect_id=raw.effect_id,
        kind=Kind(raw.kind),
        prev=raw.prev,
        data=doc["data"],
        hash=raw.hash,
        key_id=raw.key_id,
        sig=raw.sig,
        body=raw.body,
        values=None if raw.vals is None else json.loads(raw.vals),
    )


def value_of(entries: Sequence[Entry], name: str) -> Any:
    """The value last stored under ``name`` with one of these (verified) entries, or None."""
    for entry in reversed(entries):
        if entry.values is not None and name in entry.values:
            return entry.values[name]
    return None


#: a JSON string as ``json.dumps(..., ensure_ascii=False)`` writes it (the C encoder)
_quoted = encode_basestring


def _signed_tail(raw: RawEntry) -> bytes:
    """What the signed bytes of ``raw`` must hold after its ``data``, up to the timestamp: the
    canonical JSON of the columns stored beside them (keys sort after ``data``)."""
    return (
        f',"effect_id":{_quoted(raw.effect_id)},"key_id":{_quoted(raw.key_id)}'
        f',"kind":{_quoted(raw.kind)},"prev":{_quoted(raw.prev)},"seq":{raw.seq},"ts":'
    ).encode()


_V1_END = b',"v":1}'
_V2_END = b',"v":2}'
#: a format-2 entry with values ends ``,"v":2,"vals":"<64 hex>"}``
_V2_VALS = b',"v":2,"vals":"'
_V2_VALS_END_LEN = len(_V2_VALS) + 64 + 2
#: what ``check_entry`` says of a format-1 entry with values: they verify only once a later
#: ``VALUES_BOUND`` entry of its effect binds them
UNBOUND = "unbound"


def check_entry(raw: RawEntry, keyring: Keyring) -> str | None:
    """What is wrong with one stored entry, or None (or ``UNBOUND``: a format-1 entry whose
    values its chain must bind): its bytes hash to its hash, its signature holds, the signed
    fields agree with the stored columns, and the values stored beside it are the ones it
    signed."""
    return _check(raw, keyring)[0]


def _check(raw: RawEntry, keyring: Keyring) -> tuple[str | None, int]:
    """``check_entry``, and where the signed timestamp starts in the bytes (-1: not known
    without parsing them)."""
    body = raw.body if isinstance(raw.body, bytes) else str(raw.body).encode()
    digest = hashlib.sha256(body).digest()
    if digest.hex() != raw.hash:
        return "its bytes do not match its hash (edited or torn)", -1
    key = keyring.get(raw.key_id)
    if key is None:
        return f"signed with key {raw.key_id}, which is not in the keyring", -1
    if not key.verify(digest, raw.sig):
        return f"its signature does not verify with key {raw.key_id}", -1
    # fast path: the columns, written the canonical way, are exactly the bytes after ``data``
    # (the last ``,"effect_id":`` is the top-level one: ``data`` closes before it, and a key
    # inside a string would have its quotes escaped)
    tail = _signed_tail(raw)
    at = body.rfind(b',"effect_id":')
    if at > 0 and body.startswith(tail, at) and body.startswith(b'{"data":'):
        ts_at = at + len(tail)
        if raw.vals is None:
            if body.endswith(_V2_END) or body.endswith(_V1_END):
                return None, ts_at
            if body.endswith(b'"}') and body[-_V2_VALS_END_LEN:].startswith(_V2_VALS):
                return "its signed bytes bind values that are not stored (deleted)", -1
        else:
            if body.endswith(_V1_END):
                return UNBOUND, ts_at
            if body.endswith(_V2_VALS + values_digest(raw.vals).encode() + b'"}'):
                return None, ts_at
            if body.endswith(_V2_END) or body[-_V2_VALS_END_LEN:].startswith(_V2_VALS):
                return "the values stored beside it are not the ones it signed (edited)", -1
    return _check_slowly(raw, body), -1


def _check_slowly(raw: RawEntry, body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return "its signed bytes are not JSON"
    if (
        doc.get("seq") != raw.seq
        or doc.get("effect_id") != raw.effect_id
        or doc.get("kind") != raw.kind
        or doc.get("prev") != raw.prev
        or doc.get("key_id") != raw.key_id
    ):
        return "its stored columns differ from what was signed"
    signed = doc.get("vals")
    if raw.vals is None:
        return None if signed is None else "its signed bytes bind values that are not stored"
    if signed is None:
        return UNBOUND if doc.get("v") == 1 else "it holds values its signed bytes do not bind"
    if signed != values_digest(raw.vals):
        return "the values stored beside it are not the ones it signed (edited)"
    return None


def _signed_ts(raw: RawEntry, at: int) -> float:
    """The timestamp an entry that checked signed: read where ``_check`` found it, else
    parsed."""
    if at >= 0:
        try:
            return float(raw.body[at : raw.body.find(b",", at)])
        except ValueError:
            pass
    return float(json.loads(raw.body)["ts"])


@dataclass(slots=True)
class _Chain:
    """What the entries of one effect add up to, as its index row must say."""

    head: str = ""
    head_seq: int = 0
    status: str | None = None
    effect_type: str | None = None
    origin: str | None = None
    first_dispatch: float | None = None
    last_dispatch: float | None = None
    #: the head entry, and where its timestamp starts (read only when a row is checked)
    head_raw: RawEntry | None = None
    head_ts_at: int = -1
    #: format-1 entries' values (seq -> digest) no VALUES_BOUND entry has bound yet
    unbound: dict[int, str] | None = None

    @property
    def updated(self) -> float | None:
        return None if self.head_raw is None else _signed_ts(self.head_raw, self.head_ts_at)


_ANNOTATION_KINDS = frozenset(k.value for k in ANNOTATIONS)
_DISPATCHED = Kind.DISPATCHED.value


def origin_in(first: Mapping[str, Any]) -> str | None:
    """The origin an effect's first entry (its PROPOSED) signs: its delivery and input."""
    delivery, digest = first.get("delivery"), first.get("input_digest")
    if not isinstance(delivery, dict) or not isinstance(digest, str):
        return None
    return origin_of(
        delivery.get("workflow_id"), delivery.get("run_id"), delivery.get("activity_id"), digest
    )


class ChainCheck:
    """Checks entries effect by effect, in seq order: each entry alone, its place in its chain,
    its values; then what each chain adds up to against the effects table. Problems are
    ``(seq, what is wrong)``."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self.chains: dict[str, _Chain] = {}

    def add(self, raw: RawEntry) -> tuple[int, str] | None:
        """The next entry of its effect: None, or what is wrong and at which seq (an edited
        value of an earlier entry is found when the entry that binds it arrives)."""
        problem, ts_at = _check(raw, self.keyring)
        unbound = problem == UNBOUND
        if problem is not None and not unbound:
            return raw.seq, problem
        chain = self.chains.get(raw.effect_id)
        if chain is None:
            chain = self.chains[raw.effect_id] = _Chain()
        if raw.prev != chain.head:
            return raw.seq, (
                "its prev is not the previous entry of its effect (reordered or inserted)"
            )
        if not chain.head:
            data = json.loads(raw.body).get("data")
            data = data if isinstance(data, dict) else {}
            kind_type = data.get("effect_type")
            chain.effect_type = kind_type if isinstance(kind_type, str) else None
            chain.origin = origin_in(data)
        if unbound:
            assert raw.vals is not None
            if chain.unbound is None:
                chain.unbound = {}
            chain.unbound[raw.seq] = values_digest(raw.vals)
        if raw.kind == Kind.VALUES_BOUND.value:
            found = self._bind(raw, chain)
            if found is not None:
                return found
        chain.head, chain.head_seq, chain.head_raw, chain.head_ts_at = (
            raw.hash,
            raw.seq,
            raw,
            ts_at,
        )
        if raw.kind not in _ANNOTATION_KINDS:
            chain.status = raw.kind
        if raw.kind == _DISPATCHED:
            ts = _signed_ts(raw, ts_at)
            if chain.first_dispatch is None:
                chain.first_dispatch = ts
            chain.last_dispatch = ts
        return None

    @staticmethod
    def _bind(raw: RawEntry, chain: _Chain) -> tuple[int, str] | None:
        data = json.loads(raw.body).get("data")
        values = data.get("values") if isinstance(data, dict) else None
        if not isinstance(values, dict):
            return raw.seq, "a VALUES_BOUND entry without its values"
        pending = chain.unbound or {}
        for seq_text, bound in values.items():
            seq = int(seq_text) if str(seq_text).isdigit() else -1
            if pending.get(seq) != bound:
                if seq in pending:
                    return seq, "its values are not the ones bound at migration (edited)"
                return raw.seq, f"it binds values that entry {seq_text} of its effect lacks"
            del pending[seq]
        return None

    def unbound(self) -> tuple[int, str] | None:
        """The first entry whose values no signed entry binds."""
        seqs = [seq for c in self.chains.values() for seq in (c.unbound or ())]
        if not seqs:
            return None
        return min(seqs), "its values are bound by no signed entry (stored outside the journal)"

    def against(self, effect_id: str, row: EffectRow | None) -> tuple[int, str] | None:
        """What the effects table's row of ``effect_id`` says that its entries do not."""
        chain = self.chains.get(effect_id)
        if chain is None:
            if row is None:
                return None
            return row.head_seq, f"the effects table lists {effect_id[:16]}, which has no entries"
        if row is None:
            return chain.head_seq, "its effect is missing from the effects table"
        wrong = [
            name
            for name, stored, derived in (
                ("head", row.head, chain.head),
                ("head_seq", row.head_seq, chain.head_seq),
                ("status", row.status.value, chain.status),
                ("updated_ts", row.updated_ts, chain.updated),
                ("first_dispatch_ts", row.first_dispatch_ts, chain.first_dispatch),
                ("last_dispatch_ts", row.last_dispatch_ts, chain.last_dispatch),
            )
            if stored != derived
        ]
        if chain.effect_type is not None and row.effect_type != chain.effect_type:
            wrong.append("effect_type")
        if row.origin != chain.origin:
            wrong.append("origin")
        if not wrong:
            return None
        # named by the later of the two heads: a cut tail is named by the entry it lost
        return max(chain.head_seq, row.head_seq), (
            f"the effects table's {', '.join(wrong)} of its effect differ from its entries (edited)"
        )


def check_chain(
    effect_id: str, raws: Sequence[RawEntry], keyring: Keyring, row: EffectRow | None
) -> None:
    """Raise ``JournalCorrupt`` unless ``raws`` are exactly a sound chain of ``effect_id`` that
    its index row describes."""
    checker = ChainCheck(keyring)
    last = 0
    for raw in raws:
        if raw.effect_id != effect_id or raw.seq <= last:
            raise JournalCorrupt.at(effect_id, raw.seq, "it is out of its effect's order")
        found = checker.add(raw)
        if found is not None:
            raise JournalCorrupt.at(effect_id, *found)
        last = raw.seq
    found = checker.unbound() or checker.against(effect_id, row)
    if found is not None:
        raise JournalCorrupt.at(effect_id, *found)


def verify_entries(
    raws: Iterable[RawEntry],
    keyring: Keyring,
    head: JournalHead | None = None,
    rows: Iterable[EffectRow] | None = None,
) -> VerifyReport:
    """Check every entry in seq order; report the first bad one by seq. With ``rows`` (the
    effects table), also that each row says what its entries add up to."""
    checker = ChainCheck(keyring)
    expected_seq = 1
    count = 0
    last: RawEntry | None = None
    head_seen = head is None

    def failed(seq: int, problem: str, final: JournalHead | None = None) -> VerifyReport:
        return VerifyReport(
            ok=False,
            entries=count,
            effects=len(checker.chains),
            head=final,
            first_bad_seq=seq,
            problem=problem,
        )

    for raw in raws:
        found: tuple[int, str] | None = None
        if raw.seq != expected_seq and check_entry(raw, keyring) in (None, UNBOUND):
            found = (
                raw.seq,
                (
                    f"entries {expected_seq}..{raw.seq - 1} are missing"
                    if raw.seq > expected_seq
                    else f"out of order (expected seq {expected_seq})"
                ),
            )
        found = found or checker.add(raw)
        if found is not None:
            return failed(*found)
        expected_seq += 1
        count += 1
        last = raw
        if head is not None and raw.seq == head.seq:
            if raw.hash != head.hash:
                return failed(raw.seq, "the recorded head does not match this entry")
            head_seen = True
    final_head = None if last is None else JournalHead(seq=last.seq, hash=last.hash)
    if not head_seen:
        assert head is not None
        return failed(
            expected_seq,
            f"the journal ends before the recorded head {head.seq} (tail cut)",
            final_head,
        )
    unbound = checker.unbound()
    if unbound is not None:
        return failed(*unbound, final_head)
    if rows is not None:
        problems = []
        listed = set()
        for row in rows:
            listed.add(row.effect_id)
            found = checker.against(row.effect_id, row)
            if found is not None:
                problems.append(found)
        problems += [
            found
            for eid in checker.chains.keys() - listed
            if (found := checker.against(eid, None)) is not None
        ]
        if problems:
            return failed(*min(problems), final_head)
    return VerifyReport(ok=True, entries=count, effects=len(checker.chains), head=final_head)


def export_line(raw: RawEntry) -> str:
    """One entry as a JSON line an auditor can verify alone: the signed bytes as written, with
    the hash they must have, the signature over it, and the values stored beside it."""
    body = raw.body if isinstance(raw.body, bytes) else str(raw.body).encode()
    line: dict[str, Any] = {
        "seq": raw.seq,
        "effect_id": raw.effect_id,
        "kind": raw.kind,
        "prev": raw.prev,
        "hash": raw.hash,
        "key_id": raw.key_id,
        "sig": raw.sig,
        "body": body.decode("utf-8"),
    }
    if raw.vals is not None:
        line["vals"] = raw.vals
    return json.dumps(
        line,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def read_export(lines: Iterable[str]) -> Iterator[RawEntry]:
    """The entries of a ``journal export`` (JSONL), for ``verify_entries``. A line that is not
    an exported entry stops the reading with ``JournalCorrupt`` naming its line number."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            yield RawEntry(
                seq=int(doc["seq"]),
                effect_id=str(doc["effect_id"]),
                kind=str(doc["kind"]),
                prev=str(doc["prev"]),
                hash=str(doc["hash"]),
                key_id=str(doc["key_id"]),
                sig=str(doc["sig"]),
                body=str(doc["body"]).encode("utf-8"),
                vals=None if doc.get("vals") is None else str(doc["vals"]),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise JournalCorrupt(
                f"line {number} of the export is not an entry ({type(err).__name__})"
            ) from None


def state_kind(drafts: Sequence[Draft], current: Kind | None) -> Kind | None:
    """The effect's status after ``drafts``: the last kind that is not an annotation."""
    for draft in reversed(drafts):
        if draft.kind not in ANNOTATIONS:
            return draft.kind
    return current


#: measured on a 2-core machine, 64 activities in flight on one worker: batches of 3.3 to 4.2
#: appends without the wait, about 8 with 4 ms and 11 to 12 with 8 ms, and with 8 ms about 0.2
#: to 0.4 ms less worker CPU per activity (docs/benchmarks.md sets it beside no wait each run)
DEFAULT_COMMIT_DELAY = 0.008


class Journal(ABC):
    """The interface every backend implements, and the conformance suite checks."""

    url: str
    keyring: Keyring
    #: the event loop of this journal's coroutines runs other work too (a Temporal worker's
    #: pollers and workflows): ``append_async`` must never hold it for a flush to disk, even
    #: for an append that has nothing to share the flush with
    loop_shared: bool = False
    #: seconds a batch of ``append_async`` waits, when other effects of this process are under
    #: way and have not queued their appends, so they share its transaction and its flush. A
    #: lone effect never waits; 0 turns the wait off (see ``open_journal``)
    commit_delay: float = DEFAULT_COMMIT_DELAY

    @property
    @abstractmethod
    def leases(self) -> LeaseStore: ...

    @property
    @abstractmethod
    def policy(self) -> PolicyStore:
        """The policy layer's shared state (sessions, spend, admitted executions)."""

    @abstractmethod
    def read(self, effect_id: str) -> list[Entry]:
        """The effect's entries in order (empty if unknown)."""

    @abstractmethod
    def row(self, effect_id: str) -> EffectRow | None:
        """The effect's index row: status and head, without reading its entries."""

    @abstractmethod
    def append(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        """Append entries atomically, durably, if the effect's head is still ``expected_head``
        ("" for a new effect); raise ``HeadConflict`` otherwise. A new effect's origin (see
        ``by_origin``) is what its first entry signs of its delivery and input.

        When ``build`` is callable it is called inside the transaction with the lease
        ``lease_id`` as read there, and returns the drafts: authority is checked and the
        dispatch recorded in one step. ``blobs`` (argument and result values; the signed entries
        hold only their digests) are stored with the append's last entry, outside its signed
        bytes, in the same transaction; a value given as ``bytes`` is taken to be its
        canonical JSON already.
        """

    async def append_async(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        """``append`` for a coroutine. A backend may commit the appends of concurrent
        coroutines together, one transaction and one flush to disk for all of them; each call
        still gets its own entries or its own error, exactly as ``append`` would give it, and
        returns only once its entries are durable. A caller cancelled while its append is being
        written may find it written, as after a crash at that point."""
        write = functools.partial(
            self.append,
            effect_id,
            expected_head,
            build,
            effect_type=effect_type,
            lease_id=lease_id,
            blobs=blobs,
        )
        return await asyncio.to_thread(write) if self.loop_shared else write()

    @abstractmethod
    def effects(
        self,
        *,
        status: Kind | None = None,
        in_doubt: bool = False,
        older_than: float | None = None,
        limit: int | None = None,
        since: float | None = None,
    ) -> list[EffectRow]:
        """Index rows, newest first. ``in_doubt``: dispatched and never confirmed; ``since``:
        updated at or after this time (epoch seconds)."""

    def in_doubt(self, *, older_than: float | None = None) -> list[EffectRow]:
        """What was started and never confirmed (an indexed query)."""
        return self.effects(in_doubt=True, older_than=older_than)

    @abstractmethod
    def by_origin(self, origin: str) -> list[str]:
        """The effects first proposed by this origin (an indexed query)."""

    @abstractmethod
    def blob(self, effect_id: str, name: str) -> Any:
        """The value last stored under ``name`` with one of the effect's appends (``proposed``,
        ``approved``, ``result``), or None."""

    @abstractmethod
    def claim(self, effect_id: str) -> Claim | None:
        """The effect's exclusive claim, or None while a live holder has it."""

    @abstractmethod
    def is_claimed(self, effect_id: str) -> bool: ...

    @abstractmethod
    def iter_raw(self) -> Iterator[RawEntry]:
        """Every stored entry in seq order, as stored."""

    @abstractmethod
    def iter_rows(self) -> Iterator[EffectRow]:
        """Every effect's index row (policy chains included), for ``verify``."""

    @abstractmethod
    def head(self) -> JournalHead | None:
        """The last entry's seq and hash."""

    @abstractmethod
    def schema_version(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def verify(self, head: JournalHead | str | None = None) -> VerifyReport:
        """Check every entry's hash, signature, place in its chain and in the sequence, the
        values stored beside it, and every effect's index row against its entries."""
        if isinstance(head, str):
            head = JournalHead.parse(head)
        return verify_entries(self.iter_raw(), self.keyring, head, self.iter_rows())

    def check_tail(self) -> None:
        """Refuse to use a journal whose last entry is torn or not ours (checked at open)."""
        raw = self.last_raw()
        if raw is None:
            return
        if self.keyring.get(raw.key_id) is None:
            raise JournalConfigError(
                f"journal {self.url}: its last entry (seq {raw.seq}) is signed with key "
                f"{raw.key_id}, which is not configured (keys: {', '.join(self.keyring.key_ids)}); "
                "configure that key (INTERLOCK_SIGNING_KEY or the key file), or pass it as an "
                "older key after a rotation"
            )
        problem = check_entry(raw, self.keyring)
        if problem is not None:
            raise JournalCorrupt(
                f"journal {self.url}: the last entry (seq {raw.seq}) is unusable: {problem}. "
                "Nothing was appended. Run `interlock journal verify` and restore from a copy."
            )

    @abstractmethod
    def last_raw(self) -> RawEntry | None: ...

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


KeyLike = str | bytes | SigningKey


def as_key(k: KeyLike) -> SigningKey:
    """A key object from configuration (see ``parse_key``); bytes are an HMAC secret."""
    if isinstance(k, HmacKey | Ed25519Key):
        return k
    return parse_key(k) if isinstance(k, str) else HmacKey(k)


def keyring_for(
    journal_path: Path | None,
    signing_key: KeyLike | None,
    older_keys: Sequence[KeyLike] = (),
    *,
    create: bool = True,
    public_keys: Sequence[KeyLike] = (),
) -> Keyring:
    """The signing key from configuration (argument, then ``INTERLOCK_SIGNING_KEY``), else the
    journal's key file (``<journal>.key``, created with mode 0600 when ``create``).

    With ``public_keys`` and no signing key, the keyring verifies only: an auditor needs no
    secret and no key file."""
    if public_keys and signing_key is None:
        return Keyring(None, [as_key(k) for k in (*public_keys, *older_keys)])
    if signing_key is None and os.environ.get("INTERLOCK_SIGNING_KEY"):
        signing_key = os.environ["INTERLOCK_SIGNING_KEY"]
    if signing_key is None:
        if journal_path is None:
            raise JournalConfigError("a signing key is required for this journal")
        key_file = journal_path.with_name(journal_path.name + ".key")
        if not create and not key_file.exists():
            raise JournalConfigError(
                f"no signing key: {key_file} does not exist and INTERLOCK_SIGNING_KEY is not set"
            )
        key = load_or_create_key_file(key_file)
    else:
        key = as_key(signing_key)
    return Keyring(key, [as_key(k) for k in (*older_keys, *public_keys)])


@dataclass(frozen=True)
class JournalLocation:
    """A parsed journal URL."""

    scheme: str
    path: Path
    options: dict[str, str]
    url: str = ""

    @property
    def busy_timeout_s(self) -> float:
        try:
            value = float(self.options.get("busy_timeout", 10))
        except ValueError:
            raise JournalConfigError("busy_timeout must be a number of seconds") from None
        if value <= 0:
            raise JournalConfigError("busy_timeout must be positive")
        return value


def parse_journal_url(url: str | os.PathLike[str]) -> JournalLocation:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` (as SQLAlchemy spells them), or a
    plain path."""
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme in ("postgresql", "postgres"):
        return JournalLocation("postgresql", Path(), {}, text)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme == "file" else text)
    elif parsed.scheme == "sqlite":
        raw_path = text[len("sqlite://") :].split("?", 1)[0]
        if raw_path.startswith("/"):
            raw_path = raw_path[1:]
        if not raw_path:
            raise JournalConfigError("sqlite URL has no path: use sqlite:///interlock.db")
        path = Path(raw_path)
    else:
        raise JournalConfigError(
            f"unsupported journal URL scheme {parsed.scheme!r}: use sqlite:///path or "
            "postgresql://user@host/db"
        )
    options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    return JournalLocation("sqlite", path, options, text)


def open_journal(
    url: str | os.PathLike[str],
    *,
    signing_key: KeyLike | None = None,
    older_keys: Sequence[KeyLike] = (),
    create: bool = True,
    check_tail: bool = True,
    public_keys: Sequence[KeyLike] = (),
    commit_delay: float = DEFAULT_COMMIT_DELAY,
) -> Journal:
    """Open a journal by URL: ``sqlite:///path/to/interlock.db`` (or a plain path), or
    ``postgresql://user@host:5432/db`` for workers on many hosts.

    ``signing_key``: hex or text (HMAC-SHA256), or ``ed25519:<hex seed>``; default
    ``INTERLOCK_SIGNING_KEY``, else the key file beside the database. ``public_keys``
    (``ed25519-public:<hex>``) without a signing key open it to verify only.
    ``create=False`` refuses to create a journal (or its key file) that does not exist, for
    tools that only read. ``check_tail=False`` skips the open-time check of the last entry, so
    ``verify`` can report on a journal that would otherwise refuse to open.
    ``commit_delay`` (seconds, 0 to 1): how long a worker's batch of appends waits for the
    appends of its other effects under way, trading that much latency, only when effects
    overlap, for fewer flushes; 0 writes every batch at once.
    """
    delay = _commit_delay(commit_delay)
    journal = _open(url, signing_key, older_keys, create, check_tail, public_keys)
    journal.commit_delay = delay
    return journal


def _commit_delay(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise JournalConfigError("commit_delay must be a number of seconds from 0 to 1")
    return float(value)


def _open(
    url: str | os.PathLike[str],
    signing_key: KeyLike | None,
    older_keys: Sequence[KeyLike],
    create: bool,
    check_tail: bool,
    public_keys: Sequence[KeyLike],
) -> Journal:
    where = parse_journal_url(url)
    if where.scheme == "postgresql":
        from .postgres_journal import PostgresJournal

        if signing_key is None and not public_keys and not os.environ.get("INTERLOCK_SIGNING_KEY"):
            raise JournalConfigError(
                "a PostgreSQL journal has no key file: set INTERLOCK_SIGNING_KEY or pass "
                "signing_key= (every worker must sign with the same key)"
            )
        keyring = keyring_for(None, signing_key, older_keys, public_keys=public_keys)
        return PostgresJournal(where.url, keyring, check_tail=check_tail)
    from .sqlite_journal import SqliteJournal

    if create:
        where.path.parent.mkdir(parents=True, exist_ok=True)
    elif not where.path.exists():
        raise JournalConfigError(f"no journal at {where.path}: no such database file")
    keyring = keyring_for(
        where.path, signing_key, older_keys, create=create, public_keys=public_keys
    )
    return SqliteJournal(
        where.path, keyring, busy_timeout_s=where.busy_timeout_s, check_tail=check_tail
    )
