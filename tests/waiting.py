"""Waiting in tests for something a real server, worker or person makes happen."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from interlock_temporal.core.review import review_id


async def until(
    check: Callable[[], Any],
    what: str = "the condition",
    *,
    timeout: float = 30.0,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Call ``check`` (plain or async) every 0.1 s until it returns something true, and return
    that; ``TimeoutError`` naming ``what`` (and ``detail()``, e.g. a worker's logs) after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if time.monotonic() > deadline:
            more = "" if detail is None else f":\n{detail()}"
            raise TimeoutError(f"{what} not reached within {timeout:g} s{more}")
        await asyncio.sleep(0.1)


async def review_open(client: Client, effect_id: str) -> bool:
    """Whether the review of the effect in doubt runs (a check for ``until``)."""
    try:
        handle = client.get_workflow_handle(review_id("ambiguous", effect_id))
        return (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError:
        return False
