"""The Stripe refunds adapter (``interlock_temporal.targets.stripe``) against a stateful Stripe
fake (``stripe-stateful-mock`` on loopback, ``make test`` installs it) through the official SDK.

One fake and one proxy serve the whole session: the proxy counts refund requests and can let a
refund commit at Stripe and then drop its response. The fake never resets, so every test makes
its own charges. Money is always read back from the fake with a client that talks to it
directly, never from the gate.

Calls that go through the proxy run in a thread: the proxy lives on the test's event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import stripe
from pydantic import BaseModel
from temporalio.client import Client

from interlock_temporal import receipt
from interlock_temporal.core.errors import InFlight, Refused
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Change, Found, Kind
from interlock_temporal.core.protocol import Call, Gate, Measure, Ticket
from interlock_temporal.core.targets import capabilities
from interlock_temporal.core.targets import classify as core_classify
from interlock_temporal.core.targets import query as core_query
from interlock_temporal.targets.stripe import StripeRefund, StripeRefunds
from interlock_temporal.testing import (
    STRIPE_TEST_KEY,
    StripeMock,
    StripeProxy,
    free_port,
    throwaway_journal,
)
from workers import demo
from workers.scenarios import SCENARIOS, open_world_journal, run_in
from workers.stripe_harness import StripeServerWorld, stripe_inprocess_world

PRINCIPAL = "refund-bot"
ELIGIBLE = "refund_eligible"
SECRET = "whsec_interlock_test"


def sdk(url: str) -> stripe.StripeClient:
    return stripe.StripeClient(STRIPE_TEST_KEY, base_addresses={"api": url}, max_network_retries=0)


@dataclass
class Fake:
    mock: StripeMock
    proxy: StripeProxy
    #: talks to the fake directly: what the tests read the money with
    direct: stripe.StripeClient
    #: talks through the proxy (counted, and droppable)
    proxied: stripe.StripeClient

    def charge(self, amount: int = 10_000, metadata: dict[str, str] | None = None) -> str:
        params: dict[str, Any] = {"amount": amount, "currency": "usd", "source": "tok_visa"}
        if metadata:
            params["metadata"] = metadata
        return str(self.direct.v1.charges.create(params=params).id)

    def refunds(self, charge_id: str) -> list[Any]:
        listed = self.direct.v1.refunds.list(params={"charge": charge_id, "limit": 100})
        return list(listed.auto_paging_iter())

    def refunded(self, charge_id: str) -> int:
        return int(self.direct.v1.charges.retrieve(charge_id).amount_refunded)

    def manual_refund(self, charge_id: str, amount: int) -> str:
        """Support refunds by hand in the dashboard: no key of ours, no effect id."""
        return str(self.direct.v1.refunds.create(params={"charge": charge_id, "amount": amount}).id)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stripe_fake() -> AsyncIterator[Fake]:
    mock = await StripeMock().start()
    proxy = await StripeProxy(mock.port).start()
    try:
        yield Fake(mock, proxy, sdk(mock.url), sdk(proxy.url))
    finally:
        await proxy.stop()
        await mock.stop()


@pytest.fixture
def fake(stripe_fake: Fake) -> Fake:
    stripe_fake.proxy.refund_posts = 0
    stripe_fake.proxy.drop_refund_responses = 0
    stripe_fake.proxy.dropped = 0
    return stripe_fake


def effect(tag: str = "") -> str:
    return hashlib.sha256(f"{tag}{uuid.uuid4()}".encode()).hexdigest()


def metadata_of(refund: Any) -> dict[str, Any]:
    return refund.metadata.to_dict() if refund.metadata else {}


# -- capture: the facts a refund relies on --------------------------------------------------


async def test_capture_leaves_out_this_effects_own_refunds_only(fake: Fake) -> None:
    charge = fake.charge(metadata={ELIGIBLE: "true"})
    target = StripeRefunds(fake.direct, eligibility_metadata=(ELIGIBLE, "missing_key"))
    me, other = effect("me"), effect("other")
    fake.manual_refund(charge, 500)
    target.refund({"charge_id": charge, "amount_cents": 700}, effect_id=other)
    target.refund({"charge_id": charge, "amount_cents": 2_000}, effect_id=me)
    assert fake.refunded(charge) == 3_200

    facts = await target.capture({"charge_id": charge, "amount_cents": 2_000}, me)
    assert facts == {
        "charge": charge,
        "amount": 10_000,
        "currency": "usd",
        "status": "succeeded",
        "disputed": False,
        # the refund by hand and the other effect's count; this effect's own does not
        "amount_refunded_other": 1_200,
        f"metadata.{ELIGIBLE}": "true",
        "metadata.missing_key": None,
    }
    assert target.facts(charge)["amount_refunded_other"] == 3_200  # nothing excluded
    assert (await target.capture({"charge_id": charge}, other))["amount_refunded_other"] == 2_500


# -- validate: equality on every fact, and the predicates a refund needs ------------------------


async def test_a_refund_by_hand_since_the_decision_is_a_changed_fact(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.direct)
    me, payload = effect(), {"charge_id": charge, "amount_cents": 2_000}
    decided = target.facts(charge)
    assert target.validate(decided, await target.capture(payload, me), payload) == []

    fake.manual_refund(charge, 1_000)  # the remainder ($90) still covers the $20
    changes = target.validate(decided, await target.capture(payload, me), payload)
    assert changes == [
        Change(fact="amount_refunded_other", recorded=0, current=1_000),
    ]


async def test_this_effects_own_refund_does_not_change_its_facts(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.direct)
    me, payload = effect(), {"charge_id": charge, "amount_cents": 6_000}
    decided = target.facts(charge)
    target.refund(payload, effect_id=me)  # it landed; recovery re-checks the facts
    current = await target.capture(payload, me)
    # its own $60 neither changes a fact nor eats the remainder it needs
    assert target.validate(decided, current, payload) == []
    assert target.facts(charge)["amount_refunded_other"] == 6_000


async def test_a_remainder_too_small_for_the_refund_is_named(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.direct)
    fake.manual_refund(charge, 9_000)
    payload = {"charge_id": charge, "amount_cents": 2_000}
    decided = target.facts(charge)  # the agent decided with the $90 already refunded
    changes = target.validate(decided, await target.capture(payload, effect()), payload)
    assert changes == [
        Change(
            fact="refundable_remainder", recorded=2_000, current=1_000, rule="remainder >= amount"
        )
    ]
    # refunded by hand after the decision: both the changed fact and the remainder
    later = fake.charge()
    decided = target.facts(later)
    fake.manual_refund(later, 9_000)
    payload = {"charge_id": later, "amount_cents": 2_000}
    changes = target.validate(decided, await target.capture(payload, effect()), payload)
    assert [c.fact for c in changes] == ["amount_refunded_other", "refundable_remainder"]


def test_a_disputed_or_unsucceeded_charge_is_a_change_even_when_nothing_moved(
    fake: Fake,
) -> None:
    target = StripeRefunds(fake.direct)
    payload = {"charge_id": "ch_x", "amount_cents": 2_000}
    ok = {
        "charge": "ch_x",
        "amount": 10_000,
        "currency": "usd",
        "status": "succeeded",
        "disputed": False,
        "amount_refunded_other": 0,
    }
    assert target.validate(ok, ok, payload) == []

    disputed = {**ok, "disputed": True}
    # decided on an already disputed charge: equality sees nothing, the predicate does
    assert target.validate(disputed, disputed, payload) == [
        Change(fact="disputed", recorded=True, current=True, rule="no dispute")
    ]
    # disputed since the decision: named once, as a changed fact
    assert target.validate(ok, disputed, payload) == [
        Change(fact="disputed", recorded=False, current=True)
    ]
    for status in ("pending", "failed"):
        unsucceeded = {**ok, "status": status}
        assert target.validate(unsucceeded, unsucceeded, payload) == [
            Change(fact="status", recorded=status, current=status, rule="charge succeeded")
        ]


# -- classify: real SDK exceptions, produced against the fake ---------------------------------


async def test_an_over_refund_is_rejected(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.direct)
    with pytest.raises(stripe.InvalidRequestError) as err:
        target.refund({"charge_id": charge, "amount_cents": 20_000}, effect_id=effect())
    assert target.classify(err.value) == "rejected"
    assert fake.refunded(charge) == 0


async def test_the_same_key_with_another_amount_is_in_doubt(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.direct)
    eid = effect()
    first = target.refund({"charge_id": charge, "amount_cents": 2_000}, effect_id=eid)
    replay = target.refund({"charge_id": charge, "amount_cents": 2_000}, effect_id=eid)
    assert replay.refund_id == first.refund_id  # the fake dedupes by key, like Stripe
    with pytest.raises(stripe.IdempotencyError) as err:
        target.refund({"charge_id": charge, "amount_cents": 3_000}, effect_id=eid)
    # a request under this key landed: never "rejected", never "not sent"
    assert target.classify(err.value) == "in_doubt"
    assert fake.refunded(charge) == 2_000
    assert len(fake.refunds(charge)) == 1


async def test_a_refused_connection_is_in_doubt(fake: Fake) -> None:
    nowhere = StripeRefunds(sdk(f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(stripe.APIConnectionError) as err:
        nowhere.refund({"charge_id": "ch_x", "amount_cents": 2_000}, effect_id=effect())
    assert nowhere.classify(err.value) == "in_doubt"


async def test_a_dropped_response_is_in_doubt_and_the_refund_exists(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.proxied)
    eid = effect()
    fake.proxy.drop_refund_responses = 1
    with pytest.raises(stripe.APIConnectionError) as err:
        await target.refund_async({"charge_id": charge, "amount_cents": 2_000}, effect_id=eid)
    assert target.classify(err.value) == "in_doubt"
    assert fake.proxy.dropped == 1 and fake.proxy.refund_posts == 1
    (landed,) = fake.refunds(charge)  # it committed; its sender never heard back
    assert metadata_of(landed) == {"effect_id": eid}
    assert int(landed.amount) == 2_000


async def test_bad_credentials_are_rejected(fake: Fake) -> None:
    charge = fake.charge()
    client = stripe.StripeClient(
        "sk_live_not_a_test_key", base_addresses={"api": fake.mock.url}, max_network_retries=0
    )
    target = StripeRefunds(client)
    with pytest.raises(stripe.AuthenticationError) as err:
        target.refund({"charge_id": charge, "amount_cents": 2_000}, effect_id=effect())
    assert target.classify(err.value) == "rejected"
    assert fake.refunded(charge) == 0


def test_constructed_errors_classify(fake: Fake) -> None:
    target = StripeRefunds(fake.direct)
    in_use = stripe.APIError(
        "another request with this key is executing",
        http_status=409,
        json_body={"error": {"code": "idempotency_key_in_use"}},
    )
    cases: list[tuple[BaseException, str]] = [
        (stripe.RateLimitError("slow down", http_status=429), "not_sent"),
        (stripe.APIError("boom", http_status=500), "in_doubt"),
        (in_use, "in_doubt"),
        (stripe.CardError("declined", None, "card_declined", http_status=402), "rejected"),
        (stripe.PermissionError("no", http_status=403), "rejected"),
        (TimeoutError("read timed out"), "in_doubt"),
    ]
    for error, verdict in cases:
        assert target.classify(error) == verdict, error
        assert core_classify(target, error) == verdict  # what the gate will do with it


# -- query and find: through the charge's refunds, by metadata.effect_id -----------------------


async def test_query_finds_this_effects_refund_and_no_other(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.direct)
    mine, other, never = effect("mine"), effect("other"), effect("never")
    fake.manual_refund(charge, 100)
    theirs = target.refund({"charge_id": charge, "amount_cents": 300}, effect_id=other)
    sent = target.refund({"charge_id": charge, "amount_cents": 2_000}, effect_id=mine)
    payload = {"charge_id": charge, "amount_cents": 2_000}

    found = await target.query(mine, payload)
    assert found == Found(
        result={
            "refund_id": sent.refund_id,
            "charge_id": charge,
            "amount_cents": 2_000,
            "currency": "usd",
            "status": sent.status,
        },
        confirmation=sent.refund_id,
    )
    assert found.result == target.found_result(fake.direct.v1.refunds.retrieve(sent.refund_id))
    assert target.confirmation(sent) == sent.refund_id  # the model the send returns
    assert target.confirmation(found.result) == sent.refund_id  # the dict recovery returns

    assert await target.query(never, payload) is None  # another effect's refund is not it
    other_found = await target.query(other, payload)
    assert other_found is not None and other_found.confirmation == theirs.refund_id
    # through the gate's own call: it passes the approved input along
    assert await core_query(target, mine, payload) == found
    assert capabilities(target).tier == 1 and capabilities(target).queryable


async def test_query_without_the_input_raises_rather_than_guess(fake: Fake) -> None:
    charge = fake.charge()
    target = StripeRefunds(fake.direct)
    eid = effect()
    target.refund({"charge_id": charge, "amount_cents": 2_000}, effect_id=eid)
    with pytest.raises(ValueError, match="through their charge"):
        await target.query(eid, None)
    with pytest.raises(ValueError):
        await core_query(target, eid, None)  # the gate's call propagates it: never "absent"
    with pytest.raises(ValueError, match="charge_id"):
        await target.query(eid, {"amount_cents": 2_000})


# -- the gate, end to end with the core protocol (no Temporal) -------------------------------


class RefundInput(BaseModel):
    charge_id: str
    amount_cents: int
    premises: dict[str, Any] | None = None


@dataclass
class Rig:
    fake: Fake
    journal: Journal
    lease_id: str
    target: StripeRefunds
    charge: str
    offset: list[float]
    #: the facts the agent read when it decided (carried in the input's ``premises``)
    decided: dict[str, Any]

    def clock(self) -> float:
        return time.time() + self.offset[0]

    def call(self, amount: int = 2_000) -> Call:
        r = RefundInput(charge_id=self.charge, amount_cents=amount, premises=self.decided)
        return Call(
            effect_type="refund",
            activity="refund",
            input=r,
            args=(r,),
            key={"charge": self.charge, "case": "4471"},
            premises_field="premises",
            principal=PRINCIPAL,
            lease_id=self.lease_id,
            measure=lambda args: Measure(args[0].amount_cents),
            decode_args=lambda blob: (RefundInput.model_validate(blob[0]),),
        )

    @property
    def eid(self) -> str:
        return Gate.identify(self.call())[0]

    async def send(self, ticket: Ticket) -> StripeRefund:
        return await self.target.refund_async(ticket.input, effect_id=ticket.effect_id)

    async def run(self, gate: Gate | None = None) -> Any:
        return await (gate or Gate(self.journal)).run(self.call(), self.target, self.send)

    async def died_before_send(self) -> None:
        ticket = await Gate(self.journal).begin(self.call(), self.target)
        assert isinstance(ticket, Ticket) and ticket.via == "dispatch"
        ticket.release()  # the worker died: nothing was sent, nothing recorded after

    def status(self) -> Kind | None:
        row = self.journal.row(self.eid)
        return None if row is None else row.status


@pytest.fixture
def make_rig(fake: Fake, tmp_path: Path) -> Any:
    journals: list[Journal] = []

    def make(target_cls: type[StripeRefunds] = StripeRefunds) -> Rig:
        journal = throwaway_journal(tmp_path)
        journals.append(journal)
        lease = journal.leases.issue(PRINCIPAL, activities=["refund"], max_amount_cents=5_000)
        offset = [0.0]
        target = target_cls(fake.proxied, clock=lambda: time.time() + offset[0])
        charge = fake.charge()
        decided = StripeRefunds(fake.direct).facts(charge)  # the agent read the charge
        return Rig(fake, journal, lease, target, charge, offset, decided)

    yield make
    for journal in journals:
        report = journal.verify()
        journal.close()
        assert report.ok, str(report)


async def test_gate_happy_path_then_a_duplicate(fake: Fake, make_rig: Any) -> None:
    rig: Rig = make_rig()
    result = await rig.run()
    assert isinstance(result, StripeRefund)
    (landed,) = fake.refunds(rig.charge)
    assert result.refund_id == landed.id and result.amount_cents == 2_000
    assert metadata_of(landed) == {"effect_id": rig.eid}
    shown = receipt(rig.eid, journal=rig.journal)
    assert (shown.final, shown.via, shown.confirmation) == ("COMMITTED", "dispatch", landed.id)
    assert shown.tier == 1 and shown.target == "stripe-refunds"

    again = await rig.run()  # submitted again: the recorded result, nothing sent
    assert again["refund_id"] == landed.id
    assert fake.proxy.refund_posts == 1
    assert fake.refunded(rig.charge) == 2_000


async def test_gate_recovers_a_dropped_response_by_query(fake: Fake, make_rig: Any) -> None:
    rig: Rig = make_rig()
    fake.proxy.drop_refund_responses = 1
    with pytest.raises(stripe.APIConnectionError):
        await rig.run()  # not the last attempt: in doubt, left for the next attempt
    assert rig.status() is Kind.DISPATCHED
    assert fake.proxy.dropped == 1

    result = await rig.run(Gate(rig.journal))  # the next attempt, on a fresh gate
    (landed,) = fake.refunds(rig.charge)
    assert result["refund_id"] == landed.id
    shown = receipt(rig.eid, journal=rig.journal)
    assert (shown.final, shown.via, shown.confirmation) == (
        "COMMITTED",
        "recovery-query",
        landed.id,
    )
    assert fake.proxy.refund_posts == 1  # found, not sent again
    assert fake.refunded(rig.charge) == 2_000


async def test_gate_inside_the_window_resends_with_the_same_key(fake: Fake, make_rig: Any) -> None:
    rig: Rig = make_rig()
    await rig.died_before_send()
    assert fake.proxy.refund_posts == 0
    await rig.run()
    shown = receipt(rig.eid, journal=rig.journal)
    assert (shown.final, shown.via) == ("COMMITTED", "retry-idempotent")
    (landed,) = fake.refunds(rig.charge)
    assert shown.confirmation == landed.id
    assert fake.proxy.refund_posts == 1


class BlindListing(StripeRefunds):
    """A listing that has not caught up yet: recovery cannot see the refund."""

    def find(self, effect_id: str, charge_id: str) -> Found | None:
        return None


async def test_gate_inside_the_window_a_landed_refund_is_deduped_by_its_key(
    fake: Fake, make_rig: Any
) -> None:
    rig: Rig = make_rig(BlindListing)
    fake.proxy.drop_refund_responses = 1
    with pytest.raises(stripe.APIConnectionError):
        await rig.run()
    (landed,) = fake.refunds(rig.charge)
    result = await rig.run()  # not found, inside the window: the same key goes again
    assert fake.proxy.refund_posts == 2
    assert result.refund_id == landed.id  # Stripe replayed the first refund
    assert len(fake.refunds(rig.charge)) == 1 and fake.refunded(rig.charge) == 2_000
    shown = receipt(rig.eid, journal=rig.journal)
    assert (shown.via, shown.confirmation) == ("retry-idempotent", landed.id)


async def test_gate_after_the_window_asks_settles_and_reapplies(fake: Fake, make_rig: Any) -> None:
    rig: Rig = make_rig()
    await rig.died_before_send()
    rig.offset[0] = 25 * 3600  # Stripe's key is gone; a resend would not be deduped

    # the gate's own clock has not moved: "not found" is not believed before settle_time
    with pytest.raises(InFlight):
        await rig.run(Gate(rig.journal))
    assert fake.proxy.refund_posts == 0
    assert rig.status() is Kind.DISPATCHED

    await rig.run(Gate(rig.journal, clock=rig.clock))  # 25 h later for everyone
    shown = receipt(rig.eid, journal=rig.journal)
    assert (shown.final, shown.via) == ("COMMITTED", "recovery-reapply")
    (landed,) = fake.refunds(rig.charge)
    assert shown.confirmation == landed.id
    assert fake.proxy.refund_posts == 1 and fake.refunded(rig.charge) == 2_000


async def test_gate_refuses_when_support_refunded_by_hand_since_the_decision(
    fake: Fake, make_rig: Any
) -> None:
    rig: Rig = make_rig()
    fake.manual_refund(rig.charge, 2_000)
    with pytest.raises(Refused) as err:
        await rig.run()
    assert err.value.code == "stale_premise"
    assert err.value.receipt.changed_facts == ["amount_refunded_other"]
    assert fake.proxy.refund_posts == 0 and fake.refunded(rig.charge) == 2_000


# -- webhooks: verified with Stripe's scheme, recorded as CONFIRMED annotations ---------------


def signed(event: dict[str, Any], secret: str = SECRET, at: int | None = None) -> tuple[str, str]:
    payload = json.dumps(event)
    t = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{t}.{payload}".encode(), hashlib.sha256).hexdigest()
    return payload, f"t={t},v1={mac}"


def event_of(kind: str, obj: Any) -> dict[str, Any]:
    return {
        "id": f"evt_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "type": kind,
        "api_version": "2024-06-20",
        "created": int(time.time()),
        "livemode": False,
        "data": {"object": obj.to_dict() if hasattr(obj, "to_dict") else obj},
    }


def confirmations(journal: Journal, eid: str) -> list[dict[str, Any]]:
    return [e.data for e in journal.read(eid) if e.kind is Kind.CONFIRMED]


async def test_a_refund_webhook_confirms_the_effect_once(fake: Fake, make_rig: Any) -> None:
    rig: Rig = make_rig()
    result = await rig.run()
    before = receipt(rig.eid, journal=rig.journal)
    refund = fake.direct.v1.refunds.retrieve(result.refund_id)
    event = event_of("refund.created", refund)
    payload, header = signed(event)

    outcome = rig.target.confirm_webhook(payload.encode(), header, SECRET, rig.journal)
    assert outcome.confirmed == [rig.eid]
    assert (outcome.already, outcome.unknown, outcome.untagged) == ([], [], [])
    (data,) = confirmations(rig.journal, rig.eid)
    assert data["event_id"] == event["id"] and data["refund_id"] == result.refund_id
    assert data["amount"] == 2_000 and data["source"] == "stripe-webhook"
    assert rig.status() is Kind.COMMITTED  # an annotation: the state is unchanged
    after = receipt(rig.eid, journal=rig.journal)
    assert (after.final, after.via, after.confirmation) == (
        before.final,
        before.via,
        before.confirmation,
    )
    assert rig.journal.verify().ok

    again = rig.target.confirm_webhook(payload, header, SECRET, rig.journal)  # redelivered
    assert (again.confirmed, again.already) == ([], [rig.eid])
    assert len(confirmations(rig.journal, rig.eid)) == 1

    updated = event_of("refund.updated", refund)  # another event about the same refund
    outcome = rig.target.confirm_webhook(*signed(updated), SECRET, rig.journal)
    assert outcome.confirmed == [rig.eid]
    assert len(confirmations(rig.journal, rig.eid)) == 2


async def test_a_bad_signature_appends_nothing(fake: Fake, make_rig: Any) -> None:
    rig: Rig = make_rig()
    result = await rig.run()
    event = event_of("refund.created", fake.direct.v1.refunds.retrieve(result.refund_id))
    entries = len(rig.journal.read(rig.eid))
    payload, header = signed(event)
    forged_payload, forged_header = signed(event, secret="whsec_someone_else")
    stale_payload, stale_header = signed(event, at=int(time.time()) - 3600)
    for body, sig in [
        (forged_payload, forged_header),  # signed with another secret
        (payload.replace("2000", "9000"), header),  # tampered after signing
        (stale_payload, stale_header),  # outside the tolerance
        (payload, ""),
    ]:
        with pytest.raises(stripe.SignatureVerificationError):
            rig.target.confirm_webhook(body, sig, SECRET, rig.journal)
    assert len(rig.journal.read(rig.eid)) == entries
    assert confirmations(rig.journal, rig.eid) == []


async def test_unknown_and_untagged_refunds_are_reported(fake: Fake, make_rig: Any) -> None:
    rig: Rig = make_rig()
    stranger = effect("elsewhere")  # tagged by a gate with another journal
    theirs = StripeRefunds(fake.direct).refund(
        {"charge_id": rig.charge, "amount_cents": 500}, effect_id=stranger
    )
    by_hand = fake.manual_refund(rig.charge, 300)

    unknown = rig.target.confirm_webhook(
        *signed(event_of("refund.created", fake.direct.v1.refunds.retrieve(theirs.refund_id))),
        SECRET,
        rig.journal,
    )
    assert (unknown.unknown, unknown.confirmed, unknown.untagged) == ([stranger], [], [])
    assert rig.journal.row(stranger) is None  # reported, never invented

    untagged = rig.target.confirm_webhook(
        *signed(event_of("refund.created", fake.direct.v1.refunds.retrieve(by_hand))),
        SECRET,
        rig.journal,
    )
    assert (untagged.untagged, untagged.confirmed, untagged.unknown) == ([by_hand], [], [])

    other = rig.target.confirm_webhook(
        *signed(event_of("charge.succeeded", fake.direct.v1.charges.retrieve(rig.charge))),
        SECRET,
        rig.journal,
    )
    assert (other.confirmed, other.unknown, other.untagged) == ([], [], [])


async def test_a_charge_refunded_webhook_confirms_its_embedded_refunds(
    fake: Fake, make_rig: Any
) -> None:
    rig: Rig = make_rig()
    result = await rig.run()
    by_hand = fake.manual_refund(rig.charge, 300)
    charge = fake.direct.v1.charges.retrieve(rig.charge)
    embedded = {r["id"] for r in charge.to_dict()["refunds"]["data"]}
    assert embedded == {result.refund_id, by_hand}  # the fake embeds refunds.data

    outcome = rig.target.confirm_webhook(
        *signed(event_of("charge.refunded", charge)), SECRET, rig.journal
    )
    assert (outcome.confirmed, outcome.untagged) == ([rig.eid], [by_hand])
    (data,) = confirmations(rig.journal, rig.eid)
    assert data["refund_id"] == result.refund_id and data["event_type"] == "charge.refunded"
    assert rig.status() is Kind.COMMITTED
    assert rig.journal.verify().ok


async def test_a_charge_refunded_webhook_without_embedded_refunds_asks_for_them(
    fake: Fake, make_rig: Any
) -> None:
    """Newer API versions send the charge without its refunds: the adapter lists them."""
    rig: Rig = make_rig()
    result = await rig.run()
    charge = fake.direct.v1.charges.retrieve(rig.charge).to_dict()
    charge.pop("refunds", None)
    outcome = await asyncio.to_thread(
        rig.target.confirm_webhook,
        *signed(event_of("charge.refunded", charge)),
        SECRET,
        rig.journal,
    )
    assert outcome.confirmed == [rig.eid]
    (data,) = confirmations(rig.journal, rig.eid)
    assert data["refund_id"] == result.refund_id


async def test_a_failed_refund_is_reported_and_flagged(fake: Fake, make_rig: Any) -> None:
    """Stripe can fail a refund after accepting it: the money did not move, so the webhook's
    entry carries an alarm and the outcome names the effect (its state is not rewritten)."""
    rig: Rig = make_rig()
    result = await rig.run()
    refund = fake.direct.v1.refunds.retrieve(result.refund_id).to_dict()
    refund["status"] = "failed"
    outcome = rig.target.confirm_webhook(
        *signed(event_of("refund.failed", refund)), SECRET, rig.journal
    )
    assert outcome.failed == [rig.eid] and outcome.confirmed == [rig.eid]
    (data,) = confirmations(rig.journal, rig.eid)
    assert data["alarm"] == "refund_failed" and data["status"] == "failed"
    assert rig.status() is Kind.COMMITTED
    ok = rig.target.confirm_webhook(
        *signed(event_of("refund.updated", fake.direct.v1.refunds.retrieve(result.refund_id))),
        SECRET,
        rig.journal,
    )
    assert ok.failed == []


# -- the fault table's rows 1 to 10 at tier 1, in-process against the fake --------------------


@dataclass(frozen=True)
class Money:
    status: Kind
    cents: int
    #: "api" (the gate's refund, tagged with the effect id) or "manual" (by hand, untagged)
    sources: tuple[str, ...]
    #: refund requests that went through the proxy
    posts: int


COMMITTED_20 = Money(Kind.COMMITTED, 2_000, ("api",), 1)
REFUSED_0 = Money(Kind.REFUSED, 0, (), 0)
# written out again here, independent of workers.scenarios.Expect
STRIPE_MONEY: dict[str, Money] = {
    "happy_path": COMMITTED_20,
    "crash_before_send": COMMITTED_20,  # nothing was sent before the crash
    "crash_before_ack": COMMITTED_20,  # found by listing the charge's refunds: no resend
    "duplicate_submit": COMMITTED_20,
    "model_redecides": COMMITTED_20,  # the $30 re-decision is refused; the $20 stands
    "lease_revoked": REFUSED_0,
    "stale_premise": REFUSED_0,
    "refund_during_outage": Money(Kind.REFUSED, 2_000, ("manual",), 0),
    "lease_revoked_during_outage": REFUSED_0,
    "key_expired": COMMITTED_20,
}
ROWS = [s.name for s in sorted(SCENARIOS.values(), key=lambda s: s.number) if s.number <= 10]


def test_the_stripe_rows_are_rows_1_to_10() -> None:
    assert list(STRIPE_MONEY) == ROWS
    assert all(1 in SCENARIOS[n].expect for n in ROWS)


@pytest.mark.parametrize("name", ROWS, ids=lambda n: f"{SCENARIOS[n].number:02}-{n}")
async def test_stripe_row_in_process(name: str, fake: Fake, tmp_path: Path) -> None:
    world = stripe_inprocess_world(tmp_path, fake.mock, fake.proxy)
    result = await run_in(world, name)
    summary = {k: result.get(k) for k in ("final", "via", "code", "refunded_cents", "calls")}
    assert result["ok"], f"row {name}: {result['problems']} ({summary})"
    assert result["tier"] == 1

    want = STRIPE_MONEY[name]
    charge = world.order_id  # a Stripe world's order is the charge it created
    assert charge.startswith("ch_")
    refunds = fake.refunds(charge)
    assert fake.refunded(charge) == want.cents, summary
    sources = sorted("api" if metadata_of(r).get("effect_id") else "manual" for r in refunds)
    assert tuple(sources) == want.sources
    for r in refunds:
        if metadata_of(r).get("effect_id"):
            assert metadata_of(r)["effect_id"] == world.effect_id
    assert fake.proxy.refund_posts == want.posts, summary

    journal = open_world_journal(tmp_path)
    try:
        row = journal.row(world.effect_id)
        assert row is not None and row.status is want.status
        assert journal.verify().ok
    finally:
        journal.close()


# -- a real server, real worker processes, a real SIGKILL ------------------------------------


class KeptStripeWorld(StripeServerWorld):
    """The harness's world, reading the money from its fake before the fake stops."""

    money: tuple[int, list[dict[str, Any]]]

    async def close(self) -> None:
        try:
            client = sdk(self.mock.url)
            charge = client.v1.charges.retrieve(self.order_id)
            listed = client.v1.refunds.list(params={"charge": self.order_id, "limit": 100})
            self.money = (
                int(charge.amount_refunded),
                [{"id": r.id, "metadata": metadata_of(r)} for r in listed.auto_paging_iter()],
            )
        finally:
            await super().close()


@pytest.mark.server
@pytest.mark.parametrize(
    ("name", "via"),
    [("crash_before_send", {"retry-idempotent"}), ("crash_before_ack", {"recovery-query"})],
)
async def test_stripe_row_on_a_real_server(
    client: Client, tmp_path: Path, name: str, via: set[str]
) -> None:
    world = await KeptStripeWorld.launch(client, tmp_path)
    assert isinstance(world, KeptStripeWorld)
    result = await run_in(world, name)
    assert result["ok"], result["problems"]
    assert result["kills"] == 1  # a worker process died by SIGKILL, another took over
    assert result["via"] in via
    refunded, refunds = world.money
    assert refunded == 2_000
    assert [r["metadata"] for r in refunds] == [{"effect_id": world.effect_id}]
    assert result["calls"] == 1  # one refund request reached Stripe
    assert result["receipt"]["confirmation"] == refunds[0]["id"]


# -- the demo's Stripe modes ---------------------------------------------------------------


def test_demo_arguments() -> None:
    assert demo.parse([]).stripe is False and demo.parse([]).stripe_live is False
    assert demo.parse(["--stripe"]).stripe is True
    assert demo.parse(["--stripe-live"]).stripe_live is True
    with pytest.raises(SystemExit):
        demo.parse(["--stripe", "--stripe-live"])


@pytest.mark.parametrize("key", [None, "", "sk_live_abc", "rk_test_abc", "pk_test_abc"])
def test_demo_live_refuses_without_a_test_key(
    key: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if key is None:
        monkeypatch.delenv("STRIPE_API_KEY", raising=False)
    else:
        monkeypatch.setenv("STRIPE_API_KEY", key)
    assert demo.main(["--stripe-live"]) == 2
    err = capsys.readouterr().err
    assert "STRIPE_API_KEY" in err and "sk_test_" in err
    if key:
        assert key not in err  # never echo a key


@pytest.mark.server
async def test_demo_live_story_runs_against_the_fake(
    dev_server: Any, fake: Fake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``--stripe-live`` does against real Stripe test mode, pointed at the fake."""
    story: Callable[..., Any] = demo.live_story
    summary = await story(dev_server.target, fake.direct, tmp_path)
    charge = summary["charge"]
    (landed,) = fake.refunds(charge)
    assert fake.refunded(charge) == 2_000
    assert summary["refund_ids"] == [landed.id, landed.id]
    assert summary["final"] == "COMMITTED" and summary["confirmation"] == landed.id
    assert summary["ok"] is True
    assert landed.id in capsys.readouterr().out
