"""The journal: append-only, one signed entry per transition, hash-chained per effect.

Each entry's signed bytes are the RFC 8785 canonical JSON of
``{v, seq, ts, effect_id, kind, prev, key_id, data[, vals]}``; ``hash`` is sha256 of those bytes
and ``sig`` signs the hash. The bytes are stored as written, so verification hashes what was
signed instead of canonicalising again. ``prev`` is the hash of the previous entry *of the same
effect* (empty for the first), and appends are conditional on the effect's head (its row in the
effects table, moved on only from the head an append read), so no chain can fork.
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

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from ..errors import JournalCorrupt
from ..identity import canonical, canonical_json, origin_of
from ..models import ANNOTATIONS, Draft, EffectRow, Entry, Kind, built
from .signing import Keyring, SigningKey

#: 2: the signed bytes hold the digest of the values stored beside the entry (``vals``)
ENTRY_VERSION = 2
#: 3: one DISPATCHED entry for a dispatch transaction's authorization and dispatch, and its
#: proposal when the effect starts with it: ``data`` is ``{"proposal", "authorization",
#: "dispatch"}``, each what the entry of that kind would hold. Read as the entries it stands
#: for (``views``), so everything after the read sees the kinds it always saw.
COMBINED_VERSION = 3
#: the kinds a format-3 entry stands for, in order, and the part of its data each one holds
PARTS = (
    (Kind.PROPOSED, "proposal"),
    (Kind.AUTHORIZED, "authorization"),
    (Kind.DISPATCHED, "dispatch"),
)
_PART_OF = {kind: part for kind, part in PARTS}
#: the largest integer every JSON reader holds exactly (2**53 - 1)
_SAFE_INT = 2**53 - 1
#: a JSON string as ``json.dumps(..., ensure_ascii=False)`` writes it (the C encoder)
_quoted = encode_basestring


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


#: an effect's index row (the ``effects`` table), in the order ``effect_row`` reads it
ROW_COLUMNS = (
    "effect_id, effect_type, status, head, head_seq, updated_ts, first_dispatch_ts, "
    "last_dispatch_ts, origin"
)


def effect_row(values: Sequence[Any]) -> EffectRow:
    return EffectRow(
        effect_id=values[0],
        effect_type=values[1],
        status=Kind(values[2]),
        head=values[3],
        head_seq=values[4],
        updated_ts=values[5],
        first_dispatch_ts=values[6],
        last_dispatch_ts=values[7],
        origin=values[8],
    )


#: the columns of a stored entry, in the order ``raw_entry`` reads them
ENTRY_COLUMNS = "seq, effect_id, kind, prev, hash, key_id, sig, body, vals"


_E_COLUMNS = ", ".join("e." + c.strip() for c in ENTRY_COLUMNS.split(","))
#: an effect's chain as a table ``chain`` (``ENTRY_COLUMNS`` and ``prev_seq``), for a statement
#: that follows it; its parameter is the effect id. Entries have no index by effect (every
#: append would write a page at a random place of it): the chain is walked back from its index
#: row's ``head_seq`` along each entry's ``prev_seq`` (the seq of the previous entry of its
#: effect, NULL for the first and for an archive's tombstone), one primary-key lookup per
#: entry, however large the journal. ``prev_seq`` is not signed, so the walk trusts nothing of
#: it: it stays within the effect and goes strictly back (an edited ``prev_seq`` can neither
#: loop nor fetch another effect's entry), and where it stops early or skips, the entry it
#: stopped at or skipped to is not the first of a sound chain, which the read's chain check,
#: from ``prev = ''``, refuses (``check_chain``: ``JournalCorrupt`` naming that entry).
CHAIN_WALK = (
    "WITH RECURSIVE chain AS ("
    f"SELECT {_E_COLUMNS}, e.prev_seq FROM effects r JOIN entries e ON e.seq = r.head_seq "
    "AND e.effect_id = r.effect_id WHERE r.effect_id = ? "
    "UNION ALL "
    f"SELECT {_E_COLUMNS}, e.prev_seq FROM chain c JOIN entries e ON e.seq = c.prev_seq "
    "AND e.effect_id = c.effect_id WHERE c.prev_seq < c.seq) "
)


def raw_entry(values: Sequence[Any]) -> RawEntry:
    """A stored entry as read. A body an operator rewrote as text (SQLite keeps what it is given)
    is taken as its UTF-8 bytes, so the check names it as an edit instead of failing to read it."""
    seq, eid, kind, prev, hash_, key_id, sig, body, vals = values
    signed = body.encode() if isinstance(body, str) else bytes(body)
    return RawEntry(seq, eid, kind, prev, hash_, key_id, sig, signed, vals)


_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads_compact(text: str) -> Any:
    """``json.loads`` of compact JSON such as ``_values_json`` writes (no surrounding
    whitespace), by the decoder's scanner alone; anything else through ``json.loads``."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def values_json(values: Mapping[str, Any]) -> str:
    """The JSON object of an append's values as stored beside its last entry (``vals``), each
    value already canonical JSON bytes or made so."""
    parts = [
        _quoted(name) + ":" + (v if isinstance(v, bytes) else canonical(v)).decode()
        for name, v in values.items()
    ]
    return "{" + ",".join(parts) + "}"


def values_digest(vals: str) -> str:
    """The digest an entry signs of the values stored beside it: sha256 of their stored text."""
    return hashlib.sha256(vals.encode()).hexdigest()


def _envelope(
    seq: int,
    ts: float,
    effect_id: str,
    kind: str,
    prev: str,
    key_id: str,
    data: dict[str, Any],
    values_hex: str | None,
    version: int = ENTRY_VERSION,
) -> bytes:
    """The signed bytes of an entry: the canonical JSON of ``{v, seq, ts, effect_id, kind,
    prev, key_id, data[, vals]}``. Only ``data`` is canonicalised; the fields around it are
    written in their canonical order and form when that form is plain (ASCII strings, a seq
    in the interoperable range, a timestamp Python and ECMAScript print alike), else the
    whole document goes through ``canonical_json``: the bytes are the same either way."""
    if (
        type(seq) is int
        and 0 <= seq <= _SAFE_INT
        and type(ts) is float
        and 1e-4 <= ts < 1e16
        and not ts.is_integer()
        and effect_id.isascii()
        and kind.isascii()
        and prev.isascii()
        and key_id.isascii()
    ):
        head = b'{"data":' + canonical_json(data)
        tail = (
            f',"effect_id":{_quoted(effect_id)},"key_id":{_quoted(key_id)}'
            f',"kind":{_quoted(kind)},"prev":{_quoted(prev)},"seq":{seq},"ts":{ts!r},'
            f'"v":{version}'
        )
        if values_hex is not None:
            tail += f',"vals":{_quoted(values_hex)}'
        return head + (tail + "}").encode()
    doc: dict[str, Any] = {
        "v": version,
        "seq": seq,
        "ts": ts,
        "effect_id": effect_id,
        "kind": kind,
        "prev": prev,
        "key_id": key_id,
        "data": data,
    }
    if values_hex is not None:
        doc["vals"] = values_hex
    return canonical_json(doc)


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
    version: int = ENTRY_VERSION,
) -> Entry:
    """Build and sign one entry; ``vals``, the values to store beside it, are bound by digest.
    ``version``: ``COMBINED_VERSION`` for a combined dispatch (``combined``), else the
    default."""
    if type(data) is not dict:
        data = dict(data)
    values_hex = None if vals is None else values_digest(vals)
    body = _envelope(seq, ts, effect_id, kind.value, prev, key.key_id, data, values_hex, version)
    digest = hashlib.sha256(body).digest()
    # built, not validated: every field is made here with its declared type (the entry gets
    # its own copy of ``data``, as validation gives it)
    return built(
        Entry,
        {
            "seq": seq,
            "ts": ts if type(ts) is float else float(ts),
            "effect_id": effect_id,
            "kind": kind,
            "prev": prev,
            "data": dict(data),
            "hash": digest.hex(),
            "key_id": key.key_id,
            "sig": key.sign(digest),
            "body": body,
            "values": None if vals is None else _loads_compact(vals),
        },
    )


def combined(drafts: Sequence[Draft]) -> list[Draft | tuple[Draft, ...]]:
    """``drafts`` with each run of ``PROPOSED``, ``AUTHORIZED``, ``DISPATCHED`` (or of the
    last two) taken together, to be written as one format-3 entry (``combined_data``)."""
    out: list[Draft | tuple[Draft, ...]] = []
    at, n = 0, len(drafts)
    while at < n:
        kinds = [d.kind for d in drafts[at : at + 3]]
        if kinds == [Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED]:
            out.append(tuple(drafts[at : at + 3]))
            at += 3
        elif kinds[:2] == [Kind.AUTHORIZED, Kind.DISPATCHED]:
            out.append(tuple(drafts[at : at + 2]))
            at += 2
        else:
            out.append(drafts[at])
            at += 1
    return out


def combined_data(drafts: Sequence[Draft]) -> dict[str, Any]:
    """The data of the format-3 entry that stands for ``drafts`` (a run ``combined`` found)."""
    return {_PART_OF[d.kind]: d.data for d in drafts}


def views(entry: Entry, data: Mapping[str, Any]) -> list[Entry]:
    """The entries a format-3 ``entry`` stands for, given its (signed) ``data``: each shares
    its seq, hash, signature and bytes; the values stored beside it ride on the last, as they
    would on the last of the separate entries."""
    parts = [(kind, data[part]) for kind, part in PARTS if part in data]
    last = len(parts) - 1
    return [
        entry.model_copy(
            update={"kind": kind, "data": part, "values": entry.values if at == last else None}
        )
        for at, (kind, part) in enumerate(parts)
    ]


def part_of(kind: Kind, doc: Mapping[str, Any]) -> Any:
    """The data an entry of ``kind`` holds, given its signed document ``doc``: its ``data``, or
    the part of a format-3 entry's that stands for ``kind``."""
    data = doc["data"]
    if doc.get("v") == COMBINED_VERSION:
        return data[_PART_OF[kind]]
    return data


def proposal_of(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """What an effect's first entry (its signed document ``doc``) says of the effect: its data,
    or the proposal part of a combined dispatch's (format 3)."""
    data = doc.get("data")
    if isinstance(data, dict) and doc.get("v") == COMBINED_VERSION:
        data = data.get("proposal")
    return data if isinstance(data, dict) else {}


def decode_entries(raw: RawEntry) -> list[Entry]:
    """The entries a stored entry stands for, as the gate uses them (itself; the three a
    format-3 entry combines): only for an entry that verified (``check_chain``)."""
    doc = json.loads(raw.body)
    entry = _decoded(raw, doc)
    if doc.get("v") != COMBINED_VERSION:
        return [entry]
    if entry.kind is not Kind.DISPATCHED:
        raise JournalCorrupt.at(raw.effect_id, raw.seq, f"a combined entry of kind {raw.kind}")
    data = doc["data"]
    if not (
        isinstance(data, dict)
        and data.keys() <= set(_PART_OF.values())
        and {"authorization", "dispatch"} <= data.keys()
        and all(isinstance(part, dict) for part in data.values())
    ):
        raise JournalCorrupt.at(raw.effect_id, raw.seq, "a combined entry without its parts")
    return views(entry, data)


def decode_entry(raw: RawEntry) -> Entry:
    """An entry of format 1 or 2 as the gate uses it: only for an entry that verified
    (``check_chain``). A format-3 entry stands for several: ``decode_entries``."""
    doc = json.loads(raw.body)
    if doc.get("v") == COMBINED_VERSION:
        raise ValueError("a combined entry stands for several: read it with decode_entries")
    return _decoded(raw, doc)


def _decoded(raw: RawEntry, doc: Mapping[str, Any]) -> Entry:
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


def _signed_tail(raw: RawEntry) -> bytes:
    """What the signed bytes of ``raw`` must hold after its ``data``, up to the timestamp: the
    canonical JSON of the columns stored beside them (keys sort after ``data``)."""
    return (
        f',"effect_id":{_quoted(raw.effect_id)},"key_id":{_quoted(raw.key_id)}'
        f',"kind":{_quoted(raw.kind)},"prev":{_quoted(raw.prev)},"seq":{raw.seq},"ts":'
    ).encode()


_V1_END = b',"v":1}'
#: how an entry of format 2 or 3 without values ends
ENDS = (b',"v":2}', b',"v":3}')
#: a format-2 or -3 entry with values ends ``,"v":2,"vals":"<64 hex>"}`` (or ``"v":3``)
VALS_STARTS = (b',"v":2,"vals":"', b',"v":3,"vals":"')
_VALS_END_LEN = len(VALS_STARTS[0]) + 64 + 2
#: what ``check_entry`` says of a format-1 entry with values: they verify only once a later
#: ``VALUES_BOUND`` entry of its effect binds them
UNBOUND = "unbound"


def binds_values(body: bytes, vals: str) -> bool:
    """The signed bytes of a format-2 or -3 entry end binding ``vals`` (their digest)."""
    end = values_digest(vals).encode() + b'"}'
    return body.endswith(end) and body[-len(end) - len(VALS_STARTS[0]) :].startswith(VALS_STARTS)


def check_entry(raw: RawEntry, keyring: Keyring) -> str | None:
    """What is wrong with one stored entry, or None (or ``UNBOUND``: a format-1 entry whose
    values its chain must bind): its bytes hash to its hash, its signature holds, the signed
    fields agree with the stored columns, and the values stored beside it are the ones it
    signed."""
    return _check(raw, keyring)[0]


def _signed_bytes(raw: RawEntry) -> bytes:
    """An entry's signed bytes; a body an operator rewrote as text is taken as its UTF-8."""
    return raw.body if isinstance(raw.body, bytes) else str(raw.body).encode()


def _check(raw: RawEntry, keyring: Keyring) -> tuple[str | None, int]:
    """``check_entry``, and where the signed timestamp starts in the bytes (-1: not known
    without parsing them)."""
    body = _signed_bytes(raw)
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
            if body.endswith(ENDS) or body.endswith(_V1_END):
                return None, ts_at
            if body.endswith(b'"}') and body[-_VALS_END_LEN:].startswith(VALS_STARTS):
                return "its signed bytes bind values that are not stored (deleted)", -1
        else:
            if body.endswith(_V1_END):
                return UNBOUND, ts_at
            if binds_values(body, raw.vals):
                return None, ts_at
            if body.endswith(ENDS) or body[-_VALS_END_LEN:].startswith(VALS_STARTS):
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


def signed_ts(body: bytes, at: int) -> float:
    """The timestamp an entry that checked signed (``body``: its signed bytes): read where
    ``_check`` found it, else parsed."""
    if at >= 0:
        try:
            return float(body[at : body.find(b",", at)])
        except ValueError:
            pass
    return float(json.loads(body)["ts"])


@dataclass(slots=True)
class ChainSummary:
    """What the entries of one effect add up to, as its index row must say: what
    ``ChainCheck`` keeps per effect (``chains``), and ``verifying``'s short path starts."""

    head: str = ""
    head_seq: int = 0
    status: str | None = None
    effect_type: str | None = None
    origin: str | None = None
    first_dispatch: float | None = None
    last_dispatch: float | None = None
    #: the head entry's signed bytes, and where its timestamp starts (read only when a row is
    #: checked)
    head_body: bytes | None = None
    head_ts_at: int = -1
    #: the effect id as its entries' signed bytes write it (JSON), once known
    quoted_id: str = ""
    #: format-1 entries' values (seq -> digest) no VALUES_BOUND entry has bound yet
    unbound: dict[int, str] | None = None
    #: when the head was written, where its bytes are not kept (a chain joined from the
    #: ranges of ``verify_jobs``)
    updated_ts: float | None = None

    @property
    def updated(self) -> float | None:
        if self.head_body is None:
            return self.updated_ts
        return signed_ts(self.head_body, self.head_ts_at)


_ANNOTATION_KINDS = frozenset(k.value for k in ANNOTATIONS)
_DISPATCHED = Kind.DISPATCHED.value
_ARCHIVED = Kind.ARCHIVED.value
_ANCHOR = Kind.ANCHOR.value


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
        self.chains: dict[str, ChainSummary] = {}
        #: the archives' anchors met so far (``Kind.ANCHOR``)
        self.anchors: list[RawEntry] = []

    def add(self, raw: RawEntry) -> tuple[int, str] | None:
        """The next entry of its effect: None, or what is wrong and at which seq (an edited
        value of an earlier entry is found when the entry that binds it arrives)."""
        problem, ts_at = _check(raw, self.keyring)
        unbound = problem == UNBOUND
        if problem is not None and not unbound:
            return raw.seq, problem
        chain = self.chains.get(raw.effect_id)
        if chain is None:
            chain = self.chains[raw.effect_id] = ChainSummary()
        tombstone = raw.kind == _ARCHIVED
        if tombstone and chain.head:
            return raw.seq, "a tombstone after other entries of its effect (inserted)"
        # a tombstone starts its effect's live chain: its prev is the head of the entries it
        # stands for, which its archive holds
        if raw.prev != chain.head and not tombstone:
            return raw.seq, (
                "its prev is not the previous entry of its effect (reordered, inserted or forked)"
            )
        if not chain.head:
            data = proposal_of(json.loads(raw.body))
            kind_type = data.get("effect_type")
            chain.effect_type = kind_type if isinstance(kind_type, str) else None
            chain.origin = data.get("origin") if tombstone else origin_in(data)
            if tombstone:
                chain.status = data.get("final")
                chain.first_dispatch = data.get("first_dispatch_ts")
                chain.last_dispatch = data.get("last_dispatch_ts")
        if raw.kind == _ANCHOR:
            self.anchors.append(raw)
        if unbound:
            assert raw.vals is not None
            if chain.unbound is None:
                chain.unbound = {}
            chain.unbound[raw.seq] = values_digest(raw.vals)
        if raw.kind == Kind.VALUES_BOUND.value:
            found = self._bind(raw, chain)
            if found is not None:
                return found
        chain.head, chain.head_seq, chain.head_body, chain.head_ts_at = (
            raw.hash,
            raw.seq,
            _signed_bytes(raw),
            ts_at,
        )
        if raw.kind not in _ANNOTATION_KINDS and not tombstone:
            chain.status = raw.kind
        if raw.kind == _DISPATCHED:
            ts = signed_ts(_signed_bytes(raw), ts_at)
            if chain.first_dispatch is None:
                chain.first_dispatch = ts
            chain.last_dispatch = ts
        return None

    @staticmethod
    def _bind(raw: RawEntry, chain: ChainSummary) -> tuple[int, str] | None:
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


def archive_root(hashes: Iterable[str]) -> str:
    """The root an archive's anchor signs over the entries it took: sha256 of their hashes,
    in seq order, one per line."""
    root = hashlib.sha256()
    for digest in hashes:
        root.update(digest.encode() + b"\n")
    return root.hexdigest()


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
