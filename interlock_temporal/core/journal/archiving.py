"""Archives of effects in a final state (``interlock journal archive``): the file they are
written to, and how it is checked, alone or against the journal it was taken from.

An archive is JSON lines. The first line is its header, signed with the journal's key:
``{"archive": {...}, "key_id": ..., "sig": ...}``, where ``sig`` signs the sha256 of the
header's canonical JSON. The header names the archive, the seq ranges it took, the root over
the hashes of the entries it holds (``archive_root``) and each archived effect's chain head.
Every other line is one entry as ``journal export`` writes it (``export_line``): its signed
bytes, hash, signature and values, in seq order.

The live journal keeps, for each archive, a signed anchor (``Kind.ANCHOR``, alone on the chain
``archive:<id>``) with the same ranges and root and the header's digest, and for each archived
effect a tombstone (``Kind.ARCHIVED``) whose ``prev`` is the archived chain's head. ``verify``
of the live journal accepts exactly the seqs the anchors name as missing; this module checks
that an archive holds exactly those entries, sound, and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import JournalCorrupt
from ..identity import canonical_json
from ..models import JournalHead, Kind, VerifyReport
from .entries import ChainCheck, RawEntry, archive_root, read_export
from .signing import Keyring, SigningKey

#: the archive file's format, in its header
ARCHIVE_FORMAT = "interlock-archive/1"


def archive_chain(archive_id: str) -> str:
    """The live journal's chain that holds an archive's anchor."""
    return f"archive:{archive_id}"


def seq_ranges(seqs: Iterable[int]) -> list[list[int]]:
    """Sorted seqs as maximal runs ``[first, last]`` of consecutive numbers."""
    runs: list[list[int]] = []
    for seq in sorted(seqs):
        if runs and seq == runs[-1][1] + 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return runs


def header_digest(header: Mapping[str, Any]) -> str:
    """What the header's signature (and the anchor) cover: sha256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(dict(header))).hexdigest()


def header_line(header: Mapping[str, Any], key: SigningKey) -> str:
    """The archive's first line: the header and its signature."""
    digest = bytes.fromhex(header_digest(header))
    doc = {"archive": dict(header), "key_id": key.key_id, "sig": key.sign(digest)}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class ArchiveRun:
    """What one ``archive`` run did. ``skipped``: effects in a final state and old enough that
    stayed, by why (``claimed``: an attempt held it; ``under_review``: a person's decision is
    pending; ``not_happened``: resolved as not happened)."""

    archive_id: str | None
    path: Path | None
    effects: int
    entries: int
    ranges: list[list[int]]
    root: str | None
    anchor: JournalHead | None
    skipped: dict[str, int]


def read_archive(lines: Iterable[str]) -> tuple[dict[str, Any], Iterator[RawEntry]]:
    """The signed header document and the entries of an archive file."""
    it = iter(lines)
    first = next((line for line in it if line.strip()), None)
    if first is None:
        raise JournalCorrupt("the archive is empty: its first line must be its signed header")
    try:
        doc = json.loads(first)
    except ValueError:
        raise JournalCorrupt("the archive's first line is not its header (not JSON)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("archive"), dict):
        raise JournalCorrupt("the archive's first line is not its header")
    return doc, read_export(it)


def verify_archive(
    lines: Iterable[str], keyring: Keyring, anchor: Mapping[str, Any] | None = None
) -> VerifyReport:
    """Check an archive alone: its header's signature, every entry (hash, signature, place in
    its chain, values), that it holds exactly the seqs its header names, whose hashes give its
    root, and that each effect's chain ends at the head its header records. With ``anchor``
    (the data of the live journal's anchor of this archive), also that the header is the one
    the anchor signed. ``JournalCorrupt`` for a file that is not an archive."""
    doc, raws = read_archive(lines)
    header: dict[str, Any] = doc["archive"]
    checker = ChainCheck(keyring)
    seqs: list[int] = []
    hashes: list[str] = []

    def failed(seq: int | None, problem: str) -> VerifyReport:
        return VerifyReport(
            ok=False,
            entries=len(seqs),
            effects=len(checker.chains),
            first_bad_seq=seq,
            problem=problem,
        )

    problem = _header_problem(doc, keyring)
    if problem is not None:
        return failed(None, problem)
    if anchor is not None:
        problem = _against_anchor(header, anchor)
        if problem is not None:
            return failed(None, problem)
    for raw in raws:
        if seqs and raw.seq <= seqs[-1]:
            return failed(raw.seq, f"out of order (after seq {seqs[-1]})")
        found = checker.add(raw)
        if found is not None:
            return failed(*found)
        seqs.append(raw.seq)
        hashes.append(raw.hash)
    found = checker.unbound() or _holds(header, seqs, hashes, checker)
    if found is not None:
        return failed(*found)
    return VerifyReport(ok=True, entries=len(seqs), effects=len(checker.chains))


def _header_problem(doc: Mapping[str, Any], keyring: Keyring) -> str | None:
    header = doc["archive"]
    if header.get("format") != ARCHIVE_FORMAT:
        return f"the header is not of format {ARCHIVE_FORMAT}"
    key = keyring.get(str(doc.get("key_id")))
    if key is None:
        return f"the header is signed with key {doc.get('key_id')}, which is not in the keyring"
    if not key.verify(bytes.fromhex(header_digest(header)), str(doc.get("sig"))):
        return f"the header's signature does not verify with key {key.key_id} (edited)"
    return None


def _against_anchor(header: Mapping[str, Any], anchor: Mapping[str, Any]) -> str | None:
    if anchor.get("header_digest") != header_digest(header):
        return "the header is not the one the journal's anchor of this archive signed"
    if anchor.get("root") != header.get("root") or anchor.get("ranges") != header.get("ranges"):
        return "its root or ranges differ from the journal's anchor of this archive"
    return None


def _holds(
    header: Mapping[str, Any], seqs: Sequence[int], hashes: Sequence[str], checker: ChainCheck
) -> tuple[int, str] | None:
    """What the entries read lack (or have too many of) against the signed header."""
    if seq_ranges(seqs) != header.get("ranges"):
        return (seqs[0] if seqs else 0), "its entries are not the seq ranges its header names"
    if archive_root(hashes) != header.get("root"):
        return seqs[0], "the root over its entries' hashes is not its header's (edited)"
    heads: dict[str, Any] = header.get("heads") or {}
    if set(heads) != set(checker.chains):
        return seqs[0], "its effects are not the ones its header names"
    for eid, chain in checker.chains.items():
        if heads[eid] != {"seq": chain.head_seq, "hash": chain.head}:
            return chain.head_seq, f"effect {eid[:16]} does not end at the head its header records"
        if chain.status not in _FINAL:
            # the message as released (``journal verify --archive`` shows it)
            return chain.head_seq, f"effect {eid[:16]} is not settled ({chain.status})"
    return None


#: the statuses an effect ends in: an archive holds no other
_FINAL = frozenset(k.value for k in (Kind.COMMITTED, Kind.REFUSED, Kind.RESOLVED))
