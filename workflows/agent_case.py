"""The support case, decided by an agent (OpenAI Agents SDK on Temporal): its refund tool is
the gated ``refund`` activity, made a tool by ``effect_as_tool``.

The case and the order are the workflow's: the model fills in only the amount and the reason,
so whatever it re-decides names the same effect. The model is whatever the worker's
``OpenAIAgentsPlugin`` provides (the demo and the tests script one: no key, no network).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from agents import Agent, ItemHelpers, Runner
    from agents.items import ToolCallOutputItem
    from temporalio.contrib.openai_agents.workflow import activity_as_tool

    from interlock_temporal.agents import effect_as_tool
    from interlock_temporal.workflow import act_as

    from .agent_refund import refund, refund_unguarded

#: who refunds: fixed in workflow code, never taken from the input or the model
PRINCIPAL = "refund-bot"

INSTRUCTIONS = (
    "You are a support agent. Refund what the case warrants with the refund tool; if it "
    "returns an error, say so."
)


class AgentCaseFile(BaseModel):
    case_id: str
    order_id: str
    lease_id: str | None = None
    #: the customer's request, as the agent reads it
    request: str = "I was overcharged $20 on my order, please refund it."
    #: on an effect in doubt: wait for a person (True), or tell the model at once (False)
    wait_for_review: bool = True
    start_to_close_s: float = 10.0
    heartbeat_s: float | None = 2.0
    maximum_attempts: int = 0
    #: False: the refund tool is ``activity_as_tool`` over the same send with no gate (the
    #: naive baseline: the model fills in the whole request, case and order included)
    gated: bool = True


class AgentCaseOutcome(BaseModel):
    case_id: str
    #: the agent's last message
    final_output: str
    #: what each tool call returned to the model, in order
    tool_outputs: list[str]


@workflow.defn
class AgentCase:
    @workflow.run
    async def run(self, case: AgentCaseFile) -> AgentCaseOutcome:
        timeouts: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=case.start_to_close_s),
            "heartbeat_timeout": timedelta(seconds=case.heartbeat_s) if case.heartbeat_s else None,
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=0.5),
                maximum_interval=timedelta(seconds=2),
                maximum_attempts=case.maximum_attempts,
            ),
        }
        refund_tool = (
            effect_as_tool(
                refund,
                context={"case_id": case.case_id, "order_id": case.order_id, "premises": None},
                wait_for_review=case.wait_for_review,
                **timeouts,
            )
            if case.gated
            else activity_as_tool(refund_unguarded, **timeouts)
        )
        agent = Agent(name="support", instructions=INSTRUCTIONS, tools=[refund_tool])
        with act_as(PRINCIPAL, lease=case.lease_id):
            result = await Runner.run(agent, case.request)
        outputs = [
            str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
        ]
        last = ItemHelpers.text_message_outputs(result.new_items) or str(result.final_output)
        return AgentCaseOutcome(case_id=case.case_id, final_output=last, tool_outputs=outputs)
