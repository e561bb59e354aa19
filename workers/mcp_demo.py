"""``make demo DEMO_ARGS=--agent=mcp``: the support case's refund through an MCP server of ours
(``workers.mcp_server``: the MCP SDK's ``MCPServer`` over streamable HTTP, refunding on the
payments service's file), called from the workflow with the real ``temporalio-mcp`` plugin. The
model is a script of tool calls. Five stories on one dev server, each checked against the money
the payments service holds on its order, what the model read and what the journal recorded
(``demo_check.AGENT_EXPECTED``):

1. mcp-naive: temporalio-mcp alone; the MCP server refunds $20 and SIGKILLs the worker that
   called it before answering; Temporal runs the call-tool activity again: $40.
2. mcp-t1: the same crash, the tool gated; the server dedupes by the _meta effect id (tier 1),
   so the fresh worker's resend is answered with the first refund: $20 once.
3. mcp-redecide: the same crash at a server that promises nothing (tier 3): AMBIGUOUS; the model
   reads "outcome unknown" and re-decides $30 for the same order: refused, conflicting_payload.
4. mcp-policy: the model asks for $50; a policy rule denies it, the model reads the isError
   result; it asks again for $20, which lands.
5. mcp-t3: the same crash at tier 3; the workflow waits on the EffectReview; a person resolves
   it (happened), and the workflow goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from interlock_temporal.core.journal import open_journal
from interlock_temporal.policy import CallEvent
from interlock_temporal.review import review_id
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import WorkerProcess, free_port
from workflows.mcp_case import PRINCIPAL, McpCase, McpCaseFile, McpCaseOutcome, McpStep

from .agent_demo import over_limit_policy, say
from .demo_check import AgentFound, check_agent, observe_agent
from .mcp_story import mcp_worker
from .world import CASE, LEASE_MAX_CENTS, ORDER, PAID_CENTS, REFUND_CENTS

ROOT = Path(__file__).resolve().parents[1]

REFUND = McpStep(tool="refund", arguments={"amount_cents": REFUND_CENTS, "reason": "overcharged"})
REDECIDED = McpStep(tool="refund", arguments={"amount_cents": 3000, "reason": "and the trouble"})
GREEDY = McpStep(tool="refund", arguments={"amount_cents": 5000, "reason": "and the trouble"})


def mcp_amount(event: CallEvent) -> int:
    """An MCP call's input is ``McpToolCall``: the model's arguments under ``arguments``."""
    arguments = event.argument("arguments") or {}
    return int(arguments.get("amount_cents", 0))


#: refunds over $25 are denied (the model is told which argument, never its value)
OVER_LIMIT = over_limit_policy(mcp_amount)


def told(result: dict[str, Any]) -> str:
    """What the model read of a tool's result: its text."""
    return " ".join(str(c.get("text", "")) for c in result.get("content", []))


class Act:
    """One story's world: its journal, its payments file (the order paid), its MCP server
    process refunding on that file, its lease and task queue."""

    def __init__(self, client: Client, target: str, workdir: Path, name: str, dedupe: bool):
        self.client, self.target, self.name = client, target, name
        self.server = "payments" if dedupe else "payments-t3"
        self.dedupe = dedupe
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True)
        self.journal_url = f"sqlite:///{self.workdir / 'journal.db'}"
        self.journal = open_journal(self.journal_url)
        self.payments = SimulatedPayments(self.workdir / "payments.db", tier=1 if dedupe else 3)
        self.payments.open_order(ORDER, PAID_CENTS)
        self.lease_id = self.journal.leases.issue(
            PRINCIPAL,
            activities=[f"interlock.mcp.{self.server}.refund"],
            max_amount_cents=LEASE_MAX_CENTS,
        )
        self.task_queue = f"{name}-{uuid.uuid4().hex[:8]}"
        self.case_id = f"{CASE}-{name}"
        self.pid_file = self.workdir / "worker.pid"
        self.port = free_port()
        self.mcp_url = f"http://127.0.0.1:{self.port}/mcp"
        self.mcp: WorkerProcess | None = None
        self.kills = 0

    async def serve(self, *, kill_caller: bool) -> None:
        """Start the MCP server; with ``kill_caller``, it SIGKILLs the worker whose pid is in
        ``pid_file`` right after a refund commits, before it answers."""
        args = ["-m", "workers.mcp_server", "--payments", str(self.workdir / "payments.db")]
        args += ["--port", str(self.port)] + ["--dedupe"] * self.dedupe
        args += ["--kill-caller", str(self.pid_file)] if kill_caller else []
        self.mcp = await WorkerProcess(args, cwd=ROOT).start()
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("the MCP server did not listen") from None
                await asyncio.sleep(0.1)

    def story_worker(self, *, doomed: bool) -> WorkerProcess:
        args = ["-m", "workers.mcp_story", "--target", self.target]
        args += ["--task-queue", self.task_queue, "--journal", self.journal_url]
        args += ["--mcp-url", self.mcp_url]
        args += ["--pid-file", str(self.pid_file)] if doomed else []
        return WorkerProcess(args, cwd=ROOT)

    async def start(
        self, client: Client, *steps: McpStep, **changes: Any
    ) -> WorkflowHandle[McpCase, McpCaseOutcome]:
        case = McpCaseFile(
            case_id=self.case_id,
            order_id=ORDER,
            lease_id=self.lease_id,
            server=self.server,
            steps=list(steps),
            **changes,
        )
        return await client.start_workflow(
            McpCase.run, case, id=f"mcp-case-{self.task_queue}", task_queue=self.task_queue
        )

    def effect_id(self) -> str | None:
        rows = self.journal.effects()
        return rows[0].effect_id if rows else None

    def found(self, done: McpCaseOutcome) -> AgentFound:
        return observe_agent(
            self.payments,
            self.journal,
            ORDER,
            self.effect_id(),
            [told(r) for r in done.results],
            self.kills,
        )

    async def close(self) -> None:
        if self.mcp is not None:
            await self.mcp.stop()
        self.journal.close()
        self.payments.close()


async def _crashed(
    act: Act, *steps: McpStep, person: bool = False, **changes: Any
) -> McpCaseOutcome:
    """The server refunds and SIGKILLs its caller before answering; a fresh worker goes on
    (and, with ``person``, a person resolves the review the refund in doubt opened)."""
    await act.serve(kill_caller=True)
    doomed = await act.story_worker(doomed=True).start()
    handle = await act.start(act.client, *steps, **changes)
    await asyncio.wait_for(doomed.wait(), 60)
    act.kills += int(doomed.killed)
    say("  the MCP server refunded and SIGKILLed the worker that called it before answering")
    fresh = await act.story_worker(doomed=False).start()
    try:
        if person:
            await _resolved_by_a_person(act)
        done: McpCaseOutcome = await asyncio.wait_for(handle.result(), 60)
        return done
    finally:
        await fresh.stop()


async def naive(act: Act) -> McpCaseOutcome:
    return await _crashed(act, REFUND, gated=False, start_to_close_s=3.0, list_tools=False)


async def deduped(act: Act) -> McpCaseOutcome:
    return await _crashed(act, REFUND)


async def redecided(act: Act) -> McpCaseOutcome:
    done = await _crashed(act, REFUND, REDECIDED, wait_for_review=False)
    eid = act.effect_id()
    if eid is not None:  # the review stays for a person; the demo's story ends here
        await act.client.get_workflow_handle(review_id("ambiguous", eid)).terminate("demo over")
    return done


async def over_limit(act: Act) -> McpCaseOutcome:
    await act.serve(kill_caller=False)
    async with mcp_worker(
        act.target, act.task_queue, act.journal_url, act.mcp_url, policy=OVER_LIMIT
    ) as client:
        handle = await act.start(client, GREEDY, REFUND)
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]


async def resolved(act: Act) -> McpCaseOutcome:
    return await _crashed(act, REFUND, person=True)


async def _resolved_by_a_person(act: Act, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        eid = act.effect_id()
        if eid is not None:
            review = act.client.get_workflow_handle(review_id("ambiguous", eid))
            try:
                if (await review.describe()).status == WorkflowExecutionStatus.RUNNING:
                    break
            except RPCError:
                pass
        await asyncio.sleep(0.2)
    else:
        raise TimeoutError("no review opened for the refund in doubt")
    resolution = {"decision": "happened", "operator": "carol", "note": "seen in the ledger"}
    say("  the refund is AMBIGUOUS; the workflow waits for a person, who runs:")
    say(
        f"    temporal workflow signal --workflow-id {review_id('ambiguous', eid)} "
        f"--name resolve --input '{json.dumps(resolution)}'"
    )
    await review.signal("resolve", resolution)


Story = Callable[[Act], Coroutine[Any, Any, McpCaseOutcome]]
MCP_ACTS: list[tuple[str, bool, str, Story]] = [
    ("mcp-naive", False, "naive: temporalio-mcp alone, the worker SIGKILLed after the send", naive),
    ("mcp-t1", True, "the refund tool gated, the same crash (tier 1: the server dedupes)", deduped),
    ("mcp-redecide", False, "the same crash at tier 3, the model re-decides $30", redecided),
    ("mcp-policy", True, "the model asks for $50; a policy rule denies it", over_limit),
    ("mcp-t3", False, "the same crash at tier 3; a person resolves the review", resolved),
]


async def agent_acts(client: Client, target: str, workdir: Path) -> list[tuple[str, list[str]]]:
    """Every story, each checked as it ends: (story, what it did not show of what it must)."""
    checked = []
    # a lost answer is the story: the worker's warning and traceback for it would only be noise
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    for name, dedupe, title, story in MCP_ACTS:
        say(f"== {title} ==")
        act = Act(client, target, workdir, name, dedupe)
        try:
            done = await story(act)
            found = act.found(done)
        finally:
            await act.close()
        for line in found.told:
            say(f"  the model read: {' '.join(line.split())[:160]}")
        problems = check_agent(name, found)
        money = " + ".join(f"${c / 100:.0f}" for c in found.refunds) or "nothing"
        say(f"  refunded: {money}; journal: {found.gate or 'no record'} via {found.via or '-'}")
        checked.append((name, problems))
        say()
    return checked
