"""Journal values through the user's PayloadCodec: with an encrypting codec (AES-GCM) on the
workers' client, the journal's database holds no plaintext of the approved input nor of the
result, on SQLite and PostgreSQL; receipts, `journal verify`, a review's resolution and the CLI
(with and without `--codec`) still work; a worker restarted with the codec on an effect in
flight recorded without it does not send it again."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import PayloadCodec
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal._reviews.workflow import ReviewRequest
from interlock_temporal._worker.codec import CodecSealer
from interlock_temporal.cli import main
from interlock_temporal.core.identity import canonical
from interlock_temporal.core.journal import Journal, open_journal, value_of
from interlock_temporal.core.models import Draft, Kind
from interlock_temporal.core.protocol import Delivery, Done, Gate, Ticket
from interlock_temporal.core.receipts import fold, receipt
from interlock_temporal.core.review import review_id
from interlock_temporal.core.sealing import KEYED, SEALED, Values, is_sealed
from interlock_temporal.targets.payments import RefundRequest
from interlock_temporal.testing import DevServer, PostgresServer, SimulatedPayments
from workers.scenarios import ORDER
from workflows.activities import refund_key, support_activities
from workflows.support_case import CaseFile, SupportCase

from .test_protocol import connect, journal, lease  # noqa: F401  (fixtures)
from .test_protocol_records import Ledger, refund
from .test_reviews import until

KEY = "33" * 32
AES_KEY = bytes(range(32))


class AesCodec(PayloadCodec):
    """Encrypts every payload (AES-GCM), as a user's encryption codec does."""

    def __init__(self) -> None:
        self.aead = AESGCM(AES_KEY)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            nonce = os.urandom(12)
            sealed = self.aead.encrypt(nonce, p.SerializeToString(), None)
            out.append(Payload(metadata={"encoding": b"binary/encrypted"}, data=nonce + sealed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != b"binary/encrypted":
                out.append(p)
                continue
            plain = Payload()
            plain.ParseFromString(self.aead.decrypt(p.data[:12], p.data[12:], None))
            out.append(plain)
        return out


def codec() -> AesCodec:
    """The factory `--codec tests.test_journal_codec:codec` names."""
    return AesCodec()


#: PostgreSQL's cases run in make faults (about 11 s each on a real server); SQLite's in make test
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.faults)])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'journal.db'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        yield server.database(f"codec_{uuid.uuid4().hex[:8]}")


def stored_bytes(url: str) -> bytes:
    """Every byte the journal's database holds: the SQLite file and its WAL, or every row of
    every table of the PostgreSQL database."""
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())
    dump = []
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
        assert tables
        for (table,) in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"').fetchall():
                dump.append(repr(row).encode())
    return b"\n".join(dump)


async def cli(*argv: str) -> tuple[int, str]:
    """The CLI in-process, on a thread of its own (its commands run their own event loop)."""

    def run() -> tuple[int, str]:
        out = StringIO()
        with redirect_stdout(out):
            code = main(list(argv))
        return code, out.getvalue()

    return await asyncio.to_thread(run)


@asynccontextmanager
async def sealed_worker(
    dev_server: DevServer, url: str, tmp_path: Path
) -> AsyncIterator[tuple[Client, str, SimulatedPayments, Journal, str]]:
    opened = open_journal(url, signing_key=KEY)
    lease_id = opened.leases.issue(
        "refund-bot", activities=["refund"], max_amount_cents=9000, resources=[f"order:{ORDER}"]
    )
    payments = SimulatedPayments(tmp_path / "payments.db", tier=3)
    payments.open_order(ORDER, 10_000)
    converter = dataclasses.replace(pydantic_data_converter, payload_codec=AesCodec())
    client = await Client.connect(
        dev_server.target,
        data_converter=converter,
        plugins=[InterlockPlugin(url, signing_key=KEY)],
    )
    queue = f"codec-{uuid.uuid4().hex[:10]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[SupportCase],
        activities=support_activities(payments),
    ):
        yield client, queue, payments, opened, lease_id
    opened.close()
    payments.close()


@pytest.mark.server
async def test_an_encrypting_codec_leaves_no_plaintext_in_the_journal(
    dev_server: DevServer, journal_url: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    done_case, doubt_case = f"zebra-{tag}@example.org", f"okapi-{tag}@example.org"
    async with sealed_worker(dev_server, journal_url, tmp_path) as (client, queue, pay, j, lid):

        async def start(case_id: str, amount: int, **kw: Any) -> Any:
            case = CaseFile(
                case_id=case_id, order_id=ORDER, amount_cents=amount, lease_id=lid, **kw
            )
            return await client.start_workflow(
                SupportCase.run, case, id=f"case-{uuid.uuid4().hex[:8]}", task_queue=queue
            )

        committed = await (await start(done_case, 2000)).result()
        assert committed.status == "REFUNDED"
        pay.arm("after_commit", "reset")  # the send lands, its answer is lost: AMBIGUOUS
        waiting = await start(doubt_case, 1500, maximum_attempts=1, wait_for_review=True)
        doubt = fold_id(journal_url, doubt_case, 1500)
        review = client.get_workflow_handle(review_id("ambiguous", doubt))

        async def opened() -> bool:
            row = j.row(doubt)
            return row is not None and row.status is Kind.AMBIGUOUS

        await until(opened)
        await until_status(review)
        # the worker decodes: the review shows the approved input, decoded (and Temporal
        # stores the review's input encrypted by the same codec)
        history = await review.fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        assert started.input.payloads[0].metadata["encoding"] == b"binary/encrypted"
        (request,) = await client.data_converter.decode(started.input.payloads, [ReviewRequest])
        assert doubt_case in request.details
        await review.execute_update("decide", {"decision": "happened", "operator": "carol"})
        assert (await waiting.result()).status == "RESOLVED"
        await asyncio.wait_for(review.result(), 30)  # the review has ended, with the worker here
        assert pay.refunded_cents(ORDER) == 3500  # each sent once

    done = fold_id(journal_url, done_case, 2000)
    with open_journal(journal_url, signing_key=KEY) as j:
        # the ids are keyed too: a plain id is sha256 of {order, amount}, found by trying values
        assert j.effect_ids == KEYED + j.keyring.signing.key_id
        assert done != plain_id(done_case, 2000)
        entries = j.read(done)
        stored = value_of(entries, "approved")
        assert is_sealed(stored) and stored[SEALED] == "temporal-codec/v1"
        result = await Values(j.keyring, CodecSealer(AesCodec())).open(value_of(entries, "result"))
        refund_id = result["refund_id"]
        shown = receipt(done, journal=j)
        assert shown.final == "COMMITTED" and shown.executed is True
        assert fold(done, entries).digests == KEYED + j.keyring.signing.key_id
        assert receipt(doubt, journal=j).final == "RESOLVED"
        assert j.verify().ok

    everything = stored_bytes(journal_url)
    for plaintext in (done_case, doubt_case):
        assert plaintext.encode() not in everything, plaintext
    for plain in (plain_id(done_case, 2000), plain_id(doubt_case, 1500)):
        assert plain[:16].encode() not in everything
    # the result's one distinctive value is the target's confirmation (the refund id), which
    # COMMITTED records in the clear by design (a receipt names it, to find the effect at the
    # target): it appears there and nowhere else
    confirmation = b'"confirmation":"' + refund_id.encode() + b'"'
    assert everything.count(refund_id.encode()) == everything.count(confirmation) > 0
    assert b"temporal-codec/v1" in everything  # the values are there, sealed

    where = ["--journal", journal_url, "--signing-key", KEY]
    code, out = await cli(*where, "journal", "verify")
    assert code == 0, out
    code, out = await cli(*where, "effects", "show", done[:16])
    assert code == 0 and "approved value    encrypted" in out and done_case not in out
    code, out = await cli(
        *where, "effects", "show", done[:16], "--codec", "tests.test_journal_codec:codec"
    )
    assert code == 0 and done_case in out and refund_id in out
    # the ended review's result is encoded too: listed with a hint, and read with the codec
    temporal = ["--address", dev_server.target]
    code, out = await cli(*where, "reviews", "list", "--all", *temporal)
    (line,) = [x for x in out.splitlines() if doubt[:16] in x]
    assert code == 0 and "encoded by a payload codec: pass --codec" in line, out
    codec = ["--codec", "tests.test_journal_codec:codec"]
    code, out = await cli(*where, "reviews", "list", "--all", *temporal, *codec)
    (line,) = [x for x in out.splitlines() if doubt[:16] in x]
    assert code == 0 and "resolved" in line and "codec" not in line, out


def plain_id(case_id: str, amount: int) -> str:
    from interlock_temporal.core.identity import effect_id

    request = RefundRequest(case_id=case_id, order_id=ORDER, amount_cents=amount)
    return effect_id("refund", refund_key(request))


def fold_id(url: str, case_id: str, amount: int) -> str:
    """The refund's effect id in the journal at ``url``, as it names effects now."""
    from interlock_temporal.core.identity import effect_id

    request = RefundRequest(case_id=case_id, order_id=ORDER, amount_cents=amount)
    with open_journal(url, signing_key=KEY) as j:
        keyed = Values(j.keyring).ids(j.effect_ids)
    return effect_id("refund", refund_key(request), keyed=keyed)


async def until_status(review: Any) -> None:
    async def answered() -> bool:
        try:
            await review.query("status")
        except Exception:
            return False
        return True

    await until(answered)


async def test_a_worker_restarted_with_the_codec_never_resends_an_effect_in_flight(
    journal: Journal,  # noqa: F811
    lease: str,  # noqa: F811
) -> None:
    target = Ledger(tier=2)
    first = dataclasses.replace(
        refund(lease), delivery=Delivery(workflow_id="wf-1", run_id="r-1", activity_id="7")
    )
    ticket = await Gate(journal).begin(first, target)  # recorded without a codec
    assert isinstance(ticket, Ticket)
    landed = await target.send(ticket)  # sent; the worker dies before COMMITTED
    ticket.release()

    sealed = Gate(journal, values=Values(journal.keyring, CodecSealer(AesCodec())))
    again = dataclasses.replace(
        first, delivery=dataclasses.replace(first.delivery, attempt=2), admission={}
    )
    done = await sealed.begin(again, target)
    assert isinstance(done, Done) and done.via == "recovery-query"
    assert target.sends == 1  # found at the target, never sent again
    view = fold(ticket.effect_id, journal.read(ticket.effect_id))
    assert view.status is Kind.COMMITTED and view.digests is None  # its plain scheme kept
    assert view.payload_digest == Gate.identify(again)[1]
    assert view.result_digest == hashlib.sha256(canonical(landed)).hexdigest()
    # the new value is sealed all the same, and a duplicate reads it decoded
    assert is_sealed(value_of(journal.read(ticket.effect_id), "result"))
    dup = await sealed.begin(again, target)
    assert isinstance(dup, Done) and dup.result == landed and target.sends == 1
    assert journal.verify().ok


@pytest.mark.server
async def test_a_codec_keys_a_new_journals_ids_and_an_older_journal_keeps_its_own(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from interlock_temporal._worker.runtime import GateSource

    converter = dataclasses.replace(pydantic_data_converter, payload_codec=AesCodec())
    client = await Client.connect(dev_server.target, data_converter=converter)
    new = GateSource(f"sqlite:///{tmp_path / 'new.db'}", signing_key=KEY)
    new.use_client(client)
    fresh = new.gate.journal
    assert fresh.effect_ids == KEYED + fresh.keyring.signing.key_id

    older_url = f"sqlite:///{tmp_path / 'older.db'}"
    with open_journal(older_url, signing_key=KEY) as j:
        draft = Draft(kind=Kind.PROPOSED, data={"effect_type": "refund"})
        j.append("e" * 64, None, [draft], effect_type="refund")
    older = GateSource(older_url, signing_key=KEY)
    assert older.gate.journal.effect_ids is None
    with caplog.at_level("WARNING", logger="interlock_temporal"):
        older.use_client(client)
    assert older.gate.journal.effect_ids is None  # its effects keep their names
    assert "effect ids stay plain sha256 with a payload codec" in caplog.text
    assert "has effects: keying its effect ids now" in caplog.text
    for source in (new, older):
        source.gate.journal.close()
