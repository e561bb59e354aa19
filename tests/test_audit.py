"""What an auditor holds: a journal signed with Ed25519, verified with the public key alone;
an export, one verifiable line per entry; and the commands that produce and check both.

Each tamper case edits a real journal file (or export) the way an attacker with write access
would, and the verifier must name the first bad entry.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from interlock_temporal.core.errors import JournalConfigError
from interlock_temporal.core.journal import (
    Journal,
    encode_entry,
    export_line,
    open_journal,
    read_export,
    verify_entries,
)
from interlock_temporal.core.journal.signing import Ed25519Key, Keyring, parse_key
from interlock_temporal.core.models import Draft, Kind

from .test_cli import CONSOLE_SCRIPT

SEED = "a1" * 32
OTHER_SEED = "b2" * 32


def public_of(seed: str) -> str:
    return Ed25519Key(bytes.fromhex(seed)).public_text


def filled(path: Path, seed: str = SEED, effects: int = 3) -> Journal:
    """A journal with ``effects`` effects of three entries each, signed with Ed25519."""
    journal = open_journal(f"sqlite:///{path}", signing_key=f"ed25519:{seed}")
    for i in range(effects):
        eid = f"{i:064x}"
        head = ""
        for kind in (Kind.PROPOSED, Kind.DISPATCHED, Kind.COMMITTED):
            (entry,) = journal.append(
                eid, head, [Draft(kind=kind, data={"n": i})], effect_type="refund"
            )
            head = entry.hash
    return journal


def auditor(path: Path, *public: str) -> Journal:
    return open_journal(
        f"sqlite:///{path}", public_keys=list(public), create=False, check_tail=False
    )


def sql(path: Path, statement: str, *params: object) -> None:
    db = sqlite3.connect(path)
    try:
        db.execute(statement, params)
        db.commit()
    finally:
        db.close()


def test_an_ed25519_journal_verifies_with_the_public_key_alone(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    filled(db).close()
    (tmp_path / "j.db.key").unlink(missing_ok=True)  # the auditor has no secret at all
    with auditor(db, public_of(SEED)) as journal:
        report = journal.verify()
        assert report.ok and report.entries == 9, report
        with pytest.raises(JournalConfigError, match="verified, not written"):
            journal.append("f" * 64, "", [Draft(kind=Kind.PROPOSED)], effect_type="x")
    with auditor(db, public_of(OTHER_SEED)) as journal:
        report = journal.verify()
        assert not report.ok and report.first_bad_seq == 1
        assert Ed25519Key(bytes.fromhex(SEED)).key_id in (report.problem or "")


def test_reopening_an_ed25519_journal_continues_its_chain(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    filled(db).close()
    with open_journal(f"sqlite:///{db}", signing_key=f"ed25519:{SEED}") as again:
        row = again.row(f"{0:064x}")
        assert row is not None
        (note,) = again.append(row.effect_id, row.head, [Draft(kind=Kind.CONFIRMED)])
        assert note.seq == 10 and note.prev == row.head
    with auditor(db, public_of(SEED)) as journal:
        assert journal.verify().ok


@pytest.mark.parametrize(
    ("name", "first_bad"),
    [
        ("edited field", 5),
        ("dropped entry", 5),
        ("reordered pair", 4),
        ("inserted entry", 4),
        ("wrong key", 7),
    ],
)
def test_tampering_with_an_ed25519_journal_names_the_first_bad_entry(
    tmp_path: Path, name: str, first_bad: int
) -> None:
    db = tmp_path / "j.db"
    filled(db).close()
    if name == "edited field":
        body = sql_body(db, 5).replace(b'"n":1', b'"n":7')
        sql(db, "UPDATE entries SET body = ? WHERE seq = 5", body)
    elif name == "dropped entry":
        sql(db, "DELETE FROM entries WHERE seq = 4")
    elif name == "reordered pair":
        a, b = row_of(db, 4), row_of(db, 5)
        sql(db, "DELETE FROM entries WHERE seq IN (4, 5)")
        insert(db, (4, *b[1:]))
        insert(db, (5, *a[1:]))
    elif name == "inserted entry":
        sql(db, "UPDATE entries SET seq = seq + 100 WHERE seq >= 4")
        sql(db, "UPDATE entries SET seq = seq - 99 WHERE seq >= 104")
        forged = encode_entry(
            seq=4,
            ts=time.time(),
            effect_id=f"{9:064x}",
            kind=Kind.COMMITTED,
            prev="",
            key=Ed25519Key(bytes.fromhex(OTHER_SEED)),
            data={"n": 9},
        )
        insert(
            db,
            (
                4,
                forged.effect_id,
                "COMMITTED",
                "",
                forged.hash,
                forged.key_id,
                forged.sig,
                forged.body,
            ),
        )
    elif name == "wrong key":
        # a whole effect re-signed with a key the auditor does not trust
        other = Ed25519Key(bytes.fromhex(OTHER_SEED))
        for seq in (7, 8, 9):
            raw = row_of(db, seq)
            sql(
                db,
                "UPDATE entries SET key_id = ?, sig = ? WHERE seq = ?",
                other.key_id,
                other.sign(bytes.fromhex(raw[4])),
                seq,
            )
    with auditor(db, public_of(SEED)) as journal:
        report = journal.verify()
    assert not report.ok, name
    assert report.first_bad_seq == first_bad, (name, report)
    assert f"seq={first_bad}" in str(report)


def test_a_cut_tail_is_caught_by_the_effects_table_and_by_the_recorded_head(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    journal = filled(db)
    head = journal.head()
    journal.close()
    sql(db, "DELETE FROM entries WHERE seq > 6")
    with auditor(db, public_of(SEED)) as cut:
        # the effects table still names entries that are gone (a cut that rewrites the table
        # too is caught only by the head: the conformance suite shows it)
        index = cut.verify()
        assert not index.ok and index.first_bad_seq is not None and index.first_bad_seq > 6
        report = cut.verify(head)
        assert not report.ok and report.first_bad_seq == 7
        assert "tail cut" in (report.problem or "")


def test_an_export_verifies_line_by_line_and_names_a_tampered_line(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    with filled(db) as journal:
        lines = [export_line(raw) for raw in journal.iter_raw()]
        head = journal.head()
    keyring = Keyring(None, [parse_key(public_of(SEED))])
    assert len(lines) == 9 and all(json.loads(line)["body"] for line in lines)
    assert verify_entries(read_export(lines), keyring, head).ok
    doc = json.loads(lines[2])
    doc["body"] = doc["body"].replace('"n":0', '"n":5')
    tampered = [*lines[:2], json.dumps(doc), *lines[3:]]
    report = verify_entries(read_export(tampered), keyring, head)
    assert not report.ok and report.first_bad_seq == 3


def test_the_auditor_s_commands(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    filled(db).close()
    env = {"PATH": "/usr/bin:/bin", "INTERLOCK_SIGNING_KEY": f"ed25519:{SEED}"}

    def run(*argv: str, with_key: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CONSOLE_SCRIPT), "--journal", f"sqlite:///{db}", *argv],
            capture_output=True,
            text=True,
            env=env if with_key else {"PATH": env["PATH"]},
            cwd=tmp_path,
            timeout=60,
        )

    public = run("journal", "public-key")
    assert public.returncode == 0 and public.stdout.strip() == public_of(SEED)
    (tmp_path / "auditor.pub").write_text(public.stdout)
    exported = run("journal", "export", "-o", str(tmp_path / "j.jsonl"))
    assert exported.returncode == 0, exported.stderr
    assert len((tmp_path / "j.jsonl").read_text().splitlines()) == 9
    (tmp_path / "j.db.key").unlink(missing_ok=True)
    for target in ([], ["--export", str(tmp_path / "j.jsonl")]):
        ok = run(
            "journal",
            "verify",
            "--public-key",
            str(tmp_path / "auditor.pub"),
            *target,
            with_key=False,
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "result:  ok" in ok.stdout and "entries: 9" in ok.stdout
        bad = run(
            "journal", "verify", "--public-key", public_of(OTHER_SEED), *target, with_key=False
        )
        assert bad.returncode == 1 and "FAILED at entry seq 1" in bad.stdout
    keygen = run("journal", "keygen", "--json", with_key=False)
    made = json.loads(keygen.stdout)
    assert made["signing_key"].startswith("ed25519:")
    assert Ed25519Key(bytes.fromhex(made["signing_key"][8:])).public_text == made["public_key"]


def sql_body(path: Path, seq: int) -> bytes:
    return bytes(row_of(path, seq)[7])


def row_of(path: Path, seq: int) -> tuple[object, ...]:
    db = sqlite3.connect(path)
    try:
        row = db.execute(
            "SELECT seq, effect_id, kind, prev, hash, key_id, sig, body FROM entries WHERE seq = ?",
            (seq,),
        ).fetchone()
    finally:
        db.close()
    assert row is not None
    return tuple(row)


def insert(path: Path, row: tuple[object, ...]) -> None:
    sql(
        path,
        "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        *row,
    )


# -- the report ----------------------------------------------------------------------------------


async def test_the_report_counts_what_the_journal_holds(tmp_path: Path) -> None:
    from interlock_temporal.core.policy import Accounts, CallEvent, Limits, Policy, PolicyGuard
    from interlock_temporal.core.protocol import Gate, Ticket

    from .test_protocol import MemTarget, make_call

    db = tmp_path / "j.db"
    journal = open_journal(f"sqlite:///{db}", signing_key="11" * 32)
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)
    gate = Gate(journal)
    for case in ("c-1", "c-2", "c-3"):
        step = await gate.begin(make_call(lease, key={"case": case}), target)
        assert isinstance(step, Ticket)
        await gate.commit(step, await target.send(step))
    with pytest.raises(Exception, match="lease"):
        await gate.begin(make_call(lease, amount=9_999, key={"case": "c-4"}), target)
    guard = PolicyGuard(
        Policy(Limits(max_repeat_calls=1, hitl_activities=("wire",))), journal.policy
    )
    for i in range(2):
        event = CallEvent(activity="search", args=("same",), principal="bot", session="s-1")
        guard.check(event, Accounts.of(event, f"run/{i}"), delivery=f"run/{i}/1")
    event = CallEvent(activity="wire", args=({"amount": 1},), principal="bot", session="s-2")
    guard.check(event, Accounts.of(event, "run/w"), delivery="run/w/1")
    journal.close()

    env = {"PATH": "/usr/bin:/bin", "INTERLOCK_SIGNING_KEY": "11" * 32}
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "--journal", f"sqlite:///{db}", "report", "--since", "1h", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["effects"] == {"COMMITTED": 3, "REFUSED": 1}
    assert report["denials"] == {"MAX_REPEAT_EXCEEDED": 1}
    assert report["escalations"] == {"HITL_REQUIRED": 1}
    assert report["waiting"] == {
        "ambiguous_effects": 0,
        "pending_approvals": 1,
        "open_circuits": 1,
        "in_doubt": 0,
    }
    latency = report["gate_latency_ms"]
    assert latency["count"] == 3 and 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    text = subprocess.run(
        [str(CONSOLE_SCRIPT), "--journal", f"sqlite:///{db}", "report"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert text.returncode == 0
    assert "denials:" in text.stdout and "MAX_REPEAT_EXCEEDED 1" in text.stdout
    assert "1 approvals pending, 1 circuits open" in text.stdout
