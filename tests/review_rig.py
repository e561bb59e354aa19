"""The rig the real-Temporal review tests share: the ``interlock`` console script run as an
operator runs it, and an in-process worker with the plugin over a throwaway journal and the
simulated payments service, whose refunds a test reads back. Used by ``test_cli_reviews`` (the
CLI), ``test_web_approvals`` (a web backend's ``ReviewClient``) and others that need a review a
workflow waits on."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal._reviews.workflow import ReviewStatus
from interlock_temporal.core import Journal, open_journal
from interlock_temporal.core.review import review_id
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer
from workers.scenarios import ORDER
from workflows.activities import support_activities
from workflows.support_case import CaseFile, CaseOutcome, SupportCase

from .waiting import until

CONSOLE_SCRIPT = Path(sys.executable).with_name("interlock")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def interlock(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> Ran:
    """The console script in a subprocess (never blocking the loop the in-process worker runs
    on). The environment has no INTERLOCK_* or TEMPORAL_* variables unless ``env`` adds them."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
    # the package from this checkout, whichever one the environment's console script names
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [environ.get("PYTHONPATH")])])
    environ.update(env or {})
    process = await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environ,
        cwd=cwd,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


# -- an in-process worker with the plugin, at any tier ----------------------------------------


@dataclass
class Rig:
    client: Client
    task_queue: str
    payments: SimulatedPayments
    journal: Journal
    url: str
    lease_id: str
    address: str
    workdir: Path

    def case(self, **kw: Any) -> CaseFile:
        # a case id of its own: the effect id (and so the review's workflow id) is this test's,
        # whatever other tests left on the shared dev server
        return CaseFile(
            case_id=f"cli-{uuid.uuid4().hex[:10]}",
            order_id=ORDER,
            amount_cents=2000,
            lease_id=self.lease_id,
            **kw,
        )

    async def start(self, case: CaseFile) -> WorkflowHandle[SupportCase, CaseOutcome]:
        return await self.client.start_workflow(
            SupportCase.run,
            case,
            id=f"case-{uuid.uuid4().hex[:10]}",
            task_queue=self.task_queue,
        )

    async def cli(self, *argv: str) -> Ran:
        # reconcile has no journal option: the reconciler uses the worker's journal
        journal = [] if argv[0] == "reconcile" else ["--journal", self.url]
        return await interlock(*argv, *journal, "--address", self.address, cwd=self.workdir)


@asynccontextmanager
async def rig(
    dev_server: DevServer, tmp_path: Path, tier: int, policy: Any = None
) -> AsyncIterator[Rig]:
    db = tmp_path / "journal.db"
    url = f"sqlite:///{db}"
    journal = open_journal(url)  # the key file beside it: the worker and the command find it
    lease = journal.leases.issue(
        "refund-bot",
        activities=["refund"],
        max_amount_cents=5000,
        resources=[f"order:{ORDER}"],
    )
    payments = SimulatedPayments(tmp_path / "payments.db", tier=tier)
    payments.open_order(ORDER, 10_000)
    client = await Client.connect(
        dev_server.target,
        data_converter=pydantic_data_converter,
        plugins=[InterlockPlugin(url, policy=policy)],
    )
    queue = f"cli-{uuid.uuid4().hex[:10]}"
    try:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[SupportCase],
            activities=support_activities(payments),
        ):
            yield Rig(client, queue, payments, journal, url, lease, dev_server.target, tmp_path)
    finally:
        journal.close()
        payments.close()


def effect_of(case: CaseFile) -> str:
    from interlock_temporal.core.identity import effect_id

    return effect_id("refund", {"case": case.case_id, "order": case.order_id})


async def review_status(client: Client, effect_id: str) -> ReviewStatus | None:
    handle = client.get_workflow_handle(review_id("ambiguous", effect_id))
    try:
        description = await handle.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            return None
        status: ReviewStatus = await handle.query("status", result_type=ReviewStatus)
    except RPCError:
        return None
    return status


async def opened_with_one_waiting(r: Rig, eid: str) -> None:
    """Until the effect's review is open with the one workflow waiting on it."""

    async def waiting() -> bool:
        status = await review_status(r.client, eid)
        return status is not None and status.subscribers == 1

    await until(waiting, "the review opened with the workflow waiting on it")
