"""Record the histories the replay tests check (``python -m tests.histories.record``).

Run it when a release's workflow code is final: the files pin what workflows already running
in production will replay. ``--release NAME`` writes new files beside the old ones
(``support_case_review_happened.NAME.json``), never over them: the first recording has no name,
``sealed`` is the code where a waiting workflow believes only the journal (``WAKE_PATCH``). A
change to ``execute_effect`` or ``SupportCase`` that no longer replays these histories must be
guarded with ``workflow.patched``; re-recording them to make the test pass would hide exactly
the breakage the test exists to catch.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from interlock_temporal.testing import DevServer
from workers.scenarios import SCENARIOS
from workers.server_world import ServerWorld

HERE = Path(__file__).parent
ROWS = {
    "ambiguous_resolved_happened": "support_case_review_happened.json",
    "ambiguous_resolved_not_happened": "support_case_review_not_happened.json",
}


async def main(release: str = "") -> None:
    server = await DevServer(ui_port=None).start()
    try:
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        for row, filename in ROWS.items():
            workdir = Path(tempfile.mkdtemp(prefix="interlock-history-"))
            world = await ServerWorld.create(client, workdir, 3, "gated")
            world.setup()
            try:
                seen = await SCENARIOS[row].script(world)
                assert seen.outcome.status in ("REFUNDED", "RESOLVED"), seen.outcome
                case_workflows = [
                    w
                    async for w in client.list_workflows(
                        f"WorkflowType = 'SupportCase' AND TaskQueue = '{world.task_queue}'"
                    )
                ]
                (listed,) = case_workflows
                history = await client.get_workflow_handle(listed.id).fetch_history()
                if release:
                    filename = filename.replace(".json", f".{release}.json")
                (HERE / filename).write_text(history.to_json())
                print(f"recorded {filename}: {len(history.events)} events")
            finally:
                await world.close()
    finally:
        await server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[2] if sys.argv[1:2] == ["--release"] else ""))
