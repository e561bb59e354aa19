"""Keyed effect ids, on every journal backend (a part of ``JournalConformance``).

A plain effect id is sha256 of the decision (``{case, order}``): whoever reads a workflow id or
the journal can find the decision by trying values. A journal keyed with ``key_effect_ids``
names effects with HMAC-SHA256 under a key derived from its signing key instead; the plugin
keys a new journal when its client has a payload codec. The setting is made once, before the
first entry, and an edit of it is caught: two names for one decision would send it twice.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from interlock_temporal.core.errors import (
    InFlight,
    JournalConfigError,
    JournalCorrupt,
    Refused,
)
from interlock_temporal.core.identity import effect_id
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Done, Gate, Ticket
from interlock_temporal.core.sealing import KEYED, Values
from interlock_temporal.targets.payments import RefundRequest, SimulatedPayments

from .fixtures import make_release_journal as release

KEY = "11" * 32
OTHER_KEY = "22" * 32


def expected_id(journal_key: str, case: str) -> str:
    """The keyed id of the refund of ``case``, made here without the package: HKDF-SHA256 of
    the journal key (label ``interlock-effect-ids-v1``), then HMAC-SHA256 of the RFC 8785
    document sha256 would hash."""
    id_key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"interlock-effect-ids-v1"
    ).derive(bytes.fromhex(journal_key))
    document = rfc8785.dumps(
        {"effect_type": "refund", "key": {"case": case, "order": release.ORDER}}
    )
    return hmac.new(id_key, document, hashlib.sha256).hexdigest()


class _Refunds:
    """Refunds under a lease of the journal's, against the stateful payments fake."""

    def __init__(self, tmp_path: Path, journal: Journal) -> None:
        self.payments = SimulatedPayments(tmp_path / "payments-ids.db", tier=2)
        self.payments.open_order(release.ORDER, release.PAID_CENTS)
        journal.leases.issue(
            "refund-bot", activities=["refund"], max_amount_cents=5_000, lease_id=release.LEASE
        )

    def call(self, case: str, amount: int) -> Any:
        req = release.request(case, amount, self.payments)
        return release.call(req, release.LEASE, f"wf-{case}")

    async def send(self, ticket: Ticket) -> Any:
        r: RefundRequest = ticket.input
        return await self.payments.refund(
            r.order_id, r.amount_cents, idempotency_key=ticket.effect_id
        )


def keyed(journal: Journal) -> Journal:
    journal.key_effect_ids(Values(journal.keyring).id_scheme())
    return journal


class EffectIdsConformance:
    """Needs the fixtures ``open_store`` and ``tamper`` of ``JournalConformance``; HMAC keys."""

    async def test_a_keyed_journal_names_each_effect_with_hmac_and_a_duplicate_is_not_sent(
        self, open_store: Callable[..., Journal], tmp_path: Path
    ) -> None:
        journal = keyed(open_store())
        assert journal.effect_ids == KEYED + journal.keyring.signing.key_id
        refunds, gate = _Refunds(tmp_path, journal), Gate(journal)
        await gate.run(refunds.call("c-1", 2_000), refunds.payments, refunds.send)
        eid = expected_id(KEY, "c-1")
        plain = effect_id("refund", {"case": "c-1", "order": release.ORDER})
        assert eid != plain
        (row,) = journal.effects()
        assert row.effect_id == eid and row.status is Kind.COMMITTED
        assert journal.read(eid)[0].data["ids"] == journal.effect_ids
        # the same decision again, from a journal opened afresh (another worker): not sent
        again = open_store()
        assert again.effect_ids == journal.effect_ids
        done = await Gate(again).begin(refunds.call("c-1", 2_000), refunds.payments)
        assert isinstance(done, Done)
        with pytest.raises(Refused):  # the same id with another payload is refused
            await Gate(again).begin(refunds.call("c-1", 2_500), refunds.payments)
        assert refunds.payments.refunded_cents(release.ORDER) == 2_000
        assert again.verify().ok

    async def test_ids_stay_the_same_after_the_signing_key_rotates(
        self, open_store: Callable[..., Journal], tmp_path: Path
    ) -> None:
        keyed(open_store())
        rotated = open_store(signing_key=OTHER_KEY, older_keys=[KEY])
        refunds = _Refunds(tmp_path, rotated)
        await Gate(rotated).run(refunds.call("c-2", 900), refunds.payments, refunds.send)
        assert [r.effect_id for r in rotated.effects()] == [expected_id(KEY, "c-2")]
        with pytest.raises(JournalConfigError, match="does not hold: add it to older_keys"):
            await Gate(open_store(signing_key=OTHER_KEY)).begin(
                refunds.call("c-3", 900), refunds.payments
            )

    async def test_only_a_journal_without_effects_can_be_keyed(
        self, open_store: Callable[..., Journal], tmp_path: Path
    ) -> None:
        journal = open_store()
        refunds = _Refunds(tmp_path, journal)
        await Gate(journal).run(refunds.call("c-1", 1_000), refunds.payments, refunds.send)
        with pytest.raises(JournalConfigError, match="has effects: keying its effect ids now"):
            keyed(journal)
        assert journal.effect_ids is None and open_store().effect_ids is None

    async def test_a_journal_with_leases_and_no_effect_can_be_keyed(
        self, open_store: Callable[..., Journal], tmp_path: Path
    ) -> None:
        """A lease is a signed chain of the journal's own (issued before any effect, as an
        operator does): it names no effect, and the journal can still be keyed."""
        journal = open_store()
        refunds = _Refunds(tmp_path, journal)  # issues its lease
        assert journal.leases.get(release.LEASE) is not None
        keyed(journal)
        await Gate(journal).run(refunds.call("c-1", 1_000), refunds.payments, refunds.send)
        assert [r.effect_id for r in journal.effects()] == [expected_id(KEY, "c-1")]

    def test_the_setting_is_made_once(self, open_store: Callable[..., Journal]) -> None:
        journal = keyed(open_store())
        keyed(journal)  # the same scheme again: nothing to do
        other = open_store(signing_key=OTHER_KEY, older_keys=[KEY])
        with pytest.raises(JournalConfigError, match=r"keyed with hmac-sha256:.* for good"):
            keyed(other)

    async def test_a_worker_that_opened_before_the_keying_names_its_effect_again(
        self, open_store: Callable[..., Journal], tmp_path: Path
    ) -> None:
        early = open_store()  # a worker, started while the journal was new
        keyed(open_store())  # another process keys it before the first effect
        refunds = _Refunds(tmp_path, early)
        with pytest.raises(InFlight, match="effect ids were keyed"):
            await Gate(early).run(refunds.call("c-1", 700), refunds.payments, refunds.send)
        assert refunds.payments.refunded_cents(release.ORDER) == 0  # nothing was sent
        assert early.effects() == []
        await Gate(early).run(refunds.call("c-1", 700), refunds.payments, refunds.send)
        assert [r.effect_id for r in early.effects()] == [expected_id(KEY, "c-1")]
        assert refunds.payments.refunded_cents(release.ORDER) == 700

    @pytest.mark.parametrize("combined", [False, True], ids=["separate", "combined"])
    @pytest.mark.parametrize("edit", ["removed", "added"])
    async def test_an_edited_setting_is_caught_at_open_and_by_verify(
        self,
        open_store: Callable[..., Journal],
        tamper: Any,
        tmp_path: Path,
        edit: str,
        combined: bool,
    ) -> None:
        # combined: the proposal that records the setting is a part of a format-3 dispatch
        journal = open_store()
        journal.combine_dispatch = combined  # type: ignore[attr-defined]
        if edit == "removed":
            keyed(journal)
        refunds = _Refunds(tmp_path, journal)
        await Gate(journal).run(refunds.call("c-1", 600), refunds.payments, refunds.send)
        await Gate(journal).run(refunds.call("c-2", 600), refunds.payments, refunds.send)
        # the first effect's PROPOSED (the lease's signed entry comes before it)
        first = min(journal.read(r.effect_id)[0].seq for r in journal.effects())
        tamper.set_meta("effect_ids", None if edit == "removed" else "hmac-sha256:forged")
        with pytest.raises(JournalCorrupt, match="the journal's setting says") as caught:
            open_store()
        assert caught.value.seq == first
        report = journal.verify()
        assert not report.ok and report.first_bad_seq == first
        assert "names its effect with ids" in str(report.problem)
