"""The conformance suite every journal backend must pass (the effect protocol and the journal).

It is written against ``interlock_temporal.core.journal.Journal`` only. A backend's test module
subclasses ``JournalConformance`` and provides two fixtures:

``journal_factory``
    a callable ``(signing_key=..., older_keys=()) -> Journal`` that opens *the same* store
    again on each call (so reopen tests work). Keys are given as hex strings.

``tamper``
    an object implementing ``Tamper`` below, which edits the store underneath the journal the
    way an attacker or a torn write would: it bypasses the journal's API entirely.

The module is not named ``test_*`` so pytest collects it only through a backend's subclass.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import os
import re
import sqlite3
import threading
import time
import unittest.mock
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest
import rfc8785

from interlock_temporal.core.errors import (
    Ambiguous,
    HeadConflict,
    JournalConfigError,
    JournalCorrupt,
    Refused,
)
from interlock_temporal.core.identity import UnserializableInput, effect_id, origin_of
from interlock_temporal.core.journal import (
    SCHEMA_VERSION,
    Journal,
    RawEntry,
    as_key,
    encode_entry,
    verify_jobs,
)
from interlock_temporal.core.journal.archiving import verify_archive
from interlock_temporal.core.journal.entries import ENTRY_COLUMNS
from interlock_temporal.core.journal.signing import Ed25519Key
from interlock_temporal.core.journal.sql import PUT_ROW, SqlJournal
from interlock_temporal.core.journal.verifying import verify_stored
from interlock_temporal.core.leases import Demand, check_lease
from interlock_temporal.core.models import Draft, Entry, JournalHead, Kind, Lease, VerifyReport
from interlock_temporal.core.notifications import NotificationFailure
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.receipts import fold, receipt
from interlock_temporal.core.retention import archive
from interlock_temporal.core.review import record_resolution, reopen
from interlock_temporal.targets.payments import SimulatedPayments

from .effect_ids_conformance import EffectIdsConformance
from .fixtures import make_release_journal as release

KEY = "11" * 32
OTHER_KEY = "22" * 32
FORGER_KEY = "33" * 32
#: a journal the previous release wrote (schema 3, entry format 1), and the key it signed with
#: (tests/fixtures/make_schema3_journal.py)
SCHEMA3_FIXTURE = Path(__file__).parent / "fixtures" / "schema3_journal.db"
SCHEMA3_KEY = "3c" * 32

A = effect_id("conformance.refund", {"case": "A"})
B = effect_id("conformance.refund", {"case": "B"})
C = effect_id("conformance.email", {"case": "C"})
D = effect_id("conformance.email", {"case": "D"})
E = effect_id("conformance.email", {"case": "E"})

# The standard journal of ``populate``: (seq, effect, kind), interleaved across three effects.
LAYOUT: list[tuple[int, str, Kind]] = [
    (1, A, Kind.PROPOSED),
    (2, A, Kind.AUTHORIZED),
    (3, B, Kind.PROPOSED),
    (4, A, Kind.DISPATCHED),
    (5, B, Kind.DISPATCHED),
    (6, C, Kind.PROPOSED),
    (7, A, Kind.COMMITTED),
    (8, C, Kind.REFUSED),
]


class Tamper(Protocol):
    """Backend-specific edits of the stored entries, below the journal's API."""

    def set_meta(self, key: str, value: str | None) -> None:
        """Set (None: delete) a row of the journal's settings."""

    def edit_body(self, seq: int, new_bytes: bytes) -> None:
        """Replace the stored signed bytes of entry ``seq`` (nothing else)."""

    def edit_column(self, seq: int, column: str, value: Any) -> None:
        """Set one stored column (effect_id, kind, prev, hash, key_id, sig) of entry ``seq``."""

    def delete(self, seq: int) -> None:
        """Remove entry ``seq``."""

    def swap(self, seq_a: int, seq_b: int) -> None:
        """Exchange the positions of two stored entries: each keeps its bytes and columns."""

    def insert_raw(self, raw: RawEntry) -> None:
        """Store ``raw`` at position ``raw.seq``; entries at that position or later move one
        place later (their stored seq + 1, their bytes unchanged)."""

    def truncate_after(self, seq: int) -> None:
        """Remove every entry after ``seq`` (a cut tail)."""

    def snapshot(self) -> Any:
        """A comparable picture of everything the store holds."""


def holding_claims(journal: Journal, n: int = 2) -> Iterator[None]:
    claims = [journal.claim(effect_id("conformance.busy", i)) for i in range(n)]
    assert all(c is not None for c in claims)
    yield
    for claim in claims:
        assert claim is not None
        claim.release()


def verified(journal: Journal, head: JournalHead | str | None = None) -> VerifyReport:
    """``journal.verify(head)``, which ``verify(head, jobs=2)`` must report exactly, in ranges
    of a few entries (``verify_jobs``; every chain here spans ranges): ok only where one pass is
    ok, and ok from the ranges themselves, not from a pass that checked them again; any
    failure as one pass names it."""
    one = journal.verify(head)
    with unittest.mock.patch.object(verify_jobs, "MIN_PER_JOB", 1):
        several = journal.verify(head, jobs=2)
    assert several.model_copy(update={"jobs": 1}) == one
    if one.ok and one.entries >= 3:
        assert several.jobs == 2, several
    else:
        assert several.jobs == 1, several
    return one


def draft(kind: Kind, **data: Any) -> Draft:
    return Draft(kind=kind, data=data)


def populate(journal: Journal) -> dict[int, Entry]:
    """Write ``LAYOUT`` one entry per append; return the entries by seq."""
    written: dict[int, Entry] = {}
    for seq, eid, kind in LAYOUT:
        row = journal.row(eid)
        head = "" if row is None else row.head
        (entry,) = journal.append(eid, head, [draft(kind, n=seq)], effect_type="conformance.refund")
        assert entry.seq == seq
        written[seq] = entry
    return written


def schema3_rows() -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
    """The fixture's tables as the previous release left them: (columns, rows) by table."""
    db = sqlite3.connect(f"{SCHEMA3_FIXTURE.resolve().as_uri()}?mode=ro", uri=True)
    try:
        names = [
            r[0]
            for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name <> 'meta'"
            )
        ]
        tables = {}
        for name in names:
            cursor = db.execute(f"SELECT * FROM {name}")
            tables[name] = ([d[0] for d in cursor.description], cursor.fetchall())
        return tables
    finally:
        db.close()


def schema3_values() -> dict[tuple[str, str], Any]:
    """Each effect's latest value of each name in the fixture."""
    _, rows = schema3_rows()["entries"]
    latest: dict[tuple[str, str], Any] = {}
    for _seq, eid, _kind, _prev, _hash, _key, _sig, _body, vals in sorted(rows):
        for name, value in json.loads(vals or "{}").items():
            latest[(eid, name)] = value
    return latest


def raw_of(entry: Entry) -> RawEntry:
    return RawEntry(
        seq=entry.seq,
        effect_id=entry.effect_id,
        kind=entry.kind.value,
        prev=entry.prev,
        hash=entry.hash,
        key_id=entry.key_id,
        sig=entry.sig,
        body=entry.body,
    )


def journal_hash(tamper: Any, seq: int) -> str:
    (row,) = tamper._query("SELECT hash FROM entries WHERE seq = ?", (seq,))
    return str(row[0])


def signed_ts(tamper: Any, seq: int) -> float:
    (row,) = tamper._query("SELECT body FROM entries WHERE seq = ?", (seq,))
    return float(json.loads(bytes(row[0]))["ts"])


def key_id(hex_key: str) -> str:
    """The key id of a test key under the scheme the running suite uses."""
    return as_key(scheme_key(hex_key)).key_id


#: "hmac" or "ed25519": the signature scheme the running suite's journals use (a subclass sets
#: ``key_scheme``; the suite's fixtures set this for the test's duration)
SCHEME = "hmac"


def scheme_key(hex_key: str) -> str:
    """A test key (32 bytes, hex) as configuration writes it in the running scheme."""
    return f"ed25519:{hex_key}" if SCHEME == "ed25519" else hex_key


def entry_count(journal: Journal) -> int:
    return sum(1 for _ in journal.iter_raw())


TAMPERABLE_COLUMNS = ("effect_id", "kind", "prev", "hash", "key_id", "sig")


class SqlTamper(ABC):
    """Edits a SQL store's tables through a connection of its own, as an attacker or a torn
    write would: nothing goes through the journal. SQL is written with ``?`` placeholders."""

    @abstractmethod
    def _run(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        """Run the statements in one transaction."""

    @abstractmethod
    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def _tables(self) -> list[str]: ...

    def _exists(self, seq: int) -> None:
        assert self._query("SELECT 1 FROM entries WHERE seq = ?", (seq,)), (
            f"no entry {seq} to tamper with"
        )

    def set_meta(self, key: str, value: str | None) -> None:
        """Set (None: delete) a row of the journal's settings."""
        self._run(("DELETE FROM meta WHERE key = ?", (key,)))
        if value is not None:
            self._run(("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value)))

    def edit_body(self, seq: int, new_bytes: bytes) -> None:
        self._exists(seq)
        self._run(("UPDATE entries SET body = ? WHERE seq = ?", (new_bytes, seq)))

    def edit_column(self, seq: int, column: str, value: Any) -> None:
        assert column in TAMPERABLE_COLUMNS
        self._exists(seq)
        self._run((f"UPDATE entries SET {column} = ? WHERE seq = ?", (value, seq)))

    def edit_vals(self, seq: int, vals: str | None) -> None:
        """Replace the values stored beside entry ``seq`` (its signed bytes stay)."""
        self._exists(seq)
        self._run(("UPDATE entries SET vals = ? WHERE seq = ?", (vals, seq)))

    def vals(self, seq: int) -> str | None:
        (row,) = self._query("SELECT vals FROM entries WHERE seq = ?", (seq,))
        return None if row[0] is None else str(row[0])

    def edit_row(self, effect: str, column: str, value: Any) -> None:
        """Set one column of an effect's index row (the effects table)."""
        assert self._query("SELECT 1 FROM effects WHERE effect_id = ?", (effect,))
        self._run((f"UPDATE effects SET {column} = ? WHERE effect_id = ?", (value, effect)))

    @abstractmethod
    def load_schema3(self) -> None:
        """Make the store exactly what the previous release wrote: ``SCHEMA3_FIXTURE``'s tables
        and rows at schema 3, in this backend."""

    def delete(self, seq: int) -> None:
        self._exists(seq)
        self._run(("DELETE FROM entries WHERE seq = ?", (seq,)))

    def swap(self, seq_a: int, seq_b: int) -> None:
        self._exists(seq_a)
        self._exists(seq_b)
        self._run(
            ("UPDATE entries SET seq = -1 WHERE seq = ?", (seq_a,)),
            ("UPDATE entries SET seq = ? WHERE seq = ?", (seq_a, seq_b)),
            ("UPDATE entries SET seq = ? WHERE seq = -1", (seq_b,)),
        )

    def insert_raw(self, raw: RawEntry) -> None:
        self._run(
            # move the later entries one place on, through negative seqs to dodge the key
            ("UPDATE entries SET seq = -(seq + 1) WHERE seq >= ?", (raw.seq,)),
            ("UPDATE entries SET seq = -seq WHERE seq < 0", ()),
            (
                "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    raw.seq,
                    raw.effect_id,
                    raw.kind,
                    raw.prev,
                    raw.hash,
                    raw.key_id,
                    raw.sig,
                    raw.body,
                ),
            ),
        )

    def truncate_after(self, seq: int) -> None:
        self._run(("DELETE FROM entries WHERE seq > ?", (seq,)))

    def to_schema_2(self) -> None:
        """Rewrite the store as schema 2 kept it: each effect's latest value of each name in a
        ``blobs`` table, none in the entries."""
        latest: dict[tuple[str, str], str] = {}
        rows = self._query(
            "SELECT effect_id, vals FROM entries WHERE vals IS NOT NULL ORDER BY seq"
        )
        for eid, vals in rows:
            for name, value in json.loads(vals).items():
                latest[(eid, name)] = json.dumps(value)
        self._run(
            (
                "CREATE TABLE blobs (effect_id TEXT NOT NULL, name TEXT NOT NULL, "
                "value TEXT NOT NULL, PRIMARY KEY (effect_id, name))",
                (),
            ),
            *(
                ("INSERT INTO blobs (effect_id, name, value) VALUES (?, ?, ?)", (e, n, v))
                for (e, n), v in latest.items()
            ),
            ("ALTER TABLE entries DROP COLUMN vals", ()),
            ("UPDATE meta SET value = '2' WHERE key = 'schema_version'", ()),
        )

    def to_schema_7(self) -> None:
        """Rewrite the store as schema 7 kept lease charges: a ``lease_charges`` table (as its
        migration 4 made it), none on the effects' rows, and leases' rows unsealed."""
        self._run(
            (
                "CREATE TABLE lease_charges (effect_id TEXT PRIMARY KEY, lease_id TEXT NOT NULL, "
                "cents BIGINT NOT NULL, active INTEGER NOT NULL)",
                (),
            ),
            (
                "INSERT INTO lease_charges (effect_id, lease_id, cents, active) "
                "SELECT effect_id, charge_lease_id, charge_cents, charge_active FROM effects "
                "WHERE charge_lease_id IS NOT NULL",
                (),
            ),
            *(
                (f"ALTER TABLE effects DROP COLUMN {column}", ())
                for column in ("charge_lease_id", "charge_cents", "charge_active")
            ),
            # and without schema 10's seals (its lease chains stay: the migration signs the
            # rows as they stand after them)
            *(
                (f"ALTER TABLE leases DROP COLUMN {column}", ())
                for column in ("head_seq", "head_hash", "seal")
            ),
            ("ALTER TABLE lease_spend DROP COLUMN seal", ()),
            # nor schema 11's (the policy's rows)
            ("ALTER TABLE policy_sessions DROP COLUMN head", ()),
            *(
                (f"ALTER TABLE {table} DROP COLUMN seal", ())
                for table in (
                    "policy_sessions",
                    "policy_spend",
                    "policy_admissions",
                    "policy_approvals",
                )
            ),
            # nor schema 13's chain links, and with the index of chains it replaced
            ("DROP INDEX entries_next", ()),
            ("ALTER TABLE entries DROP COLUMN prev_seq", ()),
            ("CREATE UNIQUE INDEX entries_chain ON entries (effect_id, substr(prev, 1, 16))", ()),
            ("UPDATE meta SET value = '7' WHERE key = 'schema_version'", ()),
        )

    def put_back(self, raw: RawEntry) -> None:
        """Store ``raw`` (as ``iter_raw`` read it, with its values) again at its seq, linked
        to the entry its prev names (``prev_seq``), as the journal wrote it."""
        self._run(
            (
                "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body, vals, "
                "prev_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "(SELECT p.seq FROM entries p WHERE p.effect_id = ? AND p.hash = ?))",
                (
                    raw.seq,
                    raw.effect_id,
                    raw.kind,
                    raw.prev,
                    raw.hash,
                    raw.key_id,
                    raw.sig,
                    raw.body,
                    raw.vals,
                    raw.effect_id,
                    raw.prev,
                ),
            )
        )

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        return {t: sorted(self._query(f"SELECT * FROM {t}")) for t in self._tables()}


_OWN_ORDER = "o-991"


class _ArchiveStory:
    """A journal in use, for the archive's tests: refunds COMMITTED (c-1), in doubt (c-2),
    REFUSED on a revoked lease (c-3), AMBIGUOUS then resolved happened (c-4), AMBIGUOUS and
    open (c-5), resolved not_happened (c-6), and one committed by a retry while its first
    attempt, which had sent it, stalled (c-7: that attempt is the zombie)."""

    def __init__(self, journal: Journal, tmp_path: Path) -> None:
        self.journal = journal
        self.file = tmp_path / "archive.jsonl"
        self.payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
        self.tier3 = SimulatedPayments(tmp_path / "payments3.db", tier=3)
        self.gate = Gate(journal)
        self.eids: dict[str, str] = {}
        self.chains: dict[str, list[Entry]] = {}
        self.zombie: tuple[Ticket, Any] | None = None

    def call(
        self, case: str, amount: int, *, lease: str = release.LEASE, last: bool = False
    ) -> Any:
        facts = self.tier3 if case in ("c-4", "c-5", "c-6") else self.payments
        req = release.request(case, amount, facts)
        if case == "c-2":  # its own order: the others' refunds leave its premises as they were
            req = req.model_copy(
                update={"order_id": _OWN_ORDER, "premises": facts.order_facts(_OWN_ORDER)}
            )
        return release.call(req, lease, f"wf-{case}", last=last)

    async def send(self, ticket: Ticket) -> Any:
        r = ticket.input
        return await self.payments.refund(
            r.order_id, r.amount_cents, idempotency_key=ticket.effect_id
        )

    @classmethod
    async def write(cls, journal: Journal, tmp_path: Path) -> _ArchiveStory:
        s = cls(journal, tmp_path)
        for facts in (s.payments, s.tier3):
            facts.open_order(release.ORDER, release.PAID_CENTS)
        s.payments.open_order(_OWN_ORDER, release.PAID_CENTS)
        journal.leases.issue(
            "refund-bot",
            activities=["refund"],
            max_amount_cents=5_000,
            budget_cents=9_000,
            lease_id=release.LEASE,
        )
        journal.leases.issue("refund-bot", activities=["refund"], lease_id=release.REVOKED)
        journal.leases.revoke(release.REVOKED)
        gate = s.gate
        in_doubt = await gate.begin(s.call("c-2", 1_500), s.payments)
        assert isinstance(in_doubt, Ticket)
        in_doubt.release()
        await gate.run(s.call("c-1", 2_000), s.payments, s.send)
        with pytest.raises(Refused):
            await gate.begin(s.call("c-3", 700, lease=release.REVOKED), s.payments)
        for case, decision in (("c-4", "happened"), ("c-5", None), ("c-6", "not_happened")):
            ticket = await gate.begin(s.call(case, 300, last=True), s.tier3)
            assert isinstance(ticket, Ticket)
            with pytest.raises(Ambiguous):
                await gate.fail(ticket, TimeoutError(), last_attempt=True)
            if decision is not None:
                record_resolution(
                    journal,
                    ticket.effect_id,
                    kind="ambiguous",
                    decision=decision,
                    operators=["carol"],
                    result={"refund_id": f"re-{case}"} if decision == "happened" else None,
                )
        first = await gate.begin(s.call("c-7", 1_100), s.payments)
        assert isinstance(first, Ticket)
        sent = await s.send(first)
        first.release()  # it stalls after the send; a retry finds it in doubt and recovers it
        retry = await gate.begin(s.call("c-7", 1_100), s.payments)
        if isinstance(retry, Ticket):  # recovery may also find the refund and record it itself
            await gate.commit(retry, await s.send(retry))
        assert receipt(first.effect_id, journal=journal).final == "COMMITTED"
        s.zombie = (first, sent)
        for case in ("c-1", "c-2", "c-3", "c-4", "c-5", "c-6", "c-7"):
            s.eids[case] = gate.identify(s.call(case, 1))[0]
            s.chains[case] = journal.read(s.eids[case])
        return s

    async def probe(self) -> dict[str, Any]:
        """What attempts, people and auditors read of the journal now."""
        gate, journal = self.gate, self.journal
        seen: dict[str, Any] = {}
        seen["duplicate"] = await gate.run(self.call("c-1", 2_000), self.payments, self.send)
        seen["resolved"] = await gate.run(self.call("c-4", 300), self.tier3, self.send)
        with pytest.raises(Refused) as refused:
            await gate.begin(self.call("c-3", 700, lease=release.REVOKED), self.payments)
        seen["refused"] = (refused.value.code, refused.value.reason, refused.value.refused_at)
        with pytest.raises(Refused) as conflict:
            await gate.begin(self.call("c-1", 2_100), self.payments)
        seen["conflict"] = (conflict.value.code, str(conflict.value))
        with pytest.raises(Ambiguous) as ambiguous:
            await gate.begin(self.call("c-5", 300), self.tier3)
        seen["ambiguous"] = ambiguous.value.reason
        assert self.zombie is not None
        done = await gate.commit(*self.zombie)
        seen["zombie"] = (done.result, done.via)
        lease = journal.leases.get(release.LEASE)
        assert lease is not None
        seen["reserved"] = lease.reserved_cents
        seen["refunds"] = [r.effect_id for r in self.payments.refund_records(release.ORDER)]
        seen["receipts"] = {
            case: receipt(eid, journal=journal).model_dump(
                mode="json", exclude={"journal_seq", "journal_hash"}
            )
            for case, eid in self.eids.items()
        }
        seen["results"] = {case: journal.blob(eid, "result") for case, eid in self.eids.items()}
        return seen

    async def recover_and_resolve(self) -> None:
        """The effect in doubt is recovered and the open review resolved, after the archive."""
        ticket = await self.gate.begin(self.call("c-2", 1_500), self.payments)
        assert isinstance(ticket, Ticket) and ticket.effect_id == self.eids["c-2"]
        await self.gate.commit(ticket, await self.send(ticket))
        (refund,) = self.payments.refund_records(_OWN_ORDER)
        assert (refund.effect_id, refund.amount_cents) == (self.eids["c-2"], 1_500)
        assert receipt(self.eids["c-2"], journal=self.journal).final == "COMMITTED"
        record_resolution(
            self.journal,
            self.eids["c-5"],
            kind="ambiguous",
            decision="happened",
            operators=["carol"],
            result={"refund_id": "re-c-5"},
        )
        assert receipt(self.eids["c-5"], journal=self.journal).final == "RESOLVED"
        # an archived REFUSED effect is reopened by a person, and its next attempt sends it
        reopen(self.journal, self.eids["c-3"], operator="dave")
        done = await self.gate.run(self.call("c-3", 700), self.payments, self.send)
        assert done.amount_cents == 700
        reopened = receipt(self.eids["c-3"], journal=self.journal)
        assert (reopened.final, reopened.executed, reopened.operator) == ("COMMITTED", True, "dave")
        self.payments.close()
        self.tier3.close()


class JournalConformance(EffectIdsConformance):
    """Inherit this in a backend's test module and provide ``journal_factory`` and ``tamper``.
    Set ``key_scheme = "ed25519"`` to run every test with Ed25519 signatures."""

    key_scheme = "hmac"

    # -- fixtures --------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _scheme(self) -> Iterator[None]:
        global SCHEME
        SCHEME = self.key_scheme
        yield
        SCHEME = "hmac"

    @pytest.fixture
    def open_store(
        self, journal_factory: Callable[..., Journal]
    ) -> Iterator[Callable[..., Journal]]:
        """Open the backend's store (again); every journal opened is closed at teardown."""
        opened: list[Journal] = []

        def open_(signing_key: str = KEY, older_keys: Sequence[str] = ()) -> Journal:
            journal = journal_factory(
                signing_key=scheme_key(signing_key),
                older_keys=[scheme_key(k) for k in older_keys],
            )
            opened.append(journal)
            return journal

        yield open_
        for journal in opened:
            journal.close()

    @pytest.fixture
    def journal(self, open_store: Callable[..., Journal]) -> Journal:
        return open_store()

    @pytest.fixture
    def in_flight(self, journal: Journal) -> Iterator[None]:
        """Other effects in flight in this process (their claims held), as when a worker runs
        many activities: appends from coroutines are then committed in groups."""
        yield from holding_claims(journal)

    # -- appending and reading -------------------------------------------------------------

    def test_append_new_effect_and_read_back(self, journal: Journal) -> None:
        # the separate entries (as before schema 14); combined, as one entry of format 3:
        # ``test_a_combined_dispatch_reads_as_the_entries_it_stands_for``
        assert isinstance(journal, SqlJournal)
        journal.combine_dispatch = False
        before = time.time()
        written = journal.append(
            A,
            "",
            [
                draft(Kind.PROPOSED, payload_digest="d" * 64, amount=3000),
                draft(Kind.AUTHORIZED, lease_id="lease_1"),
                draft(Kind.DISPATCHED, attempt=1),
            ],
            effect_type="refund",
        )
        after = time.time()

        assert [e.seq for e in written] == [1, 2, 3]
        assert [e.kind for e in written] == [Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED]
        assert written[0].prev == ""
        assert written[1].prev == written[0].hash
        assert written[2].prev == written[1].hash
        # the first entry signs the effect's type, so the index row can be checked against it
        assert written[0].data == {
            "payload_digest": "d" * 64,
            "amount": 3000,
            "effect_type": "refund",
        }
        assert written[1].data == {"lease_id": "lease_1"}

        read = journal.read(A)
        assert read == written
        stored = list(journal.iter_raw())
        assert [r.body for r in stored] == [e.body for e in written]

        signer = as_key(scheme_key(KEY))
        for entry in read:
            assert entry.effect_id == A
            assert before <= entry.ts <= after
            # the hash covers exactly the stored bytes, and the signature covers the hash
            assert entry.hash == hashlib.sha256(entry.body).hexdigest()
            assert signer.verify(bytes.fromhex(entry.hash), entry.sig)
            if SCHEME == "hmac":
                expected = hmac.new(bytes.fromhex(KEY), bytes.fromhex(entry.hash), hashlib.sha256)
                assert entry.sig == expected.hexdigest()
            assert entry.key_id == key_id(KEY)
            # the body is canonical JSON of the signed fields, and agrees with the entry
            assert rfc8785.dumps(json.loads(entry.body)) == entry.body
            doc = json.loads(entry.body)
            assert doc["seq"] == entry.seq
            assert doc["effect_id"] == A
            assert doc["kind"] == entry.kind.value
            assert doc["prev"] == entry.prev
            assert doc["key_id"] == entry.key_id
            assert doc["data"] == entry.data
            assert doc["ts"] == entry.ts

        row = journal.row(A)
        assert row is not None
        assert row.effect_type == "refund"
        assert row.status is Kind.DISPATCHED
        assert row.head == written[-1].hash
        assert row.head_seq == 3
        assert journal.head() == JournalHead(seq=3, hash=written[-1].hash)

    def test_a_combined_dispatch_reads_as_the_entries_it_stands_for(
        self, open_store: Callable[..., Journal]
    ) -> None:
        """A dispatch transaction written as one format-3 entry (``combine_dispatch``) reads
        back as its three entries: the same data, the values on the last, one signed entry
        and one seq in the store; the row, the origin, the fold and ``verify`` as for three."""
        delivery = {"workflow_id": "wf-1", "run_id": "run-1", "activity_id": "7"}
        drafts = [
            draft(Kind.PROPOSED, delivery=delivery, input_digest="ab" * 32, amount=3000),
            draft(Kind.AUTHORIZED, lease_id="lease_1", decided_by=["lease"]),
            draft(Kind.DISPATCHED, via="dispatch"),
        ]
        folded = []
        for combine in (False, True):
            journal = open_store()
            assert isinstance(journal, SqlJournal)
            journal.combine_dispatch = combine
            eid = A if combine else B
            written = journal.append(
                eid, "", drafts, effect_type="refund", blobs={"approved": {"cents": 3000}}
            )
            assert [e.kind for e in written] == [Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED]
            assert [e.data for e in written] == [
                {**drafts[0].data, "effect_type": "refund"},
                drafts[1].data,
                drafts[2].data,
            ]
            assert [e.values for e in written] == [None, None, {"approved": {"cents": 3000}}]
            read = journal.read(eid)
            assert read == written
            done = journal.append(eid, written[-1].hash, [draft(Kind.COMMITTED, via="dispatch")])
            assert journal.read(eid) == [*written, *done]
            row = journal.row(eid)
            assert row is not None and row.status is Kind.COMMITTED
            assert row.origin == origin_of("wf-1", "run-1", "7", "ab" * 32)
            assert eid in journal.by_origin(row.origin)
            assert row.first_dispatch_ts == row.last_dispatch_ts == written[-1].ts
            folded.append(fold(eid, journal.read(eid)))
        stored = [r for r in journal.iter_raw() if r.effect_id == A]
        # one signed entry for the three, and the COMMITTED after it
        assert [(r.kind, r.seq - stored[0].seq) for r in stored] == [
            ("DISPATCHED", 0),
            ("COMMITTED", 1),
        ]
        (combined,) = (json.loads(r.body) for r in stored[:1])
        assert combined["v"] == 3 and combined["prev"] == ""
        assert set(combined["data"]) == {"proposal", "authorization", "dispatch"}
        assert [e.seq for e in journal.read(A)] == [stored[0].seq] * 3 + [stored[1].seq]
        assert journal.head() == JournalHead(seq=stored[1].seq, hash=stored[1].hash)
        # what the gate knows of the effect does not depend on how its entries were stored
        ignored = {"effect_id", "head", "head_seq", "proposed_ts"}
        ignored |= {"first_dispatch_ts", "last_dispatch_ts", "finished_ts"}
        three, one = ({k: v for k, v in vars(f).items() if k not in ignored} for f in folded)
        assert one == three and folded[1].dispatches == 1
        report = verified(journal)
        assert report.ok and report.effects == 2, report

    def test_notification_failures_are_kept_apart_from_every_chain(self, journal: Journal) -> None:
        review = f"interlock-review-ambiguous-{uuid.uuid4().hex}"
        head = journal.head()
        for attempt, (notifier, event) in enumerate(
            [("webhook", "opened"), ("webhook", "opened"), ("email", "reminder")], start=1
        ):
            journal.notifications.record_failure(
                NotificationFailure(
                    notifier=notifier,
                    review_id=review,
                    event=event,
                    attempt=attempt,
                    error=f"refused {attempt}",
                    ts=time.time(),
                )
            )
        found = {f.notifier: f for f in journal.notifications.failures() if f.review_id == review}
        assert (found["webhook"].count, found["webhook"].last_error) == (2, "refused 2")
        assert (found["email"].count, found["email"].last_event) == (1, "reminder")
        assert journal.notifications.failures(since=time.time() + 60) == []
        assert journal.head() == head  # nothing appended to any chain
        assert journal.verify().ok

    def test_seq_is_dense_across_effects_and_prev_chains_per_effect(self, journal: Journal) -> None:
        entries = populate(journal)
        stored = list(journal.iter_raw())
        assert [r.seq for r in stored] == list(range(1, len(LAYOUT) + 1))
        for eid in (A, B, C):
            chain = journal.read(eid)
            assert [e.seq for e in chain] == [s for s, e, _ in LAYOUT if e == eid]
            assert chain[0].prev == ""
            for earlier, later in itertools.pairwise(chain):
                assert later.prev == earlier.hash
            assert chain == [entries[e.seq] for e in chain]
        assert journal.read(D) == []
        assert journal.row(D) is None

    def test_existing_effect_keeps_its_type_and_a_new_one_needs_one(self, journal: Journal) -> None:
        (first,) = journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        journal.append(A, first.hash, [draft(Kind.AUTHORIZED)])
        row = journal.row(A)
        assert row is not None
        assert row.effect_type == "refund"

        with pytest.raises(ValueError):
            journal.append(B, "", [draft(Kind.PROPOSED)])
        assert journal.row(B) is None
        assert journal.read(B) == []
        assert entry_count(journal) == 2

    def test_a_new_effect_must_start_with_a_state_entry(self, journal: Journal) -> None:
        # an annotation changes no state, so an effect cannot begin with one: refused like any
        # other invalid argument (ValueError, as for a missing effect_type), nothing written
        for kinds in ([Kind.REJECTED_PROPOSAL], [Kind.CONFIRMED, Kind.REJECTED_PROPOSAL]):
            with pytest.raises(ValueError):
                journal.append(A, "", [draft(k) for k in kinds], effect_type="refund")
        assert journal.row(A) is None
        assert journal.read(A) == []
        assert entry_count(journal) == 0

    def test_stale_expected_head_raises_and_writes_nothing(self, journal: Journal) -> None:
        first = journal.append(
            A, "", [draft(Kind.PROPOSED), draft(Kind.AUTHORIZED)], effect_type="refund"
        )
        head = first[-1].hash
        before = (journal.read(A), journal.row(A), journal.head())

        stale_heads = ["", first[0].hash, "0" * 64]
        for stale in stale_heads:
            with pytest.raises(HeadConflict) as caught:
                journal.append(
                    A,
                    stale,
                    [draft(Kind.DISPATCHED)],
                    blobs={"approved": {"amount": 1}},
                )
            assert caught.value.effect_id == A
            assert caught.value.expected == stale

        # an unknown effect has head "": appending to it with a made-up head conflicts too
        with pytest.raises(HeadConflict):
            journal.append(B, head, [draft(Kind.PROPOSED)], effect_type="refund")

        assert (journal.read(A), journal.row(A), journal.head()) == before
        assert journal.row(B) is None
        assert journal.blob(A, "approved") is None
        assert entry_count(journal) == 2

    @pytest.mark.parametrize("shared_instance", [False, True], ids=["two-journals", "one-journal"])
    def test_racing_appends_at_one_head_exactly_one_wins(
        self, open_store: Callable[..., Journal], shared_instance: bool
    ) -> None:
        writers = 4
        rounds = 6
        journals = (
            [open_store()] * writers if shared_instance else [open_store() for _ in range(writers)]
        )
        (first,) = journals[0].append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        head = first.hash
        for round_ in range(rounds):
            barrier = threading.Barrier(writers)
            outcomes: list[Any] = [None] * writers

            def write(
                i: int,
                expected: str = head,
                round_: int = round_,
                barrier: threading.Barrier = barrier,
                outcomes: list[Any] = outcomes,
            ) -> None:
                barrier.wait()
                try:
                    outcomes[i] = journals[i].append(
                        A, expected, [draft(Kind.DISPATCHED, writer=i, round=round_)]
                    )
                except HeadConflict as err:
                    outcomes[i] = err
                except Exception as err:  # anything else is a failure of the test
                    outcomes[i] = ("unexpected", repr(err))

            threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            assert not any(t.is_alive() for t in threads)
            winners = [o for o in outcomes if isinstance(o, list)]
            losers = [o for o in outcomes if isinstance(o, HeadConflict)]
            assert len(winners) == 1, outcomes
            assert len(losers) == writers - 1, outcomes
            (won,) = winners[0]
            assert won.prev == head
            head = won.hash

        chain = journals[0].read(A)
        assert len(chain) == 1 + rounds
        assert chain[0].prev == ""
        for earlier, later in itertools.pairwise(chain):
            assert later.prev == earlier.hash
        assert [r.seq for r in journals[0].iter_raw()] == list(range(1, rounds + 2))
        assert journals[0].verify().ok

    # -- the callable build and the lease read inside the transaction ----------------------

    def _budget_lease(self, journal: Journal, cents: int = 10_000) -> str:
        return journal.leases.issue("agent-1", activities=["refund"], budget_cents=cents)

    @staticmethod
    def _dispatch(
        journal: Journal, eid: str, lease_id: str, cents: int, *, head: str | None = None
    ) -> Entry:
        """A DISPATCHED that reserves ``cents`` (its budget note), after PROPOSED for a new
        effect."""
        dispatched = draft(Kind.DISPATCHED, budget={"lease_id": lease_id, "cents": cents})
        if head is None:
            return journal.append(
                eid, "", [draft(Kind.PROPOSED), dispatched], effect_type="refund"
            )[-1]
        (entry,) = journal.append(eid, head, [dispatched])
        return entry

    @staticmethod
    def _others(journal: Journal, eid: str, lease_id: str) -> int | None:
        """What the dispatch transaction of ``eid`` reads the lease to hold reserved by its
        *other* effects (a build that appends nothing)."""
        seen: list[Lease | None] = []

        def look(lease: Lease | None) -> list[Draft]:
            seen.append(lease)
            return []

        row = journal.row(eid)
        journal.append(eid, "" if row is None else row.head, look, lease_id=lease_id)
        (lease,) = seen
        assert lease is not None
        return lease.reserved_cents

    @staticmethod
    def _reserved(journal: Journal, lease_id: str) -> int | None:
        lease = journal.leases.get(lease_id)
        assert lease is not None
        return lease.reserved_cents

    def test_a_budget_moves_with_the_entries_that_reserve_give_back_and_charge_again(
        self, journal: Journal
    ) -> None:
        lease_id = self._budget_lease(journal)
        first = self._dispatch(journal, A, lease_id, 2_000)
        self._dispatch(journal, B, lease_id, 3_000)
        assert self._reserved(journal, lease_id) == 5_000
        # the lease as each effect's dispatch reads it: what the *others* hold
        assert self._others(journal, A, lease_id) == 3_000
        assert self._others(journal, C, lease_id) == 5_000
        # at most one reservation per effect: a resend reserves nothing more
        again = self._dispatch(journal, A, lease_id, 2_000, head=first.hash)
        assert self._reserved(journal, lease_id) == 5_000
        # it ended without executing: given back, once
        (refused,) = journal.append(A, again.hash, [draft(Kind.REFUSED)])
        assert self._reserved(journal, lease_id) == 3_000
        assert self._others(journal, A, lease_id) == 3_000
        (alarm,) = journal.append(A, refused.hash, [draft(Kind.CONFIRMED)])
        assert self._reserved(journal, lease_id) == 3_000
        # a late COMMITTED after the REFUSED: it executed after all, charged again, once
        (late,) = journal.append(A, alarm.hash, [draft(Kind.COMMITTED, after=Kind.REFUSED.value)])
        assert self._reserved(journal, lease_id) == 5_000
        journal.append(A, late.hash, [draft(Kind.COMMITTED, after=Kind.REFUSED.value)])
        assert self._reserved(journal, lease_id) == 5_000
        assert journal.verify().ok

    def test_a_delegated_leases_budget_moves_on_every_budgeted_ancestor(
        self, journal: Journal
    ) -> None:
        """A reservation under a lease issued from another moves each budgeted ancestor's
        total by the same cents, in the same transaction (read or not by it), and
        ``journal verify`` derives the same totals from the signed entries."""
        root = self._budget_lease(journal)
        middle = journal.leases.issue("agent-2", budget_cents=6_000, parent=root)
        leaf = journal.leases.issue("agent-3", budget_cents=3_000, parent=middle)
        free = journal.leases.issue("agent-4", activities=["refund"])  # no budget
        capped = journal.leases.issue("agent-5", budget_cents=1_000, parent=free)

        def totals() -> list[int | None]:
            return [self._reserved(journal, x) for x in (root, middle, leaf)]

        first = self._dispatch(journal, A, leaf, 2_000)
        self._dispatch(journal, B, root, 1_000)
        self._dispatch(journal, C, capped, 500)
        assert totals() == [3_000, 2_000, 2_000]
        assert self._reserved(journal, capped) == 500
        # the leaf as a dispatch of A reads it: each ancestor with what A's others hold
        seen: list[Lease | None] = []
        journal.append(A, first.hash, lambda lease: seen.append(lease) or [], lease_id=leaf)
        (read,) = seen
        assert read is not None and read.ancestors == [middle, root]
        assert [(a.lease_id, a.reserved_cents) for a in read.delegators or []] == [
            (middle, 0),
            (root, 1_000),
        ]
        (refused,) = journal.append(A, first.hash, [draft(Kind.REFUSED)])
        assert totals() == [1_000, 0, 0]
        journal.append(A, refused.hash, [draft(Kind.COMMITTED, after=Kind.REFUSED.value)])
        assert totals() == [3_000, 2_000, 2_000]
        assert journal.verify().ok

    def test_a_given_back_reservation_is_taken_again_by_a_later_dispatch(
        self, journal: Journal
    ) -> None:
        lease_id = self._budget_lease(journal)
        first = self._dispatch(journal, A, lease_id, 2_000)
        (refused,) = journal.append(A, first.hash, [draft(Kind.REFUSED)])
        assert self._reserved(journal, lease_id) == 0
        self._dispatch(journal, A, lease_id, 1_500, head=refused.hash)
        assert self._reserved(journal, lease_id) == 1_500
        assert self._others(journal, A, lease_id) == 0

    def test_appends_of_one_effect_in_one_transaction_see_each_others_charge(
        self, journal: Journal
    ) -> None:
        """A batch of appends is one transaction (pipelined where the backend pipelines): the
        REFUSED after a DISPATCHED of the same batch gives back what that DISPATCHED reserved,
        and a resend in it reserves nothing more."""
        lease_id = self._budget_lease(journal)
        budget = {"lease_id": lease_id, "cents": 2_000}

        def built(kind: Kind, **data: Any) -> Callable[[Lease | None], list[Draft]]:
            return lambda _lease: [draft(kind, **data)]

        journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        journal.append(B, "", [draft(Kind.PROPOSED)], effect_type="refund")
        # each after whatever the head is then (the batch's earlier appends of its effect)
        batch = [
            (A, None, built(Kind.DISPATCHED, budget=budget), None, lease_id, None),
            (A, None, built(Kind.DISPATCHED, budget=budget), None, lease_id, None),
            (B, None, built(Kind.DISPATCHED, budget=budget), None, lease_id, None),
            (B, None, built(Kind.REFUSED), None, lease_id, None),
        ]
        sql_journal: Any = journal
        outcomes = sql_journal.append_many(batch)
        assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
        assert self._reserved(journal, lease_id) == 2_000
        assert self._others(journal, A, lease_id) == 0
        assert self._others(journal, B, lease_id) == 2_000
        assert journal.verify().ok

    def test_callable_build_receives_the_lease_as_read_in_the_transaction(
        self, journal: Journal
    ) -> None:
        lease_id = journal.leases.issue("agent-1", activities=["refund"])
        assert journal.leases.revoke(lease_id) is True
        seen: list[Lease | None] = []

        def build(lease: Lease | None) -> list[Draft]:
            seen.append(lease)
            return [draft(Kind.PROPOSED), draft(Kind.AUTHORIZED)]

        written = journal.append(A, "", build, effect_type="refund", lease_id=lease_id)
        assert len(written) == 2
        assert len(seen) == 1
        lease = seen[0]
        assert lease is not None
        assert lease.lease_id == lease_id
        assert lease.principal == "agent-1"
        assert lease.revoked_at is not None

        # an unknown lease id, and no lease id, both give the build None
        journal.append(B, "", build, effect_type="refund", lease_id="lease_unknown")
        journal.append(C, "", build, effect_type="refund")
        assert seen[1:] == [None, None]

    def test_a_revoke_racing_the_dispatch_lands_after_it(
        self, open_store: Callable[..., Journal]
    ) -> None:
        journal = open_store()
        operator = open_store()  # another connection to the same store
        lease_id = journal.leases.issue("agent-1")
        revoked: list[bool] = []
        seen: list[Lease | None] = []

        def revoke() -> None:
            revoked.append(operator.leases.revoke(lease_id))

        revoker = threading.Thread(target=revoke)

        def build(lease: Lease | None) -> list[Draft]:
            seen.append(lease)
            revoker.start()
            time.sleep(0.3)  # the revoke must wait for this transaction
            return [draft(Kind.PROPOSED), draft(Kind.AUTHORIZED), draft(Kind.DISPATCHED)]

        written = journal.append(A, "", build, effect_type="refund", lease_id=lease_id)
        revoker.join(timeout=30)
        assert not revoker.is_alive()
        assert revoked == [True]
        assert seen[0] is not None
        assert seen[0].revoked_at is None
        after = journal.leases.get(lease_id)
        assert after is not None
        assert after.revoked_at is not None
        # the revoke committed after the dispatch transaction, not in the middle of it
        assert after.revoked_at >= written[-1].ts

    def test_build_returning_nothing_writes_nothing(self, journal: Journal) -> None:
        calls: list[Lease | None] = []

        def nothing(lease: Lease | None) -> list[Draft]:
            calls.append(lease)
            return []

        assert journal.append(A, "", nothing, effect_type="refund", blobs={"proposed": 1}) == []
        assert calls == [None]
        assert journal.row(A) is None
        assert journal.read(A) == []
        assert journal.blob(A, "proposed") is None
        assert journal.head() is None

        (first,) = journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        assert journal.append(A, first.hash, nothing) == []
        assert journal.append(A, first.hash, []) == []
        row = journal.row(A)
        assert row is not None
        assert row.head == first.hash
        assert entry_count(journal) == 1

    def test_build_that_raises_writes_nothing(self, journal: Journal) -> None:
        class Boom(Exception):
            pass

        def build(lease: Lease | None) -> list[Draft]:
            raise Boom

        with pytest.raises(Boom):
            journal.append(A, "", build, effect_type="refund", blobs={"proposed": 1})
        assert journal.row(A) is None
        assert journal.blob(A, "proposed") is None
        assert entry_count(journal) == 0
        # the store is still usable afterwards
        assert len(journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")) == 1

    # -- appends from coroutines: written together, answered one by one -------------------

    async def test_an_async_append_alone_in_the_process_is_written_at_once(
        self, journal: Journal
    ) -> None:
        # with no other effect in flight there is nothing to share a flush with: the append
        # completes without giving the loop a turn (no hand-off to another thread)
        claim = journal.claim(A)
        assert claim is not None
        coro = journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        with pytest.raises(StopIteration) as done:
            coro.send(None)
        claim.release()
        assert done.value.value == journal.read(A)

    async def test_an_async_append_on_a_shared_loop_lets_the_loop_run_meanwhile(
        self, journal: Journal
    ) -> None:
        # a worker's loop also polls Temporal: even an append with nothing to share a flush
        # with must not hold it while the entries are made durable
        journal.loop_shared = True
        claim = journal.claim(A)
        assert claim is not None
        ran: list[str] = []

        async def poller() -> None:
            ran.append("poller")

        other = asyncio.ensure_future(poller())
        written = await journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        ran.append("append returned")
        claim.release()
        await other
        assert ran == ["poller", "append returned"]
        assert written == journal.read(A)

    @pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="a Linux scheduling policy")
    async def test_the_writer_thread_never_preempts_the_loop_that_hands_it_a_flush(
        self, journal: Journal
    ) -> None:
        journal.loop_shared = True
        await journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        writer = journal.writer_thread_id  # type: ignore[attr-defined]
        assert writer is not None
        assert os.sched_getscheduler(writer) == os.SCHED_BATCH

    async def test_a_batch_waits_for_the_appends_of_other_effects_under_way(
        self, journal: Journal, in_flight: None
    ) -> None:
        journal.commit_delay = 0.5
        first = asyncio.ensure_future(
            journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        )
        await asyncio.sleep(0.05)
        # other effects of this process hold claims: the first append waits for their company
        assert not first.done()
        assert journal.row(A) is None
        second = await journal.append_async(B, "", [draft(Kind.PROPOSED)], effect_type="refund")
        assert first.done()  # the two went in one batch
        assert (await first) == journal.read(A)
        assert second == journal.read(B)

    async def test_observed_appends_say_how_long_their_result_waited_for_the_loop(
        self, journal: Journal, in_flight: None
    ) -> None:
        # the load benchmark's split of the gate's time: the writer thread's end of a batch
        # to the awaiting coroutine running again is the time spent waiting for the loop
        journal.commit_delay = 0.0
        journal.loop_shared = True
        seen: list[Any] = []
        journal.observe_appends = seen.append
        busy_s = 0.15

        async def hog() -> None:
            await asyncio.sleep(0)  # let the batch reach the writer thread first
            time.sleep(busy_s)  # then hold the loop while the writer finishes

        hogging = asyncio.ensure_future(hog())
        written = await asyncio.gather(
            *[
                journal.append_async(eid, "", [draft(Kind.PROPOSED)], effect_type="refund")
                for eid in (A, B)
            ]
        )
        await hogging
        assert written == [journal.read(A), journal.read(B)]
        assert sorted(t.effect_id for t in seen) == sorted([A, B])
        for t in seen:
            assert t.submitted <= t.started < t.written <= t.resumed
            assert t.batch >= 1
        # the first batch's result came back while the loop was held
        assert max(t.loop_wait for t in seen) >= busy_s / 2
        # and unobserved, the append is the plain future, as before: no coroutine in between
        journal.observe_appends = None
        group = journal.group_commit()  # type: ignore[attr-defined]
        pending = group.submit((C, "", [draft(Kind.PROPOSED)], "refund", None, None))
        assert asyncio.isfuture(pending)
        assert (await pending) == journal.read(C)

    async def test_a_lone_effect_never_waits_for_company(self, journal: Journal) -> None:
        journal.commit_delay = 60.0
        journal.loop_shared = True  # through the group commit, as in a worker
        claim = journal.claim(A)
        assert claim is not None
        try:
            written = await asyncio.wait_for(
                journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="refund"), 10
            )
        finally:
            claim.release()
        assert written == journal.read(A)

    async def test_concurrent_async_appends_each_get_their_own_outcome(
        self, journal: Journal, in_flight: None
    ) -> None:
        (first,) = journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        ids = [effect_id("conformance.batch", n) for n in range(12)]

        def boom(lease: Lease | None) -> list[Draft]:
            raise ValueError("this build fails")

        calls = [
            journal.append_async(
                eid,
                "",
                [draft(Kind.PROPOSED, n=n), draft(Kind.DISPATCHED, n=n)],
                effect_type="batch",
                blobs={"approved": [n]},
            )
            for n, eid in enumerate(ids)
        ]
        calls.insert(3, journal.append_async(A, "f" * 64, [draft(Kind.DISPATCHED)]))  # stale
        calls.insert(7, journal.append_async(B, "", boom, effect_type="refund"))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)

        assert isinstance(outcomes.pop(7), ValueError)
        assert isinstance(outcomes.pop(3), HeadConflict)
        for n, (eid, written) in enumerate(zip(ids, outcomes, strict=True)):
            assert isinstance(written, list), written
            assert [e.kind for e in written] == [Kind.PROPOSED, Kind.DISPATCHED]
            assert [e.data["n"] for e in written] == [n, n]
            assert written[0].prev == "" and written[1].prev == written[0].hash
            assert journal.read(eid) == written
            assert journal.blob(eid, "approved") == [n]
        # nothing of the failed ones, and the chain of the stale one is untouched
        assert journal.read(A) == [first]
        assert journal.row(B) is None
        stored = [r.seq for r in journal.iter_raw()]
        assert stored == list(range(1, 2 + 2 * len(ids)))
        assert journal.verify().ok

    async def test_async_appends_racing_at_one_head_exactly_one_wins(
        self, journal: Journal, in_flight: None
    ) -> None:
        outcomes = await asyncio.gather(
            *[
                journal.append_async(A, "", [draft(Kind.PROPOSED, writer=i)], effect_type="refund")
                for i in range(5)
            ],
            return_exceptions=True,
        )
        winners = [o for o in outcomes if isinstance(o, list)]
        assert len(winners) == 1, outcomes
        assert sum(isinstance(o, HeadConflict) for o in outcomes) == 4, outcomes
        assert journal.read(A) == winners[0]

    @pytest.mark.parametrize("position", ["middle", "last"])
    async def test_an_append_after_a_row_that_lags_its_chain_fails_alone_in_its_batch(
        self, journal: Journal, tamper: SqlTamper, in_flight: None, position: str
    ) -> None:
        """An index row whose head is not the entry its ``head_seq`` names (it lags its chain
        by one entry) lets an append past the head check; the append reads the entry at
        ``head_seq`` with the row and refuses to write after it (its chain would fork). That
        append alone fails, wherever it stands in its batch."""
        first, second = journal.append(
            A, "", [draft(Kind.PROPOSED), draft(Kind.AUTHORIZED)], effect_type="refund"
        )
        tamper.edit_row(A, "head", first.hash)  # the index row lags its chain by one entry
        with pytest.raises(JournalCorrupt) as caught:
            journal.append(A, first.hash, [draft(Kind.DISPATCHED)])
        assert (caught.value.effect_id, caught.value.seq) == (A, second.seq)
        ids = [effect_id("conformance.backstop", (position, n)) for n in range(4)]
        calls = [
            journal.append_async(eid, "", [draft(Kind.PROPOSED, n=n)], effect_type="batch")
            for n, eid in enumerate(ids)
        ]
        at = 2 if position == "middle" else len(calls)
        calls.insert(at, journal.append_async(A, first.hash, [draft(Kind.DISPATCHED)]))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)

        assert isinstance(outcomes.pop(at), JournalCorrupt), outcomes
        for n, (eid, written) in enumerate(zip(ids, outcomes, strict=True)):
            assert isinstance(written, list), written
            assert [e.data["n"] for e in written] == [n]
            assert journal.read(eid) == written
        chain = [r.hash for r in journal.iter_raw() if r.effect_id == A]
        assert chain == [first.hash, second.hash]
        assert [r.seq for r in journal.iter_raw()] == list(range(1, 3 + len(ids)))

    async def test_an_async_append_cancelled_before_it_is_written_writes_nothing(
        self, journal: Journal, in_flight: None
    ) -> None:
        first = asyncio.ensure_future(
            journal.append_async(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        )
        second = asyncio.ensure_future(
            journal.append_async(B, "", [draft(Kind.PROPOSED)], effect_type="refund")
        )
        await asyncio.sleep(0)  # both are queued; neither is written yet
        second.cancel()
        assert len(await first) == 1
        with pytest.raises(asyncio.CancelledError):
            await second
        assert journal.row(B) is None
        # and what comes after is written as usual
        assert len(await journal.append_async(B, "", [draft(Kind.PROPOSED)], effect_type="x")) == 1

    # -- blobs -------------------------------------------------------------------------------

    def test_blobs_are_stored_beside_the_entries(self, journal: Journal) -> None:
        proposed = {"order": "o-1", "amount_cents": 3000, "note": "café", "items": [1, 2.5]}
        (first,) = journal.append(
            A,
            "",
            [draft(Kind.PROPOSED)],
            effect_type="refund",
            blobs={"proposed": proposed, "approved": {"amount_cents": 2500}},
        )
        assert journal.blob(A, "proposed") == proposed
        assert journal.blob(A, "approved") == {"amount_cents": 2500}
        assert journal.blob(A, "result") is None
        assert journal.blob(B, "proposed") is None

        journal.append(A, first.hash, [draft(Kind.COMMITTED)], blobs={"result": ["ok", None]})
        assert journal.blob(A, "result") == ["ok", None]
        assert journal.blob(A, "proposed") == proposed

    def test_the_latest_value_of_a_name_wins(self, journal: Journal) -> None:
        first, second = journal.append(
            A,
            "",
            [draft(Kind.PROPOSED), draft(Kind.DISPATCHED)],
            effect_type="refund",
            blobs={"approved": {"amount_cents": 2500}},
        )
        assert second.prev == first.hash
        (noted,) = journal.append(A, second.hash, [draft(Kind.CONFIRMED)])
        (again,) = journal.append(
            A, noted.hash, [draft(Kind.DISPATCHED)], blobs={"approved": {"amount_cents": 2000}}
        )
        journal.append(A, again.hash, [draft(Kind.COMMITTED)], blobs={"result": "ok"})
        assert journal.blob(A, "approved") == {"amount_cents": 2000}
        assert journal.blob(A, "result") == "ok"

    @pytest.fixture
    def open_schema3(
        self, journal_factory: Callable[..., Journal]
    ) -> Iterator[Callable[[], Journal]]:
        """Open the previous release's journal after ``tamper.load_schema3()``: signed now with
        this suite's key, the fixture's key kept to verify what it signed (a rotation)."""
        opened: list[Journal] = []

        def open_() -> Journal:
            journal = journal_factory(signing_key=scheme_key(KEY), older_keys=[SCHEMA3_KEY])
            opened.append(journal)
            return journal

        yield open_
        for journal in opened:
            journal.close()

    def test_a_journal_of_the_previous_release_migrates_and_binds_its_values(
        self, open_schema3: Callable[[], Journal], tamper: SqlTamper
    ) -> None:
        tamper.load_schema3()
        _, fixture_entries = schema3_rows()["entries"]
        before = schema3_values()
        valued = {eid for eid, _ in before}
        assert len(valued) == 4 and len(fixture_entries) == 15  # the fixture as committed

        journal = open_schema3()
        assert journal.schema_version() == SCHEMA_VERSION
        raw = list(journal.iter_raw())
        # the old entries stay exactly as written; one signed VALUES_BOUND per valued effect
        assert [(r.seq, r.hash, r.sig, r.body) for r in raw[:15]] == [
            (row[0], row[4], row[6], bytes(row[7])) for row in sorted(fixture_entries)
        ]
        # and one signed entry per lease, the chain its row is sealed with (schema 10)
        bound = [r for r in raw[15:] if r.kind == "VALUES_BOUND"]
        leases = [r for r in raw[15:] if r.effect_id.startswith("lease:")]
        assert len(bound) + len(leases) == len(raw) - 15
        assert {r.effect_id for r in bound} == valued and len(bound) == len(valued)
        assert {r.effect_id for r in leases} == {
            f"lease:{x.lease_id}" for x in journal.leases.list()
        }
        assert leases and all(r.kind == "CONFIG" for r in leases)
        assert all(r.key_id == key_id(KEY) for r in bound + leases)
        report = journal.verify()
        assert report.ok, report
        assert report.entries == 15 + len(valued) + len(leases)
        assert {(e, n): journal.blob(e, n) for e, n in before} == before
        # reopening does not bind again
        journal.close()
        assert len(list(open_schema3().iter_raw())) == 15 + len(valued) + len(leases)

    def test_an_edited_value_of_the_previous_release_is_named_after_migration(
        self, open_schema3: Callable[[], Journal], tamper: SqlTamper
    ) -> None:
        tamper.load_schema3()
        journal = open_schema3()
        (in_doubt,) = journal.in_doubt()
        (seq,) = [e.seq for e in journal.read(in_doubt.effect_id) if e.kind is Kind.DISPATCHED]
        vals = tamper.vals(seq)
        assert vals is not None and '"amount_cents":1500' in vals
        tamper.edit_vals(seq, vals.replace('"amount_cents":1500', '"amount_cents":4900'))
        report = journal.verify()
        assert not report.ok and report.first_bad_seq == seq, report
        with pytest.raises(JournalCorrupt) as caught:
            journal.read(in_doubt.effect_id)
        assert (caught.value.effect_id, caught.value.seq) == (in_doubt.effect_id, seq)

    def test_a_schema_2_store_keeps_its_values(
        self, open_schema3: Callable[[], Journal], tamper: SqlTamper
    ) -> None:
        tamper.load_schema3()
        before = schema3_values()
        tamper.to_schema_2()
        journal = open_schema3()
        assert journal.schema_version() == SCHEMA_VERSION
        assert journal.verify().ok
        # schema 3 kept each effect's latest value of each name on its head entry
        assert {(e, n): journal.blob(e, n) for e, n in before} == before

    def test_a_schema_7_store_keeps_its_lease_charges(
        self, open_store: Callable[..., Journal], tamper: SqlTamper
    ) -> None:
        """Schema 7 kept each effect's lease charge in a table of its own; the migration moves
        live and given-back charges onto the effects' rows: the budgets read the same, and each
        charge is still given back, kept or charged again as before."""
        journal = open_store()
        lease_id = self._budget_lease(journal)
        live = self._dispatch(journal, A, lease_id, 2_000)
        given = self._dispatch(journal, B, lease_id, 3_000)
        (refused,) = journal.append(B, given.hash, [draft(Kind.REFUSED)])
        other = self._dispatch(journal, C, lease_id, 1_000)
        before = {eid: self._others(journal, eid, lease_id) for eid in (A, B, C)}
        assert before == {A: 1_000, B: 3_000, C: 2_000}
        assert self._reserved(journal, lease_id) == 3_000
        journal.close()

        tamper.to_schema_7()
        assert sorted(tamper._query("SELECT effect_id, cents, active FROM lease_charges")) == (
            sorted([(A, 2_000, 1), (B, 3_000, 0), (C, 1_000, 1)])
        )
        journal = open_store()
        assert journal.schema_version() == SCHEMA_VERSION
        assert "lease_charges" not in tamper._tables()
        assert self._reserved(journal, lease_id) == 3_000
        assert {eid: self._others(journal, eid, lease_id) for eid in (A, B, C)} == before
        # the live charge is kept by a resend and given back by a REFUSED; the given-back one
        # is charged again by a late COMMITTED
        self._dispatch(journal, A, lease_id, 2_000, head=live.hash)
        assert self._reserved(journal, lease_id) == 3_000
        journal.append(C, other.hash, [draft(Kind.REFUSED)])
        assert self._reserved(journal, lease_id) == 2_000
        journal.append(B, refused.hash, [draft(Kind.COMMITTED, after=Kind.REFUSED.value)])
        assert self._reserved(journal, lease_id) == 5_000
        assert journal.verify().ok

    def test_a_verify_only_open_cannot_migrate_values_it_cannot_sign(
        self, journal_factory: Callable[..., Journal], tamper: SqlTamper
    ) -> None:
        tamper.load_schema3()
        auditor = Ed25519Key(bytes.fromhex(OTHER_KEY)).public_text
        with pytest.raises(JournalConfigError, match="signing key"):
            journal_factory(signing_key=None, older_keys=[SCHEMA3_KEY], public_keys=[auditor])

    # -- values are signed, and every read checks them ------------------------------------------

    def test_an_edited_value_is_named_by_its_seq(self, journal: Journal, tamper: Tamper) -> None:
        (_, dispatched) = journal.append(
            A,
            "",
            [draft(Kind.PROPOSED), draft(Kind.DISPATCHED)],
            effect_type="refund",
            blobs={"approved": [{"amount_cents": 2000}]},
        )
        journal.append(B, "", [draft(Kind.PROPOSED)], effect_type="refund")
        assert journal.verify().ok
        tamper.edit_vals(dispatched.seq, '{"approved":[{"amount_cents":9000}]}')
        report = journal.verify()
        assert not report.ok and report.first_bad_seq == dispatched.seq, report
        assert report.problem is not None and "values" in report.problem
        for read in (lambda: journal.read(A), lambda: journal.blob(A, "approved")):
            with pytest.raises(JournalCorrupt) as caught:
                read()
            assert (caught.value.effect_id, caught.value.seq) == (A, dispatched.seq)
        assert journal.blob(B, "approved") is None  # other effects read as before

    @pytest.mark.parametrize("vals", [None, '{"result":"ok"}'])
    def test_a_value_deleted_or_added_outside_the_journal_is_caught(
        self, journal: Journal, tamper: Tamper, vals: str | None
    ) -> None:
        first, second = journal.append(
            A, "", [draft(Kind.PROPOSED), draft(Kind.DISPATCHED)], effect_type="refund"
        )
        journal.append(A, second.hash, [draft(Kind.COMMITTED)], blobs={"result": "fine"})
        seq = first.seq if vals else second.seq + 1
        tamper.edit_vals(seq, vals)
        report = journal.verify()
        assert not report.ok and report.first_bad_seq == seq, report
        with pytest.raises(JournalCorrupt):
            journal.read(A)

    def test_an_edit_in_the_middle_of_a_chain_is_caught_when_the_effect_is_read(
        self, journal: Journal, tamper: Tamper
    ) -> None:
        entries = populate(journal)
        doc = json.loads(entries[4].body)  # A's DISPATCHED, between two of its entries
        doc["data"] = {"n": 4, "amount_cents": 999999}
        tamper.edit_body(4, rfc8785.dumps(doc))
        with pytest.raises(JournalCorrupt) as caught:
            journal.read(A)
        assert (caught.value.effect_id, caught.value.seq) == (A, 4)
        assert "seq=4" in str(caught.value)
        assert [e.seq for e in journal.read(B)] == [3, 5]  # other effects read as before

    @pytest.mark.parametrize(
        ("column", "value"),
        [
            ("status", "COMMITTED"),
            ("head", "0" * 64),
            ("head_seq", 2),
            ("effect_type", "conformance.other"),
            ("updated_ts", 1.0),
            ("first_dispatch_ts", 1.0),
            ("last_dispatch_ts", None),
            ("origin", "f" * 64),
        ],
    )
    def test_an_edited_effects_row_is_named_by_its_effects_head(
        self, journal: Journal, tamper: Tamper, column: str, value: Any
    ) -> None:
        populate(journal)
        tamper.edit_row(B, column, value)
        report = journal.verify()
        assert not report.ok and report.first_bad_seq == 5, report
        assert report.problem is not None and column in report.problem
        with pytest.raises(JournalCorrupt) as caught:
            journal.read(B)
        # a read walks the chain back from the row's head_seq: an edited one names another
        # effect's entry (A's), where it finds none of B's
        named = value if column == "head_seq" else 5
        assert (caught.value.effect_id, caught.value.seq) == (B, named)

    @pytest.mark.parametrize(
        ("seq", "prev_seq"),
        [
            (7, None),  # A's last entry: the walk stops there
            (7, 2),  # ... skips A's DISPATCHED
            (7, 6),  # ... goes to C's PROPOSED
            (7, 8),  # ... points forward (never followed)
            (7, 7),  # ... at itself
            (4, 1),  # A's DISPATCHED skips its AUTHORIZED
            (4, 3),  # ... goes to B's PROPOSED, a first entry
            (2, None),  # A's AUTHORIZED: the walk stops before its first entry
            (5, None),  # B's last
            (1, 3),  # A's first entry points back at B's (a walk that went on would read it)
        ],
    )
    def test_an_edited_prev_seq_never_makes_a_read_accept_a_wrong_chain(
        self, journal: Journal, tamper: SqlTamper, seq: int, prev_seq: int | None
    ) -> None:
        """Reads walk an effect's chain back along ``prev_seq``, which is not signed. Whatever
        it is edited to, the read either returns the effect's whole chain or raises
        ``JournalCorrupt`` naming the entry the walk went wrong at; it never returns a part of
        the chain, nor another effect's entry. Verify does not read ``prev_seq`` at all. (The
        index that allows one successor per entry would refuse some of these edits; its
        operator drops it first.)"""
        entries = populate(journal)
        chains = {eid: [e for e in entries.values() if e.effect_id == eid] for eid in (A, B, C)}
        tamper._run(
            ("DROP INDEX entries_next", ()),
            ("UPDATE entries SET prev_seq = ? WHERE seq = ?", (prev_seq, seq)),
        )
        for eid, chain in chains.items():
            try:
                assert journal.read(eid) == chain
            except JournalCorrupt as caught:
                assert caught.effect_id == eid == entries[seq].effect_id
                assert caught.seq == seq, (caught.seq, str(caught))
        assert journal.verify().ok
        if seq != 1:  # the first entry's prev_seq is never followed: nothing to refuse
            with pytest.raises(JournalCorrupt):
                journal.read(entries[seq].effect_id)

    def test_verify_names_an_entry_forked_from_its_chain(
        self, journal: Journal, tamper: SqlTamper
    ) -> None:
        """A fork written beside the journal, signed with its key, after its operator dropped
        the index that allows one successor per entry (``entries_next``): verify does not
        depend on it, and names the entry whose prev is not its effect's previous entry."""
        entries = populate(journal)
        tamper._run(("DROP INDEX entries_next", ()))
        fork = encode_entry(
            seq=len(LAYOUT) + 1,
            ts=time.time(),
            effect_id=A,
            kind=Kind.DISPATCHED,
            prev=entries[2].hash,  # A's AUTHORIZED, which A's DISPATCHED (seq 4) follows
            key=journal.keyring.signing,
            data={"n": "fork"},
        )
        tamper._run(
            (
                "INSERT INTO entries (seq, effect_id, kind, prev, hash, key_id, sig, body, "
                "prev_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    fork.seq,
                    A,
                    fork.kind.value,
                    fork.prev,
                    fork.hash,
                    fork.key_id,
                    fork.sig,
                    fork.body,
                    2,
                ),
            )
        )
        report = journal.verify()
        assert not report.ok and report.first_bad_seq == fork.seq, report
        assert report.problem is not None and "forked" in report.problem
        # moved onto the fork, the effect's row reads a sound chain; verify still names it
        tamper.edit_row(A, "head", fork.hash)
        tamper.edit_row(A, "head_seq", fork.seq)
        tamper.edit_row(A, "status", "DISPATCHED")
        for column in ("updated_ts", "first_dispatch_ts", "last_dispatch_ts"):
            tamper.edit_row(A, column, fork.ts)
        assert [e.seq for e in journal.read(A)] == [1, 2, fork.seq]
        again = journal.verify()
        assert not again.ok and again.first_bad_seq == fork.seq, again

    def test_an_older_row_put_back_is_refused_at_the_read(
        self, journal: Journal, tamper: SqlTamper
    ) -> None:
        """The row is where a read starts its walk back, so an older row put back whole (head,
        seq, status, times) would hide the entries after it: the read also takes the entry
        after the row's head (``entries_next``), and refuses; no append can fork after it
        either, whatever the row says (one successor per entry)."""
        entries = populate(journal)
        row = journal.row(A)
        assert row is not None and row.head_seq == 7  # A: 1, 2, 4, 7 (COMMITTED)
        older = entries[4]
        tamper.edit_row(A, "head", older.hash)
        tamper.edit_row(A, "head_seq", older.seq)
        tamper.edit_row(A, "status", "DISPATCHED")
        tamper.edit_row(A, "updated_ts", older.ts)
        with pytest.raises(JournalCorrupt) as caught:
            journal.read(A)
        assert caught.value.seq == 7, str(caught.value)
        # an append after the older head is refused by the index, and adds nothing
        before = entry_count(journal)
        with pytest.raises((HeadConflict, JournalCorrupt)):
            journal.append(A, older.hash, [draft(Kind.COMMITTED)])
        assert entry_count(journal) == before
        assert not verified(journal).ok

    def test_the_rows_head_is_the_appends_fork_backstop(self, journal: Journal) -> None:
        """An append's row write (``PUT_ROW``) moves an existing row on only from the head the
        append read, and never writes a new effect's row over an existing one: a writer that
        read a head another has moved on from, or no row where another has written one, has
        its transaction refused (``refused``: ``HeadConflict``), entries and all."""
        assert isinstance(journal, SqlJournal)
        (first,) = journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        (second,) = journal.append(A, first.hash, [draft(Kind.AUTHORIZED)])
        row = journal.row(A)
        assert row is not None
        kept = (row.effect_id, row.effect_type, row.status.value)
        times = (row.updated_ts, row.first_dispatch_ts, row.last_dispatch_ts, row.origin)

        def put(read: str, head: str, head_seq: int) -> None:
            def run(db: Any) -> None:
                journal.execute(
                    db,
                    f"INSERT INTO entries ({ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (head_seq, A, "CONFIRMED", second.hash, head, "k", "s", b"{}", None),
                )
                journal.execute(db, PUT_ROW, (*kept, head, head_seq, *times, None, 0, 0, read))

            journal.writing(run)

        for read in (first.hash, ""):  # a head moved on from since; no row at all
            with pytest.raises(Exception) as caught:
                put(read, "e" * 64, second.seq + 1)
            assert journal.refused(caught.value), caught.value
            assert journal.row(A) == row
            assert journal.read(A) == [first, second]
            assert journal.head() == JournalHead(seq=second.seq, hash=second.hash)

    def test_a_blob_that_cannot_be_stored_rolls_back_the_entries(self, journal: Journal) -> None:
        with pytest.raises(UnserializableInput):
            journal.append(
                A,
                "",
                [draft(Kind.PROPOSED), draft(Kind.DISPATCHED)],
                effect_type="refund",
                blobs={"proposed": {"ok": 1}, "approved": float("nan")},
            )
        assert journal.row(A) is None
        assert journal.read(A) == []
        assert journal.blob(A, "proposed") is None
        assert journal.in_doubt() == []
        assert entry_count(journal) == 0

    # -- the effects index -------------------------------------------------------------------

    def test_an_effect_is_found_by_the_origin_its_first_entry_signs(self, journal: Journal) -> None:
        delivery = {"workflow_id": "wf", "run_id": "run", "activity_id": "3", "attempt": 2}
        (first,) = journal.append(
            A,
            "",
            [draft(Kind.PROPOSED, delivery=delivery, input_digest="d" * 64)],
            effect_type="refund",
        )
        journal.append(B, "", [draft(Kind.PROPOSED, delivery=delivery)], effect_type="refund")
        origin = origin_of("wf", "run", "3", "d" * 64)
        assert origin is not None
        assert journal.by_origin(origin) == [A]
        # later entries do not move it
        journal.append(
            A, first.hash, [draft(Kind.DISPATCHED, delivery={**delivery, "run_id": "x"})]
        )
        assert journal.by_origin(origin) == [A]
        row_a, row_b = journal.row(A), journal.row(B)
        assert row_a is not None and row_a.origin == origin
        assert row_b is not None and row_b.origin is None
        assert journal.verify().ok

    def test_status_follows_the_last_entry_that_is_not_an_annotation(
        self, journal: Journal
    ) -> None:
        def step(kinds: list[Kind]) -> Kind:
            row = journal.row(A)
            written = journal.append(
                A, "" if row is None else row.head, [draft(k) for k in kinds], effect_type="refund"
            )
            row = journal.row(A)
            assert row is not None
            assert row.head == written[-1].hash
            assert row.head_seq == written[-1].seq
            return row.status

        assert step([Kind.PROPOSED]) is Kind.PROPOSED
        assert step([Kind.AUTHORIZED, Kind.DISPATCHED]) is Kind.DISPATCHED
        assert step([Kind.REJECTED_PROPOSAL]) is Kind.DISPATCHED
        assert step([Kind.COMMITTED, Kind.CONFIRMED]) is Kind.COMMITTED
        assert step([Kind.REJECTED_PROPOSAL]) is Kind.COMMITTED
        assert step([Kind.CONFIRMED, Kind.REJECTED_PROPOSAL]) is Kind.COMMITTED
        assert step([Kind.REOPENED]) is Kind.REOPENED
        assert step([Kind.RESOLVED, Kind.CONFIRMED]) is Kind.RESOLVED

    def test_in_doubt_lists_exactly_the_dispatched_effects(self, journal: Journal) -> None:
        def write(eid: str, kinds: list[Kind]) -> None:
            row = journal.row(eid)
            journal.append(
                eid, "" if row is None else row.head, [draft(k) for k in kinds], effect_type="t"
            )

        write(A, [Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED])
        write(B, [Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED, Kind.COMMITTED])
        write(C, [Kind.PROPOSED, Kind.AUTHORIZED])
        write(D, [Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED])
        write(D, [Kind.REJECTED_PROPOSAL])
        write(E, [Kind.PROPOSED, Kind.DISPATCHED, Kind.AMBIGUOUS])

        assert {r.effect_id for r in journal.in_doubt()} == {A, D}
        assert all(r.status is Kind.DISPATCHED for r in journal.in_doubt())
        assert {r.effect_id for r in journal.effects(in_doubt=True)} == {A, D}
        assert {r.effect_id for r in journal.effects(status=Kind.COMMITTED)} == {B}
        assert {r.effect_id for r in journal.effects(status=Kind.AUTHORIZED)} == {C}
        assert {r.effect_id for r in journal.effects()} == {A, B, C, D, E}
        assert len(journal.effects(limit=2)) == 2
        # nothing here is an hour old; everything is at least 0 s old
        assert journal.in_doubt(older_than=3600) == []
        assert {r.effect_id for r in journal.in_doubt(older_than=0)} == {A, D}

        # confirming the send takes the effect out of doubt
        write(A, [Kind.COMMITTED])
        assert {r.effect_id for r in journal.in_doubt()} == {D}

    def test_effects_are_listed_newest_first(self, journal: Journal) -> None:
        for eid in (A, B, C):
            journal.append(eid, "", [draft(Kind.PROPOSED)], effect_type="t")
            time.sleep(0.01)
        assert [r.effect_id for r in journal.effects()] == [C, B, A]

    def test_first_and_last_dispatch_times(self, journal: Journal) -> None:
        journal.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        row = journal.row(A)
        assert row is not None
        assert row.first_dispatch_ts is None
        assert row.last_dispatch_ts is None

        (first,) = journal.append(A, row.head, [draft(Kind.DISPATCHED)])
        row = journal.row(A)
        assert row is not None
        assert row.first_dispatch_ts == first.ts
        assert row.last_dispatch_ts == first.ts

        time.sleep(0.01)
        (note,) = journal.append(A, row.head, [draft(Kind.REJECTED_PROPOSAL)])
        row = journal.row(A)
        assert row is not None
        assert row.updated_ts == note.ts
        assert row.last_dispatch_ts == first.ts

        time.sleep(0.01)
        (again,) = journal.append(A, row.head, [draft(Kind.DISPATCHED)])
        assert again.ts > first.ts
        row = journal.row(A)
        assert row is not None
        assert row.first_dispatch_ts == first.ts
        assert row.last_dispatch_ts == again.ts

        journal.append(A, row.head, [draft(Kind.COMMITTED)])
        row = journal.row(A)
        assert row is not None
        assert (row.first_dispatch_ts, row.last_dispatch_ts) == (first.ts, again.ts)

    # -- verify --------------------------------------------------------------------------------

    def test_verify_passes_on_a_good_journal(self, journal: Journal) -> None:
        entries = populate(journal)
        report = verified(journal)
        assert report.ok, report
        assert report.entries == len(LAYOUT)
        assert report.effects == 3
        assert report.first_bad_seq is None
        last = entries[len(LAYOUT)]
        assert report.head == JournalHead(seq=last.seq, hash=last.hash)
        assert journal.head() == report.head
        assert str(report).startswith("ok")

    def test_verify_passes_on_an_empty_journal(self, journal: Journal) -> None:
        report = verified(journal)
        assert report.ok
        assert report.entries == 0
        assert journal.head() is None

    def test_verify_detects_an_edited_body(self, journal: Journal, tamper: Tamper) -> None:
        entries = populate(journal)
        doc = json.loads(entries[5].body)
        doc["data"] = {"n": 5, "amount_cents": 999999}
        tamper.edit_body(5, rfc8785.dumps(doc))
        report = verified(journal)
        assert not report.ok
        assert report.first_bad_seq == 5
        assert report.entries == 4
        assert "seq=5" in str(report)

    def test_verify_detects_an_edited_body_with_its_hash_recomputed(
        self, journal: Journal, tamper: Tamper
    ) -> None:
        entries = populate(journal)
        doc = json.loads(entries[4].body)
        doc["data"] = {"n": 4, "amount_cents": 999999}
        body = rfc8785.dumps(doc)
        tamper.edit_body(4, body)
        tamper.edit_column(4, "hash", hashlib.sha256(body).hexdigest())
        report = verified(journal)
        assert not report.ok
        assert report.first_bad_seq == 4
        assert report.problem is not None
        assert "signature" in report.problem

    @pytest.mark.parametrize(
        ("seq", "column", "value"),
        [
            (5, "kind", "COMMITTED"),
            (5, "prev", "0" * 64),
            (3, "effect_id", D),
            (6, "key_id", "hmac-0000000000000000"),
            (2, "sig", "0" * 64),
        ],
    )
    def test_verify_detects_an_edited_column(
        self, journal: Journal, tamper: Tamper, seq: int, column: str, value: str
    ) -> None:
        populate(journal)
        tamper.edit_column(seq, column, value)
        report = verified(journal)
        assert not report.ok
        assert report.first_bad_seq == seq
        assert report.entries == seq - 1

    @pytest.mark.parametrize("combined", [False, True], ids=["separate", "combined"])
    def test_the_short_path_reports_every_edit_as_the_full_check_does(
        self, journal: Journal, tamper: Tamper, combined: bool
    ) -> None:
        """``verify`` checks the common entry on a short path and leaves the rest to the full
        per-entry check: every edit of every stored column, body, value and index row is
        reported exactly as the full check alone reports it, and none passes. With the
        dispatch transaction's entries separate, and combined as one of format 3."""
        assert isinstance(journal, SqlJournal)
        journal.combine_dispatch = combined
        populate(journal)
        delivery = {"workflow_id": "wf-1", "run_id": "run-1", "activity_id": "7"}
        *_, dispatched = journal.append(
            D,
            "",
            [
                Draft(kind=Kind.PROPOSED, data={"delivery": delivery, "input_digest": "ab" * 32}),
                draft(Kind.AUTHORIZED, decided_by=["lease"]),
                draft(Kind.DISPATCHED, via="dispatch"),
            ],
            effect_type="conformance.email",
            blobs={"approved": [{"amount_cents": 2000}]},
        )
        journal.append(D, dispatched.hash, [draft(Kind.COMMITTED)], blobs={"result": "fine"})
        row = journal.row(D)
        assert row is not None and row.origin is not None

        def checked(in_ranges: bool = False) -> VerifyReport:
            # each kind of edit also in ranges (``verified``), on one entry and one row
            fast = verified(journal) if in_ranges else journal.verify()
            full = verify_stored(
                journal.iter_raw_batches(),
                journal.keyring,
                None,
                journal.row_values(),
                journal.anchor_entries(),
                short=False,
            )
            # the journal's verify adds its control-plane check (no lease here: nothing to find)
            assert fast.model_copy(update={"control": None}) == full
            return fast

        assert checked(in_ranges=True).ok
        raws = list(journal.iter_raw())
        d_raws = [r for r in raws if r.effect_id == D]
        assert [r.kind for r in d_raws][-2:] == ["DISPATCHED", "COMMITTED"]
        assert len(d_raws) == (2 if combined else 4)
        # an effect's first entry, one between two of its effect's, D's first (an origin), D's
        # DISPATCHED (values beside it; combined, the same) and the last (the journal's head)
        for raw in (raws[0], raws[3], *{d_raws[0], d_raws[-2]}, raws[-1]):
            other = raws[raw.seq % len(raws)]  # the next entry, another effect's or kind
            edits: list[tuple[str, Any]] = [
                # (the store refuses a second first entry of an effect: no fork)
                ("effect_id", other.effect_id if raw.prev else E),
                ("kind", other.kind if other.kind != raw.kind else "COMMITTED"),
                ("prev", "0" * 64),
                ("prev", other.hash if other.effect_id != raw.effect_id else "f" * 64),
                ("hash", "0" * 64),
                ("key_id", "hmac-0000000000000000"),
                ("sig", other.sig),
                ("body", raw.body.replace(b'"v":2', b'"v":3')),
                ("body", raw.body.replace(b'"v":3', b'"v":2')),
                ("body", raw.body[:20] + bytes([raw.body[20] ^ 1]) + raw.body[21:]),
                ("vals", '{"result":"edited"}'),
                ("vals", None),
            ]
            for column, value in edits:
                stored = getattr(raw, column)
                if value == stored:
                    continue
                for edited in (value, stored):
                    if column == "body":
                        tamper.edit_body(raw.seq, edited)
                    elif column == "vals":
                        tamper.edit_vals(raw.seq, edited)
                    else:
                        tamper.edit_column(raw.seq, column, edited)
                    if edited is value:
                        report = checked(in_ranges=raw is raws[3])
                        assert not report.ok and report.first_bad_seq == raw.seq, (column, report)
        assert checked().ok
        rows = {r.effect_id: r for r in journal.iter_rows()}
        for eid, row in ((B, rows[B]), (D, rows[D])):
            for column, value in [
                ("status", "REFUSED" if row.status is not Kind.REFUSED else "COMMITTED"),
                ("head", "0" * 64),
                ("head_seq", row.head_seq - 1),
                ("effect_type", "conformance.other"),
                ("updated_ts", row.updated_ts + 1),
                ("first_dispatch_ts", 1.0),
                ("last_dispatch_ts", 2.0),
                ("origin", "f" * 64),
            ]:
                tamper.edit_row(eid, column, value)
                report = checked(in_ranges=eid == B)
                assert not report.ok and report.first_bad_seq == row.head_seq, (column, report)
                stored = getattr(row, column)
                tamper.edit_row(eid, column, stored.value if column == "status" else stored)
        assert checked().ok

    @pytest.mark.parametrize("dropped", [1, 4, 7])
    def test_verify_detects_a_dropped_entry(
        self, journal: Journal, tamper: Tamper, dropped: int
    ) -> None:
        populate(journal)
        tamper.delete(dropped)
        report = verified(journal)
        assert not report.ok
        # the gap is found at the entry after it, and the report names the missing seq
        assert report.first_bad_seq == dropped + 1
        assert report.problem is not None
        assert str(dropped) in report.problem

    @pytest.mark.parametrize(("a", "b"), [(4, 5), (2, 7), (1, 8)])
    def test_verify_detects_a_reordered_pair(
        self, journal: Journal, tamper: Tamper, a: int, b: int
    ) -> None:
        entries = populate(journal)
        tamper.swap(a, b)
        stored = {r.seq: r for r in journal.iter_raw()}
        assert stored[a].hash == entries[b].hash  # the swap really happened
        report = verified(journal)
        assert not report.ok
        assert report.first_bad_seq == a

    def test_verify_detects_an_entry_inserted_in_the_middle(
        self, journal: Journal, tamper: Tamper
    ) -> None:
        populate(journal)
        forged = encode_entry(
            seq=4,
            ts=time.time(),
            effect_id=D,
            kind=Kind.COMMITTED,
            prev="",
            key=as_key(scheme_key(FORGER_KEY)),
            data={"n": 4},
        )
        tamper.insert_raw(raw_of(forged))
        assert entry_count(journal) == len(LAYOUT) + 1
        report = verified(journal)
        assert not report.ok
        assert report.first_bad_seq == 4
        assert report.problem is not None
        assert key_id(FORGER_KEY) in report.problem

    def test_verify_detects_an_entry_appended_outside_the_chain(
        self, journal: Journal, tamper: Tamper
    ) -> None:
        entries = populate(journal)
        # signed with the right key, at the right seq, but chained onto another effect's entry
        forged = encode_entry(
            seq=len(LAYOUT) + 1,
            ts=time.time(),
            effect_id=A,
            kind=Kind.COMMITTED,
            prev=entries[5].hash,
            key=as_key(scheme_key(KEY)),
            data={},
        )
        tamper.insert_raw(raw_of(forged))
        report = verified(journal)
        assert not report.ok
        assert report.first_bad_seq == len(LAYOUT) + 1
        assert report.entries == len(LAYOUT)

    def test_entries_signed_with_another_key_fail_and_name_it(
        self, open_store: Callable[..., Journal]
    ) -> None:
        old = open_store(KEY)
        populate(old)
        old.close()

        # rotation: the new key signs, the old one still verifies
        rotated = open_store(OTHER_KEY, older_keys=[KEY])
        assert verified(rotated).ok
        row = rotated.row(A)
        assert row is not None
        (newer,) = rotated.append(A, row.head, [draft(Kind.CONFIRMED)])
        assert newer.key_id == key_id(OTHER_KEY)
        assert verified(rotated).ok
        rotated.close()

        # without the old key, the first entry it signed is named, with its key
        other_only = open_store(OTHER_KEY)
        report = verified(other_only)
        assert not report.ok
        assert report.first_bad_seq == 1
        assert report.problem is not None
        assert key_id(KEY) in report.problem

    def test_opening_with_a_key_that_did_not_sign_the_tail_is_refused(
        self, open_store: Callable[..., Journal]
    ) -> None:
        journal = open_store(KEY)
        populate(journal)
        journal.close()
        with pytest.raises((JournalCorrupt, JournalConfigError)) as caught:
            open_store(OTHER_KEY)
        assert key_id(KEY) in str(caught.value)

    def test_a_cut_tail_is_caught_only_with_the_recorded_head(
        self, journal: Journal, tamper: Tamper
    ) -> None:
        populate(journal)
        recorded = journal.head()
        assert recorded is not None
        assert recorded.seq == len(LAYOUT)
        assert verified(journal, recorded).ok
        assert verified(journal, str(recorded)).ok

        tamper.truncate_after(6)
        # the effects table still names the cut entries as heads
        cut = verified(journal)
        assert not cut.ok and cut.first_bad_seq == 7, cut
        # a cut that rewrites the effects table to match is invisible without the head
        tamper.edit_row(A, "head", journal_hash(tamper, 4))
        tamper.edit_row(A, "head_seq", 4)
        tamper.edit_row(A, "status", "DISPATCHED")
        tamper.edit_row(A, "updated_ts", signed_ts(tamper, 4))
        tamper.edit_row(C, "head", journal_hash(tamper, 6))
        tamper.edit_row(C, "head_seq", 6)
        tamper.edit_row(C, "status", "PROPOSED")
        tamper.edit_row(C, "updated_ts", signed_ts(tamper, 6))
        cut = verified(journal)
        assert cut.ok, cut
        assert cut.entries == 6

        for head in (recorded, str(recorded)):
            report = verified(journal, head)
            assert not report.ok
            assert report.first_bad_seq == 7
            assert report.problem is not None
            assert str(recorded.seq) in report.problem

    def test_a_recorded_head_keeps_verifying_as_the_journal_grows(self, journal: Journal) -> None:
        entries = populate(journal)
        recorded = journal.head()
        assert recorded is not None
        row = journal.row(B)
        assert row is not None
        journal.append(B, row.head, [draft(Kind.COMMITTED)])
        assert verified(journal, recorded).ok
        # a head that names a real seq with another hash is not this journal's
        wrong = JournalHead(seq=recorded.seq, hash=entries[1].hash)
        report = verified(journal, wrong)
        assert not report.ok
        assert report.first_bad_seq == recorded.seq

    def test_a_torn_last_entry_is_refused_at_open_and_nothing_changes(
        self, open_store: Callable[..., Journal], tamper: Tamper
    ) -> None:
        journal = open_store()
        entries = populate(journal)
        journal.close()
        last = entries[len(LAYOUT)]

        tamper.edit_body(last.seq, last.body[: len(last.body) // 2])
        before = tamper.snapshot()
        with pytest.raises(JournalCorrupt) as caught:
            open_store()
        message = str(caught.value)
        assert f"seq {last.seq}" in message
        assert "torn" in message
        assert tamper.snapshot() == before

        # the refusal was about the torn bytes: restored, the journal opens and verifies
        tamper.edit_body(last.seq, last.body)
        assert open_store().verify().ok

    def test_reopen_continues_the_chain(self, open_store: Callable[..., Journal]) -> None:
        journal = open_store()
        entries = populate(journal)
        head = journal.head()
        journal.close()

        again = open_store()
        assert again.schema_version() == SCHEMA_VERSION
        assert again.head() == head
        assert again.read(A) == [entries[s] for s, e, _ in LAYOUT if e == A]
        row = again.row(B)
        assert row is not None
        (written,) = again.append(B, row.head, [draft(Kind.COMMITTED)])
        assert written.seq == len(LAYOUT) + 1
        assert written.prev == entries[5].hash
        (new,) = again.append(D, "", [draft(Kind.PROPOSED)], effect_type="t")
        assert new.seq == len(LAYOUT) + 2
        report = again.verify()
        assert report.ok, report
        assert report.entries == len(LAYOUT) + 2
        assert report.effects == 4

    # -- leases ----------------------------------------------------------------------------------

    def test_leases_issue_get_list_revoke(self, open_store: Callable[..., Journal]) -> None:
        journal = open_store()
        before = time.time()
        first = journal.leases.issue(
            "agent-1",
            activities=["refund_*"],
            max_amount_cents=5000,
            resources=["order/*"],
        )
        second = journal.leases.issue("agent-2", lease_id="lease_fixed")
        after = time.time()
        assert second == "lease_fixed"
        assert first != second

        lease = journal.leases.get(first)
        assert lease is not None
        assert lease.lease_id == first
        assert lease.principal == "agent-1"
        assert lease.activities == ["refund_*"]
        assert lease.max_amount_cents == 5000
        assert lease.resources == ["order/*"]
        assert before <= lease.issued_at <= after
        assert lease.expires_at is None
        assert lease.revoked_at is None
        assert journal.leases.get("lease_unknown") is None
        assert [x.lease_id for x in journal.leases.list()] == [first, second]

        with pytest.raises(ValueError):
            journal.leases.issue("agent-3", lease_id="lease_fixed")
        with pytest.raises(ValueError):
            journal.leases.issue("")
        assert len(journal.leases.list()) == 2

        revoke_before = time.time()
        assert journal.leases.revoke(first) is True
        assert journal.leases.revoke(first) is False
        assert journal.leases.revoke("lease_unknown") is False
        revoked = journal.leases.get(first)
        assert revoked is not None
        assert revoked.revoked_at is not None
        assert revoke_before <= revoked.revoked_at <= time.time()
        second_lease = journal.leases.get(second)
        assert second_lease is not None
        assert second_lease.revoked_at is None
        journal.close()

        # leases live in the store: another opening sees the revoke
        again = open_store()
        seen = again.leases.get(first)
        assert seen is not None
        assert seen.revoked_at == revoked.revoked_at

    def test_lease_ttl_is_recorded_and_expires(self, journal: Journal) -> None:
        lease_id = journal.leases.issue("agent-1", ttl=timedelta(seconds=90))
        lease = journal.leases.get(lease_id)
        assert lease is not None
        assert lease.expires_at is not None
        assert lease.expires_at == pytest.approx(lease.issued_at + 90, abs=1e-3)

        with pytest.raises(ValueError):
            journal.leases.issue("agent-1", ttl=timedelta(0))
        with pytest.raises(ValueError):
            journal.leases.issue("agent-1", ttl=timedelta(seconds=-1))

        short = journal.leases.issue("agent-1", ttl=timedelta(milliseconds=50))
        demand = Demand(principal="agent-1", activity="refund")
        live = journal.leases.get(short)
        assert live is not None
        assert check_lease(live, demand, time.time()) is None
        time.sleep(0.1)
        problem = check_lease(journal.leases.get(short), demand, time.time())
        assert problem is not None
        assert "expired" in problem.detail

    # -- claims ----------------------------------------------------------------------------------

    def test_claims_are_exclusive_per_effect(self, open_store: Callable[..., Journal]) -> None:
        journal = open_store()
        other = open_store()
        claim = journal.claim(A)
        assert claim is not None
        assert claim.effect_id == A
        assert journal.claim(A) is None
        assert other.claim(A) is None
        assert journal.is_claimed(A)
        assert other.is_claimed(A)
        unrelated = other.claim(B)
        assert unrelated is not None
        claim.release()
        assert not journal.is_claimed(A)
        taken = other.claim(A)
        assert taken is not None
        assert journal.claim(A) is None
        taken.release()
        unrelated.release()

    async def test_a_coroutine_reads_what_it_decides_on_under_its_claim(
        self, open_store: Callable[..., Journal]
    ) -> None:
        """``claim_reading``: the claim, and (where the backend reads with it) the entries as
        ``read`` gives them, read once the claim was granted; a claim held elsewhere gives
        neither; ``release_async`` has freed the claim when it returns."""
        journal, other = open_store(), open_store()
        other.append(A, "", [draft(Kind.PROPOSED)], effect_type="refund")
        claim, entries = await journal.claim_reading(A)
        assert claim is not None and claim.effect_id == A
        assert entries is None or entries == journal.read(A)
        assert await other.claim_reading(A) == (None, None)
        assert other.is_claimed(A)
        # written while the claim is held: a read under a later claim sees it
        other.append(A, journal.read(A)[-1].hash, [draft(Kind.NOT_SENT)])
        await journal.release_async(claim)
        assert not other.is_claimed(A)
        again, seen = await other.claim_reading(A)
        assert again is not None
        assert seen is None or [e.kind for e in seen] == [Kind.PROPOSED, Kind.NOT_SENT]
        assert await journal.read_async(A) == journal.read(A)
        await other.release_async(again)
        assert await journal.by_origin_async("nobody") == []

    async def test_a_claim_taken_for_a_caller_that_left_is_given_back(
        self, open_store: Callable[..., Journal]
    ) -> None:
        """A coroutine cancelled while its claim is being taken, or while it is being released,
        leaves no claim held: nobody could ever release it (the effect would stay in flight
        until the worker stopped)."""
        journal, other = open_store(), open_store()

        async def freed() -> bool:
            deadline = time.monotonic() + 5
            while (taken := other.claim(A)) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if taken is not None:
                taken.release()
            return taken is not None

        asking = asyncio.ensure_future(journal.claim_reading(A))
        await asyncio.sleep(0)  # under way (a backend that takes it at once has it already)
        asking.cancel()
        try:
            claim, _ = await asking
        except asyncio.CancelledError:
            claim = None
        if claim is not None:
            claim.release()
        assert await freed(), "a claim taken for a cancelled caller was kept"
        # given back, not merely dropped with its connection: this process holds no claim
        # (a worker counts the claims it holds to batch its appends)
        assert journal.claims_held() == 0  # type: ignore[attr-defined]

        for _ in range(20):
            claim = journal.claim(A)
            assert claim is not None
            releasing = asyncio.ensure_future(journal.release_async(claim))
            await asyncio.sleep(0)
            releasing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await releasing
            assert await freed(), "a release cancelled on its way was lost"

    # -- retention: archives of settled effects ------------------------------------------------

    async def test_archive_round_trip(self, journal: Journal, tmp_path: Path) -> None:
        """Settled effects move to a verifiable archive; the live journal still verifies; what
        is in doubt or under review stays and is still recovered or resolved; a duplicate, a
        zombie attempt, a conflicting payload and the lease budget answer as before."""
        story = await _ArchiveStory.write(journal, tmp_path)
        before = await story.probe()
        assert before["reserved"] > 0 and len(before["refunds"]) == 2  # c-1, c-7

        run = archive(
            journal,
            before=time.time(),
            to=story.file,
            min_age=timedelta(0),
            allow_short_min_age=True,
        )

        assert (run.effects, run.skipped) == (4, {"not_happened": 1}), run
        settled = {story.eids[c] for c in ("c-1", "c-3", "c-4", "c-7")}
        raws = list(journal.iter_raw())
        live_seqs = {r.seq for r in raws}
        # every archived seq left the live journal; live + archived cover 1..head exactly
        archived_seqs = {s for a, b in run.ranges for s in range(a, b + 1)}
        assert not archived_seqs & live_seqs
        assert archived_seqs | live_seqs == set(range(1, raws[-1].seq + 1))
        for eid in settled:
            (tomb,) = journal.read(eid)
            assert tomb.kind is Kind.ARCHIVED and tomb.data["archive_id"] == run.archive_id
        report = verified(journal)
        assert report.ok, report
        anchor = journal.read(f"archive:{run.archive_id}")[0].data
        with open(story.file, encoding="utf-8") as lines:
            alone = verify_archive(lines, journal.keyring, anchor)
        assert alone.ok, alone
        assert (alone.entries, alone.effects) == (run.entries, 4)
        # in doubt and under review: untouched (whole chains, same heads)
        assert [e.kind for e in journal.read(story.eids["c-2"])][-1] is Kind.DISPATCHED
        assert journal.read(story.eids["c-2"]) == story.chains["c-2"]
        assert journal.read(story.eids["c-5"]) == story.chains["c-5"]
        assert journal.read(story.eids["c-6"]) == story.chains["c-6"]  # resolved not_happened
        assert [r.effect_id for r in journal.in_doubt()] == [story.eids["c-2"]]

        after = await story.probe()
        assert after == before
        assert verified(journal).ok
        await story.recover_and_resolve()
        report = verified(journal)
        assert report.ok, report

    async def test_archive_tampering_is_caught(
        self, journal: Journal, tamper: Any, tmp_path: Path
    ) -> None:
        story = await _ArchiveStory.write(journal, tmp_path)
        run = archive(
            journal,
            before=time.time(),
            to=story.file,
            min_age=timedelta(0),
            allow_short_min_age=True,
        )
        assert run.anchor is not None and verified(journal).ok
        lines = story.file.read_text(encoding="utf-8").splitlines(keepends=True)
        keyring = journal.keyring
        anchor = journal.read(f"archive:{run.archive_id}")[0].data

        def check(edited: list[str]) -> str:
            report = verify_archive(edited, keyring, anchor)
            assert not report.ok
            return str(report.problem)

        # an edited amount in an archived entry: in its signed bytes, or in the values
        # stored beside them (a number as JSON holds it: "2000" alone also occurs in hashes)
        amount = re.compile(r'(_cents":)2000\b')

        def edited(field: str) -> tuple[int, list[str]]:
            for i, line in enumerate(lines[1:], 1):
                doc = json.loads(line)
                if amount.search(doc.get(field) or ""):
                    doc[field] = amount.sub(r"\g<1>2001", doc[field], count=1)
                    return i, [*lines[:i], json.dumps(doc) + "\n", *lines[i + 1 :]]
            raise AssertionError(f"no archived entry holds 2000 in its {field}")

        at, in_body = edited("body")
        assert "hash" in check(in_body)
        assert "values stored beside it are not the ones it signed" in check(edited("vals")[1])
        # an archived entry dropped: from the middle of its chain, or a chain's last
        assert "prev is not the previous entry" in check([*lines[:at], *lines[at + 1 :]])
        assert "seq ranges its header names" in check(lines[:-1])
        # an edited header (its ranges widened): its signature no longer verifies
        header = json.loads(lines[0])
        header["archive"]["ranges"][0][0] -= 1
        assert "signature" in check([json.dumps(header) + "\n", *lines[1:]])

        # the live journal: a tombstone removed, the anchor removed, an archived-style gap
        # without an anchor -- each caught
        tomb = journal.row(story.eids["c-1"])
        assert tomb is not None
        stored = {r.seq: r for r in journal.iter_raw()}
        for seq in (tomb.head_seq, run.anchor.seq):
            tamper.delete(seq)
            report = verified(journal)
            assert not report.ok and "missing" in str(report.problem), report
            tamper.put_back(stored[seq])
            assert verified(journal).ok
        # entries of a settled effect deleted with no archive at all
        chain = journal.read(story.eids["c-2"])
        for seq in sorted({e.seq for e in chain})[:2]:  # a combined dispatch's views share one
            tamper.delete(seq)
        report = verified(journal)
        assert not report.ok and "missing" in str(report.problem), report

    def test_archive_refuses_what_it_must(self, journal: Journal, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="--before is in the future"):
            archive(journal, before=time.time() + 3600, to=tmp_path / "a.jsonl")
        with pytest.raises(ValueError, match="--min-age 3600s is under 1d"):
            archive(
                journal, before=time.time(), to=tmp_path / "a.jsonl", min_age=timedelta(hours=1)
            )
        (tmp_path / "exists.jsonl").write_text("")
        with pytest.raises(ValueError, match="never overwritten"):
            archive(journal, before=time.time(), to=tmp_path / "exists.jsonl")
        # a claimed settled effect stays; an effect younger than min_age stays
        journal.append(
            A, "", [draft(Kind.PROPOSED), draft(Kind.REFUSED, code="x")], effect_type="t"
        )
        claim = journal.claim(A)
        assert claim is not None
        run = archive(
            journal,
            before=time.time(),
            to=tmp_path / "b.jsonl",
            min_age=timedelta(0),
            allow_short_min_age=True,
        )
        assert (run.effects, run.skipped, run.path) == (0, {"claimed": 1}, None)
        claim.release()
        run = archive(journal, before=time.time(), to=tmp_path / "c.jsonl")  # 30 days
        assert (run.effects, run.skipped) == (0, {})
        assert not (tmp_path / "b.jsonl").exists() and not (tmp_path / "c.jsonl").exists()
        assert [e.kind for e in journal.read(A)] == [Kind.PROPOSED, Kind.REFUSED]
