"""What every framework's page in docs/agents.md must do as written: its program, run as a
worker process of its own beside the README's ``refunds.py``, refunds $20 once for a case the
test starts, recorded COMMITTED under the principal the workflow acts as. Shared by the tests of
each framework (``test_agents``, ``test_pydantic_ai``, ``test_langgraph``)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from temporalio.client import Client

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.receipts import receipt
from interlock_temporal.targets.payments import SimulatedPayments

from .doc_snippets import ROOT


async def refunds_once(
    client: Client, folder: Path, *, program: str, workflow: str, queue: str
) -> None:
    """Run ``folder/program`` (the page's program, its placeholders swapped) and the page's
    ``workflow`` on ``queue`` for order o-1, paid $100; the page's answer, one $20 refund read
    from the payments service, and its receipt."""
    journal = open_journal(f"sqlite:///{folder / 'interlock.db'}")
    payments = SimulatedPayments(folder / "payments.db", tier=2)
    payments.open_order("o-1", 10_000)
    lease_id = journal.leases.issue("refund-bot", activities=["refund"], max_amount_cents=5000)
    env = {**os.environ, "PYTHONPATH": f"{folder}:{ROOT}"}
    worker = await asyncio.create_subprocess_exec(sys.executable, program, cwd=folder, env=env)
    try:
        done = await asyncio.wait_for(
            client.execute_workflow(
                workflow,
                {"case_id": "c-1", "order_id": "o-1", "lease_id": lease_id},
                id=f"docs-{workflow}-{queue}",
                task_queue=queue,
            ),
            60,
        )
    finally:
        worker.terminate()
        await worker.wait()
    try:
        assert done == "Your refund is on its way."
        (landed,) = payments.refund_records("o-1")
        assert landed.amount_cents == 2000
        (row,) = journal.effects()
        assert landed.effect_id == row.effect_id
        shown = receipt(row.effect_id, journal=journal)
        assert (shown.final, shown.principal) == ("COMMITTED", "refund-bot")
    finally:
        journal.close()
        payments.close()
