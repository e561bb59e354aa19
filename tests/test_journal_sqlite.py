"""The SQLite journal: the conformance suite, plus what only SQLite has (pragmas, the key file,
URL forms, several processes on one host)."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core.errors import JournalConfigError, JournalUnavailable
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import (
    DEFAULT_COMMIT_DELAY,
    SCHEMA_VERSION,
    Journal,
    open_journal,
)
from interlock_temporal.core.journal.signing import HmacKey, parse_secret
from interlock_temporal.core.journal.sql import READ_EFFECT_SQL
from interlock_temporal.core.journal.sqlite import IN_DOUBT_SQL
from interlock_temporal.core.models import Kind, Lease
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.receipts import receipt
from interlock_temporal.targets.payments import SimulatedPayments

from .fixtures import make_release_journal as release
from .journal_conformance import (
    KEY,
    OTHER_KEY,
    SCHEMA3_FIXTURE,
    JournalConformance,
    SqlTamper,
    draft,
    holding_claims,
    key_id,
)

A = effect_id("sqlite.refund", {"case": "A"})
B = effect_id("sqlite.refund", {"case": "B"})


class SqliteTamper(SqlTamper):
    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA busy_timeout=5000")
        return db

    def _run(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                db.execute(sql, params)
            db.execute("COMMIT")
        finally:
            db.close()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        db = self._connect()
        try:
            return db.execute(sql, params).fetchall()
        finally:
            db.close()

    def _tables(self) -> list[str]:
        rows = self._query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return [r[0] for r in rows]

    def load_schema3(self) -> None:
        for stale in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            stale.unlink(missing_ok=True)
        shutil.copyfile(SCHEMA3_FIXTURE, self.path)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "j.db"


@pytest.fixture
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INTERLOCK_SIGNING_KEY", raising=False)


class TestSqliteJournal(JournalConformance):
    @pytest.fixture
    def journal_factory(self, db_path: Path) -> Callable[..., Journal]:
        def factory(
            signing_key: str | None = KEY, older_keys: Sequence[str] = (), **options: Any
        ) -> Journal:
            return open_journal(
                f"sqlite:///{db_path}", signing_key=signing_key, older_keys=older_keys, **options
            )

        return factory

    @pytest.fixture
    def tamper(self, db_path: Path) -> SqliteTamper:
        return SqliteTamper(db_path)


class TestSqliteJournalEd25519(TestSqliteJournal):
    """Every conformance test again, signed with Ed25519."""

    key_scheme = "ed25519"


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def journal(db_path: Path) -> Iterator[Journal]:
    j = open_journal(f"sqlite:///{db_path}", signing_key=KEY)
    yield j
    j.close()


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "INTERLOCK_SIGNING_KEY"}
    env.update(extra)
    return env


def start_together(
    imports: str, script: str, args_per_process: list[list[str]], go: Path
) -> list[str]:
    """Start one process per argument list. Each runs ``imports``, says it is ready, and waits
    for ``go`` before running ``script``, so they all hit the store at once. Returns their
    stdouts (all must exit 0)."""
    program = (
        "import os, sys, time\n"
        + imports
        + f"open({str(go)!r} + '.ready.' + str(os.getpid()), 'w').close()\n"
        + f"while not os.path.exists({str(go)!r}):\n"
        + "    time.sleep(0.001)\n"
        + script
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", program, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for args in args_per_process
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(go.parent.glob(go.name + ".ready.*"))) < len(procs):
            assert time.monotonic() < deadline, "the processes never got ready"
            assert all(p.poll() is None for p in procs), "a process died before the start"
            time.sleep(0.005)
        go.touch()
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for ready in go.parent.glob(go.name + ".ready.*"):
        ready.unlink()
    go.unlink()
    return outputs


# -- pragmas and the schema -------------------------------------------------------------------


def test_wal_and_synchronous_full(journal: Journal, db_path: Path) -> None:
    db = journal.connection  # type: ignore[attr-defined]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    # journal_mode=WAL is a property of the file: a fresh connection sees it too
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()


def test_schema_version_is_recorded_and_a_newer_one_is_refused(
    journal: Journal, db_path: Path
) -> None:
    assert journal.schema_version() == SCHEMA_VERSION
    journal.close()
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        (value,) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert int(value) == SCHEMA_VERSION
        db.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
        )
    finally:
        db.close()
    with pytest.raises(JournalConfigError) as caught:
        open_journal(db_path, signing_key=KEY)
    assert "upgrade" in str(caught.value)


#: fields the receipts, approvals and leases gained since that release, with what they read
#: as for everything it wrote (nothing): the client identity Temporal recorded for a person's
#: vote, the journal's id (none until a worker of this release uses the journal), a lease's
#: ancestors (every lease it wrote is a root lease)
ADDED_SINCE: dict[str, dict[str, Any]] = {
    "receipts": {"sent_by": {}, "journal_id": None},
    "approvals": {"sent_by": {}},
    "leases": {"ancestors": None},
}


def as_that_release_read(read: dict[str, Any]) -> dict[str, Any]:
    """What this release reads, without the fields added since (each must read as empty; a
    lease's head, which the upgrade signs, as the head of its chain)."""
    read = copy.deepcopy(read)
    receipts, approvals = read["receipts"].values(), read["approvals"]
    for group, docs in (
        ("receipts", receipts),
        ("approvals", approvals),
        ("leases", read["leases"]),
    ):
        for doc in docs:
            for name, empty in ADDED_SINCE[group].items():
                assert doc.pop(name) == empty, (group, name)
    for doc in receipts:
        # a receipt's lease chain: a root lease's is its own id alone
        assert doc.pop("lease_chain") == ([doc["lease_id"]] if doc["lease_id"] else []), doc
    for lease in read["leases"]:
        assert re.fullmatch(r"[0-9]+:[0-9a-f]{64}", lease.pop("head")), lease
    return read


async def test_a_journal_the_previous_release_wrote_opens_verifies_and_recovers(
    tmp_path: Path,
) -> None:
    """The journal of tests/fixtures/make_release_journal.py, as the release before the journal
    became a package wrote it: this release reads from it exactly what that release read, and a
    gate recovers the effect it left in doubt (sent once, as the payments service shows)."""
    path = tmp_path / "release.db"
    shutil.copyfile(release.TARGET, path)
    before = json.loads(release.READ.read_text())
    with open_journal(f"sqlite:///{path}", signing_key=release.KEY, create=False) as journal:
        assert journal.schema_version() == SCHEMA_VERSION == 14
        # schema 13 linked each entry to its effect's previous one, and dropped the index of
        # chains: every entry that is not its effect's first names its predecessor
        db = journal.connection  # type: ignore[attr-defined]
        links = db.execute(
            "SELECT COUNT(*), COUNT(prev_seq), SUM(prev = '') FROM entries"
        ).fetchone()
        assert links[0] - links[2] == links[1] > 0, links
        unlinked = db.execute(
            "SELECT COUNT(*) FROM entries e JOIN entries p ON p.seq = e.prev_seq "
            "WHERE p.effect_id <> e.effect_id OR p.hash <> e.prev"
        ).fetchone()
        assert unlinked == (0,)
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "entries_chain" not in indexes and "entries_next" in indexes
        report = journal.verify()
        assert report.ok, report
        # the upgrade to schema 10 signed each lease as it stood: one entry, one chain each
        leases = len(journal.leases.list())
        assert leases == len(before["leases"]) == 2
        assert (report.entries, report.effects) == (22 + leases, 7 + leases)
        assert as_that_release_read(release.what_it_reads(journal)) == before
        (in_doubt,) = before["in_doubt"]
        assert before["receipts"][in_doubt]["final"] == "DISPATCHED"

        payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
        payments.open_order(release.ORDER, release.PAID_CENTS)

        async def send(ticket: Ticket) -> object:
            r = ticket.input
            return await payments.refund(
                r.order_id, r.amount_cents, idempotency_key=ticket.effect_id
            )

        again = release.call(release.request("c-2", 1_500, payments), release.LEASE, "wf-2")
        gate = Gate(journal)
        ticket = await gate.begin(again, payments)
        assert isinstance(ticket, Ticket) and ticket.effect_id == in_doubt
        await gate.commit(ticket, await send(ticket))
        (refund,) = payments.refund_records(release.ORDER)
        assert (refund.effect_id, refund.amount_cents) == (in_doubt, 1_500)
        assert payments.refunded_cents(release.ORDER) == 1_500
        payments.close()

        recovered = receipt(in_doubt, journal=journal)
        assert (recovered.final, recovered.via) == ("COMMITTED", "recovery-reapply")
        assert journal.blob(in_doubt, "result")["refund_id"] == refund.refund_id
        assert journal.in_doubt() == []
        assert journal.verify().ok
        after = as_that_release_read(release.what_it_reads(journal))
        # the recovery kept the reservation it held: the lease's budget is charged once
        assert after["leases"] == before["leases"]
        # and every other effect reads as it did
        del after["receipts"][in_doubt], before["receipts"][in_doubt]
        assert after["receipts"] == before["receipts"]


def test_lookups_by_effect_and_the_in_doubt_list_use_indexes(journal: Journal) -> None:
    db = journal.connection  # type: ignore[attr-defined]

    def plan(sql: str) -> str:
        params = ("x",) * sql.count("?")
        return " | ".join(r[-1] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params))

    # an effect's entries: walked back from its row by the primary keys, no index of entries
    # by effect (none is left for a scan to hide behind), nothing scanned but the walk itself
    by_effect = plan(READ_EFFECT_SQL)
    searches = [step for step in by_effect.split(" | ") if step.startswith("SEARCH")]
    assert searches == [
        "SEARCH r USING PRIMARY KEY (effect_id=?)",
        "SEARCH e USING INTEGER PRIMARY KEY (rowid=?)",
        "SEARCH e USING INTEGER PRIMARY KEY (rowid=?)",
        "SEARCH f USING PRIMARY KEY (effect_id=?)",
        # the entry after the row's head, if any: found by its predecessor's seq
        "SEARCH f USING PRIMARY KEY (effect_id=?)",
        "SEARCH n USING INDEX entries_next (prev_seq=?)",
    ], by_effect
    assert [s for s in by_effect.split(" | ") if s.startswith("SCAN")] == [
        "SCAN c",
        "SCAN c LEFT-JOIN",
    ], by_effect
    # the unstable-key check's lookup by origin, through its (narrow) index
    by_origin = journal.by_origin  # its statement, as it runs it
    traced: list[str] = []
    db.set_trace_callback(traced.append)
    try:
        by_origin("ab" * 32)
    finally:
        db.set_trace_callback(None)
    (sql,) = [t for t in traced if "origin" in t]
    origin = plan(sql.replace("'" + "ab" * 32 + "'", "?"))
    assert "USING INDEX effects_origin" in origin, origin
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    # of entries, only the anchors' (partial) and one successor per entry, by seq: none by effect
    entry_indexes = {i for i in indexes if i.startswith("entries_")}
    assert entry_indexes == {"entries_anchors", "entries_next"}, indexes
    in_doubt = plan(IN_DOUBT_SQL)
    assert "USING INDEX effects_in_doubt" in in_doubt, in_doubt
    row = plan("SELECT * FROM effects WHERE effect_id = ?")
    assert "USING PRIMARY KEY" in row or "USING INDEX" in row, row


# -- the signing key ---------------------------------------------------------------------------


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


@pytest.mark.usefixtures("no_env_key")
def test_key_file_is_created_private_and_reused(db_path: Path) -> None:
    old_umask = os.umask(0)  # even with a permissive umask the key is private
    try:
        journal = open_journal(db_path)
    finally:
        os.umask(old_umask)
    key_file = db_path.with_name("j.db.key")
    assert key_file.exists()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    secret = parse_secret(key_file.read_text())
    assert len(secret) >= 32
    assert journal.keyring.signing.key_id == HmacKey(secret).key_id
    (entry,) = journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="t")
    assert entry.key_id == HmacKey(secret).key_id
    journal.close()
    assert not [n for n in _files(db_path.parent) if n.startswith(".j.db.key")]

    text = key_file.read_text()
    again = open_journal(db_path)
    try:
        assert key_file.read_text() == text
        assert again.keyring.signing.key_id == HmacKey(secret).key_id
        assert again.verify().ok
    finally:
        again.close()


@pytest.mark.usefixtures("no_env_key")
@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644], ids=oct)
def test_key_file_readable_by_others_is_refused(db_path: Path, mode: int) -> None:
    open_journal(db_path).close()
    key_file = db_path.with_name("j.db.key")
    key_file.chmod(mode)
    with pytest.raises(JournalConfigError) as caught:
        open_journal(db_path)
    assert str(key_file) in str(caught.value)
    key_file.chmod(0o600)
    open_journal(db_path).close()


@pytest.mark.usefixtures("no_env_key")
def test_key_file_for_a_journal_in_a_new_directory(tmp_path: Path) -> None:
    # the journal creates its directory; with no key configured, the key file goes there too
    path = tmp_path / "state" / "interlock" / "j.db"
    journal = open_journal(path)
    try:
        key_file = path.with_name("j.db.key")
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert len(journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="t")) == 1
    finally:
        journal.close()


@pytest.mark.usefixtures("no_env_key")
def test_a_configured_key_creates_no_key_file(db_path: Path) -> None:
    journal = open_journal(db_path, signing_key=KEY)
    journal.close()
    assert journal.keyring.signing.key_id == key_id(KEY)
    assert not db_path.with_name("j.db.key").exists()


def test_the_environment_key_is_used(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLOCK_SIGNING_KEY", OTHER_KEY)
    journal = open_journal(db_path)
    try:
        assert journal.keyring.signing.key_id == key_id(OTHER_KEY)
        (entry,) = journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="t")
        assert entry.key_id == key_id(OTHER_KEY)
    finally:
        journal.close()
    assert not db_path.with_name("j.db.key").exists()
    # an explicit key still wins over the environment
    explicit = open_journal(db_path, signing_key=OTHER_KEY, older_keys=[KEY])
    try:
        assert explicit.keyring.signing.key_id == key_id(OTHER_KEY)
    finally:
        explicit.close()
    monkeypatch.setenv("INTERLOCK_SIGNING_KEY", KEY)
    rotated = open_journal(db_path, older_keys=[OTHER_KEY])
    try:
        assert rotated.keyring.signing.key_id == key_id(KEY)
        assert rotated.verify().ok
    finally:
        rotated.close()


@pytest.mark.usefixtures("no_env_key")
def test_processes_creating_the_key_at_once_end_with_one_key(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    imports = "from interlock_temporal.core.journal import open_journal\n"
    script = "j = open_journal(sys.argv[1])\nprint(j.keyring.signing.key_id)\nj.close()\n"
    outputs = start_together(imports, script, [[str(path)]] * 5, tmp_path / "go")
    ids = {out.strip() for out in outputs}
    assert len(ids) == 1, outputs
    key_file = tmp_path / "j.db.key"
    assert ids == {HmacKey(parse_secret(key_file.read_text())).key_id}
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert not [n for n in _files(tmp_path) if n.startswith(".j.db.key")]


# -- several processes on one host ---------------------------------------------------------------


def test_processes_appending_to_one_effect_never_fork_its_chain(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writers, per_writer = 3, 15
    setup = open_journal(path, signing_key=KEY)
    setup.append(A, "", [draft(Kind.PROPOSED)], effect_type="t")
    setup.close()
    imports = (
        "from interlock_temporal.core.errors import HeadConflict\n"
        "from interlock_temporal.core.journal import open_journal\n"
        "from interlock_temporal.core.models import Draft, Kind\n"
    )
    script = (
        "j = open_journal(sys.argv[1], signing_key=sys.argv[2])\n"
        "done = conflicts = 0\n"
        "while done < int(sys.argv[4]):\n"
        "    row = j.row(sys.argv[3])\n"
        "    try:\n"
        "        note = Draft(kind=Kind.CONFIRMED, data={'w': os.getpid()})\n"
        "        j.append(sys.argv[3], row.head, [note])\n"
        "        done += 1\n"
        "    except HeadConflict:\n"
        "        conflicts += 1\n"
        "print(done, conflicts)\n"
        "j.close()\n"
    )
    outputs = start_together(
        imports, script, [[str(path), KEY, A, str(per_writer)]] * writers, tmp_path / "go"
    )
    assert [int(out.split()[0]) for out in outputs] == [per_writer] * writers

    journal = open_journal(path, signing_key=KEY)
    try:
        chain = journal.read(A)
        assert len(chain) == 1 + writers * per_writer
        for earlier, later in itertools.pairwise(chain):
            assert later.prev == earlier.hash
        assert [e.seq for e in chain] == list(range(1, len(chain) + 1))
        assert len({e.data["w"] for e in chain[1:]}) == writers
        report = journal.verify()
        assert report.ok, report
    finally:
        journal.close()


def test_an_unwritable_journal_raises_unavailable_and_writes_nothing(db_path: Path) -> None:
    # chmod does not stop root; a writer holding the database's write lock does, for anyone
    journal = open_journal(f"sqlite:///{db_path}?busy_timeout=0.2", signing_key=KEY)
    (first,) = journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="t")
    lease_id = journal.leases.issue("agent-1")
    built: list[Lease | None] = []

    def build(lease: Lease | None) -> list[Any]:
        built.append(lease)
        return [draft(Kind.DISPATCHED)]

    locker = sqlite3.connect(db_path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        with pytest.raises(JournalUnavailable) as caught:
            journal.append(A, first.hash, build, lease_id=lease_id, blobs={"approved": 1})
        waited = time.monotonic() - started
        assert 0.15 <= waited < 5, waited
        assert "cannot be written" in str(caught.value)
        with pytest.raises(JournalUnavailable):
            journal.append(B, "", [draft(Kind.PROPOSED)], effect_type="t")
        with pytest.raises(JournalUnavailable):
            journal.leases.issue("agent-2")
        with pytest.raises(JournalUnavailable):
            journal.leases.revoke(lease_id)
    finally:
        locker.execute("ROLLBACK")
        locker.close()

    try:
        assert built == []  # nothing was decided, so nothing can have been sent
        assert journal.read(A) == [first]
        row = journal.row(A)
        assert row is not None
        assert row.status is Kind.PROPOSED
        assert journal.row(B) is None
        assert journal.blob(A, "approved") is None
        assert [lease.lease_id for lease in journal.leases.list()] == [lease_id]
        lease = journal.leases.get(lease_id)
        assert lease is not None
        assert lease.revoked_at is None
        # with the lock gone, the same append goes through
        assert len(journal.append(A, first.hash, build, lease_id=lease_id)) == 1
        assert journal.verify().ok
    finally:
        journal.close()


# -- group commit: appends from coroutines share one transaction and one flush -----------------


@pytest.fixture
def in_flight(journal: Journal) -> Iterator[None]:
    yield from holding_claims(journal)


@pytest.mark.parametrize("commit_delay", [0.0, DEFAULT_COMMIT_DELAY])
async def test_concurrent_async_appends_share_commits(
    journal: Journal, in_flight: None, commit_delay: float
) -> None:
    journal.commit_delay = commit_delay
    statements: list[str] = []
    journal.connection.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    ids = [effect_id("sqlite.group", n) for n in range(40)]
    written = await asyncio.gather(
        *[
            journal.append_async(
                eid, "", [draft(Kind.PROPOSED), draft(Kind.DISPATCHED)], effect_type="g"
            )
            for eid in ids
        ]
    )
    journal.connection.set_trace_callback(None)  # type: ignore[attr-defined]
    commits = statements.count("COMMIT")
    if commit_delay:
        # the first append waits for the other effects under way: all go in one transaction
        assert commits == 1, commits
    else:
        # the first append is written alone; the rest queue behind its flush and go together
        assert 1 < commits <= 3, commits
    assert all(journal.read(eid) == w for eid, w in zip(ids, written, strict=True))
    assert sorted(e.seq for w in written for e in w) == list(range(1, 81))
    assert journal.verify().ok


async def test_a_batch_that_cannot_begin_fails_every_append_and_the_next_goes_through(
    db_path: Path,
) -> None:
    journal = open_journal(f"sqlite:///{db_path}?busy_timeout=0.2", signing_key=KEY)
    busy = holding_claims(journal)
    next(busy)
    locker = sqlite3.connect(db_path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        outcomes = await asyncio.gather(
            *[
                journal.append_async(eid, "", [draft(Kind.DISPATCHED)], effect_type="g")
                for eid in (A, B)
            ],
            return_exceptions=True,
        )
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    try:
        assert all(isinstance(o, JournalUnavailable) for o in outcomes), outcomes
        assert journal.row(A) is None and journal.row(B) is None
        assert len(await journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="g")) == 1
    finally:
        next(busy, None)
        journal.close()


class _FailingFlush:
    """A journal's connection whose COMMIT fails as SQLite's does when the flush to disk fails:
    the transaction rolled back, a disk I/O error raised (while ``failing``)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.failing = True

    def execute(self, sql: str, *args: Any) -> Any:
        if self.failing and sql == "COMMIT":
            self.db.execute("ROLLBACK")
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_failed_flush_fails_the_whole_batch_and_keeps_none_of_it(
    journal: Journal, in_flight: None
) -> None:
    flushes: list[_FailingFlush] = []

    def failing(db: sqlite3.Connection) -> _FailingFlush:
        flushes.append(_FailingFlush(db))
        return flushes[-1]

    journal.wrap_connections(failing)  # type: ignore[attr-defined]
    ids = [effect_id("sqlite.lost", n) for n in range(6)]
    outcomes = await asyncio.gather(
        *[journal.append_async(eid, "", [draft(Kind.DISPATCHED)], effect_type="g") for eid in ids],
        return_exceptions=True,
    )
    for flush in flushes:
        flush.failing = False
    assert all(isinstance(o, JournalUnavailable) for o in outcomes), outcomes
    assert all(journal.row(eid) is None for eid in ids)
    assert list(journal.iter_raw()) == []
    assert len(await journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="g")) == 1
    assert journal.verify().ok


@pytest.mark.parametrize("bad", [-0.001, 1.5, float("nan"), "0.004", True, None])
def test_a_commit_delay_out_of_range_is_refused_by_name(db_path: Path, bad: object) -> None:
    with pytest.raises(JournalConfigError, match="commit_delay must be a number of seconds"):
        open_journal(db_path, signing_key=KEY, commit_delay=bad)  # type: ignore[arg-type]
    assert not db_path.exists()  # refused before anything was opened


def test_the_commit_delay_is_the_journals(db_path: Path) -> None:
    with open_journal(db_path, signing_key=KEY) as journal:
        assert journal.commit_delay == DEFAULT_COMMIT_DELAY
    with open_journal(db_path, signing_key=KEY, commit_delay=0) as journal:
        assert journal.commit_delay == 0


# -- open_journal URLs ----------------------------------------------------------------------------


def _roundtrip(url: str | os.PathLike[str]) -> Journal:
    journal = open_journal(url, signing_key=KEY)
    journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="t")
    assert journal.verify().ok
    journal.close()
    return journal


def test_url_sqlite_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _roundtrip("sqlite:///rel.db")
    _roundtrip("sqlite:///nested/dir/rel.db")
    assert (tmp_path / "rel.db").is_file()
    assert (tmp_path / "nested" / "dir" / "rel.db").is_file()


def test_url_sqlite_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = tmp_path / "abs.db"
    url = f"sqlite:///{path}"
    assert url.startswith("sqlite:////")
    _roundtrip(url)
    assert path.is_file()
    assert not (elsewhere / str(path).lstrip("/")).exists()
    assert _files(elsewhere) == set()


def test_url_plain_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _roundtrip(str(tmp_path / "plain.db"))
    _roundtrip(tmp_path / "pathlike.db")
    _roundtrip("relative-plain.db")
    for name in ("plain.db", "pathlike.db", "relative-plain.db"):
        assert (tmp_path / name).is_file()


def test_url_busy_timeout_option(db_path: Path) -> None:
    journal = open_journal(f"sqlite:///{db_path}?busy_timeout=0.25", signing_key=KEY)
    try:
        db = journal.connection  # type: ignore[attr-defined]
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 250
    finally:
        journal.close()
    assert db_path.is_file()


@pytest.mark.parametrize(
    "url",
    ["mysql://localhost/db", "redis://x", "http://h/j.db"],
)
def test_url_unsupported_scheme(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(JournalConfigError) as caught:
        open_journal(url, signing_key=KEY)
    assert "scheme" in str(caught.value)
    assert _files(tmp_path) == set()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///"])
def test_url_sqlite_without_a_path(url: str) -> None:
    with pytest.raises(JournalConfigError):
        open_journal(url, signing_key=KEY)


def test_url_bad_option_value_is_a_config_error(db_path: Path) -> None:
    with pytest.raises(JournalConfigError):
        open_journal(f"sqlite:///{db_path}?busy_timeout=soon", signing_key=KEY)


@pytest.mark.parametrize("directory", ["run #1", "disk%41", "a?b", "plain dir"])
def test_paths_with_uri_characters_verify(tmp_path: Path, directory: str) -> None:
    # verify reads through a second, read-only connection: the path must survive that
    path = tmp_path / directory / "j.db"
    journal = open_journal(path, signing_key=KEY)
    try:
        journal.append(A, "", [draft(Kind.PROPOSED), draft(Kind.DISPATCHED)], effect_type="t")
        report = journal.verify()
        assert report.ok, report
        assert report.entries == 2
    finally:
        journal.close()
    assert _files(tmp_path) == {directory}
