"""Record the ``EffectReview`` histories the replay tests check
(``python -m tests.histories.record_reviews``), as ``record.py`` does for the support case.

They were recorded from the ``EffectReview`` of before notifications and review deadlines by
default (branch ``notify`` at e99a5ff): a review resolved by a person (the support case's row),
and reviews that reached their deadline (an approval and an AMBIGUOUS one: both expired then).
Re-recording them with a later release would hide the breakage the replay test exists to catch;
``--release NAME`` records a later release's resolved review beside them
(``effect_review_resolved.NAME.json``; ``sealed``: the review whose request carries the journal's
seal and whose ``settled`` signal is checked against the journal).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal._reviews.workflow import EffectReview, ReviewRequest
from interlock_temporal.core.review_rules import ReviewRules
from interlock_temporal.testing import DevServer
from workers.scenarios import SCENARIOS
from workers.server_world import ServerWorld

HERE = Path(__file__).parent / "reviews"


async def resolved(client: Client, release: str = "") -> None:
    workdir = Path(tempfile.mkdtemp(prefix="interlock-history-"))
    world = await ServerWorld.create(client, workdir, 3, "gated")
    world.setup()
    try:
        seen = await SCENARIOS["ambiguous_resolved_happened"].script(world)
        assert seen.outcome.status == "RESOLVED", seen.outcome
        (listed,) = [
            w
            async for w in client.list_workflows(
                f"WorkflowType = 'EffectReview' AND TaskQueue = '{world.task_queue}'"
            )
        ]
        history = await client.get_workflow_handle(listed.id).fetch_history()
        name = f"effect_review_resolved{'.' + release if release else ''}.json"
        (HERE / name).write_text(history.to_json())
        print(f"recorded {name}: {len(history.events)} events")
    finally:
        await world.close()


async def expired(server: DevServer) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="interlock-history-"))
    plugin = InterlockPlugin(f"sqlite:///{workdir / 'journal.db'}", signing_key="11" * 32)
    client = await Client.connect(server.target, plugins=[plugin])
    queue = f"history-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue):
        for kind in ("approval", "ambiguous"):
            req = ReviewRequest(
                kind=kind,
                effect_id="e" * 64,
                activity="refund",
                principal="refund-bot",
                rules=ReviewRules(deadline_s=1.0),
                details="recorded for the replay test",
            )
            handle = await client.start_workflow(
                EffectReview.run,
                req,
                id=f"interlock-review-{kind}-{uuid.uuid4().hex}",
                task_queue=queue,
            )
            status = await handle.result()
            assert status.state == "expired", status
            history = await handle.fetch_history()
            name = f"effect_review_{kind}_deadline.json"
            (HERE / name).write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events")


async def main(release: str = "") -> None:
    server = await DevServer(ui_port=None).start()
    try:
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        await resolved(client, release)
        if not release:  # a review started by hand is not sealed: since then it only closes
            await expired(server)
    finally:
        await server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[2] if sys.argv[1:2] == ["--release"] else ""))
