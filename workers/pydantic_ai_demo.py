"""``make demo DEMO_ARGS=--agent=pydantic-ai``: the support case decided by an agent built with
Pydantic AI on Temporal (``TemporalDurability``, with ``PydanticAIPlugin`` on the worker), its
refund tool the gated activity in a ``GatedToolset``. The model is a script (a ``FunctionModel``):
no key, no network. Five stories on one dev server, each checked against the money the payments
service holds on its order, what the agent was told and what the journal recorded
(``demo_check.AGENT_EXPECTED``):

0. pai-naive: the same agent with a plain Pydantic AI tool that sends the refund itself, run as
   its toolset's activity; the worker is SIGKILLed right after the refund landed; Temporal runs
   the activity again: $40 in two refunds.
1. pai-t2: the worker is SIGKILLed right after the refund was sent; a fresh worker asks the
   service (tier 2), finds it: $20 once, and the agent is told the refund.
2. pai-redecide: $20 lands, then the agent re-decides $30 for the same case: refused as
   conflicting_payload (the tool's error, no retry spent), nothing more sent.
3. pai-policy: the agent asks for $50; a policy rule denies it and the agent is told; it asks
   again for $20, which lands.
4. pai-t3: the refund's answer is lost at a tier-3 service: AMBIGUOUS. The call is deferred, the
   workflow waits for the EffectReview (no activity waits); a person resolves it (happened) and
   the agent is given the result and finishes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from interlock_temporal.review import review_id
from interlock_temporal.testing import WorkerProcess
from workflows.pydantic_ai_case import (
    PydanticAICase,
    PydanticAICaseFile,
    PydanticAICaseOutcome,
)

from .agent_demo import OVER_LIMIT, Act, review_opened, say, tell
from .pydantic_ai_story import pydantic_ai_worker
from .world import ORDER

ROOT = Path(__file__).resolve().parents[1]


class PydanticAIAct(Act):
    """One story's world (as the OpenAI agent's), its workflow ``PydanticAICase``."""

    async def start(  # type: ignore[override]
        self, client: Client, **changes: Any
    ) -> WorkflowHandle[PydanticAICase, PydanticAICaseOutcome]:
        case = PydanticAICaseFile(
            case_id=self.case_id, order_id=ORDER, lease_id=self.lease_id, **changes
        )
        return await client.start_workflow(
            PydanticAICase.run,
            case,
            id=f"pai-case-{self.task_queue}",
            task_queue=self.task_queue,
        )

    def worker(self, model: Any = None, **options: Any) -> Any:
        return pydantic_ai_worker(
            self.target, self.task_queue, self.journal_url, self.payments, **options
        )

    def process(self, *extra: str) -> WorkerProcess:
        args = ["-m", "workers.pydantic_ai_story", "--target", self.target]
        args += ["--task-queue", self.task_queue, "--journal", self.journal_url]
        args += ["--payments", str(self.workdir / "payments.db"), "--tier", str(self.tier)]
        return WorkerProcess([*args, *extra], cwd=ROOT)


async def _killed_then_fresh(
    act: PydanticAIAct, handle: Any, doomed: WorkerProcess
) -> PydanticAICaseOutcome:
    await asyncio.wait_for(doomed.wait(), 60)
    act.kills += int(doomed.killed)
    fresh = await act.process().start()
    try:
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]
    finally:
        await fresh.stop()


async def naive_killed_after_send(act: PydanticAIAct) -> PydanticAICaseOutcome:
    act.payments.arm("after_commit", "kill")  # whichever worker process lands the refund dies
    doomed = await act.process().start()
    handle = await act.start(act.client, gated=False, script="naive")
    say("  the refund landed and the worker was SIGKILLed before Temporal heard of it")
    return await _killed_then_fresh(act, handle, doomed)


async def killed_after_send(act: PydanticAIAct) -> PydanticAICaseOutcome:
    kill = ["--kill-at", "after_send", "--kill-marker", str(act.workdir / "killed")]
    doomed = await act.process(*kill).start()
    handle = await act.start(act.client)
    say("  the worker sent the refund and was SIGKILLed before the gate recorded its result")
    return await _killed_then_fresh(act, handle, doomed)


async def redecided(act: PydanticAIAct) -> PydanticAICaseOutcome:
    async with act.worker() as client:
        handle = await act.start(client, script="redecide")
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]


async def over_limit(act: PydanticAIAct) -> PydanticAICaseOutcome:
    async with act.worker(policy=OVER_LIMIT) as client:
        handle = await act.start(client, script="greedy")
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]


async def resolved_by_a_person(act: PydanticAIAct) -> PydanticAICaseOutcome:
    act.payments.arm("after_commit", "reset")
    async with act.worker() as client:
        handle = await act.start(client)
        eid = await review_opened(act, client)
        resolution = {"decision": "happened", "operator": "carol", "note": "seen in the ledger"}
        say("  the refund is AMBIGUOUS; the call is deferred and the workflow waits for a person:")
        say(
            f"    temporal workflow signal --workflow-id {review_id('ambiguous', eid)} "
            f"--name resolve --input '{json.dumps(resolution)}'"
        )
        await client.get_workflow_handle(review_id("ambiguous", eid)).signal("resolve", resolution)
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]


Story = Callable[[PydanticAIAct], Coroutine[Any, Any, PydanticAICaseOutcome]]
PYDANTIC_AI_ACTS: list[tuple[str, int, str, Story]] = [
    (
        "pai-naive",
        2,
        "naive: a plain Pydantic AI refund tool, the worker SIGKILLed after the send",
        naive_killed_after_send,
    ),
    (
        "pai-t2",
        2,
        "the agent's gated refund, the worker SIGKILLed after the send (tier 2)",
        killed_after_send,
    ),
    ("pai-redecide", 2, "$20 lands, the agent re-decides $30", redecided),
    ("pai-policy", 2, "the agent asks for $50; a policy rule denies it", over_limit),
    (
        "pai-t3",
        3,
        "the answer lost (tier 3): a deferred call, a person resolves the review",
        resolved_by_a_person,
    ),
]


async def agent_acts(client: Client, target: str, workdir: Path) -> list[tuple[str, list[str]]]:
    """Every story, each checked as it ends: (story, what it did not show of what it must)."""
    return await tell(PYDANTIC_AI_ACTS, PydanticAIAct, client, target, workdir)
