"""The fault table against Stripe: the real ``stripe`` SDK, ``stripe-stateful-mock`` on
loopback behind a proxy that counts (and can lose) refund responses, and the same armed faults
the simulated service has, fired in the worker around the real requests. An order is a charge.

Test and demo harness only; the product adapter is ``interlock_temporal.targets.stripe``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import stripe
from temporalio.client import Client

from interlock_temporal.targets._faults import FaultAction, FaultPlan, FaultPoint
from interlock_temporal.targets.payments import RefundRecord, RefundResult
from interlock_temporal.targets.stripe import StripeRefunds
from interlock_temporal.testing import STRIPE_TEST_KEY, StripeMock, StripeProxy
from workflows.support_case import Mode

from .inprocess_world import InProcessWorld
from .server_world import ServerWorld
from .world import Payments

ELIGIBLE = "refund_eligible"


def stripe_client(url: str) -> stripe.StripeClient:
    return stripe.StripeClient(STRIPE_TEST_KEY, base_addresses={"api": url}, max_network_retries=0)


def _order_of(args: Any) -> str:
    """Refund inputs name the order; a Stripe order is its charge."""
    value = args.get("order_id") if isinstance(args, Mapping) else getattr(args, "order_id", None)
    if not isinstance(value, str):
        raise ValueError("the refund input has no order_id")
    return value


class OffsetClock:
    """Wall time plus an offset kept in a file, so every worker process sees the dedupe window
    pass when the runner says so (the fake never expires keys)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> float:
        try:
            return time.time() + float(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return time.time()

    def advance(self, seconds: float) -> None:
        now = self() - time.time()
        self.path.write_text(str(now + seconds))


def mark_ineligible(client: stripe.StripeClient, charge_id: str) -> None:
    client.v1.charges.update(charge_id, params={"metadata": {ELIGIBLE: "false"}})


class FaultyStripeRefunds(StripeRefunds):
    """The adapter with the harness's faults at ``capture`` (the order stops being eligible
    after the agent decided, before the gate dispatches)."""

    def __init__(self, client: stripe.StripeClient, plan: FaultPlan, clock: OffsetClock) -> None:
        super().__init__(
            client,
            charge=_order_of,
            eligibility_metadata=(ELIGIBLE,),
            settle_time=timedelta(seconds=1),
            clock=clock,
        )
        self.plan = plan

    def found_result(self, refund: Any) -> Any:
        """The support activity returns a RefundResult (an order is its charge)."""
        return RefundResult(
            refund_id=refund.id, order_id=refund.charge, amount_cents=int(refund.amount)
        ).model_dump(mode="json")

    async def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        charge = _order_of(args)
        await asyncio.to_thread(
            self.plan.fire,
            "capture",
            {"make_ineligible": lambda _: mark_ineligible(self.client, charge)},
        )
        return await super().capture(args, effect_id)


class StripeRefundService:
    """What the support activities call: order facts from the charge, and refunds (through the
    adapter, keyed by the effect id, or keyless for the naive baseline), with the armed faults
    fired just before the request and just after Stripe answered."""

    def __init__(self, target: StripeRefunds, plan: FaultPlan) -> None:
        self.target = target
        self.plan = plan

    def order_facts(self, order_id: str) -> dict[str, Any]:
        return self.target.facts(order_id)

    async def refund(
        self, order_id: str, amount_cents: int, *, idempotency_key: str | None = None
    ) -> RefundResult:
        stall = await asyncio.to_thread(self.plan.fire, "before_send")
        if stall:
            await asyncio.sleep(stall)
        if idempotency_key is not None:
            sent = await self.target.refund_async(
                {"order_id": order_id, "amount_cents": amount_cents}, effect_id=idempotency_key
            )
            refund_id, amount = sent.refund_id, sent.amount_cents
        else:
            created = await asyncio.to_thread(
                self.target.client.v1.refunds.create,
                params={"charge": order_id, "amount": amount_cents},
            )
            refund_id, amount = created.id, int(created.amount)
        await asyncio.to_thread(self.plan.fire, "after_commit")
        return RefundResult(refund_id=refund_id, order_id=order_id, amount_cents=amount)


def worker_parts(
    api_url: str, faults: Path, clock: Path
) -> tuple[StripeRefundService, StripeRefunds]:
    """The service and target a worker process uses (``workers.worker --stripe-api ...``)."""
    plan = FaultPlan(faults)
    target = FaultyStripeRefunds(stripe_client(api_url), plan, OffsetClock(clock))
    return StripeRefundService(target, plan), target


class StripeFacade:
    """The world's view of Stripe: the money read back from the fake (never from the gate),
    charges as orders, refunds by hand, the eligibility flag, the clock, the armed faults."""

    def __init__(self, mock_url: str, proxy: StripeProxy | None, workdir: Path) -> None:
        self.client = stripe_client(mock_url)
        self.proxy = proxy
        self.faults_path = workdir / "faults.db"
        self.clock_path = workdir / "clock-offset"
        self.plan = FaultPlan(self.faults_path)
        self.clock = OffsetClock(self.clock_path)

    def open_order(self, order_id: str, paid_cents: int) -> str:
        charge = self.client.v1.charges.create(
            params={
                "amount": paid_cents,
                "currency": "usd",
                "source": "tok_visa",
                "metadata": {"order": order_id},
            }
        )
        return str(charge.id)

    def arm(
        self, point: FaultPoint, action: FaultAction, *, arg: float | None = None, count: int = 1
    ) -> None:
        self.plan.arm(point, action, arg=arg, count=count)

    def manual_refund(self, order_id: str, amount_cents: int) -> str:
        """Support refunds by hand in the dashboard: no key, no effect id."""
        refund = self.client.v1.refunds.create(params={"charge": order_id, "amount": amount_cents})
        return str(refund.id)

    def set_eligible(self, order_id: str, eligible: bool) -> None:
        self.client.v1.charges.update(
            order_id, params={"metadata": {ELIGIBLE: "true" if eligible else "false"}}
        )

    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def refund_records(self, order_id: str) -> list[RefundRecord]:
        listed = self.client.v1.refunds.list(params={"charge": order_id, "limit": 100})
        records = []
        for r in listed.auto_paging_iter():
            metadata = r.metadata.to_dict() if r.metadata else {}
            effect_id = metadata.get("effect_id")
            records.append(
                RefundRecord(
                    refund_id=r.id,
                    order_id=order_id,
                    amount_cents=int(r.amount),
                    source="api" if effect_id else "manual",
                    effect_id=effect_id,
                    created_at=float(r.created),
                )
            )
        return records

    def refunded_cents(self, order_id: str) -> int:
        return int(self.client.v1.charges.retrieve(order_id).amount_refunded)

    def calls(self, order_id: str | None = None) -> int:
        """Refund requests that reached Stripe through the proxy (the gate's and baselines'):
        every order's, so a world keeps one order per proxy (or resets the count)."""
        return self.proxy.refund_posts if self.proxy is not None else 0

    def order_facts(self, order_id: str) -> dict[str, Any]:
        return FaultyStripeRefunds(self.client, self.plan, self.clock).facts(order_id)

    def close(self) -> None:
        self.plan.close()


# -- the worlds ----------------------------------------------------------------------------


class StripeServerWorld(ServerWorld):
    """A row on a real Temporal server with worker processes talking to the Stripe fake
    through the proxy. Stripe is tier 1: it dedupes by key inside a window and can be asked."""

    def __init__(
        self, client: Client, workdir: Path, mode: Mode, mock: StripeMock, proxy: StripeProxy
    ) -> None:
        self.mock = mock
        self.proxy = proxy
        super().__init__(client, workdir, 1, mode)

    @classmethod
    async def launch(cls, client: Client, workdir: Path, mode: Mode = "gated") -> StripeServerWorld:
        mock = await StripeMock().start()
        try:
            proxy = await StripeProxy(mock.port).start()
            try:
                return cls(client, workdir, mode, mock, proxy)
            except BaseException:
                await proxy.stop()
                raise
        except BaseException:
            await mock.stop()
            raise

    def _payments(self) -> Payments:
        self.facade = StripeFacade(self.mock.url, self.proxy, self.workdir)
        return self.facade

    def target_args(self) -> list[str]:
        return [
            "--stripe-api",
            self.proxy.url,
            "--faults",
            str(self.facade.faults_path),
            "--clock-file",
            str(self.facade.clock_path),
        ]

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await self.proxy.stop()
            await self.mock.stop()


def stripe_inprocess_world(workdir: Path, mock: StripeMock, proxy: StripeProxy) -> InProcessWorld:
    """A row against the core alone, with the real SDK and the fake (a crash unwinds)."""
    facade = StripeFacade(mock.url, proxy, workdir)
    # the worker's parts share the facade's fault plan (one file, one connection to close)
    target = FaultyStripeRefunds(stripe_client(proxy.url), facade.plan, facade.clock)
    service = StripeRefundService(target, facade.plan)
    return InProcessWorld(workdir, 1, parts=(facade, service, target))
