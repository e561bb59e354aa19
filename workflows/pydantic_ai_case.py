"""The support case, decided by an agent built with Pydantic AI on Temporal: its refund tool is
the gated ``refund`` activity, in a ``GatedToolset`` built for the run.

The case and the order are the workflow's: the model fills in only the amount and the reason, so
whatever it re-decides names the same effect. The model requests are activities (Pydantic AI's
``TemporalDurability``, the successor of its ``TemporalAgent``); the model is a script
(``SCRIPTS``, a ``FunctionModel`` each, registered with the agent by name and picked by the case
file): no key, no network. A real deployment registers its own model instead.

``NAIVE`` is the same story without the gate: a plain tool that sends the refund itself, which
the durable agent runs as its toolset's activity (the demo's naive baseline: after a crash,
Temporal runs the activity again).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import TemporalDurability
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.tools import DeferredToolRequests
    from temporalio.workflow import ActivityConfig

    from interlock_temporal.pydantic_ai import GatedToolset, run_gated
    from interlock_temporal.targets.payments import RefundResult
    from interlock_temporal.workflow import act_as

    from .agent_refund import SERVICES, refund
    from .scripts import SHARED_SCRIPTS, Call, Say, Step

#: who refunds: fixed in workflow code, never taken from the input or the model
PRINCIPAL = "refund-bot"
INSTRUCTIONS = (
    "You are a support agent. Refund what the case warrants with the refund tool; if it "
    "returns an error, say so."
)
#: the order the naive story's model names (it fills in the whole request itself)
NAIVE_ORDER = "881"


SCRIPTS: dict[str, tuple[Step, ...]] = {
    **SHARED_SCRIPTS,
    "naive": (
        Call(
            "refund_unguarded",
            {"order_id": NAIVE_ORDER, "amount_cents": 2000, "reason": "overcharged"},
        ),
        Say("Your refund is on its way."),
    ),
}


def tool_returns(messages: Sequence[ModelMessage]) -> list[ToolReturnPart]:
    """The tool returns the model has been given, in order."""
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def scripted(steps: Sequence[Step]) -> FunctionModel:
    """A model that answers from a script: at each turn, the step after as many steps as the run
    has tool returns. The turn is read from the messages, not counted here, so a worker that
    restarts mid-run goes on where the run is. The call id is ``call_<turn>``."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = len(tool_returns(messages))
        step = steps[min(turn, len(steps) - 1)]
        if isinstance(step, Say):
            return ModelResponse(parts=[TextPart(step.text)])
        names = [t.name for t in info.function_tools]
        if step.tool not in names:
            raise ValueError(f"the script calls {step.tool!r}; the agent's tools are {names}")
        return ModelResponse(
            parts=[ToolCallPart(step.tool, dict(step.arguments), tool_call_id=f"call_{turn}")]
        )

    return FunctionModel(answer, model_name="scripted")


MODELS = {name: scripted(steps) for name, steps in SCRIPTS.items()}
MODEL_ACTIVITY = ActivityConfig(start_to_close_timeout=timedelta(seconds=30))

#: the agent: its model requests are activities (``TemporalDurability``, Pydantic AI's durable
#: agent on Temporal); its tools come with the run (``GatedToolset``)
AGENT: Agent[None, str | DeferredToolRequests] = Agent(
    MODELS["refund"],
    name="support",
    instructions=INSTRUCTIONS,
    output_type=[str, DeferredToolRequests],
    capabilities=[TemporalDurability(models=MODELS, model_activity_config=MODEL_ACTIVITY)],
)


async def refund_unguarded(order_id: str, amount_cents: int, reason: str) -> RefundResult:
    """Refund part of the customer's order: order_id, amount_cents (cents) and a short reason."""
    return await SERVICES[activity.info().task_queue].refund(order_id, amount_cents)


#: the naive agent: the same send as a plain tool, run in the toolset's activity, no gate
NAIVE: Agent[None, str] = Agent(
    MODELS["naive"],
    name="support_naive",
    instructions=INSTRUCTIONS,
    tools=[refund_unguarded],
    capabilities=[
        TemporalDurability(
            models={"naive": MODELS["naive"]},
            model_activity_config=MODEL_ACTIVITY,
            # the toolset's activity: a dead worker's attempt times out in seconds, not a minute
            activity_config=ActivityConfig(start_to_close_timeout=timedelta(seconds=5)),
        )
    ],
)


class PydanticAICaseFile(BaseModel):
    case_id: str
    order_id: str
    lease_id: str | None = None
    #: the customer's request, as the agent reads it
    request: str = "I was overcharged $20 on my order, please refund it."
    #: which of ``SCRIPTS`` the model plays
    script: str = "refund"
    start_to_close_s: float = 10.0
    heartbeat_s: float | None = 2.0
    maximum_attempts: int = 0
    #: False: the naive agent (``NAIVE``), its refund tool without the gate
    gated: bool = True


class PydanticAICaseOutcome(BaseModel):
    case_id: str
    #: the agent's last message
    final_output: str
    #: what each tool call returned to the model, in order
    tool_outputs: list[str]
    #: how each call ended for the model ("success", "failed", ...), in the same order
    tool_outcomes: list[str]


@workflow.defn
class PydanticAICase:
    #: the agents whose activities ``PydanticAIPlugin`` registers on the worker
    __pydantic_ai_agents__ = (AGENT, NAIVE)

    @workflow.run
    async def run(self, case: PydanticAICaseFile) -> PydanticAICaseOutcome:
        timeouts: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=case.start_to_close_s),
            "heartbeat_timeout": timedelta(seconds=case.heartbeat_s) if case.heartbeat_s else None,
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=0.5),
                maximum_interval=timedelta(seconds=2),
                maximum_attempts=case.maximum_attempts,
            ),
        }
        if not case.gated:
            result = await NAIVE.run(case.request, model=case.script)
            return outcome(case, result.all_messages(), str(result.output))
        refunds = GatedToolset("refunds")
        refunds.add(
            refund,
            context={"case_id": case.case_id, "order_id": case.order_id, "premises": None},
            **timeouts,
        )
        with act_as(PRINCIPAL, lease=case.lease_id):
            result = await run_gated(AGENT, case.request, toolsets=[refunds], model=case.script)
        return outcome(case, result.all_messages(), str(result.output))


def outcome(
    case: PydanticAICaseFile, messages: Sequence[ModelMessage], final: str
) -> PydanticAICaseOutcome:
    returns = tool_returns(messages)
    return PydanticAICaseOutcome(
        case_id=case.case_id,
        final_output=final,
        tool_outputs=[part.model_response_str(wrap_if_error=False) for part in returns],
        tool_outcomes=[part.outcome for part in returns],
    )
