"""Mistakes in a gated activity that say what to do (issue 35): a ``key=`` (or ``amount=``,
``resource=``) that is not a function is refused at ``@gated`` with the line to write; a
target's ``capture`` that raises is a named, retryable error naming the target (nothing is
recorded or sent, and the next attempt goes out once it works); a tier-1 or tier-2 body that
returned without reading ``current_effect()`` is a warning, once per activity type, naming the
double-send risk."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError

from interlock_temporal import current_effect, gated
from interlock_temporal.core import Call, Gate, Journal, Measure, open_journal
from interlock_temporal.core.errors import CaptureFailed
from interlock_temporal.core.models import Kind
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer
from workers.world import ORDER
from workflows.activities import REFUND_EFFECT

from .test_server import cause_of, rig

MARKER = "customer-said-zebra-7731"


# -- key=, amount=, resource= ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            {"key": "customer_id"},
            "key= takes a function of the activity's arguments, not 'customer_id' (a str): "
            'write key=lambda r: {"customer_id": r.customer_id}',
        ),
        (
            {"key": ["case_id", "order_id"]},
            "key= takes a function of the activity's arguments, not ['case_id', 'order_id'] (a "
            'list): write key=lambda r: {"case_id": r.case_id, "order_id": r.order_id}',
        ),
        (
            {"amount": "amount_cents"},
            "amount= takes a function of the activity's arguments, not 'amount_cents' (a str): "
            "write amount=lambda r: r.amount_cents",
        ),
        (
            {"key": 7},
            "key= takes a function of the activity's arguments, not 7 (a int): write "
            "key=lambda r: ...",
        ),
    ],
)
def test_a_key_that_is_not_a_function_is_refused_at_gated_with_the_line_to_write(
    tmp_path: Path, given: dict[str, Any], line: str
) -> None:
    payments = SimulatedPayments(tmp_path / "p.db")
    with pytest.raises(TypeError) as refused:

        @activity.defn
        @gated(target=payments, **given)
        async def refund(r: RefundRequest) -> RefundResult:
            raise AssertionError("never runs")

    assert str(refused.value) == f"gated activity refund: {line}"
    # and the same for gated(fn, ...) around an activity already defined
    with pytest.raises(TypeError) as around:
        gated(_refund_defined, target=payments, **given)
    assert str(around.value) == f"gated activity _refund_defined: {line}"
    payments.close()


@activity.defn(name="refund_defined")
async def _refund_defined(r: RefundRequest) -> RefundResult:
    raise AssertionError("never runs")


# -- a capture that raises ----------------------------------------------------------------------


class BrokenCapture(SimulatedPayments):
    """A target whose capture fails (its message holds a value that must not travel on)."""

    def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        raise KeyError(MARKER)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as opened:
        yield opened


async def test_a_capture_that_raises_names_the_target_and_records_nothing(
    journal: Journal, tmp_path: Path
) -> None:
    target = BrokenCapture(tmp_path / "p.db", name="ledger")
    target.open_order(ORDER, 10_000)
    req = RefundRequest(case_id="4471", order_id=ORDER, amount_cents=2_000, reason=MARKER)
    lease = journal.leases.issue("refund-bot")
    call = Call(
        effect_type="refund",
        activity="refund",
        input=req,
        args=(req,),
        key={"case": req.case_id},
        principal="refund-bot",
        lease_id=lease,
        measure=lambda args: Measure(args[0].amount_cents),
        param_names=("r",),
    )
    eid = Gate.identify(call)[0]
    with pytest.raises(CaptureFailed) as failed:
        await Gate(journal).begin(call, target)
    message = str(failed.value)
    assert message.startswith(
        f"target ledger could not capture the premises of effect {eid[:16]}: its capture "
        "raised KeyError at test_gated_mistakes.py:"
    )
    assert message.endswith(
        "in capture. Nothing was recorded or sent; the attempt will be retried (as often as "
        "the activity's retry policy allows). Fix capture if it is a bug, or raise a "
        "non-retryable error from it to stop"
    )
    assert MARKER not in message
    assert isinstance(failed.value.error, KeyError)
    assert journal.read(eid) == [] and not journal.is_claimed(eid)
    target.close()


@pytest.mark.server
async def test_on_a_worker_a_failing_capture_is_retried_as_a_named_error_then_sent_once(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path) as r:
        # the only attempt: the named error, retryable, what the workflow sees
        r.payments.arm("capture", "unavailable", count=1)
        with pytest.raises(WorkflowFailureError) as failed:
            await r.call(
                "refund", r.request(), principal="refund-bot", lease=r.lease_id, maximum_attempts=1
            )
        cause = cause_of(failed.value)
        assert (cause.type, cause.non_retryable) == ("PremiseCaptureFailed", False)
        assert cause.message.startswith("target payments could not capture the premises of")
        assert "its capture raised PaymentsUnavailable at payments.py:" in cause.message
        assert "the attempt will be retried" in cause.message
        assert list(cause.details) == [{"target": "payments", "error": "PaymentsUnavailable"}]
        assert r.journal.effects() == [] and r.payments.calls() == 0

        # two attempts fail to capture; the third sends, once
        r.payments.arm("capture", "unavailable", count=2)
        result = await r.call("refund", r.request(), principal="refund-bot", lease=r.lease_id)
        assert result["amount_cents"] == r.request().amount_cents
        assert r.payments.calls() == 1
        (row,) = r.journal.effects()
        kinds = [e.kind for e in r.journal.read(row.effect_id)]
        assert kinds == [Kind.PROPOSED, Kind.AUTHORIZED, Kind.DISPATCHED, Kind.COMMITTED]


# -- a body that never read current_effect() ------------------------------------------------------


@pytest.mark.server
async def test_a_tier_2_body_that_never_read_current_effect_warns_once_per_activity_type(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="interlock_temporal")
    service = SimulatedPayments(tmp_path / "forgetful.db", tier=2)
    service.open_order(ORDER, 10_000)

    @activity.defn(name="refund_forgetful")
    @gated(target=service, **REFUND_EFFECT)
    async def refund_forgetful(r: RefundRequest) -> RefundResult:
        return await service.refund(r.order_id, r.amount_cents)  # no idempotency key

    @activity.defn(name="refund_careful")
    @gated(target=service, **REFUND_EFFECT)
    async def refund_careful(r: RefundRequest) -> RefundResult:
        key = current_effect().idempotency_key
        return await service.refund(r.order_id, r.amount_cents, idempotency_key=key)

    async with rig(dev_server, tmp_path, extra=[refund_forgetful, refund_careful]) as r:
        lease = r.journal.leases.issue("refund-bot", activities=["refund_*"])
        for case in ("c-1", "c-2"):
            for name in ("refund_forgetful", "refund_careful"):
                req = RefundRequest(
                    case_id=case,
                    order_id=ORDER,
                    amount_cents=500,
                    premises=service.order_facts(ORDER),
                )
                await r.call(name, req, principal="refund-bot", lease=lease)
        assert service.calls() == 4
    lines = [
        rec.getMessage()
        for rec in caplog.records
        if "without reading current_effect" in rec.getMessage()
    ]
    assert lines == [
        "gated activity 'refund_forgetful' (target payments, tier 2) returned without reading "
        "current_effect(): the effect id never reached payments as the tag its query looks for, "
        "so recovery cannot find the first send: after a crash mid-send, the effect may be sent "
        "twice. Pass current_effect().effect_id to the target in the body (e.g. "
        "idempotency_key=current_effect().idempotency_key)"
    ]
    service.close()
