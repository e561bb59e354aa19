"""The WAL pages a new effect makes SQLite write, in all and by table (figure 1, and
``checkout_ab``'s side-by-side of two checkouts).

The problem: a durable commit costs about what it flushes, and SQLite flushes whole pages (the
WAL gets one frame per page a transaction changed), so the pages a new effect touches are the
durable part of the gate's cost, whatever its statements are. The mechanism: new effects through
``Gate.run`` on a fresh journal with its WAL checkpointer stopped once it caught up and the WAL
emptied, so the WAL then holds every frame the effects wrote; its frame headers are read (the page
number of each) and each page is named by its table or index through SQLite's ``dbstat``. The
cost: ``n`` durable effects (about 1 ms each here) and one read of the WAL; the WAL grows to about
``n`` x 15 frames of a page each (below the writers' auto-checkpoint, which would start it over).

``checkout_ab`` runs this file from its own checkout inside another checkout's process (that
checkout's journal, gate and ``gate_cost``), so it names only what every checkout has at import,
and takes ``gate_cost``'s helpers when it runs (``gate_cost`` imports this module).
"""

from __future__ import annotations

import collections
import sqlite3
import struct
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock_temporal.core.journal.sqlite import SqliteJournal
from interlock_temporal.core.protocol import Gate


@dataclass(frozen=True)
class WalPages:
    """WAL frames (pages written) per new effect over ``effects`` new effects, in all and by the
    table or index each page belongs to (``?``: a page ``dbstat`` no longer names, such as one
    freed since)."""

    effects: int
    per_effect: float
    by_table: dict[str, float]


def wal_frames(path: Path) -> list[int]:
    """The page number of every frame in ``path``'s WAL, in order."""
    data = Path(f"{path}-wal").read_bytes()
    (page_size,) = struct.unpack(">I", data[8:12])
    pages, offset = [], 32
    while offset + 24 + page_size <= len(data):
        pages.append(struct.unpack(">I", data[offset : offset + 4])[0])
        offset += 24 + page_size
    return pages


# A checkout from before the SQLite journal named these for measurements (``connection``,
# ``wrap_connections``, ``checkpointer``, ``stop_checkpointer``: issue 31) is driven through its
# private attributes instead, so that ``checkout_ab`` still compares against it.


def stop_checkpoints(journal: SqliteJournal) -> None:
    """Stop the journal's WAL checkpointer once it caught up, and empty the WAL."""
    if not hasattr(journal, "stop_checkpointer"):
        old: Any = journal
        checkpointer = old._checkpointer  # private: a checkout from before issue 31
        if checkpointer is not None:
            checkpointer.settle(30.0)
            checkpointer.close()
            old._checkpointer = None  # private: as above
        old._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # private: as above
        return
    checkpointer = journal.checkpointer
    if checkpointer is not None:
        checkpointer.catch_up(30.0)
        journal.stop_checkpointer()
    journal.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


async def count(path: Path, n: int) -> WalPages:
    """WAL frames per new effect, by table: ``n`` new effects through ``Gate.run`` on a fresh
    durable journal at ``path`` (after ``ROTATE_WARMUP`` untimed ones, as figure 1's size 0
    takes), its checkpoints stopped."""
    # the running checkout's (``checkout_ab``): imported here, as gate_cost imports this module
    from .gate_cost import ROTATE_WARMUP, ConstantSend, TrivialTarget, make_call, open_bench_journal

    journal = open_bench_journal(path)
    try:
        if not isinstance(journal, SqliteJournal):
            raise TypeError("WAL pages are the SQLite journal's")
        gate, target, send = Gate(journal), TrivialTarget(), ConstantSend()
        for i in range(ROTATE_WARMUP):
            await gate.run(make_call("pages-warm", i), target, send)
        stop_checkpoints(journal)  # stopped: the WAL keeps every frame the effects write
        for i in range(n):
            await gate.run(make_call("pages", i), target, send)
        frames = wal_frames(path)
        with closing(sqlite3.connect(path)) as look:
            table_of = dict(look.execute("SELECT pageno, name FROM dbstat"))
    finally:
        journal.close()
    by_table = collections.Counter(table_of.get(page, "?") for page in frames)
    return WalPages(
        effects=n,
        per_effect=len(frames) / n,
        by_table={t: c / n for t, c in by_table.most_common()},
    )
