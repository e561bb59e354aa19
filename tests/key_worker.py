"""A worker process for the effect-key tests: the support case's refund, and the same refund
keyed by the clock (the mistake a key must not make). ``python -m tests.key_worker --target
HOST:PORT --task-queue Q --journal URL --payments FILE``; prints ``READY`` once it polls."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, current_effect, gated
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from workflows.activities import support_activities

from .server_workflows import CallActivity, ReusedActivityId


def refund_at_activity(payments: SimulatedPayments) -> Callable[..., Any]:
    @activity.defn(name="refund_at")
    @gated(
        target=payments,
        # the mistake: the key reads the clock, so every attempt names another effect
        key=lambda r: {"case": r.case_id, "order": r.order_id, "at": time.time()},
        premises="premises",
        amount=lambda r: r.amount_cents,
    )
    async def refund_at(r: RefundRequest) -> RefundResult:
        return await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    return refund_at


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--task-queue", required=True)
    p.add_argument("--journal", required=True)
    p.add_argument("--payments", type=Path, required=True)
    p.add_argument("--tier", type=int, default=2)
    args = p.parse_args()
    payments = SimulatedPayments(args.payments, tier=args.tier)
    client = await Client.connect(args.target, plugins=[InterlockPlugin(args.journal)])
    async with Worker(
        client,
        task_queue=args.task_queue,
        workflows=[CallActivity, ReusedActivityId],
        activities=[*support_activities(payments), refund_at_activity(payments)],
    ):
        print(f"READY pid={os.getpid()}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
