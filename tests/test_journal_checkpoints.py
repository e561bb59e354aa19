"""The SQLite journal's WAL checkpoints run off the commits' path (``core/journal/checkpoints``):
on a thread and connection of their own, the WAL stays bounded, and a process killed while
they run loses nothing it acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import checkpoints, open_journal
from interlock_temporal.core.journal import sqlite as sqlite_journal
from interlock_temporal.core.models import Kind

from .journal_conformance import KEY, draft


def _wal_pending(path: Path) -> tuple[int, int]:
    """(frames in the WAL, frames of them copied into the database), read from the WAL index
    (``-shm``): its header's mxFrame at byte 16, then after its two copies the checkpoint
    info's nBackfill at byte 96 (SQLite's wal.c, ``WalIndexHdr`` and ``WalCkptInfo``)."""
    shm = Path(f"{path}-shm").read_bytes()
    return int.from_bytes(shm[16:20], sys.byteorder), int.from_bytes(shm[96:100], sys.byteorder)


def test_the_commit_leaves_the_checkpoint_to_the_journals_thread(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = open_journal(path, signing_key=KEY)
    try:
        db = journal.connection  # type: ignore[attr-defined]
        # the writers' own checkpoint is a distant backstop, not SQLite's default 1,000 pages
        assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == checkpoints.BACKSTOP_PAGES
        checkpointer = journal.checkpointer  # type: ignore[attr-defined]
        rounds = checkpointer.rounds
        for i in range(40):
            eid = effect_id("cp.refund", {"i": i})
            journal.append(eid, "", [draft(Kind.PROPOSED)], effect_type="cp.refund")
        frames, copied = _wal_pending(path)
        assert frames > 0
        deadline = time.monotonic() + 5
        while copied < frames and time.monotonic() < deadline:
            time.sleep(0.01)
            frames, copied = _wal_pending(path)
        # every frame was copied into the database, by the journal's own thread
        assert (frames, copied) == (frames, frames)
        assert checkpointer.rounds > rounds
    finally:
        journal.close()
    assert not Path(f"{path}-wal").exists()  # the last connection closed checkpoints it all


def test_catch_up_runs_the_round_asked_for_now_and_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an interval far beyond the test: only ``catch_up`` can start the round before it ends
    monkeypatch.setattr(checkpoints, "INTERVAL_S", 60.0)
    path = tmp_path / "j.db"
    journal = open_journal(path, signing_key=KEY)
    checkpointer = journal.checkpointer  # type: ignore[attr-defined]
    try:
        assert checkpointer.catch_up(5.0)  # nothing asked for: caught up at once
        assert checkpointer.rounds == 0
        for i in range(20):
            eid = effect_id("cp.refund", {"i": i})
            journal.append(eid, "", [draft(Kind.PROPOSED)], effect_type="cp.refund")
        frames, copied = _wal_pending(path)
        assert frames > copied
        started = time.monotonic()
        assert checkpointer.catch_up(10.0)
        assert time.monotonic() - started < 5.0
        # it returned once the round had copied every frame, not before
        assert checkpointer.rounds == 1
        frames, copied = _wal_pending(path)
        assert frames > 0 and copied == frames
        # and the thread went back to waiting for commits: the next ones are checkpointed too
        eid = effect_id("cp.refund", {"i": "after"})
        journal.append(eid, "", [draft(Kind.PROPOSED)], effect_type="cp.refund")
        assert checkpointer.catch_up(10.0)
        assert checkpointer.rounds == 2
        frames, copied = _wal_pending(path)
        assert copied == frames
    finally:
        journal.close()


def test_catch_up_gives_up_after_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every round ends with a pass that holds the writers: while they are held here, the
    # round cannot end
    monkeypatch.setattr(checkpoints, "SOFT_LIMIT_FRAMES", 0)
    monkeypatch.setattr(checkpoints, "INTERVAL_S", 60.0)
    path = tmp_path / "j.db"
    journal = open_journal(path, signing_key=KEY)
    checkpointer = journal.checkpointer  # type: ignore[attr-defined]
    try:
        eid = effect_id("cp.refund", {"i": 0})
        journal.append(eid, "", [draft(Kind.PROPOSED)], effect_type="cp.refund")
        with journal.writers_held():  # type: ignore[attr-defined]
            assert not checkpointer.catch_up(0.3)
            assert checkpointer.held_passes == 0
        assert checkpointer.catch_up(10.0)
        assert checkpointer.held_passes == 1
    finally:
        journal.close()


def test_a_hold_asked_for_starts_before_the_writes_asked_for_after_it(tmp_path: Path) -> None:
    # the writers' lock is not fair: a thread writing in a loop, as under steady commits, takes
    # it again before the checkpointer's thread wakes. The hold is asked for while a write runs;
    # the same thread's next write, asked for after it, must wait for the hold to end
    journal = open_journal(tmp_path / "j.db", signing_key=KEY)
    writing = journal.writing  # type: ignore[attr-defined]
    inside, go = threading.Event(), threading.Event()
    order: list[str] = []

    def first(db: object) -> None:
        inside.set()
        assert go.wait(10)

    def writer() -> None:
        writing(first)
        writing(lambda db: order.append("write"))

    def holder() -> None:
        with journal.writers_held():  # type: ignore[attr-defined]
            order.append("hold")

    threads = [threading.Thread(target=writer), threading.Thread(target=holder)]
    try:
        threads[0].start()
        assert inside.wait(10)
        threads[1].start()
        deadline = time.monotonic() + 10
        while not journal.hold_asked and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.001)
        assert journal.hold_asked  # type: ignore[attr-defined]
        go.set()
        for thread in threads:
            thread.join(10)
        assert order == ["hold", "write"]
        assert not journal.hold_asked  # type: ignore[attr-defined]
    finally:
        go.set()
        journal.close()


def test_the_wal_stays_bounded_under_steady_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small limits so that a few seconds of commits are many times the limit; the backstop
    # far away, so that only the checkpointer can keep the WAL small
    monkeypatch.setattr(checkpoints, "SOFT_LIMIT_FRAMES", 100)
    monkeypatch.setattr(checkpoints, "INTERVAL_S", 0.01)
    monkeypatch.setattr(sqlite_journal, "BACKSTOP_PAGES", 1_000_000)
    path = tmp_path / "j.db"
    journal = open_journal(path, signing_key=KEY)
    checkpointer = journal.checkpointer  # type: ignore[attr-defined]
    try:
        written = largest = last = 0
        for i in range(1_500):
            eid = effect_id("cp.refund", {"i": i})
            journal.append(eid, "", [draft(Kind.PROPOSED, blob="x" * 2_000)], effect_type="t")
            frames, _ = _wal_pending(path)
            # frames this commit wrote (after the WAL was written from its start: all of them)
            written += frames - last if frames > last else frames
            largest, last = max(largest, frames), frames
        assert journal.verify().effects == 1_500
    finally:
        journal.close()
    # 1,500 commits wrote several thousand frames; the WAL never held a quarter of them: it
    # was written from its start again, after rounds that held the writers for their last pass
    assert written >= 3 * 1_500
    assert largest < written / 4, (largest, written)
    assert checkpointer.held_passes > 0


CHILD = """
import sys
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.models import Draft, Kind
j = open_journal(sys.argv[1], signing_key=sys.argv[2])
cp = j.checkpointer
i = 0
while True:
    eid = effect_id("cp.refund", {"i": i})
    j.append(eid, "", [Draft(kind=Kind.PROPOSED, data={"i": i, "pad": "x" * 500})],
             effect_type="cp.refund")
    print(eid, cp.rounds, flush=True)
    i += 1
"""


def test_a_sigkill_while_checkpoints_run_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    env = {k: v for k, v in os.environ.items() if k != "INTERLOCK_SIGNING_KEY"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), KEY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    acknowledged: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        rounds = 0
        # kill it mid-run, once its checkpointer has run a few rounds beside the commits
        while rounds < 5 or len(acknowledged) < 300:
            assert time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            eid, done = line.split()
            acknowledged.append(eid)
            rounds = int(done)
        os.kill(proc.pid, signal.SIGKILL)
        # read on through the buffer ``readline`` filled: ``communicate`` reads the pipe
        # itself, past the lines already buffered, which would go uncounted
        rest = proc.stdout.read()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    acknowledged += [line.split()[0] for line in rest.splitlines() if line.strip()]
    journal = open_journal(path, signing_key=KEY)
    try:
        report = journal.verify()
        assert report.ok, report
        for eid in acknowledged:
            row = journal.row(eid)
            assert row is not None and row.status is Kind.PROPOSED, eid
        # what was acknowledged is all there; at most the one append in flight is beyond it
        assert report.effects - len(acknowledged) in (0, 1), report
    finally:
        journal.close()
