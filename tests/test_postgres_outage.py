"""PostgreSQL stopped in the middle of a send, at every tier, with real worker processes: the
refund lands, the journal cannot record it; nothing more is sent while the journal cannot be
written (the attempts fail retryably); once the database is back, each effect ends as the fault
table says for its tier, the money read from the payments service."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.review import review_id
from interlock_temporal.testing import PostgresServer
from workers.scenarios import ORDER, REFUND_CENTS
from workers.server_world import ServerWorld

from .waiting import until

pytestmark = pytest.mark.server

KEY = "6b" * 32


@pytest.mark.faults  # a real outage held for seconds: in make faults (pytest -m faults)
async def test_postgres_stopped_mid_send_loses_nothing(client: Client, tmp_path: Path) -> None:
    server = PostgresServer().start()
    worlds: dict[int, ServerWorld] = {}
    try:
        for tier in (1, 2, 3):
            url = server.database(f"outage_t{tier}_{uuid.uuid4().hex[:6]}")
            workdir = tmp_path / f"t{tier}"
            workdir.mkdir()
            world = ServerWorld(client, workdir, tier, "gated", url, KEY)
            world.setup()
            # the refund lands, then its response is held: the outage starts inside it. Held for
            # 10 s, so all three are in flight at once even on a loaded machine (with 4 s, the
            # first could commit before the third was dispatched there, and the moment never came)
            world.payments.arm("after_commit", "stall", arg=10.0)
            worlds[tier] = world
        runs = {t: await w.start(w.case(start_to_close_s=30.0)) for t, w in worlds.items()}

        async def all_dispatched() -> bool:
            return all(
                (row := w.journal.row(w.effect_id)) is not None and row.status is Kind.DISPATCHED
                for w in worlds.values()
            )

        await until(all_dispatched, timeout=60)
        server.stop("fast")
        down_at = time.monotonic()

        async def failing_retryably(tier: int) -> bool:
            description = await runs[tier].describe()
            pending = description.raw_description.pending_activities
            return any(
                p.attempt > 1
                and p.last_failure.application_failure_info.type == "InterlockJournalUnavailable"
                and not p.last_failure.application_failure_info.non_retryable
                for p in pending
            )

        for tier in worlds:
            await until(lambda tier=tier: failing_retryably(tier), timeout=60)
        await asyncio.sleep(max(0.0, 8.0 - (time.monotonic() - down_at)))
        # nothing was sent while the journal could not be written: the one send that landed
        # before the outage, and no other
        for tier, world in worlds.items():
            assert world.payments.calls() == 1, tier
        server.restart()
        for world in worlds.values():
            world.journal.close()
            world.journal = open_journal(server.admin_url(world_db(world)), signing_key=KEY)

        outcomes = {t: await w.result(runs[t]) for t, w in worlds.items()}
        for tier in (1, 2):
            world = worlds[tier]
            assert outcomes[tier].status == "REFUNDED", outcomes[tier]
            assert world.payments.refunded_cents(ORDER) == REFUND_CENTS
            assert len(world.payments.refund_records(ORDER)) == 1
            row = world.journal.row(world.effect_id)
            assert row is not None and row.status is Kind.COMMITTED
            via = [e.data.get("via") for e in world.journal.read(world.effect_id)]
            assert via[-1] == "recovery-query", via
        t3 = worlds[3]
        assert outcomes[3].status == "AMBIGUOUS", outcomes[3]
        assert t3.payments.refunded_cents(ORDER) == REFUND_CENTS  # it did land, once
        row = t3.journal.row(t3.effect_id)
        assert row is not None and row.status is Kind.AMBIGUOUS
        review = client.get_workflow_handle(review_id("ambiguous", t3.effect_id))

        async def review_open() -> bool:
            try:
                return (await review.describe()).status == WorkflowExecutionStatus.RUNNING
            except Exception:
                return False

        await until(review_open, timeout=60)
        for world in worlds.values():
            assert world.journal.verify().ok
    finally:
        for world in worlds.values():
            await world.close()
        server.close()


def world_db(world: ServerWorld) -> str:
    return world.journal.url.rsplit("/", 1)[1]
