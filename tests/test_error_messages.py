"""Errors that say what to do (issue 19): a refusal met again says when and why it was refused
and how a person reopens it; a lease this journal never saw names the worker's journal (without
its password) and the likely cause; a key that is not JSON data names the field path and the
type, never the value. The gate runs against real SQLite and PostgreSQL journals and the real
payments service; the last tests run the same on a real Temporal worker."""

from __future__ import annotations

import dataclasses
import re
import shlex
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from temporalio import activity
from temporalio.client import WorkflowFailureError

from interlock_temporal import current_effect, gated
from interlock_temporal.cli import main
from interlock_temporal.core import Call, Gate, Journal, Measure, Refused, open_journal
from interlock_temporal.core.errors import DECIDED_AGAIN, InvalidCall
from interlock_temporal.core.identity import UnserializableInput, jsonable
from interlock_temporal.core.journal import redacted
from interlock_temporal.core.models import Kind
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer, PostgresServer
from workers.world import ORDER

from .test_server import cause_of, rig

#: what a value's repr says: it must never reach a message
MARKER = "customer-said-zebra-7731"
KEY = "5e" * 32


class Clock:
    """An object with no JSON form (a key that read the clock, say)."""

    def __repr__(self) -> str:
        return MARKER


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[SimulatedPayments]:
    service = SimulatedPayments(tmp_path / "payments.db", tier=2)
    service.open_order(ORDER, 10_000)
    yield service
    service.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def journal(db: Path) -> Iterator[Journal]:
    with open_journal(f"sqlite:///{db}") as opened:  # its key file, as the CLI finds it
        yield opened


def refund_call(lease_id: str | None, amount: int = 2_000, **kw: Any) -> Call:
    req = RefundRequest(case_id="4471", order_id=ORDER, amount_cents=amount, reason=MARKER)
    fields: dict[str, Any] = {
        "key": {"case": req.case_id, "order": req.order_id},
        "principal": "refund-bot",
        "lease_id": lease_id,
        "measure": lambda args: Measure(args[0].amount_cents),
        "param_names": ("r",),
        **kw,
    }
    return Call(effect_type="refund", activity="refund", input=req, args=(req,), **fields)


async def attempt(journal: Journal, payments: SimulatedPayments, call: Call) -> Any:
    async def send(ticket: Any) -> Any:
        return await payments.refund(
            ticket.input.order_id, ticket.input.amount_cents, idempotency_key=ticket.effect_id
        )

    return await Gate(journal).run(call, payments, send)


async def refused(journal: Journal, payments: SimulatedPayments, call: Call) -> Refused:
    with pytest.raises(Refused) as caught:
        await attempt(journal, payments, call)
    return caught.value


def earlier(effect_id: str, when: str, code: str, reason: str) -> str:
    return (
        f"refused earlier, at {when} ({code}: {reason}); nothing was sent now. It stays refused "
        f"on every attempt until a person reopens it (`interlock effects reopen {effect_id} "
        "--operator NAME`); its next attempt then runs under the lease and the facts current then"
    )


# -- a refusal met again ------------------------------------------------------------------------


async def test_a_refusal_met_again_says_when_and_why_and_the_reopen_command_works(
    journal: Journal, payments: SimulatedPayments, db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lease = journal.leases.issue("refund-bot", activities=["refund"])
    journal.leases.revoke(lease)
    call = refund_call(lease)
    eid = Gate.identify(call)[0]

    first = await refused(journal, payments, call)
    assert str(first) == "lease: lease revoked"  # the first refusal reads as it always did
    assert first.refused_at is None
    entries = len(journal.read(eid))

    again = await refused(journal, payments, call)
    finished = first.receipt.finished_at
    assert finished is not None and finished.utcoffset() is not None
    (refusal,) = [e for e in journal.read(eid) if e.kind is Kind.REFUSED]
    assert again.refused_at == refusal.ts
    when = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert str(again) == earlier(eid, when, "lease", "lease revoked")
    # the code, the reason and the receipt stay as recorded; nothing was written or sent
    assert (again.code, again.reason) == ("lease", "lease revoked")
    assert again.receipt == first.receipt
    assert len(journal.read(eid)) == entries
    assert payments.calls() == 0

    # the command the message gives, as written, with a name: reopens it; the next attempt
    # runs under the lease current then (a new one) and the refund goes out, once
    found = re.search(r"`(interlock effects reopen \S+ --operator NAME)`", str(again))
    assert found is not None
    argv = shlex.split(found.group(1).replace("NAME", "carol"))[1:]
    assert main(["--journal", f"sqlite:///{db}", *argv]) == 0, capsys.readouterr().err
    renewed = journal.leases.issue("refund-bot", activities=["refund"])
    result = await attempt(journal, payments, refund_call(renewed))
    assert result.amount_cents == 2_000
    assert payments.refunded_cents(ORDER) == 2_000 and payments.calls() == 1


async def test_a_refusal_over_the_leases_maximum_met_again_keeps_its_reason(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=1_000)
    call = refund_call(lease, amount=9_000)
    first = await refused(journal, payments, call)
    assert str(first) == "lease: amount over the lease's maximum"
    again = await refused(journal, payments, call)
    assert str(again).startswith("refused earlier, at 20")
    assert "(lease: amount over the lease's maximum); nothing was sent now" in str(again)
    assert "9000" not in str(again) and MARKER not in str(again)
    assert payments.calls() == 0


# -- a lease this journal never saw ---------------------------------------------------------


def unknown_lease_reason(lease_id: str, url: str) -> str:
    return (
        f"no lease {lease_id} in this worker's journal {url}: if it was issued, the "
        "workers (or `interlock leases issue`) may be on different journals; give every worker "
        "and the CLI the same journal URL"
    )


def unknown_lease(lease_id: str, url: str) -> str:
    return f"lease: {unknown_lease_reason(lease_id, url)}. {DECIDED_AGAIN}"


async def test_a_lease_issued_into_another_journal_names_this_workers_journal(
    journal: Journal, payments: SimulatedPayments, db: Path, tmp_path: Path
) -> None:
    with open_journal(tmp_path / "elsewhere.db") as other:
        lease = other.leases.issue("refund-bot")  # the CLI pointed at another journal
    call = refund_call(lease)
    got = await refused(journal, payments, call)
    assert str(got) == unknown_lease(lease, f"sqlite:///{db}")
    assert got.code == "lease" and got.receipt.final == "REFUSED"
    assert got.receipt.executed is False
    assert payments.calls() == 0
    # a later attempt with the same configuration says it was refused earlier, with the same
    # advice, and that fixing the configuration is the way out (nothing is written)
    entries = len(journal.read(got.receipt.effect_id))
    again = await refused(journal, payments, call)
    assert f"no lease {lease} in this worker's journal sqlite:///{db}" in str(again)
    assert str(again).startswith("refused earlier, at ")
    assert str(again).endswith(
        "nothing was sent now: this attempt has the configuration that was refused. "
        + DECIDED_AGAIN
    )
    assert "interlock effects reopen" not in str(again)
    assert len(journal.read(got.receipt.effect_id)) == entries


async def test_a_lease_a_postgres_journal_never_saw_names_it_without_its_password(
    postgres: PostgresServer, payments: SimulatedPayments
) -> None:
    name = postgres.database("unknown_lease")
    url = name.replace("postgres@", "postgres:hunter2-secret@", 1)  # trust auth ignores it
    with open_journal(url, signing_key=KEY) as pg:
        call = refund_call("lease_never_issued_here")
        got = await refused(pg, payments, call)
        shown = name.replace("postgres@", "postgres:***@", 1)
        assert str(got) == unknown_lease("lease_never_issued_here", shown)
        assert "hunter2" not in str(got)
        eid = Gate.identify(call)[0]
        assert all(b"hunter2" not in e.body for e in pg.read(eid))  # nor in the journal
    assert payments.calls() == 0


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://app:s3cret@db.internal/interlock",
            "postgresql://app:***@db.internal/interlock",
        ),
        (
            "postgresql://app:s3cr%40t@db:5432/interlock?sslmode=require",
            "postgresql://app:***@db:5432/interlock?sslmode=require",
        ),
        ("postgres://app:s3c@ret@db/interlock", "postgres://app:***@db/interlock"),
        ("postgresql://:s3cret@db/interlock", "postgresql://:***@db/interlock"),
        (
            "postgresql://db/interlock?user=app&password=s3cret&sslmode=require",
            "postgresql://db/interlock?user=app&password=***&sslmode=require",
        ),
        (
            "postgresql://app@db/interlock?sslpassword=s3cret",
            "postgresql://app@db/interlock?sslpassword=***",
        ),
        ("postgresql://app@db:5432/interlock", "postgresql://app@db:5432/interlock"),
        ("sqlite:///var/lib/interlock.db", "sqlite:///var/lib/interlock.db"),
        (
            "sqlite:////abs/interlock.db?busy_timeout=5",
            "sqlite:////abs/interlock.db?busy_timeout=5",
        ),
        ("interlock.db", "interlock.db"),
    ],
)
def test_a_journal_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redacted(url) == shown
    assert "s3c" not in redacted(url)
    assert redacted(shown) == shown  # once redacted, it stays as it is


# -- a key that is not JSON data ---------------------------------------------------------------


class Stamped(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    order: str
    at: Any


@dataclasses.dataclass
class Line:
    sku: str
    at: Any


@pytest.mark.parametrize(
    ("key", "where", "what"),
    [
        ({"order": {"id": ORDER, "when": Clock()}}, "key['order']['when']", "Clock"),
        ({"lines": [{"sku": "a"}, {"sku": Clock()}]}, "key['lines'][1]['sku']", "Clock"),
        ([{"order": ORDER}, [1, Clock()]], "key[1][1]", "Clock"),
        ({"order": types.MappingProxyType({"id": ORDER})}, "key['order']", "mappingproxy"),
        ({"stamp": Stamped(order=ORDER, at=Clock())}, "key['stamp'].at", "Clock"),
        ({"lines": [Line("a", Clock())]}, "key['lines'][0].at", "Clock"),
    ],
    ids=["dict-in-dict", "dict-in-list", "list-in-list", "mapping", "model", "dataclass"],
)
async def test_a_key_that_is_not_json_data_names_the_path_and_the_type(
    journal: Journal, payments: SimulatedPayments, key: Any, where: str, what: str
) -> None:
    lease = journal.leases.issue("refund-bot")
    with pytest.raises(InvalidCall) as caught:
        await attempt(journal, payments, refund_call(lease, key=key))
    message = str(caught.value)
    assert message.endswith(f"{where}: {what} is not JSON data"), message
    assert "refund" in message
    assert MARKER not in message and ORDER not in message
    assert journal.effects() == [] and payments.calls() == 0


async def test_an_input_that_is_not_json_data_names_the_argument_path(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = journal.leases.issue("refund-bot")
    arg = {"order_id": ORDER, "amount_cents": 2_000, "meta": {"tags": ["a", Clock()]}}
    call = Call(
        effect_type="refund",
        activity="refund",
        input=arg,
        args=(arg,),
        key={"order": ORDER},
        principal="refund-bot",
        lease_id=lease,
        param_names=("r",),
    )
    with pytest.raises(InvalidCall) as caught:
        await attempt(journal, payments, call)
    assert str(caught.value).endswith("r['meta']['tags'][1]: Clock is not JSON data")
    assert MARKER not in str(caught.value)
    assert journal.effects() == [] and payments.calls() == 0


def test_jsonable_names_where_from_the_path_it_is_given() -> None:
    with pytest.raises(UnserializableInput) as nested:
        jsonable({"a": [1, {"b": Clock()}]}, "key")
    assert str(nested.value) == "key['a'][1]['b']: Clock is not JSON data"
    with pytest.raises(UnserializableInput) as top:
        jsonable(Clock(), "key")
    assert str(top.value) == "key: Clock is not JSON data"
    with pytest.raises(UnserializableInput) as unnamed:
        jsonable({"a": Clock()})
    assert str(unnamed.value) == "value['a']: Clock is not JSON data"
    with pytest.raises(UnserializableInput) as bare:
        jsonable(Clock())
    assert str(bare.value) == "value of type Clock is not JSON data"
    with pytest.raises(UnserializableInput) as in_a_set:
        jsonable({"tags": frozenset({Clock()})}, "key")
    assert str(in_a_set.value) == "an item of key['tags']: Clock is not JSON data"
    assert jsonable({"a": [1, {"b": "c"}]}, "key") == {"a": [1, {"b": "c"}]}


# -- on a real Temporal worker ------------------------------------------------------------------


@pytest.mark.server
async def test_on_a_worker_a_refusal_met_again_says_so_and_an_unknown_lease_names_the_journal(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path) as r:
        over = r.request(amount_cents=9_000)  # over the rig lease's 5000 maximum
        with pytest.raises(WorkflowFailureError) as first:
            await r.call("refund", over, principal="refund-bot", lease=r.lease_id)
        cause = cause_of(first.value)
        assert (cause.type, cause.non_retryable) == ("EffectRefused", True)
        assert cause.message == "lease: amount over the lease's maximum"
        (receipt,) = cause.details

        with pytest.raises(WorkflowFailureError) as second:  # another workflow, same decision
            await r.call("refund", over, principal="refund-bot", lease=r.lease_id)
        again = cause_of(second.value)
        assert (again.type, again.non_retryable) == ("EffectRefused", True)
        eid = receipt["effect_id"]
        when = receipt["finished_at"][:19] + "Z"  # the receipt's UTC time, to the second
        assert again.message == earlier(eid, when, "lease", "amount over the lease's maximum")
        (again_receipt,) = again.details
        assert again_receipt["journal_hash"] == receipt["journal_hash"]

        with pytest.raises(WorkflowFailureError) as elsewhere:
            other = r.request().model_copy(update={"case_id": "9001"})  # another decision
            await r.call("refund", other, principal="refund-bot", lease="lease_elsewhere")
        lost = cause_of(elsewhere.value)
        assert lost.type == "EffectRefused"
        assert lost.message == unknown_lease(
            "lease_elsewhere", f"sqlite:///{tmp_path / 'journal.db'}"
        )
        assert r.payments.calls() == 0


@pytest.mark.server
async def test_on_a_worker_a_key_that_is_not_json_data_names_the_path(
    dev_server: DevServer, tmp_path: Path
) -> None:
    service = SimulatedPayments(tmp_path / "stamped-payments.db", tier=2)

    @activity.defn(name="refund_stamped")
    @gated(target=service, key=lambda r: {"order": {"id": r.order_id, "when": Clock()}})
    async def refund_stamped(r: RefundRequest) -> RefundResult:
        return await service.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    async with rig(dev_server, tmp_path, extra=[refund_stamped]) as r:
        with pytest.raises(WorkflowFailureError) as failure:
            await r.call("refund_stamped", r.request(), principal="refund-bot", lease=r.lease_id)
        cause = cause_of(failure.value)
        assert (cause.type, cause.non_retryable) == ("InvalidEffectInput", True)
        assert cause.message.endswith("key['order']['when']: Clock is not JSON data")
        assert MARKER not in cause.message
        assert r.journal.effects() == [] and service.calls() == 0
    service.close()
