"""``make demo DEMO_ARGS=--agent=langgraph``: the support case decided by a LangGraph agent on
Temporal (``temporalio.langgraph.LangGraphPlugin``): the model node an activity, the tool node
in the workflow, its refund tool the gated activity (``interlock_temporal.langgraph``). The
model is a script: no key, no network. The OpenAI story's five stories, each checked against
the money the payments service holds on its order, what the agent was told and what the
journal recorded (``demo_check.AGENT_EXPECTED``):

0. agent-naive: LangGraph's own ``ToolNode`` run as one activity over an ungated refund; the
   worker is SIGKILLed right after the refund landed; Temporal runs the tool node's activity
   again: $40 in two refunds.
1. agent-t2: the worker is SIGKILLed right after the refund was sent; a fresh worker replays
   the graph, the tool node asks for the refund again, and the gate asks the service (tier 2)
   and finds it: $20 once, and the agent is told the refund.
2. agent-redecide: the refund lands and its answer is lost at a tier-3 service; the agent is
   told the outcome is unknown and re-decides $30 for the same case: refused as
   conflicting_payload, nothing more sent.
3. agent-policy: the agent asks for $50; a policy rule denies it and the agent reads the
   tool's error; it asks again for $20, which lands.
4. agent-t3: the answer is lost again; the tool interrupts the graph (``interrupt()``) with
   the review to decide it in; a person resolves it (happened), the graph resumes, and the
   agent goes on to finish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from workflows.agent_case import AgentCaseOutcome
from workflows.langgraph_case import LangGraphCase, LangGraphCaseFile

from . import agent_demo
from .agent_story import ScriptedModel
from .langgraph_story import ScriptedChatModel, langgraph_worker
from .world import ORDER


class GraphAct(agent_demo.Act):
    """A story's world, told by the LangGraph agent."""

    story_module = "workers.langgraph_story"

    async def start(self, client: Client, **changes: Any) -> WorkflowHandle[Any, AgentCaseOutcome]:
        case = LangGraphCaseFile(
            case_id=self.case_id, order_id=ORDER, lease_id=self.lease_id, **changes
        )
        return await client.start_workflow(
            LangGraphCase.run,
            case,
            id=f"langgraph-case-{self.task_queue}",
            task_queue=self.task_queue,
        )

    def worker(self, model: ScriptedModel, **options: Any) -> Any:
        """The in-process worker, its chat model the same script as ``model``'s."""
        chat = ScriptedChatModel(steps=model.steps)
        return langgraph_worker(
            self.target, self.task_queue, chat, self.journal_url, self.payments, **options
        )


async def agent_acts(client: Client, target: str, workdir: Path) -> list[tuple[str, list[str]]]:
    """Every story, told by the LangGraph agent, each checked as it ends."""
    return await agent_demo.tell(agent_demo.AGENT_ACTS, GraphAct, client, target, workdir)
