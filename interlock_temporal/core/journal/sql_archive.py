"""An archive run on a SQL journal, in one write transaction: the effects in a final state
chosen, their entries written to the archive file (flushed to disk before anything leaves the
journal), then removed, each effect's tombstone and the archive's anchor appended, and the
transaction committed. If anything fails before the commit, nothing left the journal and the file is
removed again; a crash between the file's flush and the commit leaves a file whose anchor is
not in the journal (``journal verify --archive`` says so): it took nothing.

Appends wait for the run (it holds the journal's seq, as an append does), so no effect moves
while it is chosen. An effect an attempt holds a claim on when the run looks is left alone;
the run takes no claims itself (on PostgreSQL each would hold a connection), so an attempt
that claims an effect meanwhile reads it final, and an append it makes waits for the run,
finds the head moved to the tombstone and reads again: it answers as before.

The run sees the journal through ``JournalAccess`` (``sql_access``): it holds and moves the
journal's seq, and writes entries and index rows with the journal's own statements."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import JournalCorrupt
from ..models import Entry, JournalHead, Kind
from .archiving import (
    ARCHIVE_FORMAT,
    ArchiveRun,
    archive_chain,
    header_digest,
    header_line,
    seq_ranges,
)
from .entries import (
    CHAIN_WALK,
    ENTRY_COLUMNS,
    ROW_COLUMNS,
    RawEntry,
    archive_root,
    check_chain,
    decode_entries,
    effect_row,
    encode_entry,
    export_line,
    raw_entry,
    value_of,
    values_json,
)
from .interface import ARCHIVE_CHAIN_TYPE, POLICY_CHAIN_TYPE
from .sql_access import JournalAccess

#: what ``judge`` says of an effect: the tombstone's data, or why it stays (a ``skipped`` key)
Judge = Callable[[str, list[Entry]], "dict[str, Any] | str"]

#: an entry's columns as ``CHAIN_WALK``'s table ``c`` holds them
_C_COLUMNS = ", ".join("c." + c.strip() for c in ENTRY_COLUMNS.split(","))
#: the statuses an effect ends in (a run looks at no other)
_FINAL = ("COMMITTED", "REFUSED", "RESOLVED")


class _Chosen:
    """One effect the run takes: its stored entries, index row and tombstone data."""

    def __init__(self, raws: list[RawEntry], row: Any, tombstone: dict[str, Any], result: Any):
        self.raws = raws
        self.row = row
        self.tombstone = tombstone
        self.result = result


def archive_final(
    journal: JournalAccess, *, cutoff: float, to: Path, judge: Judge, header: Mapping[str, Any]
) -> ArchiveRun:
    """Move the effects in a final state last updated before ``cutoff`` that ``judge`` accepts
    to the archive file ``to`` (which must not exist), leaving tombstones and an anchor."""
    skipped: dict[str, int] = {}
    return journal.writing(lambda db: _run(journal, db, cutoff, to, judge, dict(header), skipped))


def _run(
    journal: JournalAccess,
    db: Any,
    cutoff: float,
    to: Path,
    judge: Judge,
    header: dict[str, Any],
    skipped: dict[str, int],
) -> ArchiveRun:
    seq = journal.hold_seq(db)  # held until the commit: appends wait for the run
    chosen = _choose(journal, db, cutoff, judge, skipped)
    if not chosen:
        return ArchiveRun(None, None, 0, 0, [], None, None, skipped)
    raws = sorted((r for c in chosen for r in c.raws), key=lambda r: r.seq)
    archive_id = uuid.uuid4().hex
    ranges = seq_ranges(r.seq for r in raws)
    last = journal.execute(db, "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
    header.update(
        format=ARCHIVE_FORMAT,
        archive_id=archive_id,
        journal_head_before={"seq": int(last[0]), "hash": str(last[1])},
        ranges=ranges,
        root=archive_root(r.hash for r in raws),
        entries=len(raws),
        heads={c.row.effect_id: {"seq": c.raws[-1].seq, "hash": c.raws[-1].hash} for c in chosen},
    )
    _write_file(to, header_line(header, journal.keyring.signing), raws)
    try:
        for first, end in ranges:
            journal.execute(db, "DELETE FROM entries WHERE seq >= ? AND seq <= ?", (first, end))
        for c in chosen:
            seq = _tombstone(journal, db, seq, c, archive_id)
        anchor = _anchor(journal, db, seq + 1, archive_id, header)
        journal.advance_seq(db, anchor.seq)
    except BaseException:
        with contextlib.suppress(OSError):
            to.unlink()
        raise
    return ArchiveRun(
        archive_id,
        to,
        len(chosen),
        len(raws),
        ranges,
        header["root"],
        JournalHead(seq=anchor.seq, hash=anchor.hash),
        skipped,
    )


def _choose(
    journal: JournalAccess,
    db: Any,
    cutoff: float,
    judge: Judge,
    skipped: dict[str, int],
) -> list[_Chosen]:
    rows = journal.execute(
        db,
        f"SELECT {ROW_COLUMNS} FROM effects WHERE status IN (?, ?, ?) AND updated_ts < ? "
        "AND effect_type NOT IN (?, ?) ORDER BY head_seq",
        (*_FINAL, cutoff, POLICY_CHAIN_TYPE, ARCHIVE_CHAIN_TYPE),
    ).fetchall()
    chosen = []
    for values in rows:
        row = effect_row(values)
        if journal.is_claimed(row.effect_id):
            skipped["claimed"] = skipped.get("claimed", 0) + 1
            continue
        # walked back from its row's head (``CHAIN_WALK``): entries have no index by effect
        stored = journal.execute(
            db, f"{CHAIN_WALK}SELECT {_C_COLUMNS} FROM chain c ORDER BY 1", (row.effect_id,)
        ).fetchall()
        raws = [raw_entry(r) for r in stored]
        check_chain(row.effect_id, raws, journal.keyring, row)  # never archive a broken chain
        if raws[-1].kind == Kind.ARCHIVED.value:
            continue  # only its tombstone is left: nothing to move
        entries = [e for r in raws for e in decode_entries(r)]
        verdict = judge(row.effect_id, entries)
        if isinstance(verdict, str):
            skipped[verdict] = skipped.get(verdict, 0) + 1
            continue
        chosen.append(_Chosen(raws, row, verdict, value_of(entries, "result")))
    return chosen


def _write_file(to: Path, header: str, raws: Sequence[RawEntry]) -> None:
    """The archive, flushed to disk: created new (an existing file is never overwritten)."""
    with open(to, "x", encoding="utf-8") as out:
        out.write(header + "\n")
        for raw in raws:
            out.write(export_line(raw) + "\n")
        out.flush()
        os.fsync(out.fileno())
    with contextlib.suppress(OSError):
        directory = os.open(to.resolve().parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _tombstone(journal: JournalAccess, db: Any, seq: int, c: _Chosen, archive_id: str) -> int:
    """Append the effect's tombstone after ``seq``; its index row points at it. The tombstone
    keeps the row's time (its signed ``ts``), so the effect's age and listings do not change."""
    row = c.row
    data = {
        **c.tombstone,
        "effect_type": row.effect_type,
        "origin": row.origin,
        "archive_id": archive_id,
        "first_dispatch_ts": row.first_dispatch_ts,
        "last_dispatch_ts": row.last_dispatch_ts,
        "archived_at": time.time(),
    }
    vals = None if c.result is None else values_json({"result": c.result})
    entry = encode_entry(
        seq=seq + 1,
        ts=row.updated_ts,
        effect_id=row.effect_id,
        kind=Kind.ARCHIVED,
        prev=c.raws[-1].hash,
        key=journal.keyring.signing,
        data=data,
        vals=vals,
    )
    _insert(journal, db, entry, vals)
    # moved on only from the head the run read (``PUT_ROW``'s backstop: the row's head)
    moved = journal.execute(
        db,
        "UPDATE effects SET head = ?, head_seq = ? WHERE effect_id = ? AND head = ?",
        (entry.hash, entry.seq, row.effect_id, row.head),
    )
    if moved.rowcount != 1:
        raise JournalCorrupt.at(row.effect_id, row.head_seq, "its head moved during the run")
    return entry.seq


def _anchor(
    journal: JournalAccess, db: Any, seq: int, archive_id: str, header: Mapping[str, Any]
) -> Entry:
    now = time.time()
    chain = archive_chain(archive_id)
    entry = encode_entry(
        seq=seq,
        ts=now,
        effect_id=chain,
        kind=Kind.ANCHOR,
        prev="",
        key=journal.keyring.signing,
        data={
            "effect_type": ARCHIVE_CHAIN_TYPE,
            "archive_id": archive_id,
            "ranges": header["ranges"],
            "root": header["root"],
            "entries": header["entries"],
            "effects": len(header["heads"]),
            "header_digest": header_digest(header),
        },
    )
    _insert(journal, db, entry, None)
    journal.execute(
        db,
        f"INSERT INTO effects ({ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, NULL)",
        (chain, ARCHIVE_CHAIN_TYPE, Kind.ANCHOR.value, entry.hash, entry.seq, now),
    )
    return entry


def _insert(journal: JournalAccess, db: Any, e: Entry, vals: str | None) -> None:
    """A tombstone or an anchor: the first entry of its (live) chain, so no ``prev_seq``."""
    journal.execute(
        db,
        f"INSERT INTO entries ({ENTRY_COLUMNS}, prev_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
        (e.seq, e.effect_id, e.kind.value, e.prev, e.hash, e.key_id, e.sig, e.body, vals),
    )
