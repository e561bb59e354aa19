"""Refusals about the caller's own configuration are decided again (issue 35): no ``act_as``,
``act_as`` without a lease, a lease this journal does not hold, an activity outside the lease.
Once the code (or the lease) is fixed, the next attempt decides the effect again, behind an
explicit, signed ``REOPENED`` entry naming the refusal it reopens; no person is needed. Every
other refusal (revoked, expired, another principal, over the maximum or the budget, a policy,
a premise, a person) stays until a person reopens it, and a re-decision checks everything a
first attempt checks, so it cannot be used to get past one.

The gate runs against a real SQLite journal and the real payments service; the last tests run
the same on a real Temporal worker."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from interlock_temporal.cli._render import entry_summary
from interlock_temporal.core import Call, Gate, Journal, Measure, Refused, open_journal
from interlock_temporal.core.errors import DECIDED_AGAIN
from interlock_temporal.core.models import Kind
from interlock_temporal.core.receipts import fold, receipt_of
from interlock_temporal.targets.payments import RefundRequest, SimulatedPayments
from interlock_temporal.testing import DevServer
from workers.world import ORDER

from .fixtures import make_release_journal as release
from .test_server import cause_of, rig

PRINCIPAL = "refund-bot"


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[SimulatedPayments]:
    service = SimulatedPayments(tmp_path / "payments.db", tier=2)
    service.open_order(ORDER, 10_000)
    yield service
    service.close()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as opened:
        yield opened


def refund_call(
    principal: str | None, lease_id: str | None, amount: int = 2_000, activity: str = "refund"
) -> Call:
    req = RefundRequest(case_id="4471", order_id=ORDER, amount_cents=amount, reason="case 4471")
    return Call(
        effect_type="refund",
        activity=activity,
        input=req,
        args=(req,),
        key={"case": req.case_id, "order": req.order_id},
        principal=principal,
        lease_id=lease_id,
        measure=lambda args: Measure(args[0].amount_cents),
        param_names=("r",),
    )


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


def kinds(journal: Journal, eid: str) -> list[Kind]:
    return [e.kind for e in journal.read(eid)]


# -- the four refusals about the configuration ----------------------------------------------------


@pytest.mark.parametrize(
    "configuration", ["no_act_as", "no_lease", "unknown_lease", "outside_scope"]
)
async def test_a_refusal_about_the_configuration_is_decided_again_once_it_is_fixed(
    journal: Journal, payments: SimulatedPayments, configuration: str
) -> None:
    good = journal.leases.issue(PRINCIPAL, activities=["refund"], max_amount_cents=5_000)
    wrong = {
        "no_act_as": refund_call(None, None),
        "no_lease": refund_call(PRINCIPAL, None),
        "unknown_lease": refund_call(PRINCIPAL, "lease_never_issued"),
        "outside_scope": refund_call(
            PRINCIPAL, journal.leases.issue(PRINCIPAL, activities=["send_welcome_sms"])
        ),
    }[configuration]
    eid = Gate.identify(wrong)[0]
    first = await refused(journal, payments, wrong)
    assert first.configuration == configuration
    assert str(first).endswith(DECIDED_AGAIN)
    assert first.receipt.final == "REFUSED" and first.receipt.executed is False
    (refusal,) = [e for e in journal.read(eid) if e.kind is Kind.REFUSED]
    assert refusal.data["configuration"] == configuration  # in the signed entry

    result = await attempt(journal, payments, refund_call(PRINCIPAL, good))  # the code fixed
    assert result.amount_cents == 2_000
    assert payments.calls() == 1 and payments.refunded_cents(ORDER) == 2_000
    assert kinds(journal, eid) == [
        Kind.PROPOSED,
        Kind.REFUSED,
        Kind.REOPENED,
        Kind.AUTHORIZED,
        Kind.DISPATCHED,
        Kind.COMMITTED,
    ]
    reopened = next(e for e in journal.read(eid) if e.kind is Kind.REOPENED)
    assert reopened.data["redecided"] == configuration
    assert reopened.data["refused_code"] == "lease"
    assert reopened.data["reason"] == (
        f"decided again: the refusal ({configuration}) was about the caller's configuration, "
        "and this attempt's differs"
    )
    assert (reopened.data["principal"], reopened.data["lease_id"]) == (PRINCIPAL, good)
    assert "operator" not in reopened.data  # no person decided this
    # `interlock effects show` says which configuration each entry was about
    assert f"configuration={configuration}" in entry_summary(refusal.data, width=400)
    assert f"redecided={configuration}" in entry_summary(reopened.data, width=400)
    receipt = receipt_of(fold(eid, journal.read(eid)))
    assert (receipt.final, receipt.via, receipt.executed) == ("COMMITTED", "reopened", True)
    assert receipt.decided_by == ["lease", f"redecided:{configuration}"]
    assert (receipt.lease_id, receipt.principal, receipt.operator) == (good, PRINCIPAL, None)
    assert journal.verify().ok

    # a duplicate afterwards returns the recorded result; nothing is sent or reopened again
    again = await attempt(journal, payments, refund_call(PRINCIPAL, good))
    assert again["refund_id"] == result.refund_id and payments.calls() == 1
    assert kinds(journal, eid).count(Kind.REOPENED) == 1


async def test_the_same_configuration_again_writes_nothing_and_says_how_to_fix_it(
    journal: Journal, payments: SimulatedPayments
) -> None:
    call = refund_call(None, None)
    eid = Gate.identify(call)[0]
    first = await refused(journal, payments, call)
    assert str(first) == (
        "lease: no act_as: the workflow ran refund outside act_as, so it acts for no principal "
        'under no lease. Run it inside `with act_as("<principal>", lease="<lease id>"):` in '
        f"the workflow. {DECIDED_AGAIN}"
    )
    written = journal.read(eid)
    again = await refused(journal, payments, call)
    assert str(again).startswith("refused earlier, at 20")
    assert str(again).endswith(
        "nothing was sent now: this attempt has the configuration that was refused. "
        + DECIDED_AGAIN
    )
    assert (again.code, again.reason, again.configuration) == (
        first.code,
        first.reason,
        "no_act_as",
    )
    assert journal.read(eid) == written  # nothing written
    # another configuration that is still wrong: decided again, and refused for it (recorded)
    other = await refused(journal, payments, refund_call(PRINCIPAL, None))
    assert other.configuration == "no_lease" and other.refused_at is None
    assert kinds(journal, eid) == [Kind.PROPOSED, Kind.REFUSED, Kind.REOPENED, Kind.REFUSED]
    assert payments.calls() == 0
    assert journal.verify().ok


# -- every other refusal stays ---------------------------------------------------------------------


async def test_a_revoked_lease_stays_refused_whatever_lease_comes_next(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = journal.leases.issue(PRINCIPAL, activities=["refund"])
    journal.leases.revoke(lease)
    call = refund_call(PRINCIPAL, lease)
    eid = Gate.identify(call)[0]
    first = await refused(journal, payments, call)
    assert first.configuration is None and str(first) == "lease: lease revoked"
    written = journal.read(eid)
    fresh = journal.leases.issue(PRINCIPAL, activities=["refund"])
    again = await refused(journal, payments, refund_call(PRINCIPAL, fresh))
    assert "until a person reopens it (`interlock effects reopen" in str(again)
    assert journal.read(eid) == written and payments.calls() == 0


@pytest.mark.parametrize("sticky", ["budget", "maximum", "principal", "expired"])
async def test_no_reconfiguration_gets_past_a_refusal_about_the_effect(
    journal: Journal, payments: SimulatedPayments, sticky: str
) -> None:
    """The attack: a refusal about the effect, then another configuration (a wrong one, to be
    decided again; then a lease that would allow it). Nothing reopens the effect."""
    if sticky == "budget":
        lease = journal.leases.issue(PRINCIPAL, activities=["refund"], budget_cents=1_000)
    elif sticky == "maximum":
        lease = journal.leases.issue(PRINCIPAL, activities=["refund"], max_amount_cents=1_000)
    elif sticky == "principal":
        lease = journal.leases.issue("someone-else", activities=["refund"])
    else:
        lease = journal.leases.issue(
            PRINCIPAL, activities=["refund"], ttl=timedelta(milliseconds=1)
        )
        time.sleep(0.01)
    call = refund_call(PRINCIPAL, lease)
    eid = Gate.identify(call)[0]
    first = await refused(journal, payments, call)
    assert first.configuration is None
    written = journal.read(eid)
    generous = journal.leases.issue(PRINCIPAL, activities=["refund"])
    for attempt_with in (
        refund_call(None, None),
        refund_call(PRINCIPAL, None),
        refund_call(PRINCIPAL, "lease_never_issued"),
        refund_call(PRINCIPAL, generous),
    ):
        again = await refused(journal, payments, attempt_with)
        assert again.refused_at is not None and again.configuration is None
        assert (again.code, again.reason) == (first.code, first.reason)
    assert journal.read(eid) == written and payments.calls() == 0


async def test_a_redecision_that_meets_a_refusal_about_the_effect_makes_it_stick(
    journal: Journal, payments: SimulatedPayments
) -> None:
    """No act_as, then a lease whose budget does not cover the refund: decided again and
    refused for the budget; that refusal stays, even for a lease that would allow it."""
    call = refund_call(None, None)
    eid = Gate.identify(call)[0]
    await refused(journal, payments, call)
    tight = journal.leases.issue(PRINCIPAL, activities=["refund"], budget_cents=1_000)
    budget = await refused(journal, payments, refund_call(PRINCIPAL, tight))
    assert (budget.code, budget.configuration) == ("lease_budget", None)
    assert kinds(journal, eid) == [Kind.PROPOSED, Kind.REFUSED, Kind.REOPENED, Kind.REFUSED]
    generous = journal.leases.issue(PRINCIPAL, activities=["refund"])
    after = journal.read(eid)
    sticky = await refused(journal, payments, refund_call(PRINCIPAL, generous))
    assert sticky.refused_at is not None and sticky.code == "lease_budget"
    assert journal.read(eid) == after and payments.calls() == 0
    assert journal.leases.get(tight).reserved_cents == 0  # type: ignore[union-attr]
    assert journal.verify().ok


async def test_a_refusal_the_previous_release_recorded_stays_and_its_journal_recovers(
    tmp_path: Path,
) -> None:
    """The journal of tests/fixtures/make_release_journal.py: its refusal (a revoked lease, not
    marked as the caller's configuration) stays refused under a lease that would allow it;
    the journal still verifies."""
    path = tmp_path / "release.db"
    shutil.copyfile(release.TARGET, path)
    with open_journal(f"sqlite:///{path}", signing_key=release.KEY, create=False) as journal:
        assert journal.verify().ok
        payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
        payments.open_order(release.ORDER, release.PAID_CENTS)
        call = release.call(release.request("c-3", 700, payments), release.LEASE, "wf-3")
        eid = Gate.identify(call)[0]
        written = journal.read(eid)
        assert written[-1].kind is Kind.REFUSED and "configuration" not in written[-1].data
        with pytest.raises(Refused) as caught:
            await Gate(journal).begin(call, payments)
        assert caught.value.refused_at is not None and caught.value.configuration is None
        assert journal.read(eid) == written and payments.calls() == 0
        assert journal.verify().ok
        payments.close()


# -- on a real Temporal worker ------------------------------------------------------------------


@pytest.mark.server
async def test_on_a_worker_a_fixed_act_as_succeeds_without_an_operator(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="interlock_temporal")
    async with rig(dev_server, tmp_path) as r:
        request = r.request()
        with pytest.raises(WorkflowFailureError) as forgot:  # the workflow forgot act_as
            await r.call("refund", request)
        cause = cause_of(forgot.value)
        assert (cause.type, cause.non_retryable) == ("EffectRefused", True)
        assert cause.message == (
            "lease: no act_as: the workflow ran refund outside act_as, so it acts for no "
            'principal under no lease. Run it inside `with act_as("<principal>", '
            f'lease="<lease id>"):` in the workflow. {DECIDED_AGAIN}'
        )
        (receipt,) = cause.details
        eid = receipt["effect_id"]

        # the code fixed: a new workflow, the same decision, under act_as
        result = await r.call("refund", request, principal=PRINCIPAL, lease=r.lease_id)
        assert result["amount_cents"] == request.amount_cents
        assert r.payments.calls() == 1
        assert r.payments.refunded_cents(ORDER) == request.amount_cents
        entries = r.journal.read(eid)
        assert [e.kind for e in entries] == [
            Kind.PROPOSED,
            Kind.REFUSED,
            Kind.REOPENED,
            Kind.AUTHORIZED,
            Kind.DISPATCHED,
            Kind.COMMITTED,
        ]
        reopened = entries[2]
        assert reopened.data["redecided"] == "no_act_as"
        assert reopened.data["reason"].startswith("decided again: the refusal (no_act_as)")
        assert r.journal.verify().ok

        # a lease refusal is logged at INFO, once per lease and reason
        lines = [
            rec
            for rec in caplog.records
            if rec.name == "interlock_temporal" and "refused under" in rec.getMessage()
        ]
        assert [rec.levelno for rec in lines] == [logging.INFO]
        assert (
            lines[0]
            .getMessage()
            .startswith(
                f"interlock: refund refused under no lease (effect {eid[:16]}): lease: no act_as"
            )
        )


@pytest.mark.server
async def test_on_a_worker_a_revoked_lease_stays_refused_and_is_logged_once(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="interlock_temporal")
    async with rig(dev_server, tmp_path) as r:
        r.journal.leases.revoke(r.lease_id)
        request = r.request()
        for _ in range(2):
            with pytest.raises(WorkflowFailureError) as revoked:
                await r.call("refund", request, principal=PRINCIPAL, lease=r.lease_id)
        again = cause_of(revoked.value)
        assert again.type == "EffectRefused"
        assert "until a person reopens it" in again.message
        fresh = r.journal.leases.issue(
            PRINCIPAL, activities=["refund"], max_amount_cents=5_000, resources=[f"order:{ORDER}"]
        )
        with pytest.raises(WorkflowFailureError) as still:
            await r.call("refund", request, principal=PRINCIPAL, lease=fresh)
        assert "until a person reopens it" in cause_of(still.value).message
        (receipt,) = cause_of(still.value).details
        assert Kind.REOPENED not in [e.kind for e in r.journal.read(receipt["effect_id"])]
        assert r.payments.calls() == 0

        lines = [
            rec
            for rec in caplog.records
            if rec.name == "interlock_temporal" and "refused under" in rec.getMessage()
        ]
        infos = [rec.getMessage() for rec in lines if rec.levelno == logging.INFO]
        # one line for the revoked lease (the first refusal), one for the same refusal met
        # under the fresh lease; the second attempt under the revoked lease is DEBUG
        assert len(infos) == 2, infos
        assert infos[0].startswith(f"interlock: refund refused under lease {r.lease_id} (effect")
        assert infos[0].endswith("lease: lease revoked")
        assert len(lines) == 3
        assert all(str(request.amount_cents) not in m for m in infos)
