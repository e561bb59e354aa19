"""The ``interlock`` command's conventions, on real journals built by the real effect protocol:
every listing prints JSON with ``--json`` (and ``leases issue`` prints the lease), a duration
needs a unit (a bare number is refused, naming the option), every command exits with the
documented codes, and every subcommand's ``--help`` ends with examples that parse."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.cli import build_parser, main
from interlock_temporal.cli._shared import EPILOG
from interlock_temporal.core import Kind, open_journal

from .test_cli import World, _body, _tamper, build_world, cli

__all__ = ["cli"]  # the fixture, shared with test_cli

ROOT = Path(__file__).resolve().parent.parent
UNITS = "s (seconds), m (minutes), h (hours) or d (days)"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INTERLOCK_JOURNAL", "INTERLOCK_SIGNING_KEY", "INTERLOCK_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """One journal with an effect in each state, read by every test that does not change it."""
    return build_world(tmp_path_factory.mktemp("world"))


# -- --json on every listing ---------------------------------------------------------------------


def test_effects_list_json_holds_each_effects_fields(world: World, cli: Any) -> None:
    result = cli("--journal", world.url, "effects", "list", "--json")
    assert result.code == 0, result.err
    rows = {row["effect_id"]: row for row in result.json()}
    assert set(rows) == {world.committed, world.in_doubt, world.refused, world.ambiguous}
    for row in rows.values():
        assert {"effect_id", "effect_type", "status", "updated_ts", "dispatches"} <= set(row)
        assert row["effect_type"] == "refund"
    assert rows[world.committed]["status"] == "COMMITTED"
    assert (rows[world.refused]["status"], rows[world.refused]["dispatches"]) == ("REFUSED", 0)
    with open_journal(world.url) as journal:
        row = journal.row(world.ambiguous)
    assert row is not None and rows[world.ambiguous]["head"] == row.head


def test_effects_in_doubt_json_lists_the_one_in_doubt(world: World, cli: Any) -> None:
    result = cli("--journal", world.url, "effects", "list", "--in-doubt", "--json")
    assert result.code == 0, result.err
    (row,) = result.json()
    assert row["effect_id"] == world.in_doubt
    assert (row["status"], row["dispatches"]) == ("DISPATCHED", 1)
    assert row["first_dispatch_ts"] is not None


def test_leases_list_json_holds_each_leases_fields_and_state(world: World, cli: Any) -> None:
    result = cli("--journal", world.url, "leases", "list", "--json")
    assert result.code == 0, result.err
    (lease,) = result.json()
    assert lease["lease_id"] == world.lease_id
    assert (lease["principal"], lease["state"]) == ("refund-bot", "live")
    assert (lease["activities"], lease["max_amount_cents"]) == (["refund"], 5000)


def test_circuit_show_report_verify_and_head_print_json(world: World, cli: Any) -> None:
    shown = cli("--journal", world.url, "circuit", "show", "support-case-4471", "--json")
    assert shown.code == 0, shown.err
    assert shown.json() == {
        "session": "support-case-4471",
        "known": False,
        "open": False,
        "code": None,
        "activity": None,
        "opened_at": None,
        "calls": 0,
        "spent_usd": 0.0,
    }
    report = cli("--journal", world.url, "report", "--since", "1h", "--json")
    assert report.code == 0, report.err
    doc = report.json()
    assert doc["effects"] == {"AMBIGUOUS": 1, "COMMITTED": 1, "DISPATCHED": 1, "REFUSED": 1}
    assert (doc["waiting"]["ambiguous_effects"], doc["waiting"]["in_doubt"]) == (1, 1)
    assert doc["gate_latency_ms"]["count"] == 1
    verified = cli("--journal", world.url, "journal", "verify", "--json")
    assert verified.code == 0 and verified.json()["ok"] is True
    head = cli("--journal", world.url, "journal", "head", "--json")
    assert head.code == 0 and head.json()["hash"] == verified.json()["head"]["hash"]


def test_leases_issue_json_prints_the_lease_it_issued(tmp_path: Path, cli: Any) -> None:
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    before = time.time()
    result = cli(
        "--journal",
        url,
        "leases",
        "issue",
        "mailer",
        "--activity",
        "send_email",
        "--budget-cents",
        "2500",
        "--ttl",
        "2h",
        "--json",
    )
    assert result.code == 0, result.err
    doc = result.json()
    with open_journal(url) as journal:
        lease = journal.leases.get(doc["lease_id"])
    assert lease is not None
    assert doc == {**lease.model_dump(mode="json"), "state": "live"}
    assert (doc["principal"], doc["activities"], doc["budget_cents"]) == (
        "mailer",
        ["send_email"],
        2500,
    )
    assert before + 7200 - 5 <= doc["expires_at"] <= time.time() + 7200 + 5
    # without --json: the id alone, as before
    plain = cli("--journal", url, "leases", "issue", "mailer")
    assert plain.code == 0 and re.fullmatch(r"lease_[0-9a-f]+\n", plain.out)


# -- durations need a unit -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["leases", "issue", "bot", "--ttl", "1"], "--ttl"),
        (["leases", "issue", "bot", "--ttl", "3600"], "--ttl"),
        (["effects", "list", "--older-than", "5"], "--older-than"),
        (["report", "--since", "24"], "--since"),
        (["reconcile", "--task-queue", "q", "--older-than", "0"], "--older-than"),
        (["reconcile", "--task-queue", "q", "--timeout", "300"], "--timeout"),
        (["reviews", "resolve", "a" * 64, "--decision", "happened", "--operator", "carol",
          "--timeout", "60"], "--timeout"),
    ],
    ids=["ttl-1", "ttl-3600", "older-than", "since", "reconcile-age", "reconcile-timeout",
         "resolve-timeout"],
)  # fmt: skip
def test_a_bare_number_is_refused_naming_the_option_and_the_units(
    tmp_path: Path, cli: Any, argv: list[str], option: str
) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    open_journal(url).close()
    result = cli("--journal", url, *argv)
    assert result.code == 2
    assert result.out == ""
    last = result.err.strip().splitlines()[-1]
    bare = argv[argv.index(option) + 1]
    assert last == (
        f"interlock: error: argument {option}: invalid duration '{bare}': give a unit, {UNITS}: "
        f"e.g. {bare}s, {bare}m or {bare}h"
    )
    with open_journal(url) as journal:
        assert journal.leases.list() == []  # nothing was issued for a ttl it had to guess


def test_a_duration_with_a_unit_is_taken(tmp_path: Path, cli: Any) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    issued = cli("--journal", url, "leases", "issue", "bot", "--ttl", "45s", "--json")
    assert issued.code == 0, issued.err
    doc = issued.json()
    assert doc["expires_at"] - doc["issued_at"] == pytest.approx(45, abs=0.01)
    bad = cli("--journal", url, "leases", "issue", "bot", "--ttl", "45 minutes")
    assert bad.code == 2 and f"use a number and a unit, {UNITS}" in bad.err


# -- exit codes ----------------------------------------------------------------------------------


def test_the_exit_code_table_is_the_same_in_help_and_in_the_operator_guide() -> None:
    helped = {int(m) for m in re.findall(r"^  (\d+) ", EPILOG, re.M)}
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", guide, re.M)}
    assert helped == documented == {0, 1, 2, 3, 130}


def _case(world: World, tmp_path: Path, name: str) -> list[str]:
    """The arguments of one documented case (some change a journal of their own first)."""
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    cases: dict[str, list[str]] = {
        "ok": ["--journal", world.url, "journal", "verify"],
        "empty listing": ["--journal", fresh, "effects", "list", "--state", "RESOLVED"],
        "verify failed": ["--journal", "TAMPERED", "journal", "verify"],
        "revoke not live": ["--journal", fresh, "leases", "revoke", "REVOKED"],
        "reopen not refused": [
            "--journal", world.url, "effects", "reopen", world.committed, "--operator", "dave"
        ],
        "circuit not open": [
            "--journal", world.url, "circuit", "reset", "s-1", "--operator", "carol"
        ],
        # (a journal of its own: the fresh one holds a lease, whose chain is signed entries)
        "empty journal has no head": [
            "--journal", f"sqlite:///{tmp_path / 'empty.db'}", "journal", "head"
        ],
        "missing option": ["--journal", world.url, "effects", "reopen", world.refused],
        "bad option value": ["--journal", world.url, "effects", "list", "--limit", "0"],
        "blank operator (reopen)": [
            "--journal", world.url, "effects", "reopen", world.refused, "--operator", " "
        ],
        "blank operator (circuit)": [
            "--journal", world.url, "circuit", "reset", "s-1", "--operator", ""
        ],
        "blank operator (resolve)": [
            "reviews", "resolve", "a" * 64, "--decision", "happened", "--operator", " "
        ],
        "no such effect": ["--journal", world.url, "effects", "show", "f" * 64],
        "no such lease": ["--journal", world.url, "leases", "revoke", "lease_nope"],
        "no such command": ["frobnicate"],
        "journal cannot be opened": [
            "--journal", f"sqlite:///{tmp_path}/typo.db", "journal", "head"
        ],
        "bad journal URL": ["--journal", "redis://x", "effects", "list"],
        "server unreachable": [
            "reviews", "list", "--address", "127.0.0.1:1", "--journal", world.url
        ],
    }  # fmt: skip
    return cases[name]


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("ok", 0),
        ("empty listing", 0),
        ("verify failed", 1),
        ("revoke not live", 1),
        ("reopen not refused", 1),
        ("circuit not open", 1),
        ("empty journal has no head", 1),
        ("missing option", 2),
        ("bad option value", 2),
        ("blank operator (reopen)", 2),
        ("blank operator (circuit)", 2),
        ("blank operator (resolve)", 2),
        ("no such effect", 2),
        ("no such lease", 2),
        ("no such command", 2),
        ("journal cannot be opened", 3),
        ("bad journal URL", 3),
        ("server unreachable", 3),
    ],
)
def test_each_documented_case_exits_with_its_code(
    world: World, tmp_path: Path, cli: Any, name: str, code: int
) -> None:
    argv = _case(world, tmp_path, name)
    fresh = tmp_path / "fresh.db"
    with open_journal(fresh) as journal:
        lease = journal.leases.issue("bot")
        journal.leases.revoke(lease)
    open_journal(tmp_path / "empty.db").close()  # a journal with no entry at all
    argv = [lease if a == "REVOKED" else a for a in argv]
    if "TAMPERED" in argv:
        copy = build_world(tmp_path / "tampered")
        _tamper(copy.db, 2, _body(copy.db, 2).replace(b"lease", b"LEASE"))
        argv = [copy.url if a == "TAMPERED" else a for a in argv]
    with open_journal(world.url) as journal:
        before = [(r.effect_id, r.head) for r in journal.effects()]
    result = cli(*argv)
    assert result.code == code, (result.out, result.err)
    if code:  # it says why: one line on stderr (verify prints its report)
        said = result.err or result.out
        assert said.startswith(("interlock: ", "usage: interlock", "journal: ")), said
        assert "Traceback" not in said
    with open_journal(world.url) as journal:
        assert [(r.effect_id, r.head) for r in journal.effects()] == before  # nothing changed
        assert journal.row(world.refused) is not None
        refused = journal.row(world.refused)
        assert refused is not None and refused.status is Kind.REFUSED


# -- --help examples -----------------------------------------------------------------------------


def _subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        yield path, parser
        return
    for action in actions:
        for name, sub in action.choices.items():
            yield from _subcommands(sub, (*path, name))


SUBCOMMANDS = list(_subcommands(build_parser()))


def test_every_command_is_walked() -> None:
    names = {" ".join(path) for path, _ in SUBCOMMANDS}
    assert {"journal verify", "effects list", "leases issue", "report", "reconcile"} <= names
    assert {"operators keygen", "operators add", "operators rules"} <= names
    assert len(names) == 25  # doctor: what escapes the gate


@pytest.mark.parametrize(
    ("path", "parser"), SUBCOMMANDS, ids=[" ".join(path) for path, _ in SUBCOMMANDS]
)
def test_each_subcommands_help_ends_with_examples_that_parse(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*path, "--help"]) == 0
    text = out.getvalue()
    assert "examples:\n" in text, text
    block = text.split("examples:\n", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in block.splitlines()]
    assert 1 <= len(lines) <= 3, lines
    assert text.rstrip().endswith("exit codes, defaults and durations: interlock --help")
    for line in lines:
        words = shlex.split(line)
        assert words[: len(path) + 1] == ["interlock", *path], line
        # the shell's part of the line (a pipe, a redirection) is not the command's
        for stop in ("|", ">", ">>"):
            if stop in words:
                words = words[: words.index(stop)]
        words = [f"1:{'0' * 64}" if w.startswith("$(") else w for w in words]
        args = build_parser().parse_args(words[1:])  # a usage error would exit 2
        assert callable(args.handler)
