"""``interlock journal archive`` and ``journal verify --archive``: the command, what it
prints, and what it refuses (the archive's semantics are the conformance suite's)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core import receipt

from . import test_cli as base
from .test_cli import World, build_world

_clean_env = base._clean_env
cli = base.cli


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path)


TOMORROW = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d")
SOON = (datetime.now(UTC) + timedelta(seconds=5)).isoformat()


def test_archive_moves_settled_effects_and_both_verify(
    world: World, cli: Any, tmp_path: Path
) -> None:
    to = tmp_path / "archive.jsonl"
    now = datetime.now(UTC).isoformat()
    args = ["--journal", world.url, "journal", "archive", "--before", now, "--to", str(to)]
    short = cli(*args, "--min-age", "0s", "--allow-short-min-age", "--json")
    assert short.code == 0, short.err
    run = short.json()
    # committed and refused leave; in doubt and ambiguous stay
    assert run["effects"] == 2 and run["file"] == str(to), run
    with world.open() as journal:
        for eid, final in ((world.committed, "COMMITTED"), (world.refused, "REFUSED")):
            (tomb,) = journal.read(eid)
            assert tomb.kind.value == "ARCHIVED" and tomb.data["archive_id"] == run["archive_id"]
            assert receipt(eid, journal=journal).final == final
        assert len(journal.read(world.in_doubt)) > 1 and len(journal.read(world.ambiguous)) > 1

    listed = cli("--journal", world.url, "effects", "list", "--json")
    counts = {row["effect_id"]: row["dispatches"] for row in listed.json()}
    assert counts[world.committed] == 1 and counts[world.refused] == 0, counts

    live = cli("--journal", world.url, "journal", "verify")
    assert live.code == 0 and re.search(r"^result:\s+ok$", live.out, re.M), live.out
    alone = cli("--signing-key", _key(world), "journal", "verify", "--archive", str(to))
    assert alone.code == 0, alone.err
    assert re.search(r"^result\s+ok$", alone.out, re.M) and "alone" in alone.out, alone.out
    anchored = cli("--journal", world.url, "journal", "verify", "--archive", str(to), "--json")
    assert anchored.code == 0, anchored.err
    assert anchored.json()["ok"] and anchored.json()["archive_id"] == run["archive_id"]

    # an edited archive fails, and says where
    lines = to.read_text().splitlines(keepends=True)
    entry = json.loads(lines[1])
    entry["body"] = entry["body"].replace("refund-bot", "refund-bod")
    lines[1] = json.dumps(entry) + "\n"
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(lines))
    bad = cli("--journal", world.url, "journal", "verify", "--archive", str(edited))
    assert bad.code == 1 and "FAILED at seq" in bad.out, bad.out

    # nothing left to archive: no file, and it says so
    again = cli(*args[:-1], str(tmp_path / "b.jsonl"), "--min-age", "0s", "--allow-short-min-age")
    assert again.code == 0 and "nothing to archive" in again.out, again.out
    assert not (tmp_path / "b.jsonl").exists()


def test_archive_refusals(world: World, cli: Any, tmp_path: Path) -> None:
    to = tmp_path / "a.jsonl"
    base = ["--journal", world.url, "journal", "archive", "--to", str(to)]
    future = cli(*base, "--before", TOMORROW)
    assert future.code == 2 and "--before is in the future" in future.err, future.err
    short = cli(*base, "--before", "2020-01-01", "--min-age", "1h")
    assert short.code == 2, short.err
    assert "--min-age 3600s is under 1d" in short.err
    assert "schedule_to_close_timeout" in short.err and "--allow-short-min-age" in short.err
    baddate = cli(*base, "--before", "last tuesday")
    assert baddate.code == 2 and "invalid date 'last tuesday'" in baddate.err
    to.write_text("kept")
    exists = cli(*base, "--before", "2020-01-01")
    assert exists.code == 2 and "never overwritten" in exists.err
    assert to.read_text() == "kept"
    # the default min-age (30 days) keeps everything this world just wrote
    to.unlink()
    kept = cli(*base, "--before", datetime.now(UTC).isoformat(), "--json")
    assert kept.code == 0 and kept.json()["effects"] == 0, kept.out
    assert not to.exists()
    with world.open() as journal:
        assert len(journal.read(world.committed)) > 1


def test_verify_archive_against_a_journal_without_its_anchor(
    world: World, cli: Any, tmp_path: Path
) -> None:
    to = tmp_path / "a.jsonl"
    now = datetime.now(UTC).isoformat()
    ran = cli(
        "--journal",
        world.url,
        "journal",
        "archive",
        "--before",
        now,
        "--to",
        str(to),
        "--min-age",
        "0s",
        "--allow-short-min-age",
    )
    assert ran.code == 0, ran.err
    other = build_world(tmp_path / "other")
    bad = cli("--journal", other.url, "journal", "verify", "--archive", str(to))
    assert bad.code == 1
    assert "has no anchor of archive" in bad.err and "took nothing from it" in bad.err


def _key(made: World) -> str:
    return made.db.with_name(made.db.name + ".key").read_text().strip()
