"""What a PostgreSQL journal requires of its server, checked against real ones: a cluster running
with fsync = off, a real PgBouncer in transaction mode (and in session mode, which is fine), and a
real streaming standby (asynchronous, then synchronous)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from interlock_temporal.core.errors import JournalConfigError, JournalUnavailable
from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.journal import postgres as pg_journal
from interlock_temporal.testing import PostgresServer, free_port

from .journal_conformance import KEY

PGBOUNCER = Path("/usr/sbin/pgbouncer")


def opened(url: str) -> None:
    open_journal(url, signing_key=KEY).close()


# -- durability ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fsync_off() -> Iterator[PostgresServer]:
    server = PostgresServer(settings={"fsync": "off"}).start()
    try:
        yield server
    finally:
        server.close()


def test_a_server_with_fsync_off_is_refused_saying_why_and_how(fsync_off: PostgresServer) -> None:
    with pytest.raises(JournalConfigError) as refused:
        opened(fsync_off.url)
    message = str(refused.value)
    assert "runs with fsync = off" in message
    assert "can lose or corrupt entries the journal has already acknowledged" in message
    assert "add allow_unsafe_durability=true to the journal URL" in message
    # refused before anything was written: no table was created
    with psycopg.connect(fsync_off.url) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)


def test_the_explicit_opt_out_opens_it_with_a_warning(
    fsync_off: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = fsync_off.database(f"optout_{uuid.uuid4().hex[:8]}")
    with caplog.at_level(logging.WARNING, logger="interlock_temporal.journal"):
        journal = open_journal(f"{url}?allow_unsafe_durability=true", signing_key=KEY)
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM entries").fetchone() == (0,)
    finally:
        journal.close()
    assert any(
        "fsync = off" in r.getMessage() and "opened anyway" in r.getMessage()
        for r in caplog.records
    )


def test_the_opt_out_takes_only_true_or_false(postgres: PostgresServer) -> None:
    with pytest.raises(JournalConfigError, match="allow_unsafe_durability must be true or false"):
        opened(f"{postgres.url}?allow_unsafe_durability=perhaps")
    # false is the default, said out loud: a server with fsync on opens
    opened(f"{postgres.url}?allow_unsafe_durability=false")


def test_every_session_commits_synchronously_whatever_the_server_default() -> None:
    server = PostgresServer(settings={"synchronous_commit": "off"}).start()
    try:
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        journal = open_journal(server.url, signing_key=KEY)
        try:
            shown = journal.reading(  # type: ignore[attr-defined]
                lambda conn: conn.execute("SHOW synchronous_commit").fetchone()
            )
            assert shown == ("on",)
            claim = journal.claim("ab" * 32)
            assert claim is not None
            conn = claim._conn  # type: ignore[attr-defined]
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
            claim.release()
        finally:
            journal.close()
    finally:
        server.close()


# -- a pooling proxy -------------------------------------------------------------------------


class PgBouncer:
    """Debian's pgbouncer on loopback in front of ``server``, in ``mode``; run as the server's
    user (pgbouncer refuses root)."""

    def __init__(self, server: PostgresServer, mode: str) -> None:
        self.port = free_port()
        self.directory = server.directory / f"pgbouncer-{mode}"
        self.directory.mkdir()
        ini = self.directory / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port} user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = any\npool_mode = {mode}\n"
            "max_client_conn = 200\ndefault_pool_size = 20\n"
            f"logfile = {self.directory / 'pgbouncer.log'}\n"
        )
        argv = [str(PGBOUNCER), str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
            shutil.chown(ini, "postgres", "postgres")
            argv = ["runuser", "-u", "postgres", "--", *argv]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=1).close()
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def bouncers(postgres: PostgresServer) -> Iterator[dict[str, PgBouncer]]:
    if not PGBOUNCER.exists():
        pytest.fail(f"{PGBOUNCER} is missing: `make pgbouncer` installs it (make test does)")
    started: dict[str, PgBouncer] = {}
    try:
        for mode in ("transaction", "session"):
            started[mode] = PgBouncer(postgres, mode)
        yield started
    finally:
        for bouncer in started.values():
            bouncer.close()


def test_a_transaction_mode_pool_is_refused_naming_the_fix(
    postgres: PostgresServer, bouncers: dict[str, PgBouncer]
) -> None:
    name = f"bounced_{uuid.uuid4().hex[:8]}"
    postgres.database(name)
    with pytest.raises(JournalConfigError) as refused:
        opened(bouncers["transaction"].url(name))
    message = str(refused.value)
    assert "a pooling proxy in transaction or statement mode" in message
    assert "Claims are session advisory locks" in message
    assert (
        "connect the journal directly to PostgreSQL, or through a pool in session mode" in message
    )
    assert "pool_mode = session" in message
    # refused before the schema was written
    with psycopg.connect(postgres.admin_url(name)) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)


def test_a_session_mode_pool_is_fine_and_its_claims_exclude(
    postgres: PostgresServer, bouncers: dict[str, PgBouncer]
) -> None:
    name = f"session_{uuid.uuid4().hex[:8]}"
    postgres.database(name)
    one = open_journal(bouncers["session"].url(name), signing_key=KEY)
    other = open_journal(bouncers["session"].url(name), signing_key=KEY)
    try:
        claim = one.claim("cd" * 32)
        assert claim is not None
        assert other.claim("cd" * 32) is None
        claim.release()
        again = other.claim("cd" * 32)
        assert again is not None
        again.release()
    finally:
        one.close()
        other.close()


def test_a_claim_whose_session_moved_is_refused(
    postgres: PostgresServer,
    bouncers: dict[str, PgBouncer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check at each claim, on its own (the open-time check skipped): while another client
    holds the pool's one idle server connection in a transaction, the claim's statement runs on
    another server session than its connection started on."""
    name = f"moved_{uuid.uuid4().hex[:8]}"
    postgres.database(name)
    url = bouncers["transaction"].url(name)
    monkeypatch.setattr(pg_journal, "check_sessions", lambda *a, **k: None)
    journal = open_journal(url, signing_key=KEY)
    try:
        # the claim pool's connection, opened (and its session noted) before the others
        first = journal.claim("ef" * 32)
        assert first is not None
        first.release()
        with psycopg.connect(url) as busy, busy.transaction():
            busy.execute("SELECT 1")  # holds a server connection for the transaction
            with pytest.raises(JournalUnavailable) as refused:
                for _ in range(20):  # the proxy may pick the noted session a few times
                    claim = journal.claim("ef" * 32)
                    assert claim is not None
                    claim.release()
        assert "server session changed between statements" in str(refused.value)
        assert "pool_mode = session" in str(refused.value)
    finally:
        journal.close()


# -- standbys --------------------------------------------------------------------------------


@pytest.fixture
def replicated() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    primary = PostgresServer().start()
    standby = PostgresServer()
    try:
        if os.geteuid() == 0:
            shutil.chown(standby.directory, "postgres", "postgres")
        standby._run(
            "pg_basebackup",
            *("-D", str(standby.data), "-h", "127.0.0.1", "-p", str(primary.port)),
            *("-U", "postgres", "-R", "-c", "fast", "--no-sync"),
        )
        with (standby.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
                "application_name=standby_one'\n"
            )
        standby.start()
        yield primary, standby
    finally:
        standby.close()
        primary.close()


def replication_state(primary: PostgresServer, want: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with psycopg.connect(primary.url) as conn:
            rows = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()
        if rows == [(want,)]:
            return
        time.sleep(0.1)
    raise AssertionError(f"the standby never reached {want}: {rows}")


@pytest.mark.faults
def test_asynchronous_standbys_are_warned_about_synchronous_ones_are_not(
    replicated: tuple[PostgresServer, PostgresServer], caplog: pytest.LogCaptureFixture
) -> None:
    primary, _ = replicated
    replication_state(primary, "async")
    with caplog.at_level(logging.WARNING, logger="interlock_temporal.journal"):
        opened(primary.url)
    warned = [
        r.getMessage() for r in caplog.records if "replicates asynchronously" in r.getMessage()
    ]
    assert len(warned) == 1, caplog.records
    assert "standby_one (async)" in warned[0]
    assert "a failover to such a standby can lose journal entries" in warned[0]

    with psycopg.connect(primary.admin_url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby_one'")
        conn.execute("SELECT pg_reload_conf()")
    replication_state(primary, "sync")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="interlock_temporal.journal"):
        opened(primary.url)
    assert not [r for r in caplog.records if "replicates" in r.getMessage()]


def test_no_standby_no_warning(postgres: PostgresServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="interlock_temporal.journal"):
        opened(postgres.url)
    assert not [r for r in caplog.records if r.name == "interlock_temporal.journal"]
