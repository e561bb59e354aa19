"""``make demo DEMO_ARGS=--agent``: the support case decided by an agent (OpenAI Agents SDK on
Temporal), its refund tool the gated activity (``effect_as_tool``). The model is a script: no
key, no network, tracing export off. Five stories on one dev server, each checked against the
money the payments service holds on its order, what the agent was told and what the journal
recorded (``demo_check.AGENT_EXPECTED``):

0. agent-naive: the same agent with the tool temporalio's ``activity_as_tool`` makes of an
   ungated refund; the worker is SIGKILLed right after the refund landed; Temporal runs the
   activity again: $40 in two refunds.
1. agent-t2: the worker is SIGKILLed right after the refund was sent; a fresh worker asks the
   service (tier 2), finds it: $20 once, and the agent is told the refund.
2. agent-redecide: the refund lands and its answer is lost at a tier-3 service; the agent is
   told the outcome is unknown and re-decides $30 for the same case: refused as
   conflicting_payload, nothing more sent.
3. agent-policy: the agent asks for $50; a policy rule denies it and the agent is told; it
   asks again for $20, which lands.
4. agent-t3: the answer is lost again; the tool waits on the EffectReview; a person resolves
   it (happened), and the agent goes on to finish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from interlock_temporal.core.journal import open_journal
from interlock_temporal.policy import CallEvent, Policy, deny_when
from interlock_temporal.review import review_id
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import WorkerProcess
from workflows.agent_case import PRINCIPAL, AgentCase, AgentCaseFile, AgentCaseOutcome

from .agent_story import SCRIPTS, ScriptedModel, agent_worker
from .demo_check import AgentFound, check_agent, observe_agent
from .world import CASE, LEASE_MAX_CENTS, ORDER, PAID_CENTS

ROOT = Path(__file__).resolve().parents[1]


def amount_cents(event: CallEvent) -> int:
    """The amount a refund call asks for: its input's ``amount_cents``."""
    return int(event.argument("amount_cents", 0))


def over_limit_policy(amount: Callable[[CallEvent], int] = amount_cents) -> Policy:
    """Refunds over $25 are denied (the model is told which argument, never its value);
    ``amount`` reads a call's amount from its input, in the framework's shape."""

    def over_25_dollars(event: CallEvent) -> bool:
        return amount(event) > 2500

    return Policy(
        rules=[
            deny_when(
                over_25_dollars,
                code="OVER_LIMIT",
                reason="refunds over $25 need a person",
                argument="amount_cents",
            )
        ]
    )


#: the agent stories' policy
OVER_LIMIT = over_limit_policy()


def say(text: str = "") -> None:
    print(text, flush=True)


class Act:
    """One story's world: its own journal, payments service (the order paid) and task queue.
    Another framework's story subclasses it: its worker module, ``start`` and ``worker``."""

    #: the module whose worker process the crash stories start and SIGKILL
    story_module = "workers.agent_story"

    def __init__(self, client: Client, target: str, workdir: Path, name: str, tier: int):
        self.client, self.target, self.name, self.tier = client, target, name, tier
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True)
        self.journal_url = f"sqlite:///{self.workdir / 'journal.db'}"
        self.journal = open_journal(self.journal_url)
        self.payments = SimulatedPayments(self.workdir / "payments.db", tier=tier)
        self.payments.open_order(ORDER, PAID_CENTS)
        self.lease_id = self.journal.leases.issue(
            PRINCIPAL, activities=["refund"], max_amount_cents=LEASE_MAX_CENTS
        )
        self.task_queue = f"{name}-{uuid.uuid4().hex[:8]}"
        #: a case of its own: its effect (and its review) is no other story's
        self.case_id = f"{CASE}-{name}"
        self.kills = 0

    async def start(
        self, client: Client, **changes: Any
    ) -> WorkflowHandle[AgentCase, AgentCaseOutcome]:
        case = AgentCaseFile(
            case_id=self.case_id, order_id=ORDER, lease_id=self.lease_id, **changes
        )
        return await client.start_workflow(
            AgentCase.run,
            case,
            id=f"agent-case-{self.task_queue}",
            task_queue=self.task_queue,
        )

    def worker(self, model: ScriptedModel, **options: Any) -> Any:
        return agent_worker(
            self.target, self.task_queue, model, self.journal_url, self.payments, **options
        )

    def effect_id(self) -> str | None:
        rows = [r.effect_id for r in self.journal.effects() if r.effect_type == "refund"]
        return rows[0] if rows else None

    def found(self, done: Told) -> AgentFound:
        return observe_agent(
            self.payments, self.journal, ORDER, self.effect_id(), done.tool_outputs, self.kills
        )

    def close(self) -> None:
        self.journal.close()
        self.payments.close()


def _story_worker(act: Act, *extra: str) -> WorkerProcess:
    args = ["-m", act.story_module, "--target", act.target, "--task-queue", act.task_queue]
    args += ["--journal", act.journal_url, "--payments", str(act.workdir / "payments.db")]
    return WorkerProcess([*args, *extra], cwd=ROOT)


async def naive_killed_after_send(act: Act) -> AgentCaseOutcome:
    act.payments.arm("after_commit", "kill")  # whichever worker process lands the refund dies
    doomed = await _story_worker(act, "--script", "naive").start()
    handle = await act.start(act.client, gated=False, start_to_close_s=5.0)
    await asyncio.wait_for(doomed.wait(), 60)
    act.kills += int(doomed.killed)
    say("  the refund landed and the worker was SIGKILLed before Temporal heard of it")
    fresh = await _story_worker(act, "--script", "naive").start()
    try:
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]
    finally:
        await fresh.stop()


async def killed_after_send(act: Act) -> AgentCaseOutcome:
    kill = ["--kill-at", "after_send", "--kill-marker", str(act.workdir / "killed")]
    doomed = await _story_worker(act, *kill).start()
    handle = await act.start(act.client)
    await asyncio.wait_for(doomed.wait(), 60)
    act.kills += int(doomed.killed)
    say("  the worker sent the refund and was SIGKILLed before the gate recorded its result")
    fresh = await _story_worker(act).start()
    try:
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]
    finally:
        await fresh.stop()


async def redecided(act: Act) -> AgentCaseOutcome:
    act.payments.arm("after_commit", "reset")  # the refund commits; its answer is lost
    async with act.worker(ScriptedModel(SCRIPTS["redecide"])) as client:
        handle = await act.start(client, wait_for_review=False)
        done: AgentCaseOutcome = await asyncio.wait_for(handle.result(), 60)
        eid = act.effect_id()
        if eid is not None:  # the review stays for a person; the demo's story ends here
            await client.get_workflow_handle(review_id("ambiguous", eid)).terminate("demo over")
    return done


async def over_limit(act: Act) -> AgentCaseOutcome:
    async with act.worker(ScriptedModel(SCRIPTS["greedy"]), policy=OVER_LIMIT) as client:
        handle = await act.start(client)
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]


async def resolved_by_a_person(act: Act) -> AgentCaseOutcome:
    act.payments.arm("after_commit", "reset")
    async with act.worker(ScriptedModel(SCRIPTS["refund"])) as client:
        handle = await act.start(client)
        eid = await review_opened(act, client)
        resolution = {"decision": "happened", "operator": "carol", "note": "seen in the ledger"}
        say("  the refund is AMBIGUOUS; the agent's tool waits for a person, who runs:")
        say(
            f"    temporal workflow signal --workflow-id {review_id('ambiguous', eid)} "
            f"--name resolve --input '{json.dumps(resolution)}'"
        )
        await client.get_workflow_handle(review_id("ambiguous", eid)).signal("resolve", resolution)
        return await asyncio.wait_for(handle.result(), 60)  # type: ignore[no-any-return]


async def review_opened(act: Act, client: Client, timeout: float = 60) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        eid = act.effect_id()
        if eid is not None:
            review = client.get_workflow_handle(review_id("ambiguous", eid))
            try:
                if (await review.describe()).status == WorkflowExecutionStatus.RUNNING:
                    return eid
            except RPCError:
                pass
        await asyncio.sleep(0.2)
    raise TimeoutError("no review opened for the refund in doubt")


Story = Callable[[Act], Coroutine[Any, Any, AgentCaseOutcome]]
AGENT_ACTS: list[tuple[str, int, str, Story]] = [
    (
        "agent-naive",
        2,
        "naive: the agent's refund tool without the gate, the worker SIGKILLed after the send",
        naive_killed_after_send,
    ),
    (
        "agent-t2",
        2,
        "the agent's refund, the worker SIGKILLed after the send (tier 2)",
        killed_after_send,
    ),
    ("agent-redecide", 3, "the answer lost, the agent re-decides $30 (tier 3)", redecided),
    ("agent-policy", 2, "the agent asks for $50; a policy rule denies it", over_limit),
    ("agent-t3", 3, "the answer lost; a person resolves the review (tier 3)", resolved_by_a_person),
]


class Told(Protocol):
    """What a story's workflow ends with, whichever framework's agent ran it."""

    final_output: str
    tool_outputs: list[str]


async def agent_acts(client: Client, target: str, workdir: Path) -> list[tuple[str, list[str]]]:
    """Every story, each checked as it ends: (story, what it did not show of what it must)."""
    return await tell(AGENT_ACTS, Act, client, target, workdir)


async def tell(
    acts: Sequence[tuple[str, int, str, Callable[[Any], Coroutine[Any, Any, Told]]]],
    make: Callable[[Client, str, Path, str, int], Act],
    client: Client,
    target: str,
    workdir: Path,
) -> list[tuple[str, list[str]]]:
    """Run ``acts`` (name, tier, title, story), each in a world ``make`` builds, and check each
    as it ends: (story, what it did not show of what it must)."""
    checked = []
    # a lost answer is the story: the worker's warning and traceback for it would only be noise
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    for name, tier, title, story in acts:
        say(f"== {title} ==")
        act = make(client, target, workdir, name, tier)
        try:
            done = await story(act)
            found = act.found(done)
        finally:
            act.close()
        for n, told in enumerate(found.told, start=1):
            say(f"  tool call {n} returned to the agent: {told}")
        say(f"  the agent's last word: {done.final_output}")
        money, count = sum(found.refunds), len(found.refunds)
        dollars = f"${money / 100:.0f}"
        say(f"  payments service: {dollars} refunded on order #{ORDER} in {count} refund(s)")
        say(f"  journal: {found.gate or 'no record'}" + (f" via {found.via}" if found.via else ""))
        say()
        checked.append((name, check_agent(name, found)))
    return checked
