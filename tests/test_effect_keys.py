"""An effect key must be a function of the approved decision. A key (or an
input) with no single canonical JSON form is refused before anything is sent, naming the field
and the type; a key that changes between attempts of one activity with one input (it read the
clock) is caught on the retry, which sends nothing and says ``UnstableEffectKey``. Money is read
from the payments service."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError

from interlock_temporal import current_effect, gated, open_journal
from interlock_temporal.core.errors import InvalidCall, UnstableEffectKey
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Delivery, Gate, Measure, Ticket
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer, WorkerProcess
from interlock_temporal.workflow import receipt_from
from workers.server_world import ROOT

from .test_server import ORDER, cause_of, rig

KEY = "7c" * 32


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with open_journal(tmp_path / "journal.db", signing_key=KEY) as j:
        yield j


@pytest.fixture
def payments(tmp_path: Path) -> SimulatedPayments:
    service = SimulatedPayments(tmp_path / "payments.db", tier=2)
    service.open_order(ORDER, 10_000)
    return service


class Tagged(BaseModel):
    order_id: str
    amount_cents: int
    tags: set[str]


def call_of(
    arg: Any,
    *,
    key: Any = None,
    lease: str | None = None,
    attempt: int = 1,
    activity_id: str = "7",
) -> Call:
    return Call(
        effect_type="refund",
        activity="refund",
        input=arg,
        args=(arg,),
        key=key,
        principal="refund-bot",
        lease_id=lease,
        measure=lambda args: Measure(2_000),
        delivery=Delivery(
            workflow_id="wf-keys", run_id="run-1", activity_id=activity_id, attempt=attempt
        ),
        param_names=("r",),
    )


# -- values with no canonical JSON form -------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "where", "what"),
    [
        ({"order": "o-1", "items": {"a", "b"}}, "key['items']", "set"),
        ({"order": "o-1", "items": frozenset({"a"})}, "key['items']", "frozenset"),
        ({"order": "o-1", "at": [1, math.nan]}, "key['at'][1]", "NaN"),
        ({"order": "o-1", "amount": math.inf}, "key['amount']", "infinite"),
        ({"order": "o-1", "blob": b"\x00secret"}, "key['blob']", "bytes"),
        ({"order": "o-1", "who": object()}, "key['who']:", "object is not JSON data"),
        ({"order": "o-1", "nested": {7: "x"}}, "key['nested'] has", "a key of type int"),
        ({"order": "o-1", "n": 2**60}, "key['n']", "integer outside"),
    ],
)
async def test_a_key_without_one_canonical_form_is_refused_naming_where(
    journal: Journal, payments: SimulatedPayments, key: Any, where: str, what: str
) -> None:
    call = call_of({"order_id": ORDER, "amount_cents": 2_000}, key=key)
    with pytest.raises(InvalidCall) as refused:
        await Gate(journal).begin(call, payments)
    message = str(refused.value)
    named = where if " " in where or where.endswith(":") else f"{where} is"
    assert named in message and what in message, message
    assert "secret" not in message
    assert journal.effects() == [] and payments.calls() == 0


async def test_a_set_in_an_input_that_is_its_own_key_is_refused_naming_the_field(
    journal: Journal, payments: SimulatedPayments
) -> None:
    call = call_of(Tagged(order_id=ORDER, amount_cents=2_000, tags={"vip", "late"}))
    with pytest.raises(InvalidCall, match=r"r\.tags is a set"):
        await Gate(journal).begin(call, payments)
    assert journal.effects() == []


async def test_bytes_in_an_input_with_its_own_key_are_allowed(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = journal.leases.issue("refund-bot")
    arg = {"order_id": ORDER, "amount_cents": 2_000, "attachment": b"%PDF-1.7"}
    ticket = await Gate(journal).begin(call_of(arg, key={"order": ORDER}, lease=lease), payments)
    assert isinstance(ticket, Ticket)
    ticket.release()


# -- a key that changes between attempts -----------------------------------------------------


async def test_a_retry_whose_key_changed_sends_nothing_and_names_both_effects(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = journal.leases.issue("refund-bot")
    arg = {"order_id": ORDER, "amount_cents": 2_000}
    first = call_of(arg, key={"order": ORDER, "at": 1.5}, lease=lease)
    ticket = await Gate(journal).begin(first, payments)
    assert isinstance(ticket, Ticket)
    await payments.refund(ORDER, 2_000, idempotency_key=ticket.effect_id)
    ticket.release()  # the worker died after the send, before recording it

    retry = call_of(arg, key={"order": ORDER, "at": 2.5}, lease=lease, attempt=2)
    with pytest.raises(UnstableEffectKey) as caught:
        await Gate(journal).begin(retry, payments)
    err = caught.value
    assert err.first_effect_id == ticket.effect_id
    assert err.effect_id == Gate.identify(retry)[0] != ticket.effect_id
    assert err.effect_id in str(err) and ticket.effect_id in str(err)
    # the first effect is closed out without a send: the target has it
    assert err.receipt is not None and err.receipt.effect_id == ticket.effect_id
    assert (err.receipt.final, err.receipt.via) == ("COMMITTED", "recovery-query")
    assert journal.row(err.effect_id) is None  # nothing proposed under the new id
    assert payments.calls(ORDER) == 1 and payments.refunded_cents(ORDER) == 2_000


@pytest.mark.parametrize(
    ("tier", "final", "code"), [(2, "REFUSED", "abandoned"), (3, "AMBIGUOUS", "unknowable")]
)
async def test_the_first_effect_of_a_changed_key_is_closed_out_without_a_send(
    journal: Journal, tmp_path: Path, tier: int, final: str, code: str
) -> None:
    service = SimulatedPayments(tmp_path / f"tier{tier}.db", tier=tier)
    service.open_order(ORDER, 10_000)
    lease = journal.leases.issue("refund-bot")
    arg = {"order_id": ORDER, "amount_cents": 2_000}
    ticket = await Gate(journal).begin(call_of(arg, key={"at": 1}, lease=lease), service)
    assert isinstance(ticket, Ticket)
    ticket.release()  # died before the send
    retry = call_of(arg, key={"at": 2}, lease=lease, attempt=2)
    with pytest.raises(UnstableEffectKey) as caught:
        await Gate(journal).begin(retry, service)
    receipt = caught.value.receipt
    assert receipt is not None and (receipt.final, receipt.code) == (final, code)
    assert receipt.executed is (False if final == "REFUSED" else "unknown")
    why = "its activity's effect key changed between attempts"
    assert receipt.reason == (
        f"{why}, and it never happened; nobody else may send it"
        if final == "REFUSED"
        else f"{why} while it was in doubt, and the target cannot say whether it happened"
    )
    assert service.calls(ORDER) == 0


async def test_a_first_attempt_that_reuses_an_activity_id_is_not_a_changed_key(
    journal: Journal, payments: SimulatedPayments
) -> None:
    """Only a retry can change its key: a first attempt with the same activity id and input
    (an id reused on purpose) names a new effect and dispatches it."""
    lease = journal.leases.issue("refund-bot")
    arg = {"order_id": ORDER, "amount_cents": 2_000}
    first = await Gate(journal).begin(call_of(arg, key={"at": 1}, lease=lease), payments)
    assert isinstance(first, Ticket)
    first.release()
    again = await Gate(journal).begin(call_of(arg, key={"at": 2}, lease=lease), payments)
    assert isinstance(again, Ticket) and again.via == "dispatch"
    assert again.effect_id != first.effect_id
    again.release()


async def test_a_changed_key_whose_first_effect_is_held_names_it_as_it_stands(
    journal: Journal, payments: SimulatedPayments, tmp_path: Path
) -> None:
    """The first effect's own attempt is still live (it holds the claim): it cannot be closed
    out now, so the retry's error carries its receipt as it stands, in doubt, and sends nothing."""
    lease = journal.leases.issue("refund-bot")
    arg = {"order_id": ORDER, "amount_cents": 2_000}
    ticket = await Gate(journal).begin(call_of(arg, key={"at": 1}, lease=lease), payments)
    assert isinstance(ticket, Ticket)
    retry = call_of(arg, key={"at": 2}, lease=lease, attempt=2)
    with (
        open_journal(tmp_path / "journal.db", signing_key=KEY) as other_worker,
        pytest.raises(UnstableEffectKey) as caught,
    ):
        await Gate(other_worker).begin(retry, payments)
    receipt = caught.value.receipt
    assert receipt is not None and receipt.effect_id == ticket.effect_id
    assert (receipt.final, receipt.executed) == ("DISPATCHED", "unknown")
    assert caught.value.first_effect_id == ticket.effect_id
    assert payments.calls(ORDER) == 0
    ticket.release()


async def test_an_activity_id_reused_for_another_input_is_not_a_changed_key(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = journal.leases.issue("refund-bot")
    done = await Gate(journal).run(
        call_of({"order_id": ORDER, "amount_cents": 2_000}, key={"case": "a"}, lease=lease),
        payments,
        lambda t: payments.refund(ORDER, 2_000, idempotency_key=t.effect_id),
    )
    assert done.amount_cents == 2_000
    # the same activity id again in the same run, with another input, on a retry
    other = {"order_id": ORDER, "amount_cents": 1_000}
    ticket = await Gate(journal).begin(
        call_of(other, key={"case": "b"}, lease=lease, attempt=2), payments
    )
    assert isinstance(ticket, Ticket) and ticket.via == "dispatch"
    ticket.release()


# -- on a real server -------------------------------------------------------------------------


@pytest.mark.server
async def test_a_set_key_is_refused_on_a_real_worker_naming_the_field(
    dev_server: DevServer, tmp_path: Path
) -> None:
    payments_file = tmp_path / "tagged-payments.db"
    service = SimulatedPayments(payments_file, tier=2)

    @activity.defn(name="refund_tagged")
    @gated(target=service, key=lambda r: {"order": r.order_id, "tags": set(r.reason.split())})
    async def refund_tagged(r: RefundRequest) -> RefundResult:
        return await service.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    async with rig(dev_server, tmp_path, extra=[refund_tagged]) as r:
        with pytest.raises(WorkflowFailureError) as failure:
            await r.call("refund_tagged", r.request(), principal="refund-bot", lease=r.lease_id)
        cause = cause_of(failure.value)
        assert cause.type == "InvalidEffectInput" and cause.non_retryable
        assert "key['tags'] is a set" in cause.message
        assert r.journal.effects() == [] and service.calls() == 0
    service.close()


async def key_worker(client: Client, queue: str, journal: Journal, payments: Path) -> WorkerProcess:
    return await WorkerProcess(
        [
            "-m",
            "tests.key_worker",
            "--target",
            client.service_client.config.target_host,
            "--task-queue",
            queue,
            "--journal",
            journal.url,
            "--payments",
            str(payments),
        ],
        cwd=ROOT,
        env={"INTERLOCK_SIGNING_KEY": KEY},
    ).start()


def refund_request(
    payments: SimulatedPayments, case: str, cents: int, order: str = ORDER
) -> dict[str, Any]:
    return RefundRequest(
        case_id=case,
        order_id=order,
        amount_cents=cents,
        reason="damaged",
        premises=payments.order_facts(order),
    ).model_dump(mode="json")


@pytest.mark.server
@pytest.mark.faults
async def test_a_clock_keyed_activity_killed_after_its_send_sends_once(
    client: Client, journal: Journal, payments: SimulatedPayments
) -> None:
    queue = f"keys-{uuid.uuid4().hex[:8]}"
    lease = journal.leases.issue("refund-bot", activities=["refund_at"])
    payments.arm("after_commit", "kill")
    first = await key_worker(client, queue, journal, payments.path)
    workers = [first]
    try:
        run = await client.start_workflow(
            "CallActivity",
            {
                "activity": "refund_at",
                "arg": refund_request(payments, "c-clock", 2_000),
                "principal": "refund-bot",
                "lease": lease,
                "heartbeat_s": 2,
            },
            id=f"clock-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        await first.wait(timeout=60)
        assert first.killed
        workers.append(await key_worker(client, queue, journal, payments.path))
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(run.result(), 60)
        cause = cause_of(failure.value)
        assert cause.type == "UnstableEffectKey" and cause.non_retryable
        (first,) = journal.effects()
        assert first.effect_id in cause.message
        # closed out without a send: the service has it, and the error carries its receipt
        shown = receipt_from(failure.value.cause)  # type: ignore[arg-type]
        assert shown is not None and shown.effect_id == first.effect_id
        assert (shown.final, shown.via, shown.executed) == ("COMMITTED", "recovery-query", True)
        assert payments.calls(ORDER) == 1
        assert payments.refunded_cents(ORDER) == 2_000
        assert len(payments.refund_records(ORDER)) == 1
    finally:
        await asyncio.gather(*[w.stop() for w in workers])


@pytest.mark.server
@pytest.mark.faults
async def test_an_activity_id_reused_in_a_loop_with_a_retry_is_not_flagged(
    client: Client, journal: Journal, payments: SimulatedPayments
) -> None:
    queue = f"keys-{uuid.uuid4().hex[:8]}"
    lease = journal.leases.issue("refund-bot", activities=["refund"])
    other_order = payments.open_order("o-loop-2", 5_000)
    worker = await key_worker(client, queue, journal, payments.path)
    workers = [worker]
    try:
        run = await client.start_workflow(
            "ReusedActivityId",
            {
                "activity": "refund",
                "activity_id": "refund-step",
                "args": [
                    refund_request(payments, "c-loop-1", 2_000),
                    refund_request(payments, "c-loop-2", 1_000, other_order),
                ],
                "principal": "refund-bot",
                "lease": lease,
            },
            id=f"loop-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        deadline = time.monotonic() + 30
        while not [r for r in journal.effects() if r.status is Kind.COMMITTED]:
            assert time.monotonic() < deadline, "the first refund never committed"
            await asyncio.sleep(0.1)
        # the second refund, under the same activity id, dies after its send and is retried
        payments.arm("after_commit", "kill")
        await run.signal("next")
        await worker.wait(timeout=60)
        assert worker.killed
        workers.append(await key_worker(client, queue, journal, payments.path))
        results = await asyncio.wait_for(run.result(), 60)
        assert [r["amount_cents"] for r in results] == [2_000, 1_000]
        assert payments.refunded_cents(ORDER) == 2_000
        assert payments.refunded_cents(other_order) == 1_000
        assert payments.calls() == 2
        assert {r.status for r in journal.effects()} == {Kind.COMMITTED}
    finally:
        await asyncio.gather(*[w.stop() for w in workers])
