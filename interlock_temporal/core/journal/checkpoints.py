"""The embedded journal's WAL checkpoints, off the effects' path.

SQLite's own auto-checkpoint runs inside the COMMIT that crosses its threshold: that one effect
waits while the WAL's pages are copied back into the database file and the file is synced
(measured: the gate's p99 at 3-9x its p50). Here the journal's writers' connection keeps only a
distant auto-checkpoint, as a backstop, and a thread of the journal's own, on a connection of
its own, runs ``PRAGMA wal_checkpoint(PASSIVE)`` a short while after commits: PASSIVE never
waits for a writer nor holds one up, so the commits go on while it copies.

Durability is SQLite's, unchanged: the checkpointer's connection syncs as the writers' does
(``synchronous=FULL``: the WAL before the copy, the database file after it), and an entry is
acknowledged only once its COMMIT is in the WAL on disk, checkpointed or not.

The WAL's size is bounded: SQLite writes the WAL from its start again once a checkpoint has
copied every frame and no reader is behind it. Under a steady stream of commits a pass never
quite catches up (each commit adds frames while it syncs), so once the WAL holds more than
``SOFT_LIMIT_FRAMES``, a round ends with one more pass while this process's writers wait
(``hold``): a short one, the frames before it having been copied already. The writers' own
auto-checkpoint, at ``BACKSTOP_PAGES``, bounds the WAL if the thread cannot run at all (or
another process writes without one).

A pass's statement is read to its end (``fetchall``): a statement left open holds a read lock
on the WAL, and the WAL is never written from its start again while a reader is behind it.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

log = logging.getLogger("interlock_temporal.journal")

#: how long after a commit the checkpoint starts (commits arriving meanwhile share it)
INTERVAL_S = 0.05
#: checkpoint passes per round, while commits keep adding frames behind the last one
PASSES = 4
#: the WAL's frames (about 16 MiB) beyond which a round ends with a pass holding the writers
SOFT_LIMIT_FRAMES = 4_000
#: the writers' own (inline) auto-checkpoint, a backstop only: about 64 MiB of 4 KiB pages
BACKSTOP_PAGES = 16_384


class Checkpointer:
    """Runs PASSIVE checkpoints of one SQLite database on a thread and connection of its own,
    ``INTERVAL_S`` after the commits it is told of (``nudge``). ``hold()`` is a context manager
    that keeps this process's writers out (for the rare pass that must catch up)."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        hold: Callable[[], AbstractContextManager[object]],
        *,
        interval_s: float | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self._db = connect()
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._hold = hold
        self._interval_s = INTERVAL_S if interval_s is None else interval_s
        self._on_start = on_start
        self._nudged = threading.Event()
        self._stopping = threading.Event()
        #: set by ``close`` and ``catch_up``: the round waiting out its interval starts now
        self._wake = threading.Event()
        #: a round is running (guarded by ``_rounds``, notified after each round)
        self._running = False
        self._rounds = threading.Condition()
        #: checkpoint rounds run, and passes that held the writers (read by tests)
        self.rounds = 0
        self.held_passes = 0
        self._thread = threading.Thread(target=self._run, name="interlock-checkpoint", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        """A commit happened: checkpoint soon. Already nudged, the round to come (it clears the
        flag before it starts) covers this commit: ``Event.set`` would only take its lock."""
        if not self._nudged.is_set():
            self._nudged.set()

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while True:
            self._nudged.wait()
            # let the commits of the next moment share this round
            self._wake.wait(self._interval_s)
            if self._stopping.is_set():
                return
            with self._rounds:
                self._wake.clear()
                self._running = True
                self._nudged.clear()
            try:
                if self._stopping.is_set():  # ``close`` may have nudged just before the clear
                    return
                self.checkpoint()
            except sqlite3.Error as err:  # the next commit tries again; the backstop holds
                log.warning("journal checkpoint failed: %s", err)
            finally:
                with self._rounds:
                    self._running = False
                    self._rounds.notify_all()

    def checkpoint(self) -> tuple[int, int]:
        """One round: PASSIVE passes until every frame is copied (or ``PASSES`` ran); then, if
        the WAL has grown past ``SOFT_LIMIT_FRAMES``, one more while this process's writers
        wait, so that it ends between two transactions with every frame copied, which lets
        the next commit write the WAL from its start. (WAL frames, frames copied) after it."""
        self.rounds += 1
        frames = copied = 0
        for _ in range(PASSES):
            frames, copied = self._pass()
            if frames <= copied or self._stopping.is_set():
                break
        if frames > SOFT_LIMIT_FRAMES and not self._stopping.is_set():
            with self._hold():
                frames, copied = self._pass()
            self.held_passes += 1
        return frames, copied

    def _pass(self) -> tuple[int, int]:
        ((busy, frames, copied),) = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        if busy:  # another connection's checkpoint is running: it does the work
            return 0, 0
        return int(frames), int(copied)

    def catch_up(self, timeout_s: float) -> bool:
        """Start the round the last commits asked for now, without waiting out its interval,
        and wait until no round is running or asked for (True: the checkpoints caught up with
        the commits), or ``timeout_s`` passed (False). For a caller that knows no commit
        follows soon (the benchmarks, between one journal's burst of traffic and another's)."""
        with self._rounds:
            if self._nudged.is_set():
                self._wake.set()
            return self._rounds.wait_for(
                lambda: self._stopping.is_set() or not (self._running or self._nudged.is_set()),
                timeout_s,
            )

    def close(self) -> None:
        """Stop the thread (after the pass it is in) and close its connection."""
        self._stopping.set()
        self._wake.set()
        self._nudged.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
