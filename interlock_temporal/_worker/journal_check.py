"""One task queue, one journal: a worker refuses gated work when its task queue is shared with a
worker of another journal.

The problem: Temporal delivers an activity's attempts to whichever worker of its task queue
polls first, and an effect's record lives in one journal. With two journals behind one task
queue (the default ``sqlite:///interlock.db`` on two hosts), attempt 1 of a tier-3 effect can
send on worker A and die in doubt, and attempt 2 land on worker B, whose journal never heard of
it: B sends it again. Neither journal is wrong; the deployment is (``core.journal_identity``).

The mechanism: each worker names its journal in its Temporal identity
(``"<identity> interlock-journal:<id>"``), which the server lists for each poller of a task
queue. ``QueueJournalCheck`` asks the server for the activity pollers of the worker's task
queue when the worker starts and every ``CHECK_EVERY_S`` after (``ListTaskQueuePartitions``,
then ``DescribeTaskQueue`` of each partition: one call describes one partition, and a worker's
pollers can all sit on partitions other than the root); a poller whose identity names another
journal id makes the worker refuse every gated activity before the gate decides anything
(``JournalMismatch``: non-retryable, naming both journals and what to fix; nothing written,
nothing sent), with one WARNING each time what it sees changes. Pollers
without the tag (plain, ungated workers) are ignored. The server lists a poller for a few
minutes after its last poll, so a worker that just died in doubt still counts (which is the
case that matters); the cost is that after the fix, gated work stays refused until the server
forgets the other journal's poller (minutes).

As defence in depth, the gate's heartbeats during a send carry the journal id too
(``heartbeat_details``), and an attempt after the first whose earlier attempt's details name
another journal is refused the same way. Heartbeat details are throttled and may be lost (an
attempt that died before its first heartbeat left none), so they back up the poller check and
never replace it.

When a ``DescribeTaskQueue`` fails (a flaky connection, a server that refuses the call), the
worker keeps the last answer and logs once per streak of failures: gated work is not blocked
on a call that has nothing to do with the effect. The cost: until a call succeeds again, a
worker of another journal that started meanwhile is not noticed (the heartbeat check still
applies to retries). A server that will not list partitions gets the root partition described
alone, which sees a worker whose pollers all sit on other partitions late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    ListTaskQueuePartitionsRequest,
)

from ..core.journal_identity import journal_named_by, mismatch_message
from .errors import JournalMismatch

if TYPE_CHECKING:
    import temporalio.activity
    import temporalio.client

log = logging.getLogger("interlock_temporal")

#: how often a worker asks for its task queue's pollers. The check at start stops the worker that
#: joins a task queue of another journal at once; the period is how long an earlier worker runs
#: gated work before it hears of the newcomer (which itself refuses from its first poll). Each
#: check is 1 + partitions small RPCs (5 with the server's default of 4 partitions): every 30 s
#: is far below anything the server notices, and shorter than the time the default retry policy
#: (1, 2, 4, 8, 16 s between attempts) takes to make six attempts of one activity
CHECK_EVERY_S = 30.0
#: how long one ``DescribeTaskQueue`` may take before it counts as failed
CALL_TIMEOUT_S = 10.0
#: the heartbeat details key that names the journal of the attempt that sent them
HEARTBEAT_KEY = "interlock_journal"


def heartbeat_details(journal_id: str) -> dict[str, str]:
    """What the gate heartbeats with while it sends on the body's behalf."""
    return {HEARTBEAT_KEY: journal_id}


def journal_in_details(details: Sequence[Any]) -> str | None:
    """The journal id an earlier attempt's heartbeat details name (None: they name none)."""
    for detail in details:
        if isinstance(detail, dict):
            found = detail.get(HEARTBEAT_KEY)
            if isinstance(found, str) and found:
                return found
    return None


class QueueJournalCheck:
    """The journals the other pollers of one worker's task queue name, asked of the server at
    start and every ``CHECK_EVERY_S``. The worker's runtime holds one; ``refusal`` is what the
    gate asks before each gated attempt."""

    def __init__(
        self,
        journal_id: str,
        client: temporalio.client.Client,
        task_queue: str,
        *,
        every_s: float | None = None,
    ) -> None:
        self.journal_id = journal_id
        self.client = client
        self.task_queue = task_queue
        #: how often to ask (None: ``CHECK_EVERY_S`` as it is when the loop runs)
        self.every_s = every_s
        #: another journal's poller seen at the last answer: (its journal id, its identity)
        self.other: tuple[str, str] | None = None
        #: whether a check has answered at least once
        self.checked = False
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    async def _partitions(self) -> list[str]:
        """The activity partitions of the task queue (``ListTaskQueuePartitions``); the root
        alone when the server will not list them."""
        try:
            listed = await self.client.workflow_service.list_task_queue_partitions(
                ListTaskQueuePartitionsRequest(
                    namespace=self.client.namespace, task_queue=TaskQueue(name=self.task_queue)
                ),
                timeout=timedelta(seconds=CALL_TIMEOUT_S),
            )
        except Exception as err:
            log.debug(
                "listing the partitions of %r failed (%s): the root only", self.task_queue, err
            )
            return [self.task_queue]
        keys = [p.key for p in listed.activity_task_queue_partitions if p.key]
        return keys or [self.task_queue]

    async def poller_identities(self) -> list[str]:
        """The identities of the task queue's activity pollers, from every partition: a
        ``DescribeTaskQueue`` describes one partition, and a worker's pollers may all sit on
        others (a second worker's, while the first one's hold the root)."""
        identities: list[str] = []
        for partition in await self._partitions():
            response = await self.client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=self.client.namespace,
                    task_queue=TaskQueue(name=partition),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                ),
                timeout=timedelta(seconds=CALL_TIMEOUT_S),
            )
            identities.extend(poller.identity for poller in response.pollers)
        return identities

    async def check(self) -> None:
        """Ask the server once; on failure keep the last answer (see the module's docstring)."""
        try:
            identities = await self.poller_identities()
        except Exception as err:
            if not self._failing:
                self._failing = True
                log.warning(
                    "interlock: could not list the pollers of task queue %r (%s): keeping the "
                    "last answer (%s) until the call succeeds again",
                    self.task_queue,
                    err,
                    "never asked" if not self.checked else self._describe(),
                )
            return
        if self._failing:
            self._failing = False
            log.info("interlock: listing the pollers of task queue %r works again", self.task_queue)
        other: tuple[str, str] | None = None
        for identity in identities:
            named = journal_named_by(identity)
            if named is not None and named != self.journal_id:
                other = (named, identity)
                break
        self.checked = True
        self._seen(other)

    def _seen(self, other: tuple[str, str] | None) -> None:
        before = None if self.other is None else self.other[0]
        self.other = other
        if other is not None and other[0] != before:
            log.warning(
                "interlock: refusing gated activities: %s",
                mismatch_message(
                    self.journal_id,
                    other[0],
                    f"poller {other[1]!r} of task queue {self.task_queue!r}",
                ),
            )
        elif other is None and before is not None:
            log.warning(
                "interlock: task queue %r no longer has a poller of another journal: gated "
                "activities run again",
                self.task_queue,
            )

    def _describe(self) -> str:
        return "no other journal" if self.other is None else f"journal {self.other[0]}"

    async def start(self) -> None:
        """Check now, then every ``every_s`` until ``stop``."""
        if self._task is not None:
            return
        await self.check()
        self._task = asyncio.ensure_future(self._every())

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S if self.every_s is None else self.every_s)
            await self.check()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def running(self) -> bool:
        return self._task is not None

    def refusal(self, info: temporalio.activity.Info) -> JournalMismatch | None:
        """Why this worker must not run the gated attempt ``info``: a poller of its task queue
        names another journal, or (after the first attempt) an earlier attempt's heartbeat
        details do. None: it may."""
        if self.other is not None:
            theirs, identity = self.other
            where = f"poller {identity!r} of task queue {self.task_queue!r}"
            return JournalMismatch(
                mismatch_message(self.journal_id, theirs, where), self.journal_id, theirs
            )
        return refusal_by_heartbeat(self.journal_id, info)


def refusal_by_heartbeat(journal_id: str, info: temporalio.activity.Info) -> JournalMismatch | None:
    """Attempt 2 or later whose earlier attempt heartbeat another journal's id: refused."""
    if info.attempt <= 1:
        return None
    theirs = journal_in_details(info.heartbeat_details)
    if theirs is None or theirs == journal_id:
        return None
    where = f"the heartbeat details of attempt {info.attempt - 1} of activity {info.activity_id!r}"
    return JournalMismatch(mismatch_message(journal_id, theirs, where), journal_id, theirs)
