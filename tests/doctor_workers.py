"""Workers that ``interlock doctor --worker tests.doctor_workers:ATTR`` builds (in a subprocess,
as an operator runs it) and that ``test_doctor`` starts in process: one with an ungated
activity that sends (``send_email``), one where every activity is gated or declared
``no_effects``. Each factory takes no argument: the server, the journal and the directory of
the simulated services come from the environment (``TEMPORAL_ADDRESS``, ``INTERLOCK_JOURNAL``,
``DOCTOR_DIR``; the task queue from ``DOCTOR_TASK_QUEUE``, a policy file from
``DOCTOR_POLICY``), as a deployment's worker module would read them."""

from __future__ import annotations

import os
import smtplib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, current_effect, gated, no_effects
from interlock_temporal.targets.payments import SimulatedPayments


def _activities(workdir: Path, *, ungated: bool) -> list[Callable[..., Any]]:
    # tier 1 (a dedupe window) and tier 2 (queryable): two gated activities, two tiers
    cards = SimulatedPayments(workdir / "cards.db", tier=1, name="cards")
    bank = SimulatedPayments(workdir / "bank.db", tier=2, name="bank")

    @activity.defn(name="refund_card")
    @gated(target=cards)
    async def refund_card(order_id: str, amount_cents: int) -> Any:
        return await cards.refund(
            order_id, amount_cents, idempotency_key=current_effect().effect_id
        )

    @activity.defn(name="refund_bank")
    @gated(target=bank)
    async def refund_bank(order_id: str, amount_cents: int) -> Any:
        return await bank.refund(order_id, amount_cents, idempotency_key=current_effect().effect_id)

    @activity.defn(name="lookup_order")
    @no_effects
    async def lookup_order(order_id: str) -> dict[str, Any]:
        return bank.order_facts(order_id)

    @activity.defn(name="send_email")
    async def send_email(to: str, body: str) -> None:
        """Sends, and nothing guards it: neither gated, nor named by a policy."""
        with smtplib.SMTP("localhost", 2525) as smtp:
            smtp.sendmail("agent@example.com", [to], body)

    found: list[Callable[..., Any]] = [refund_card, refund_bank, lookup_order]
    return [*found, send_email] if ungated else found


async def _worker(*, ungated: bool) -> Worker:
    workdir = Path(os.environ["DOCTOR_DIR"])
    plugin = InterlockPlugin(policy=os.environ.get("DOCTOR_POLICY") or None)
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[plugin])
    return Worker(
        client,
        task_queue=os.environ.get("DOCTOR_TASK_QUEUE", "doctor"),
        activities=_activities(workdir, ungated=ungated),
    )


async def unguarded() -> Worker:
    """A worker with ``send_email``, which sends and is neither gated nor policed."""
    return await _worker(ungated=True)


async def clean() -> Worker:
    """Every activity gated or declared ``no_effects``."""
    return await _worker(ungated=False)


def not_a_worker() -> str:
    return "a string"
