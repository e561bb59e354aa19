"""Every value the gate relies on is signed, and every read checks it.

An operator with write access to the database edits what the journal holds: a stored value (the
approved input, the result) or a field signed in the middle of an effect's chain. ``verify``
names the entry, and the gate decides nothing on that effect: recovery sends nothing, a
duplicate is not answered from it, and its receipt is refused. Money is read from the payments
service. SQLite and PostgreSQL both."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from interlock_temporal import receipt
from interlock_temporal.core.errors import JournalCorrupt
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Gate
from interlock_temporal.targets.payments import SimulatedPayments

from .refund_story import KEY, ORDER, Refund, Store, data_path, journal, payments, store

__all__ = ["journal", "payments", "store"]


def resigned_digest(body: bytes, path: tuple[str, ...], value: Any) -> bytes:
    """``body`` with the signed field at ``path`` replaced (its hash and signature left as
    they were: the operator has no key)."""
    doc = json.loads(body)
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return rfc8785.dumps(doc)


async def test_an_edited_approved_amount_is_never_sent(
    store: Store, journal: Journal, payments: SimulatedPayments
) -> None:
    """The operator raises the approved amount of an effect in doubt, and the digest its
    AUTHORIZED entry records to match: today's recovery would resend $49."""
    refund = Refund(journal, payments)
    eid = await refund.dies_before_send()
    seq_d, _, vals = store.entry(eid, Kind.DISPATCHED)
    assert vals is not None and '"amount_cents":2000' in vals
    edited = vals.replace('"amount_cents":2000', '"amount_cents":4900')
    store.sql("UPDATE entries SET vals = ? WHERE seq = ?", edited, seq_d)
    seq_a, body_a, _ = store.entry(eid, Kind.AUTHORIZED)
    approved = json.loads(edited)["approved"]
    digest = hashlib.sha256(rfc8785.dumps(approved)).hexdigest()
    store.sql(
        "UPDATE entries SET body = ? WHERE seq = ?",
        resigned_digest(body_a, (*data_path(body_a, Kind.AUTHORIZED), "approved_digest"), digest),
        seq_a,
    )

    report = journal.verify()
    assert not report.ok and report.first_bad_seq == seq_a, report
    with pytest.raises(JournalCorrupt) as caught:
        await refund.run()
    assert (caught.value.effect_id, caught.value.seq) == (eid, seq_a)
    with pytest.raises(JournalCorrupt):
        receipt(eid, journal=journal)
    assert payments.calls(ORDER) == 0
    assert payments.refunded_cents(ORDER) == 0


async def test_an_edited_result_is_never_returned_to_a_duplicate(
    store: Store, journal: Journal, payments: SimulatedPayments
) -> None:
    refund = Refund(journal, payments)
    first = await refund.run()
    eid = Gate.identify(refund.call())[0]
    seq, _, vals = store.entry(eid, Kind.COMMITTED)
    assert vals is not None and first.refund_id in vals
    store.sql(
        "UPDATE entries SET vals = ? WHERE seq = ?", vals.replace(first.refund_id, "re-x"), seq
    )

    report = journal.verify()
    assert not report.ok and report.first_bad_seq == seq, report
    with pytest.raises(JournalCorrupt) as caught:
        await refund.run()  # a duplicate submission: today it returns the edited result
    assert caught.value.seq == seq
    assert payments.calls(ORDER) == 1 and payments.refunded_cents(ORDER) == 2_000


async def test_an_edited_field_in_the_middle_of_a_chain_stops_recovery(
    store: Store, journal: Journal, payments: SimulatedPayments
) -> None:
    """The operator changes what the PROPOSED entry recorded (the premises the agent relied
    on), two entries before the chain's head: today only the last entry is ever checked."""
    refund = Refund(journal, payments)
    eid = await refund.dies_before_send()
    seq_p, body_p, _ = store.entry(eid, Kind.PROPOSED)
    path = data_path(body_p, Kind.PROPOSED)
    facts = functools.reduce(lambda node, key: node[key], path, json.loads(body_p))["premises"]
    store.sql(
        "UPDATE entries SET body = ? WHERE seq = ?",
        resigned_digest(body_p, (*path, "premises"), {**facts, "refundable_cents": 1}),
        seq_p,
    )
    assert journal.verify().first_bad_seq == seq_p
    with pytest.raises(JournalCorrupt) as caught:
        await refund.run()
    assert (caught.value.effect_id, caught.value.seq) == (eid, seq_p)
    assert journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]
    assert payments.calls(ORDER) == 0


@pytest.mark.server
async def test_the_reconciler_reports_a_corrupt_effect_and_sends_nothing(
    client: Any, store: Store, tmp_path: Path
) -> None:
    """A cancelled workflow's refund is in doubt (the worker died before the send); the
    operator edits the payload digest its PROPOSED entry signed. Today the reconciler calls
    that a conflicting payload; it must name the corrupt entry, and send nothing."""
    from workers.server_world import ServerWorld

    from .test_reconciler import cancelled_in_doubt, reconcile

    world = ServerWorld(client, tmp_path, 2, "gated", journal_url=store.url, signing_key=KEY)
    try:
        eid = await cancelled_in_doubt(world, "before_send")
        seq, body, _ = store.entry(eid, Kind.PROPOSED)
        edited = resigned_digest(
            body, (*data_path(body, Kind.PROPOSED), "payload_digest"), "0" * 64
        )
        store.sql("UPDATE entries SET body = ? WHERE seq = ?", edited, seq)

        report = await reconcile(client, world.task_queue)
        (outcome,) = [o for o in report.outcomes if o.effect_id == eid]
        assert (outcome.final, outcome.skipped) == ("skipped", "journal_corrupt"), outcome
        assert f"seq={seq}" in outcome.note
        assert "conflicting_payload" not in outcome.note
        assert world.journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]
        assert world.payments.calls(world.order_id) == 0
        assert world.payments.refunded_cents(world.order_id) == 0
    finally:
        await world.close()
