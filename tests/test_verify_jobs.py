"""``journal verify --jobs``: a journal checked in ranges on several processes reports exactly
what one pass reports. The journal here interleaves its effects as workers do (an effect's
COMMITTED lands a few effects later), so chains cross the ranges' cuts; each edit is one that
only the joining of ranges can see (a chain forked or started twice across a cut, an entry
dropped at a cut, a row whose head another range holds or no range reads). Real SQLite, and the
real ``interlock`` command; entries signed as the journal signs them, written straight into its
tables to keep the test fast."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import unittest.mock
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core.identity import effect_id, origin_of
from interlock_temporal.core.journal import encode_entry, open_journal, verify_jobs
from interlock_temporal.core.journal.signing import HmacKey
from interlock_temporal.core.journal.verify_jobs import _cuts
from interlock_temporal.core.models import Kind, VerifyReport

from .test_verify_stored import write_straight

KEY = "6a" * 32
EFFECTS = 1_500  # three entries each
LAG = 7  # an effect's COMMITTED is written after the next LAG effects' first two entries
PER_JOB = 1_000  # ranges of about this many entries in these tests (``MIN_PER_JOB``)
FORGED_TS = 1_900_000_000.0  # when the entries these tests forge say they were written


def _build(path: Path) -> dict[str, Any]:
    """The journal, and what the tests need of it: each entry's (effect, kind, prev, hash) by
    seq, each effect's first and head seqs."""
    open_journal(f"sqlite:///{path}", signing_key=KEY).close()  # the schema
    key = HmacKey(bytes.fromhex(KEY))
    entries: list[tuple[Any, ...]] = []
    rows: list[tuple[Any, ...]] = []
    heads: dict[str, tuple[str, int, float]] = {}
    meta: dict[str, Any] = {"entries": {}, "first": {}}
    seq = 0

    def write(eid: str, kind: Kind, data: dict[str, Any], vals: str | None) -> float:
        nonlocal seq
        seq += 1
        prev = heads[eid][0] if eid in heads else ""
        ts = 1_800_000_000.0 + seq / 1_000
        e = encode_entry(
            seq=seq, ts=ts, effect_id=eid, kind=kind, prev=prev, key=key, data=data, vals=vals
        )
        entries.append((seq, eid, kind.value, prev, e.hash, e.key_id, e.sig, e.body, vals))
        meta["entries"][seq] = (eid, kind.value, prev, e.hash, e.body)
        meta["first"].setdefault(eid, seq)
        heads[eid] = (e.hash, seq, ts)
        return ts

    eids = [effect_id("jobs.refund", {"n": n}) for n in range(EFFECTS)]
    dispatched: dict[str, float] = {}
    for n in range(EFFECTS + LAG):
        if n < EFFECTS:
            eid = eids[n]
            delivery = {"workflow_id": f"wf-{n}", "run_id": "run-1", "activity_id": "1"}
            data = {"delivery": delivery, "input_digest": f"{n:064x}", "effect_type": "jobs.refund"}
            write(eid, Kind.PROPOSED, data, None)
            vals = json.dumps({"approved": {"n": n}})
            dispatched[eid] = write(eid, Kind.DISPATCHED, {"via": "dispatch"}, vals)
        if n >= LAG:
            eid = eids[n - LAG]
            write(eid, Kind.COMMITTED, {"via": "dispatch"}, json.dumps({"result": {"n": n}}))
    for n, eid in enumerate(eids):
        head, head_seq, ts = heads[eid]
        origin = origin_of(f"wf-{n}", "run-1", "1", f"{n:064x}")
        at = dispatched[eid]
        rows.append((eid, "jobs.refund", "COMMITTED", head, head_seq, ts, at, at, origin))
    write_straight(path, entries, rows)
    meta["heads"] = {eid: h[1] for eid, h in heads.items()}
    return meta


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("jobs") / "journal.db"
    return path, _build(path)


@pytest.fixture
def journal_path(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    path.write_bytes(built[0].read_bytes())
    return path


@pytest.fixture
def meta(built: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    return built[1]


@pytest.fixture(autouse=True)
def small_ranges() -> Iterator[None]:
    with unittest.mock.patch.object(verify_jobs, "MIN_PER_JOB", PER_JOB):
        yield


def _both(path: Path, jobs: int = 3) -> tuple[VerifyReport, VerifyReport]:
    """One pass's report and the ranges' (which must be the same but for ``jobs``)."""
    with open_journal(f"sqlite:///{path}", create=False, check_tail=False, signing_key=KEY) as j:
        one = j.verify()
        several = j.verify(jobs=jobs)
    assert several.model_copy(update={"jobs": 1}) == one
    return one, several


def _edit(path: Path, sql: str, *params: Any) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(sql, params)
    db.close()


def _insert(path: Path, seq: int, eid: str, kind: Kind, prev: str, vals: str | None) -> None:
    """A properly signed entry at ``seq``, which must be free (the journal's last + 1). The
    chain's unique index, where the schema has one, is dropped first: an operator can, and
    verify must not depend on it."""
    _edit(path, "DROP INDEX IF EXISTS entries_chain")
    e = encode_entry(
        seq=seq,
        ts=FORGED_TS,
        effect_id=eid,
        kind=kind,
        prev=prev,
        key=HmacKey(bytes.fromhex(KEY)),
        data={"via": "forged"},
        vals=vals,
    )
    _edit(
        path,
        "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body, vals) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        seq,
        eid,
        kind.value,
        prev,
        e.hash,
        e.key_id,
        e.sig,
        e.body,
        vals,
    )


def _spanning(meta: dict[str, Any], cut: int) -> str:
    """An effect whose first entry is before ``cut`` and whose head is at or after it."""
    for eid, first in meta["first"].items():
        if first < cut <= meta["heads"][eid]:
            return str(eid)
    raise AssertionError(f"no chain crosses seq {cut}")


TOTAL = EFFECTS * 3
CUTS = [1, 1 + TOTAL // 3, 1 + 2 * TOTAL // 3]


def test_the_cuts_are_even_and_never_inside_an_archives_run() -> None:
    assert _cuts(TOTAL, 3, {}, PER_JOB) == CUTS
    # too few entries for the ranges asked: fewer ranges, each at least the minimum
    assert _cuts(2_500, 8, {}, PER_JOB) == [1, 1_251]
    assert _cuts(999, 4, {}, PER_JOB) == [1]
    # a cut inside an archive's run moves to the run's start; one that collapses is dropped
    assert _cuts(TOTAL, 3, {1_400: 1_600}, PER_JOB) == [1, 1_400, CUTS[2]]
    assert _cuts(TOTAL, 3, {1: 2_000}, PER_JOB) == [1, CUTS[2]]


def test_a_good_journal_verifies_in_ranges_as_in_one_pass(journal_path: Path) -> None:
    one, several = _both(journal_path)
    assert one.ok and one.entries == TOTAL and one.effects == EFFECTS
    assert several.jobs == 3  # joined from the ranges, not checked again by one pass
    assert one.control is not None and several.control == one.control


def test_an_edit_in_any_range_is_named_as_one_pass_names_it(
    journal_path: Path, meta: dict[str, Any]
) -> None:
    for seq in (CUTS[1] - 1, CUTS[1], CUTS[2] + 5, TOTAL):
        body: bytes = meta["entries"][seq][4]
        _edit(journal_path, "UPDATE entries SET body = ? WHERE seq = ?", body + b" ", seq)
        one, several = _both(journal_path)
        assert not one.ok and one.first_bad_seq == seq and several.jobs == 1
        _edit(journal_path, "UPDATE entries SET body = ? WHERE seq = ?", body, seq)
    assert _both(journal_path)[1].jobs == 3


@pytest.mark.parametrize("at", [CUTS[1] - 1, CUTS[1], CUTS[2]])
def test_an_entry_dropped_at_a_cut_is_named(journal_path: Path, at: int) -> None:
    _edit(journal_path, "DELETE FROM entries WHERE seq = ?", at)
    one, _ = _both(journal_path)
    assert not one.ok and one.first_bad_seq is not None and one.first_bad_seq >= at


def test_a_chain_forked_across_a_cut_is_named(journal_path: Path, meta: dict[str, Any]) -> None:
    """A second entry claiming the predecessor that a chain crossing the cut already
    continues from, appended at the end (a later range): signed, so only the chain sees it."""
    eid = _spanning(meta, CUTS[2])
    first = meta["first"][eid]
    _insert(journal_path, TOTAL + 1, eid, Kind.COMMITTED, meta["entries"][first][3], None)
    one, several = _both(journal_path)
    assert not one.ok and one.first_bad_seq == TOTAL + 1, one
    assert "prev" in str(one.problem) and several.jobs == 1


def test_a_fork_the_effects_row_was_moved_onto_is_named(
    journal_path: Path, meta: dict[str, Any]
) -> None:
    """The fork's range takes the effect up at the fork's prev, and its row (moved onto the
    fork, so that it agrees with it) is read there: only the join, where the link must be the
    head the range before left the chain at, sees that the fork does not continue the chain."""
    eid = next(
        e for e, first in meta["first"].items() if CUTS[1] <= first and meta["heads"][e] < CUTS[2]
    )
    first = meta["first"][eid]
    _insert(journal_path, TOTAL + 1, eid, Kind.COMMITTED, meta["entries"][first][3], None)
    fork = _stored_hash(journal_path, TOTAL + 1)
    _edit(
        journal_path,
        "UPDATE effects SET head = ?, head_seq = ?, updated_ts = ? WHERE effect_id = ?",
        fork,
        TOTAL + 1,
        FORGED_TS,
        eid,
    )
    one, several = _both(journal_path)
    assert not one.ok and one.first_bad_seq == TOTAL + 1, one
    assert "prev" in str(one.problem) and several.jobs == 1


def _stored_hash(path: Path, seq: int) -> str:
    db = sqlite3.connect(path)
    (found,) = db.execute("SELECT hash FROM entries WHERE seq = ?", (seq,)).fetchone()
    db.close()
    return str(found)


def test_a_chain_started_again_in_a_later_range_is_named(
    journal_path: Path, meta: dict[str, Any]
) -> None:
    eid = next(iter(meta["first"]))  # started in the first range, ended there
    _insert(journal_path, TOTAL + 1, eid, Kind.PROPOSED, "", None)
    one, _ = _both(journal_path)
    assert not one.ok and one.first_bad_seq == TOTAL + 1, one


@pytest.mark.parametrize(
    "head_seq",
    [-1, 0, "text", 2.5, 10**15, "moved"],
    ids=["negative", "zero", "text", "real", "past-every-range", "another-range"],
)
def test_a_row_whose_head_another_range_holds_or_none_reads_is_named(
    journal_path: Path, meta: dict[str, Any], head_seq: Any
) -> None:
    """Each range checks the rows whose ``head_seq`` it holds; a row edited to another range,
    or to a value no range reads, is still read exactly once (``STRAY_ROWS``) and named."""
    eid = _spanning(meta, CUTS[1])
    if head_seq == "moved":
        head_seq = meta["heads"][eid] + TOTAL // 3  # the next range's
    _edit(journal_path, "UPDATE effects SET head_seq = ? WHERE effect_id = ?", head_seq, eid)
    one, _ = _both(journal_path)
    assert not one.ok and "effects table" in str(one.problem), one


def test_a_row_missing_or_added_is_named(journal_path: Path, meta: dict[str, Any]) -> None:
    eid = _spanning(meta, CUTS[2])
    db = sqlite3.connect(journal_path)
    row = db.execute("SELECT * FROM effects WHERE effect_id = ?", (eid,)).fetchone()
    db.close()
    _edit(journal_path, "DELETE FROM effects WHERE effect_id = ?", eid)
    one, _ = _both(journal_path)
    assert not one.ok and "missing from the effects table" in str(one.problem), one
    marks = ", ".join("?" * len(row))
    _edit(journal_path, f"INSERT INTO effects VALUES ({marks})", *row)
    assert _both(journal_path)[1].jobs == 3
    stray = ("f" * 64, *row[1:])
    _edit(journal_path, f"INSERT INTO effects VALUES ({marks})", *stray)
    one, _ = _both(journal_path)
    assert not one.ok and "which has no entries" in str(one.problem), one


def test_the_command_verifies_on_the_processes_asked(journal_path: Path, tmp_path: Path) -> None:
    """``interlock journal verify --jobs 2``, as a person runs it: the report says how many
    processes checked the entries (a journal this small needs the minimum lowered, which only
    a test does)."""
    script = (
        "import sys, unittest.mock\n"
        "from interlock_temporal.core.journal import verify_jobs\n"
        "from interlock_temporal.cli import main\n"
        f"with unittest.mock.patch.object(verify_jobs, 'MIN_PER_JOB', {PER_JOB}):\n"
        "    sys.exit(main(sys.argv[1:]))\n"
    )
    url = f"sqlite:///{journal_path}"
    done = subprocess.run(
        [sys.executable, "-c", script, "--journal", url, "journal", "verify", "--jobs", "2"],
        capture_output=True,
        text=True,
        env={"INTERLOCK_SIGNING_KEY": KEY, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "processes: 2" in done.stdout.replace("  ", " ")
    done = subprocess.run(
        [sys.executable, "-c", script, "--journal", url, "journal", "verify", "--json"],
        capture_output=True,
        text=True,
        env={"INTERLOCK_SIGNING_KEY": KEY, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] >= 1


def test_processes_that_cannot_start_leave_the_work_to_one_pass(
    journal_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No interpreter to start (an embedded Python, a sandbox): the verify is still made, by
    one pass, and says so in the log; it never fails for want of processes."""
    monkeypatch.setattr(sys, "executable", str(journal_path.parent / "no-python-here"))
    with open_journal(
        f"sqlite:///{journal_path}", create=False, check_tail=False, signing_key=KEY
    ) as j:
        report = j.verify(jobs=3)
    assert report.ok and report.jobs == 1 and report.entries == TOTAL
    assert "one process checks it all" in caplog.text
