"""``journal verify`` of 9,000 entries: the short path checks the common entry, the full check
names what is wrong. An edit deep in the journal, between entries the short path accepted, is
named by its seq exactly as the full check alone names it (real SQLite; entries signed as the
journal signs them, written straight into its tables to keep the test fast)."""

from __future__ import annotations

import gc
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core.identity import effect_id, origin_of
from interlock_temporal.core.journal import Journal, encode_entry, open_journal
from interlock_temporal.core.journal.entries import origin_in, proposal_of
from interlock_temporal.core.journal.signing import Ed25519Key, HmacKey, Keyring
from interlock_temporal.core.journal.verifying import (
    _PRECHECK,
    _proposal,
    first_facts,
    read_ahead,
    verify_stored,
)
from interlock_temporal.core.models import Kind, VerifyReport

KEY = "5e" * 32
EFFECTS = 3_000  # three entries each: 9,000 entries
#: the first entry of effect 2,000 (it starts a chain), its DISPATCHED (values beside it) and
#: its COMMITTED (the effect's head)
FIRST, DISPATCHED, COMMITTED = 6_001, 6_002, 6_003


def _build(path: Path) -> None:
    open_journal(f"sqlite:///{path}", signing_key=KEY).close()  # the schema
    key = HmacKey(bytes.fromhex(KEY))
    entries: list[tuple[Any, ...]] = []
    rows: list[tuple[Any, ...]] = []
    seq = 0
    for n in range(EFFECTS):
        eid = effect_id("verify.refund", {"n": n})
        delivery = {"workflow_id": f"wf-{n}", "run_id": "run-1", "activity_id": "1"}
        digest = f"{n:064x}"
        prev = ""
        stamps: dict[Kind, float] = {}
        for kind, data, vals in (
            (Kind.PROPOSED, {"delivery": delivery, "input_digest": digest}, None),
            (Kind.DISPATCHED, {"via": "dispatch"}, json.dumps({"approved": {"n": n}})),
            (Kind.COMMITTED, {"via": "dispatch"}, json.dumps({"result": {"id": f"re_{n}"}})),
        ):
            seq += 1
            stamps[kind] = 1_800_000_000.0 + seq / 1_000
            if kind is Kind.PROPOSED:
                data = {**data, "effect_type": "verify.refund"}
            e = encode_entry(
                seq=seq,
                ts=stamps[kind],
                effect_id=eid,
                kind=kind,
                prev=prev,
                key=key,
                data=data,
                vals=vals,
            )
            entries.append((seq, eid, kind.value, prev, e.hash, e.key_id, e.sig, e.body, vals))
            prev = e.hash
        dispatched = stamps[Kind.DISPATCHED]
        origin = origin_of(delivery["workflow_id"], delivery["run_id"], "1", digest)
        committed = stamps[Kind.COMMITTED]
        row = (eid, "verify.refund", "COMMITTED", prev, seq, committed, dispatched, dispatched)
        rows.append((*row, origin))
    write_straight(path, entries, rows)


def write_straight(path: Path, entries: list[tuple[Any, ...]], rows: list[tuple[Any, ...]]) -> None:
    """Signed entries (``RawEntry``'s fields) and effects rows (``EffectRow``'s) written
    straight into a SQLite journal's tables, in one transaction: a large journal in seconds."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body, vals) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        entries,
    )
    db.executemany(
        "INSERT INTO effects (effect_id, effect_type, status, head, head_seq, updated_ts, "
        "first_dispatch_ts, last_dispatch_ts, origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    db.execute("COMMIT")
    db.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verify") / "journal.db"
    _build(path)
    return path


@pytest.fixture
def journal_path(built: Path, tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    path.write_bytes(built.read_bytes())
    return path


def _verified(path: Path) -> VerifyReport:
    """``journal.verify()``, which must report exactly what the full check alone reports."""
    with open_journal(f"sqlite:///{path}", create=False, check_tail=False, signing_key=KEY) as j:
        fast = j.verify()
        full = _full(j)
    # the journal's verify adds its control-plane check (whose problems would fail it)
    assert fast.model_copy(update={"control": None}) == full
    assert fast.control is None or fast.control.problems == []
    return fast


def _full(j: Journal) -> VerifyReport:
    rows = j.row_values()
    return verify_stored(
        j.iter_raw_batches(), j.keyring, None, rows, j.anchor_entries(), short=False
    )


def _edit(path: Path, sql: str, *params: Any) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(sql, params)
    db.close()


def _flip(body: bytes) -> bytes:
    at = body.index(b'"via":"dispatch"') + 8 if b'"via"' in body else body.index(b"wf-") + 3
    return body[:at] + bytes([body[at] ^ 1]) + body[at + 1 :]


def _stored(path: Path, seq: int, column: str) -> Any:
    db = sqlite3.connect(path)
    (value,) = db.execute(f"SELECT {column} FROM entries WHERE seq = ?", (seq,)).fetchone()
    db.close()
    return value


def test_a_sound_journal_of_several_reads_verifies(journal_path: Path) -> None:
    report = _verified(journal_path)
    assert report.ok, report
    assert (report.entries, report.effects) == (3 * EFFECTS, EFFECTS)
    assert report.head is not None and report.head.seq == 3 * EFFECTS


EDITS: list[tuple[str, int, Callable[[Path, int], None], str]] = [
    (
        "a flipped byte of a chain's first entry",
        FIRST,
        lambda p, s: _edit(
            p, "UPDATE entries SET body = ? WHERE seq = ?", _flip(_stored(p, s, "body")), s
        ),
        "its bytes do not match its hash (edited or torn)",
    ),
    (
        "a flipped byte in the middle of a chain",
        DISPATCHED,
        lambda p, s: _edit(
            p, "UPDATE entries SET body = ? WHERE seq = ?", _flip(_stored(p, s, "body")), s
        ),
        "its bytes do not match its hash (edited or torn)",
    ),
    (
        "another entry's signature",
        DISPATCHED,
        lambda p, s: _edit(
            p, "UPDATE entries SET sig = ? WHERE seq = ?", _stored(p, s + 3, "sig"), s
        ),
        "its signature does not verify with key",
    ),
    (
        "an edited value",
        DISPATCHED,
        lambda p, s: _edit(
            p, "UPDATE entries SET vals = ? WHERE seq = ?", '{"approved":{"n":99999}}', s
        ),
        "the values stored beside it are not the ones it signed (edited)",
    ),
    (
        "an edited kind",
        COMMITTED,
        lambda p, s: _edit(p, "UPDATE entries SET kind = 'REFUSED' WHERE seq = ?", s),
        "its stored columns differ from what was signed",
    ),
    (
        "a dropped entry",
        DISPATCHED,
        lambda p, s: _edit(p, "DELETE FROM entries WHERE seq = ?", s),
        f"entries {DISPATCHED}..{DISPATCHED} are missing",
    ),
]


@pytest.mark.parametrize(
    ("seq", "edit", "problem"),
    [pytest.param(seq, edit, problem, id=name) for name, seq, edit, problem in EDITS],
)
def test_an_edit_deep_in_the_journal_is_named_by_its_seq(
    journal_path: Path, seq: int, edit: Callable[[Path, int], None], problem: str
) -> None:
    edit(journal_path, seq)
    report = _verified(journal_path)
    # a dropped entry is named by the entry after the gap, which is not missing
    named = seq + 1 if "missing" in problem else seq
    assert not report.ok and report.first_bad_seq == named, report
    assert report.problem is not None and report.problem.startswith(problem), report
    assert report.entries == seq - 1  # every entry before it checked


@pytest.mark.parametrize(
    ("column", "value"),
    [("head", "0" * 64), ("origin", "f" * 64), ("updated_ts", 1.0), ("status", "DISPATCHED")],
)
def test_an_edited_row_deep_in_the_journal_is_named_by_its_head(
    journal_path: Path, column: str, value: Any
) -> None:
    eid = _stored(journal_path, COMMITTED, "effect_id")
    _edit(journal_path, f"UPDATE effects SET {column} = ? WHERE effect_id = ?", value, eid)
    report = _verified(journal_path)
    assert not report.ok and report.first_bad_seq == COMMITTED, report
    assert report.problem is not None and column in report.problem, report
    assert report.entries == 3 * EFFECTS


@pytest.mark.parametrize("enabled", [True, False])
def test_verify_leaves_the_garbage_collector_as_it_found_it(
    journal_path: Path, enabled: bool
) -> None:
    """The collector pauses during a pass (it makes no cycles) and is restored after it, also
    after a pass that finds an edit."""
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        assert _verified(journal_path).ok
        assert gc.isenabled() is enabled
        _edit(journal_path, "UPDATE entries SET sig = ? WHERE seq = ?", "0" * 64, DISPATCHED)
        assert _verified(journal_path).first_bad_seq == DISPATCHED
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_read_ahead_yields_every_batch_in_order_and_raises_what_the_reader_raised() -> None:
    def batches() -> Iterator[list[int]]:
        yield from ([n] for n in range(100))
        raise sqlite3.OperationalError("the server went away")

    read: list[int] = []
    with pytest.raises(sqlite3.OperationalError, match="the server went away"):
        for batch in read_ahead(batches):
            read += batch
    assert read == list(range(100))


def test_read_ahead_closed_early_closes_its_source_and_stops() -> None:
    closed = threading.Event()

    def batches() -> Iterator[int]:
        try:
            yield from range(1_000_000)
        finally:
            closed.set()

    reading = read_ahead(batches)
    assert [next(reading) for _ in range(5)] == [0, 1, 2, 3, 4]
    reading.close()  # as a verify that found an edit stops reading
    assert closed.is_set()
    assert not any(t.name == "interlock-read-ahead" for t in threading.enumerate())


def _effects(key: HmacKey | Ed25519Key, effects: int) -> list[tuple[Any, ...]]:
    """The stored tuples of ``effects`` effects of three entries each, signed with ``key``."""
    out: list[tuple[Any, ...]] = []
    for n in range(effects):
        eid = effect_id("verify.refund", {"n": n})
        prev = ""
        for kind, data in (
            (Kind.PROPOSED, {"effect_type": "verify.refund", "input_digest": f"{n:064x}"}),
            (Kind.DISPATCHED, {"via": "dispatch"}),
            (Kind.COMMITTED, {"via": "dispatch"}),
        ):
            seq = len(out) + 1
            e = encode_entry(
                seq=seq,
                ts=1_800_000_000.5 + seq,
                effect_id=eid,
                kind=kind,
                prev=prev,
                key=key,
                data=data,
            )
            out.append((seq, eid, kind.value, prev, e.hash, e.key_id, e.sig, e.body, None))
            prev = e.hash
    return out


def _both(raws: list[tuple[Any, ...]], keyring: Keyring) -> VerifyReport:
    """``verify_stored`` of ``raws`` (one read), which must report exactly what the full check
    alone reports."""
    fast = verify_stored([raws], keyring)
    assert fast == verify_stored([raws], keyring, short=False)
    return fast


def test_ed25519_signatures_checked_ahead_on_threads_name_an_edit_by_its_seq() -> None:
    """An Ed25519 journal's signatures are checked ahead, in reads of ``_PRECHECK`` entries, on
    threads: an edited signature deep in it, or an entry signed by another key, is named by its
    seq as the full check names it, and the threads are gone after the pass."""
    key = Ed25519Key(bytes.fromhex("6e" * 32))
    keyring = Keyring(None, [key.public_only()])
    raws = _effects(key, 1_000)  # 3,000 entries: several reads ahead
    assert len(raws) > 4 * _PRECHECK
    report = _both(raws, keyring)
    assert report.ok and report.entries == len(raws), report
    for seq in (2_500, 2_501):  # a chain's next entry, a chain's first
        at = seq - 1
        edited = [*raws]
        edited[at] = (*raws[at][:6], raws[at + 3][6], *raws[at][7:])
        report = _both(edited, keyring)
        assert not report.ok and report.first_bad_seq == seq, report
        assert report.problem is not None and "signature does not verify" in report.problem
    other = Ed25519Key(bytes.fromhex("6f" * 32))
    # from seq 1,501 on, the same effects signed by another key: each checked by its own
    mixed = raws[:1_500] + _effects(other, 1_000)[1_500:]
    report = _both(mixed, Keyring(None, [key.public_only(), other.public_only()]))
    assert report.ok and report.entries == len(raws), report
    report = _both(mixed, keyring)
    assert not report.ok and report.first_bad_seq == 1_501, report
    assert report.problem is not None and "not in the keyring" in report.problem
    assert not any(t.name.startswith("interlock-verify") for t in threading.enumerate())


FIRST_BODIES = [
    # as the journal writes them, and in shapes it does not: the full check's reading decides
    b'{"data":{"delivery":{"activity_id":"1","run_id":"r","workflow_id":"w"},'
    b'"effect_type":"t","input_digest":"d","z":[1,{"a":2}]},"v":2}',
    b'{"data":{"effect_type":"first","effect_type":"last"},"v":2}',
    b'{"data":{"input_digest":"d","delivery":{"activity_id":"1","run_id":"r",'
    b'"workflow_id":"w"},"effect_type":"t"},"v":2}',
    b'{"data":{"effect_type":"t","zz":1,"effect_type":"after"},"v":2}',
    b'{"data":{ "effect_type":"t"},"v":2}',
    b'{"data":{"effect_type":"\\u0074"},"v":2}',
    b'{"data":{},"v":2}',
    b'{"data":[1],"v":2}',
    b'{"v":2}',
]


_P = '{"delivery":{"activity_id":"1","run_id":"r","workflow_id":"w"},"effect_type":"t",'
_ENVELOPE = ',"effect_id":"e","key_id":"k","kind":"DISPATCHED","prev":"","seq":1,"ts":1.5,"v":3}'
COMBINED_DATA = [
    # (data, scanned alone): as the journal writes them, and in shapes it does not; the whole
    # document's reading decides
    (
        '{"authorization":{"a":1},"dispatch":{"via":"d"},"proposal":' + _P + '"input_digest":"d"}}',
        True,
    ),
    # a key "proposal" inside the proposal, last; inside the dispatch, before it
    (
        '{"authorization":{},"dispatch":{},"proposal":'
        + _P
        + '"premises":{"a":1,"proposal":{"x":1}}}}',
        False,
    ),
    (
        '{"authorization":{},"dispatch":{"proposal":{"effect_type":"no"}},"proposal":'
        + _P
        + '"z":1}}',
        True,
    ),
    # two proposals (the last counts), the last not an object, one only inside a string
    ('{"authorization":{},"proposal":{"effect_type":"first"},"proposal":' + _P + '"z":1}}', True),
    ('{"authorization":{},"proposal":' + _P + '"z":1},"proposal":1}', False),
    ('{"authorization":{"note":",\\"proposal\\":{"},"dispatch":{}}', False),
    ('{"authorization":{},"proposal":' + _P + '"z":1} }', False),
    ('{"authorization":{},"proposal":' + _P + '"z":1},"zz":{}}', False),
]


@pytest.mark.parametrize(("data", "alone"), COMBINED_DATA)
def test_a_combined_dispatchs_proposal_is_read_as_the_whole_document_reads_it(
    data: str, alone: bool
) -> None:
    """A combined dispatch's proposal is scanned alone where it is the data's last value, and
    the whole document read otherwise: what either gives is what ``json.loads`` gives."""
    body = ('{"data":' + data + _ENVELOPE).encode()
    assert (_proposal(body) is not None) is alone
    proposal = proposal_of(json.loads(body))
    effect_type = proposal.get("effect_type")
    expected = (effect_type if isinstance(effect_type, str) else None), origin_in(proposal)
    assert first_facts(body) == expected
    # the same data in an entry of format 2 is its own proposal: read whole, never scanned
    as_format_2 = body.replace(b',"v":3}', b',"v":2}')
    assert _proposal(as_format_2) is None
    own = json.loads(as_format_2)["data"]
    assert first_facts(as_format_2) == (None, origin_in(own))


@pytest.mark.parametrize("combined", [False, True], ids=["proposed", "combined"])
@pytest.mark.parametrize("body", FIRST_BODIES)
def test_a_first_entry_is_read_as_the_full_check_reads_it(body: bytes, combined: bool) -> None:
    """``first_facts`` reads an effect's first entry as ``json.loads`` reads it, whatever its
    shape: a reading of only the keys up to ``input_digest`` would take the wrong type from a
    body that repeats a key after them. A combined dispatch (format 3) is read in its proposal,
    and only an entry of format 3 is."""
    data = json.loads(body).get("data")
    data = data if isinstance(data, dict) else {}
    effect_type = data.get("effect_type")
    expected = (effect_type if isinstance(effect_type, str) else None), origin_in(data)
    if combined:  # the same proposal, as the part of a combined dispatch
        body = body.replace(b'{"data":', b'{"data":{"authorization":{},"proposal":', 1)
        body = body.replace(b',"v":2}', b'},"v":3}') if b'"data"' in body else body
        if b'"data"' not in body:
            expected = None, None
    assert first_facts(body) == expected
