"""The gated payment the HTTP target's end-to-end tests run, and a worker process for the crash
test: ``python -m tests.http_worker TEMPORAL JOURNAL QUEUE API_URL TIER [--kill-after-send]``
serves the ``CallActivity`` workflow and the ``http_pay`` activity; with ``--kill-after-send``
it SIGKILLs itself right after the API answered the send, before the gate records it."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, current_effect, gated
from interlock_temporal.targets.http import HttpResult, HttpTarget, Lookup
from interlock_temporal.testing import kill_at

from .server_workflows import CallActivity

SIGNING_KEY = "33" * 32
ACTIVITY = "http_pay"


class Pay(BaseModel):
    order: str
    amount_cents: int
    currency: str


def payments_api(url: str, tier: int) -> HttpTarget:
    """Tier 1: the API dedupes a resend by its key for 24 hours. Tier 2: it does not, but it
    can be asked for a payment by its key (a JSON 404, with its own header, when absent)."""
    if tier == 1:
        return HttpTarget(
            "payments-api", dedupe_window=timedelta(hours=24), settle_time=timedelta(seconds=1)
        )
    lookup = Lookup(f"{url}/payments/by-key/{{effect_id}}", api_header="X-Api")
    return HttpTarget("payments-api", lookup=lookup, settle_time=timedelta(seconds=1))


def pay_activity(url: str, tier: int) -> Callable[..., Any]:
    target = payments_api(url, tier)

    @activity.defn(name=ACTIVITY)
    @gated(target=target, key=lambda p: {"order": p.order})
    async def http_pay(p: Pay) -> HttpResult:
        payment = {"amount_cents": p.amount_cents, "currency": p.currency}
        return await target.send(
            "POST", f"{url}/payments", json=payment, effect_id=current_effect().effect_id
        )

    return http_pay


def worker(client: Client, queue: str, url: str, tier: int) -> Worker:
    return Worker(
        client,
        task_queue=queue,
        workflows=[CallActivity],
        activities=[pay_activity(url, tier)],
        # after a crash, the workflow's next task goes to any worker after 1 s, not 10
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )


async def main(temporal: str, journal: str, queue: str, url: str, tier: int, kill: bool) -> None:
    plugin = InterlockPlugin(
        journal, signing_key=SIGNING_KEY, on_point=kill_at("after_send") if kill else None
    )
    client = await Client.connect(
        temporal, data_converter=pydantic_data_converter, plugins=[plugin]
    )
    await worker(client, queue, url, tier).run()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("temporal", "journal", "queue", "url"):
        parser.add_argument(name)
    parser.add_argument("tier", type=int)
    parser.add_argument("--kill-after-send", action="store_true")
    a = parser.parse_args()
    asyncio.run(main(a.temporal, a.journal, a.queue, a.url, a.tier, a.kill_after_send))
