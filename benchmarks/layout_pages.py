"""WAL pages per new effect for journal layouts not built yet: a design's pages measured before
it is written (``python -m benchmarks.layout_pages``).

The problem: issue 39's pages target (≤ 6 per new effect) asks which tables a new effect must
touch at all, and rebuilding the journal to find out costs a day per layout. The mechanism: the
gate's write pattern replayed on bare SQLite (WAL, the checkpoints stopped), rows of the sizes
the gate writes (the entries' bodies and values are read from a journal given on the command
line, e.g. figure 5's bench journal), the WAL's frames counted per table (``dbstat``), for:

- ``now``: schema 13 as the journal writes it: the dispatch's three entries and the effect's
  row in one transaction, the COMMITTED and the row's update in the next; the in-doubt list a
  partial index of the effects table;
- ``append``: the commit as a pure append: the row written once, at dispatch (its first seq:
  a read walks forward along ``entries_next``), and "in doubt" a partial index of DISPATCHED
  entries (inserted at its right edge, never deleted: a dispatch with no successor is in doubt);
- ``append+v3``: ``append`` with the dispatch's three entries as one (about the same bytes).

No lease budget's row is written (the journal's figure adds about one page under a budget). The
cost: a few seconds; what it cannot say is what the gate's reads would cost on such a layout.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path

from . import bench_dir
from .wal_pages import wal_frames

_SCHEMA = """
PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
CREATE TABLE entries (seq INTEGER PRIMARY KEY, effect_id TEXT NOT NULL, kind TEXT NOT NULL,
  prev TEXT NOT NULL, hash TEXT NOT NULL, key_id TEXT NOT NULL, sig TEXT NOT NULL,
  body BLOB NOT NULL, vals TEXT, prev_seq INTEGER);
CREATE UNIQUE INDEX entries_next ON entries (prev_seq) WHERE prev_seq IS NOT NULL;
CREATE TABLE effects (effect_id TEXT PRIMARY KEY, effect_type TEXT NOT NULL, status TEXT NOT NULL,
  head TEXT NOT NULL, head_seq INTEGER NOT NULL, updated_ts REAL NOT NULL,
  first_dispatch_ts REAL, last_dispatch_ts REAL, origin TEXT, lease_id TEXT, cents INTEGER,
  active INTEGER) WITHOUT ROWID;
CREATE INDEX effects_origin ON effects (substr(origin, 1, 16)) WHERE origin IS NOT NULL;
"""
_IN_DOUBT = {
    "now": (
        "CREATE INDEX effects_in_doubt ON effects (last_dispatch_ts) WHERE status = 'DISPATCHED'"
    ),
    "append": "CREATE INDEX entries_dispatched ON entries (seq) WHERE kind = 'DISPATCHED'",
}
LAYOUTS = ("now", "append", "append+v3")
_DISPATCH = ("PROPOSED", "AUTHORIZED", "DISPATCHED")
#: the bytes of one combined dispatch entry, as encoding the gate's three entries' data as one
#: measured (1,508 against the three's 1,991)
V3_BYTES = 1_508


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pages(
    layout: str, rows: dict[str, tuple[bytes, str | None]], path: Path, warm: int, n: int
) -> tuple[float, dict[str, float]]:
    """WAL frames per new effect (and by table) of ``n`` new effects after ``warm`` ones."""
    for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        stale.unlink(missing_ok=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.executescript(_SCHEMA + _IN_DOUBT[layout.split("+")[0]] + ";")
        seq = 0
        for i in range(warm + n):
            if i == warm:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            eid, ts = _digest(f"{layout} {i}"), 1.8e9 + i
            first, prev, prev_seq = seq + 1, "", None
            kinds = ("DISPATCHED",) if layout.endswith("v3") else _DISPATCH
            db.execute("BEGIN IMMEDIATE")
            for kind in kinds:
                seq += 1
                body, vals = rows[kind]
                if layout.endswith("v3"):  # the three bodies' data in one entry
                    body = b"".join(rows[k][0] for k in _DISPATCH)[:V3_BYTES]
                entry = _digest(f"{eid} {seq}")
                db.execute(
                    "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (seq, eid, kind, prev, entry, "hmac-x", entry, body, vals, prev_seq),
                )
                prev, prev_seq = entry, seq
            head_seq = seq if layout == "now" else first
            db.execute(
                "INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (eid, "refund", "DISPATCHED", prev, head_seq, ts, ts, ts, _digest(eid), "l", 1, 1),
            )
            db.execute("COMMIT")
            db.execute("BEGIN IMMEDIATE")
            seq += 1
            body, vals = rows["COMMITTED"]
            entry = _digest(f"{eid} {seq}")
            db.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, eid, "COMMITTED", prev, entry, "hmac-x", entry, body, vals, prev_seq),
            )
            if layout == "now":
                db.execute(
                    "UPDATE effects SET status = 'COMMITTED', head = ?, head_seq = ?, "
                    "updated_ts = ? WHERE effect_id = ?",
                    (entry, seq, ts + 0.1, eid),
                )
            db.execute("COMMIT")
        frames = wal_frames(path)
        table_of = dict(db.execute("SELECT pageno, name FROM dbstat"))
    by_table = collections.Counter(table_of.get(page, "?") for page in frames)
    return len(frames) / n, {t: c / n for t, c in by_table.most_common()}


def gate_rows(journal: Path) -> dict[str, tuple[bytes, str | None]]:
    """One committed effect's entries (body, values) by kind, from a journal the gate wrote."""
    with closing(sqlite3.connect(f"{journal.resolve().as_uri()}?mode=ro", uri=True)) as db:
        (eid,) = db.execute(
            "SELECT effect_id FROM entries WHERE kind = 'COMMITTED' ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        found = db.execute("SELECT kind, body, vals FROM entries WHERE effect_id = ?", (eid,))
        return {kind: (bytes(body), vals) for kind, body, vals in found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("journal", type=Path, help="a SQLite journal the gate wrote (its rows)")
    parser.add_argument("--warm", type=int, default=3_000)
    parser.add_argument("--effects", type=int, default=1_000)
    args = parser.parse_args()
    rows = gate_rows(args.journal)
    if not rows.keys() >= set(_DISPATCH):
        # the layouts are built from the three entries' sizes (``append+v3`` from V3_BYTES)
        parser.error(
            "the journal holds no separate PROPOSED, AUTHORIZED and DISPATCHED: give one the "
            "gate wrote before schema 14, or with SqlJournal.combine_dispatch off"
        )
    directory = bench_dir("layouts")
    for layout in LAYOUTS:
        total, by_table = pages(layout, rows, directory / f"{layout}.db", args.warm, args.effects)
        tables = ", ".join(f"{t} {c:.2f}" for t, c in by_table.items())
        print(f"{layout}: {total:.2f} WAL pages per new effect ({tables})")


if __name__ == "__main__":
    main()
