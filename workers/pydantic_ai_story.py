"""The Pydantic AI agent's side of the story: a worker that runs ``PydanticAICase`` with Pydantic
AI's Temporal plugin and the gate. No key and no network: the model is a script
(``workflows.pydantic_ai_case.SCRIPTS``, picked by the case file).

``python -m workers.pydantic_ai_story --target HOST:PORT --task-queue Q --journal URL --payments
FILE`` runs a worker process (it prints ``READY``); the tests and the demo start, SIGKILL and
restart it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal.policy import Policy
from interlock_temporal.targets.payments import SimulatedPayments
from workflows.agent_refund import SERVICES, refund
from workflows.pydantic_ai_case import PydanticAICase

from .story_worker import serve, story_parser, story_parts


def pydantic_ai_plugins(
    journal: str,
    payments: SimulatedPayments,
    *,
    on_point: Callable[[str, str], None] | None = None,
    policy: Policy | str | Path | None = None,
) -> list[Any]:
    """Pydantic AI's plugin first (its payload converter carries pydantic models and its
    sandbox passes the framework through), the gate after it (it keeps that converter), the
    refund's target bound by name."""
    return [
        PydanticAIPlugin(),
        InterlockPlugin(journal, targets={"refund": payments}, on_point=on_point, policy=policy),
    ]


@asynccontextmanager
async def pydantic_ai_worker(
    target: str,
    task_queue: str,
    journal: str,
    payments: SimulatedPayments,
    *,
    cached: bool = True,
    **plugin_options: Any,
) -> AsyncIterator[Client]:
    """A worker for ``PydanticAICase`` on ``task_queue``, running while inside; yields its
    client. The agents' activities (model requests, the naive toolset's calls) are registered by
    ``PydanticAIPlugin`` from the workflow's ``__pydantic_ai_agents__``. ``cached=False``: a
    worker that keeps no workflow in its cache, so each workflow task replays the run."""
    client = await Client.connect(
        target, plugins=pydantic_ai_plugins(journal, payments, **plugin_options)
    )
    SERVICES[task_queue] = payments
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[PydanticAICase],
        activities=[refund],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        max_cached_workflows=1000 if cached else 0,
    )
    try:
        async with worker:
            yield client
    finally:
        SERVICES.pop(task_queue, None)


async def main(argv: list[str] | None = None) -> None:
    args = story_parser(__doc__).parse_args(argv)
    payments, hook = story_parts(args)
    await serve(
        pydantic_ai_worker(args.target, args.task_queue, args.journal, payments, on_point=hook)
    )


if __name__ == "__main__":
    asyncio.run(main())
