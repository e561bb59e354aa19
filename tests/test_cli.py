"""The ``interlock`` command against real SQLite journals built by the real effect protocol."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.cli import main, parse_duration
from interlock_temporal.cli._render import (
    entry_summary,
    render_effects,
    render_entries,
    render_receipt,
)
from interlock_temporal.core import (
    Ambiguous,
    Call,
    Draft,
    Gate,
    Journal,
    JournalHead,
    Kind,
    Measure,
    Receipt,
    Refused,
    VerifyReport,
    open_journal,
    receipt,
)
from interlock_temporal.targets.payments import RefundRequest, SimulatedCrash, SimulatedPayments

CONSOLE_SCRIPT = Path(sys.executable).with_name("interlock")
#: an argument value that must never reach the operator's view
MARKER = "customer-said-zebra-7731"


@dataclass
class World:
    """A journal with one effect in each interesting state."""

    db: Path
    url: str
    lease_id: str
    committed: str
    in_doubt: str
    refused: str
    ambiguous: str

    def open(self) -> Journal:
        return open_journal(self.url)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INTERLOCK_JOURNAL", "INTERLOCK_SIGNING_KEY", "INTERLOCK_DEBUG"):
        monkeypatch.delenv(name, raising=False)


def _call(req: RefundRequest, lease_id: str) -> Call:
    return Call(
        effect_type="refund",
        activity="refund",
        input=req,
        args=(req,),
        key={"case": req.case_id, "order": req.order_id},
        premises_field="premises",
        principal="refund-bot",
        lease_id=lease_id,
        measure=lambda args: Measure(RefundRequest.model_validate(args[0]).amount_cents),
    )


def _refund(
    journal: Journal, pay: SimulatedPayments, lease_id: str, case: str, amount: int, order: str
) -> str:
    """Run one refund through the gate; return its effect id, whatever became of it."""
    req = RefundRequest(
        case_id=case,
        order_id=order,
        amount_cents=amount,
        reason=MARKER,
        premises=pay.order_facts(order),
    )

    async def send(ticket: Any) -> Any:
        return await pay.refund(
            ticket.input.order_id, ticket.input.amount_cents, idempotency_key=ticket.effect_id
        )

    async def attempt() -> None:
        with contextlib.suppress(Refused, Ambiguous, SimulatedCrash):
            await Gate(journal).run(_call(req, lease_id), pay, send)

    asyncio.run(attempt())
    return Gate.identify(_call(req, lease_id))[0]


def build_world(tmp_path: Path) -> World:
    db = tmp_path / "interlock.db"
    url = f"sqlite:///{db}"
    journal = open_journal(url)
    pay2 = SimulatedPayments(tmp_path / "pay2.db", tier=2)
    pay3 = SimulatedPayments(tmp_path / "pay3.db", tier=3)
    try:
        pay2.open_order("881", 10000)
        pay3.open_order("990", 10000)
        lease = journal.leases.issue("refund-bot", activities=["refund"], max_amount_cents=5000)
        committed = _refund(journal, pay2, lease, "c-1", 1000, "881")
        # the worker dies after the refund landed, before COMMITTED: in doubt
        pay2.arm("after_commit", "crash")
        in_doubt = _refund(journal, pay2, lease, "c-2", 1500, "881")
        # over the lease's maximum: refused before anything is sent
        refused = _refund(journal, pay2, lease, "c-3", 9000, "881")
        # tier 3: the crash leaves it in doubt, the retry cannot know: ambiguous
        pay3.arm("after_commit", "crash")
        ambiguous = _refund(journal, pay3, lease, "c-4", 2000, "990")
        _refund(journal, pay3, lease, "c-4", 2000, "990")
        rows = {eid: journal.row(eid) for eid in (committed, in_doubt, refused, ambiguous)}
        statuses = {eid: row.status if row else None for eid, row in rows.items()}
        assert statuses == {
            committed: Kind.COMMITTED,
            in_doubt: Kind.DISPATCHED,
            refused: Kind.REFUSED,
            ambiguous: Kind.AMBIGUOUS,
        }
    finally:
        pay2.close()
        pay3.close()
        journal.close()
    return World(db, url, lease, committed, in_doubt, refused, ambiguous)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path)


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    yield run


def _tamper(db: Path, seq: int, body: bytes | str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE entries SET body = ? WHERE seq = ?", (body, seq))
    conn.close()


def _body(db: Path, seq: int) -> bytes:
    with sqlite3.connect(db) as conn:
        (value,) = conn.execute("SELECT body FROM entries WHERE seq = ?", (seq,)).fetchone()
    conn.close()
    assert isinstance(value, bytes)
    return value


def _last_seq(world: World) -> int:
    with world.open() as journal:
        head = journal.head()
    assert head is not None
    return head.seq


# -- the version ----------------------------------------------------------------------------------


def test_version_is_the_installed_distribution_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert (
        capsys.readouterr().out == f"interlock {importlib.metadata.version('interlock-temporal')}\n"
    )


# -- journal verify / head ----------------------------------------------------------------------


def test_verify_ok(world: World, cli: Any) -> None:
    result = cli("--journal", world.url, "journal", "verify")
    assert result.code == 0, result.err
    assert re.search(r"^result:\s+ok$", result.out, re.M)
    assert re.search(rf"^entries:\s+{_last_seq(world)}$", result.out, re.M)
    # the four effects' chains and the lease's (its signed entries)
    assert re.search(r"^chains:\s+5$", result.out, re.M)
    assert result.err == ""

    as_json = cli("--journal", world.url, "journal", "verify", "--json")
    assert as_json.code == 0
    report = VerifyReport.model_validate(as_json.json())
    assert report.ok and report.entries == _last_seq(world) and report.effects == 5


def test_verify_names_the_edited_entry(world: World, cli: Any) -> None:
    assert _last_seq(world) > 2  # seq 2 is inside the journal, not its tail
    _tamper(world.db, 2, _body(world.db, 2).replace(b"lease", b"LEASE"))

    result = cli("--journal", world.url, "journal", "verify")
    assert result.code == 1
    assert "FAILED at entry seq 2" in result.out
    assert re.search(r"^first bad seq:\s+2$", result.out, re.M)
    assert "Traceback" not in result.err

    report = VerifyReport.model_validate(
        cli("--journal", world.url, "journal", "verify", "--json").json()
    )
    assert not report.ok and report.first_bad_seq == 2 and report.entries == 1


def test_verify_reports_a_body_rewritten_as_text(world: World, cli: Any) -> None:
    # SQLite stores what it is given: a TEXT body must be reported, not crash the hashing
    _tamper(world.db, 2, '{"forged": true}')
    result = cli("--journal", world.url, "journal", "verify", "--json")
    assert result.code == 1, result.err
    assert result.json()["first_bad_seq"] == 2


def test_verify_runs_on_a_corrupt_tail_other_commands_refuse(world: World, cli: Any) -> None:
    last = _last_seq(world)
    _tamper(world.db, last, _body(world.db, last) + b" ")

    result = cli("--journal", world.url, "journal", "verify")
    assert result.code == 1, result.err
    assert f"FAILED at entry seq {last}" in result.out

    for argv in (["journal", "head"], ["effects", "list"], ["leases", "list"]):
        refused = cli("--journal", world.url, *argv)
        assert refused.code == 3, argv
        assert refused.out == ""
        assert len(refused.err.strip().splitlines()) == 1
        assert f"seq {last}" in refused.err


def test_head_round_trips_into_verify_head(world: World, cli: Any, tmp_path: Path) -> None:
    result = cli("--journal", world.url, "journal", "head")
    assert result.code == 0
    printed = result.out.strip()
    with world.open() as journal:
        assert printed == str(journal.head())
    head = JournalHead.parse(printed)

    assert cli("--journal", world.url, "journal", "verify", "--head", printed).code == 0
    as_json = cli("--journal", world.url, "journal", "head", "--json")
    assert JournalHead.model_validate(as_json.json()) == head

    # cut the tail: the effects table still names the lost entry, and the recorded head does
    with sqlite3.connect(world.db) as conn:
        conn.execute("DELETE FROM entries WHERE seq = ?", (head.seq,))
    conn.close()
    alone = cli("--journal", world.url, "journal", "verify")
    assert alone.code == 1 and f"FAILED at entry seq {head.seq}" in alone.out, alone.out
    cut = cli("--journal", world.url, "journal", "verify", "--head", printed)
    assert cut.code == 1
    assert "tail cut" in cut.out
    assert f"FAILED at entry seq {head.seq}" in cut.out


def test_verify_head_must_match_the_entry(world: World, cli: Any) -> None:
    seq = _last_seq(world) - 1
    wrong = f"{seq}:{'0' * 64}"
    result = cli("--journal", world.url, "journal", "verify", "--head", wrong)
    assert result.code == 1
    assert f"FAILED at entry seq {seq}" in result.out


@pytest.mark.parametrize("bad", ["junk", "12:abc", "x:" + "0" * 64])
def test_verify_rejects_a_malformed_head(world: World, cli: Any, bad: str) -> None:
    result = cli("--journal", world.url, "journal", "verify", "--head", bad)
    assert result.code == 2
    assert "SEQ:HASH" in result.err


def test_head_of_an_empty_journal(tmp_path: Path, cli: Any) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_journal(url).close()
    result = cli("--journal", url, "journal", "head")
    assert result.code == 1
    assert result.out == ""
    assert "empty" in result.err
    verify = cli("--journal", url, "journal", "verify", "--json")
    assert verify.code == 0 and verify.json()["entries"] == 0


# -- effects list -------------------------------------------------------------------------------


def test_effects_list_table(world: World, cli: Any) -> None:
    result = cli("--journal", world.url, "effects", "list")
    assert result.code == 0
    lines = result.out.strip().splitlines()
    assert lines[0].split() == ["EFFECT", "TYPE", "STATUS", "UPDATED", "DISPATCHES"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {
        w[:16] for w in (world.committed, world.in_doubt, world.refused, world.ambiguous)
    }
    assert world.committed not in result.out  # shortened to 16 characters
    assert rows[world.committed[:16]][1:3] == ["refund", "COMMITTED"]
    assert rows[world.in_doubt[:16]][2] == "DISPATCHED"
    assert rows[world.refused[:16]][-1] == "0"
    assert rows[world.in_doubt[:16]][-1] == "1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rows[world.committed[:16]][3])


def test_effects_list_filters(world: World, cli: Any) -> None:
    def ids(*argv: str) -> list[str]:
        result = cli("--journal", world.url, "effects", "list", "--json", *argv)
        assert result.code == 0, result.err
        return [row["effect_id"] for row in result.json()]

    assert ids("--state", "COMMITTED") == [world.committed]
    assert ids("--state", "refused") == [world.refused]
    assert ids("--state", "ambiguous") == [world.ambiguous]
    assert ids("--in-doubt") == [world.in_doubt]
    assert ids("--state", "resolved") == []
    assert sorted(ids()) == sorted(
        [world.committed, world.in_doubt, world.refused, world.ambiguous]
    )
    assert ids("--in-doubt", "--older-than", "1h") == []

    rows = cli("--journal", world.url, "effects", "list", "--json", "--in-doubt").json()
    assert rows[0]["status"] == "DISPATCHED" and rows[0]["dispatches"] == 1

    table = cli("--journal", world.url, "effects", "list", "--in-doubt")
    assert world.in_doubt[:16] in table.out
    assert world.committed[:16] not in table.out


def test_effects_list_limit(world: World, cli: Any) -> None:
    limited = cli("--journal", world.url, "effects", "list", "--json", "--limit", "2")
    assert limited.code == 0 and len(limited.json()) == 2
    assert "--limit" in limited.err
    everything = cli("--journal", world.url, "effects", "list", "--json", "--limit", "4")
    assert len(everything.json()) == 4 and everything.err == ""


def test_effects_list_usage_errors(world: World, cli: Any) -> None:
    assert cli("--journal", world.url, "effects", "list", "--state", "bogus").code == 2
    both = cli("--journal", world.url, "effects", "list", "--state", "refused", "--in-doubt")
    assert both.code == 2
    # annotations are never an effect's state
    assert cli("--journal", world.url, "effects", "list", "--state", "CONFIRMED").code == 2
    assert cli("--journal", world.url, "effects", "list", "--limit", "0").code == 2


def test_effects_list_empty(tmp_path: Path, cli: Any) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_journal(url).close()
    result = cli("--journal", url, "effects", "list")
    assert result.code == 0 and result.out == "" and "no effects" in result.err
    assert cli("--journal", url, "effects", "list", "--json").json() == []


# -- effects show -------------------------------------------------------------------------------


def _fields(text: str) -> dict[str, str]:
    block = text.split("\n\n", 1)[0]
    out = {}
    for line in block.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def test_effects_show_committed(world: World, cli: Any) -> None:
    result = cli("--journal", world.url, "effects", "show", world.committed)
    assert result.code == 0, result.err
    fields = _fields(result.out)
    assert fields["effect"] == world.committed
    assert fields["final"] == "COMMITTED"
    assert fields["via"] == "dispatch"
    assert fields["executed"] == "yes"
    assert fields["proposed"] == fields["authorized"] == fields["recorded"] == "yes"
    assert fields["principal"] == "refund-bot"
    assert fields["lease"] == world.lease_id
    assert fields["target"] == "payments (tier 2)"
    with world.open() as journal:
        expected = receipt(world.committed, journal=journal)
        entries = journal.read(world.committed)
    assert fields["journal seq"] == str(expected.journal_seq)
    assert fields["journal hash"] == expected.journal_hash

    table = result.out.split("\n\n", 1)[1].strip().splitlines()
    assert table[0].split()[:4] == ["SEQ", "KIND", "TIME", "HASH"]
    assert [line.split()[:2] for line in table[1:]] == [[str(e.seq), e.kind.value] for e in entries]
    assert [line.split()[3] for line in table[1:]] == [e.hash[:12] for e in entries]
    assert "via=dispatch" in table[-1]
    # argument values stay out of the operator's view
    assert MARKER not in result.out


def test_effects_show_refused_and_ambiguous(world: World, cli: Any) -> None:
    refused = _fields(cli("--journal", world.url, "effects", "show", world.refused).out)
    assert refused["final"] == "REFUSED"
    assert refused["executed"] == "no"
    assert refused["code"] == "lease"
    assert refused["reason"] == "amount over the lease's maximum"

    shown = cli("--journal", world.url, "effects", "show", world.ambiguous)
    ambiguous = _fields(shown.out)
    assert ambiguous["final"] == "AMBIGUOUS"
    assert ambiguous["executed"] == "unknown"
    assert ambiguous["changed facts"] == "refunded_cents"
    assert ambiguous["dispatches"] == "1"
    assert "changed=refunded_cents" in shown.out
    assert MARKER not in shown.out


def test_effects_show_by_prefix(world: World, cli: Any) -> None:
    full = cli("--journal", world.url, "effects", "show", world.in_doubt)
    by_prefix = cli("--journal", world.url, "effects", "show", world.in_doubt[:8])
    by_upper = cli("--journal", world.url, "effects", "show", world.in_doubt[:12].upper())
    assert full.code == by_prefix.code == by_upper.code == 0
    assert full.out == by_prefix.out == by_upper.out
    assert _fields(full.out)["final"] == "DISPATCHED"


def test_effects_show_json_is_the_receipt(world: World, cli: Any) -> None:
    result = cli("--journal", world.url, "effects", "show", "--json", world.committed[:16])
    assert result.code == 0
    shown = Receipt.model_validate_json(result.out)
    with world.open() as journal:
        assert shown == receipt(world.committed, journal=journal)
    assert shown.final == "COMMITTED" and shown.executed is True


def test_effects_show_unknown_and_ambiguous_prefix(world: World, cli: Any) -> None:
    unknown = cli("--journal", world.url, "effects", "show", "f" * 64)
    assert unknown.code == 2 and "no effect" in unknown.err
    short = cli("--journal", world.url, "effects", "show", world.committed[:7])
    assert short.code == 2 and "8 characters" in short.err

    with world.open() as journal:
        for tail in ("1", "2"):
            journal.append(
                "deadbeef" + tail * 56,
                "",
                [Draft(kind=Kind.PROPOSED, data={"effect_type": "t"})],
                effect_type="t",
            )
    ambiguous = cli("--journal", world.url, "effects", "show", "deadbeef")
    assert ambiguous.code == 2
    assert "ambiguous" in ambiguous.err and "2 effects" in ambiguous.err
    unique = cli("--journal", world.url, "effects", "show", "deadbeef2")
    assert unique.code == 0
    assert _fields(unique.out)["effect"] == "deadbeef" + "2" * 56


# -- leases -------------------------------------------------------------------------------------


def test_leases_issue_list_revoke(world: World, cli: Any) -> None:
    before = time.time()
    issued = cli(
        "--journal",
        world.url,
        "leases",
        "issue",
        "mailer",
        "--activity",
        "send_email",
        "--activity",
        "notify*",
        "--max-amount-cents",
        "250",
        "--resource",
        "case:*",
        "--ttl",
        "1h30m",
    )
    assert issued.code == 0, issued.err
    lease_id = issued.out.strip()
    assert re.fullmatch(r"lease_[0-9a-f]+", lease_id)
    with world.open() as journal:
        lease = journal.leases.get(lease_id)
    assert lease is not None
    assert lease.principal == "mailer"
    assert lease.activities == ["send_email", "notify*"]
    assert lease.max_amount_cents == 250
    assert lease.resources == ["case:*"]
    assert lease.expires_at is not None
    assert before + 5400 - 5 <= lease.expires_at <= time.time() + 5400 + 5

    listed = {
        doc["lease_id"]: doc
        for doc in cli("--journal", world.url, "leases", "list", "--json").json()
    }
    assert set(listed) == {world.lease_id, lease_id}
    assert listed[lease_id]["state"] == "live"
    table = cli("--journal", world.url, "leases", "list").out
    row = next(line for line in table.splitlines() if line.startswith(lease_id))
    assert row.split()[1:3] == ["mailer", "live"]

    revoked = cli("--journal", world.url, "leases", "revoke", lease_id)
    assert revoked.code == 0 and lease_id in revoked.out
    with world.open() as journal:
        after = journal.leases.get(lease_id)
        untouched = journal.leases.get(world.lease_id)
    assert after is not None and after.revoked_at is not None
    assert untouched is not None and untouched.revoked_at is None

    again = cli("--journal", world.url, "leases", "revoke", lease_id)
    assert again.code == 1 and "not live" in again.err
    listed = {
        doc["lease_id"]: doc
        for doc in cli("--journal", world.url, "leases", "list", "--json").json()
    }
    assert listed[lease_id]["state"] == "revoked"
    assert listed[world.lease_id]["state"] == "live"

    missing = cli("--journal", world.url, "leases", "revoke", "lease_nope")
    assert missing.code == 2 and "no lease" in missing.err


def test_leases_with_a_budget_show_what_is_reserved(world: World, cli: Any) -> None:
    issued = cli("--journal", world.url, "leases", "issue", "refund-bot", "--budget-cents", "3000")
    assert issued.code == 0, issued.err
    lease_id = issued.out.strip()
    with world.open() as journal:
        lease = journal.leases.get(lease_id)
        assert lease is not None and (lease.budget_cents, lease.reserved_cents) == (3000, 0)
        (ticket,) = journal.append(
            "b" * 64,
            "",
            [
                Draft(kind=Kind.PROPOSED, data={}),
                Draft(
                    kind=Kind.DISPATCHED,
                    data={"budget": {"lease_id": lease_id, "cents": 2000}},
                ),
            ],
            effect_type="refund",
        )[-1:]
        assert ticket.kind is Kind.DISPATCHED
    (doc,) = [
        d
        for d in cli("--journal", world.url, "leases", "list", "--json").json()
        if d["lease_id"] == lease_id
    ]
    assert (doc["budget_cents"], doc["reserved_cents"]) == (3000, 2000)
    table = cli("--journal", world.url, "leases", "list").out
    assert "RESERVED/BUDGET" in table
    row = next(line for line in table.splitlines() if line.startswith(lease_id))
    assert "2000/3000" in row.split()
    bad = cli("--journal", world.url, "leases", "issue", "x", "--budget-cents", "-5")
    assert bad.code == 2


def test_leases_issue_from_a_parent_only_narrows_it(world: World, cli: Any) -> None:
    """``leases issue --from``: an over-grant exits 2 naming the field (not its value), and
    nothing is issued; a narrower child is issued, and ``leases list`` names its parent."""
    flags = ("--journal", world.url, "leases")
    issued = cli(*flags, "issue", "planner", "--activity", "refund", "--budget-cents", "3000")
    assert issued.code == 0, issued.err
    parent = issued.out.strip()
    wide = cli(*flags, "issue", "sub-bot", "--from", parent, "--budget-cents", "3001")
    assert wide.code == 2 and "budget_cents" in wide.err and "3001" not in wide.err, wide.err
    outside = cli(*flags, "issue", "sub-bot", "--from", parent, "--activity", "wire")
    assert outside.code == 2 and "activities" in outside.err, outside.err
    listed = cli(*flags, "list", "--json").json()
    assert not [d for d in listed if d["principal"] == "sub-bot"]
    child = cli(*flags, "issue", "sub-bot", "--from", parent, "--budget-cents", "1000", "--json")
    assert child.code == 0, child.err
    doc = child.json()
    assert doc["ancestors"] == [parent]
    assert (doc["activities"], doc["budget_cents"]) == (["refund"], 1000)
    table = cli(*flags, "list").out
    row = next(line for line in table.splitlines() if line.startswith(doc["lease_id"]))
    assert row.split()[-1] == parent
    assert "FROM" in table.splitlines()[0]
    # the parent revoked: the child, live itself, is listed as ended by its ancestor, and can
    # still be revoked on its own
    assert cli(*flags, "revoke", parent).code == 0
    states = {d["lease_id"]: d["state"] for d in cli(*flags, "list", "--json").json()}
    assert (states[parent], states[doc["lease_id"]]) == ("revoked", "ancestor revoked")
    assert cli(*flags, "revoke", doc["lease_id"]).code == 0
    states = {d["lease_id"]: d["state"] for d in cli(*flags, "list", "--json").json()}
    assert states[doc["lease_id"]] == "revoked"


def test_leases_revoke_expired_is_nothing_to_do(world: World, cli: Any) -> None:
    with world.open() as journal:
        lease_id = journal.leases.issue("bot", ttl=timedelta(milliseconds=1))
    time.sleep(0.01)
    result = cli("--journal", world.url, "leases", "revoke", lease_id)
    assert result.code == 1 and "expired" in result.err
    with world.open() as journal:
        lease = journal.leases.get(lease_id)
    assert lease is not None and lease.revoked_at is None


def test_leases_issue_without_options_and_into_a_new_journal(tmp_path: Path, cli: Any) -> None:
    db = tmp_path / "fresh" / "dir" / "j.db"
    result = cli("--journal", str(db), "leases", "issue", "bot")
    assert result.code == 0, result.err
    with open_journal(db) as journal:
        lease = journal.leases.get(result.out.strip())
    assert lease is not None
    assert (lease.activities, lease.max_amount_cents, lease.resources, lease.expires_at) == (
        None,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["bot", "--ttl", "0s"],
        ["bot", "--ttl", "soon"],
        ["bot", "--max-amount-cents", "-1"],
        ["bot", "--max-amount-cents", "lots"],
        [""],
        [],
    ],
)
def test_leases_issue_usage_errors(world: World, cli: Any, argv: list[str]) -> None:
    result = cli("--journal", world.url, "leases", "issue", *argv)
    assert result.code == 2
    with world.open() as journal:
        assert [lease.lease_id for lease in journal.leases.list()] == [world.lease_id]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("1h", 3600), ("2d", 172800), ("1h30m", 5400), ("45S", 45)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


# -- opening the journal ------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["postgres://db/interlock", "sqlite://", "redis://x"])
def test_bad_journal_url_exits_3(cli: Any, url: str) -> None:
    result = cli("--journal", url, "journal", "verify")
    assert result.code == 3
    assert result.out == ""
    assert len(result.err.strip().splitlines()) == 1
    assert "Traceback" not in result.err


def test_missing_database_exits_3_and_creates_nothing(tmp_path: Path, cli: Any) -> None:
    db = tmp_path / "typo.db"
    for argv in (["journal", "verify"], ["journal", "head"], ["effects", "list"]):
        result = cli("--journal", f"sqlite:///{db}", *argv)
        assert result.code == 3 and "no such database" in result.err
    assert list(tmp_path.iterdir()) == []


def test_not_a_database_exits_3(tmp_path: Path, cli: Any) -> None:
    db = tmp_path / "notes.db"
    db.write_text("these are not entries\n" * 100)
    key = tmp_path / "notes.db.key"
    key.write_text("00" * 32)
    key.chmod(0o600)
    result = cli("--journal", str(db), "journal", "verify")
    assert result.code == 3 and "cannot be opened" in result.err


def test_signing_key_options(tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "11" * 32
    url = f"sqlite:///{tmp_path / 'keyed.db'}"
    with open_journal(url, signing_key=key) as journal:
        journal.leases.issue("bot")
        journal.append("e" * 64, "", [Draft(kind=Kind.PROPOSED)], effect_type="t")

    missing = cli("--journal", url, "journal", "verify")
    assert missing.code == 3 and "INTERLOCK_SIGNING_KEY" in missing.err
    assert not (tmp_path / "keyed.db.key").exists()  # no stray key was created

    assert cli("--journal", url, "--signing-key", key, "journal", "verify").code == 0
    assert cli("--journal", url, "journal", "verify", "--signing-key", key).code == 0
    wrong = cli("--journal", url, "--signing-key", "22" * 32, "journal", "verify")
    assert wrong.code == 1 and "not in the keyring" in wrong.out
    assert cli("--journal", url, "--signing-key", "short", "journal", "verify").code == 3

    monkeypatch.setenv("INTERLOCK_SIGNING_KEY", key)
    assert cli("--journal", url, "journal", "head").code == 0


def test_journal_from_environment_and_option_placement(
    world: World, cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the default sqlite:///interlock.db is not there
    default = cli("journal", "head")
    assert default.code == 3 and "interlock.db" in default.err

    monkeypatch.setenv("INTERLOCK_JOURNAL", world.url)
    from_env = cli("journal", "head")
    assert from_env.code == 0
    assert cli("journal", "head", "--journal", world.url).out == from_env.out
    # an option given after the subcommand wins over the environment
    other = tmp_path / "other.db"
    open_journal(other).close()
    assert cli("journal", "head", "--journal", str(other)).code == 1


def test_usage(cli: Any) -> None:
    assert cli().code == 2
    assert cli("journal").code == 2
    assert cli("frobnicate").code == 2
    helped = cli("--help")
    assert helped.code == 0 and "exit codes" in helped.out


# -- the installed console script ---------------------------------------------------------------


def test_console_script(world: World, tmp_path: Path) -> None:
    assert CONSOLE_SCRIPT.exists(), CONSOLE_SCRIPT
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["INTERLOCK_JOURNAL"] = world.url

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CONSOLE_SCRIPT), *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )

    ok = run("journal", "verify")
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout

    head = run("journal", "head")
    assert head.returncode == 0
    assert run("journal", "verify", "--head", head.stdout.strip()).returncode == 0

    shown = run("effects", "show", world.committed[:10], "--json")
    assert shown.returncode == 0
    assert Receipt.model_validate_json(shown.stdout).effect_id == world.committed

    # an entry inside the journal that names the lease: an authorization (its own entry, or
    # a combined dispatch's part), after the first effect's first entry, which opening checks
    seq = next(n for n in range(3, 10) if b'"lease":{' in _body(world.db, n))
    _tamper(world.db, seq, _body(world.db, seq).replace(b"lease", b"LEASE"))
    bad = run("journal", "verify")
    assert bad.returncode == 1
    assert f"seq {seq}" in bad.stdout

    broken = run("--journal", "postgres://nowhere/db", "journal", "verify")
    assert broken.returncode == 3
    assert "Traceback" not in broken.stderr
    assert broken.stderr.startswith("interlock: ")
    assert len(broken.stderr.strip().splitlines()) == 1

    module = subprocess.run(
        [sys.executable, "-m", "interlock_temporal.cli", "journal", "head"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert module.returncode == 0 and module.stdout == head.stdout


# -- rendering ----------------------------------------------------------------------------------


def test_render_receipt_aligns_its_fields(world: World) -> None:
    with world.open() as journal:
        text = render_receipt(receipt(world.refused, journal=journal))
    lines = text.splitlines()
    columns = set()
    for line in lines:
        match = re.match(r"([a-z ]+:)( +)\S", line)
        assert match is not None, line
        columns.add(len(match.group(1)) + len(match.group(2)))
    assert len(columns) == 1  # every value starts in the same column
    keys = [line.split(":", 1)[0] for line in lines]
    for key in (
        "final",
        "via",
        "proposed",
        "authorized",
        "executed",
        "recorded",
        "code",
        "reason",
        "changed facts",
        "principal",
        "lease",
        "confirmation",
        "journal seq",
        "journal hash",
    ):
        assert key in keys


def test_render_entries_and_effects(world: World) -> None:
    with world.open() as journal:
        entries = journal.read(world.committed)
        rows = journal.effects()
    table = render_entries(entries).splitlines()
    assert len(table) == len(entries) + 1
    assert all(entries[i].hash[:12] in table[i + 1] for i in range(len(entries)))
    assert render_entries([]) == "(no entries)"
    effects = render_effects(rows).splitlines()
    assert effects[0].split() == ["EFFECT", "TYPE", "STATUS", "UPDATED"]
    assert {line.split()[0] for line in effects[1:]} == {row.effect_id[:16] for row in rows}


def test_entry_summary_leaves_values_out() -> None:
    summary = entry_summary(
        {
            "via": "dispatch",
            "payload_digest": "ab" * 32,
            "premises": {"paid_cents": 777777},
            "note": "the customer's card ends 4242",
            "amount_cents": 918273,
            "lease": {"lease_id": "lease_x", "max_amount_cents": 5000},
            "changes": [{"fact": "eligible", "recorded": True, "current": False}],
            "delivery": {"workflow_id": "wf", "attempt": 3},
        }
    )
    assert "via=dispatch" in summary
    assert "payload#abababababab" in summary
    assert "changed=eligible" in summary
    assert "attempt=3" in summary
    for secret in ("777777", "4242", "918273", "5000", "ab" * 7):
        assert secret not in summary
