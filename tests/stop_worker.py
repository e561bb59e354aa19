"""A worker process written as the README's is, for the Ctrl-C test: ``InterlockPlugin`` on the
client, a gated activity, and ``asyncio.run(main())`` with ``await run_worker(worker)`` (or,
with ``--plain``, ``await worker.run()``).

``python -m tests.stop_worker TARGET TASK_QUEUE DIRECTORY [--plain]``"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, current_effect, gated, run_worker
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments


async def main(target: str, task_queue: str, directory: Path, plain: bool) -> None:
    payments = SimulatedPayments(directory / "payments.db", tier=2)

    @activity.defn
    @gated(target=payments, key=lambda r: {"case": r.case_id, "order": r.order_id})
    async def refund(r: RefundRequest) -> RefundResult:
        return await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    plugin = InterlockPlugin(journal=f"sqlite:///{directory / 'interlock.db'}")
    client = await Client.connect(target, plugins=[plugin])
    worker = Worker(client, task_queue=task_queue, activities=[refund])
    if plain:
        await worker.run()
    else:
        await run_worker(worker)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("task_queue")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.target, args.task_queue, args.directory, args.plain))
