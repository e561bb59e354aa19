"""The agent's side of the story: a scripted model, and a worker that runs ``AgentCase`` with the
OpenAI Agents plugin and the gate. No key and no network: the model is a script, and the SDK's
tracing export is off.

``python -m workers.agent_story --target HOST:PORT --journal URL --payments FILE --script NAME``
runs a worker process (it prints ``READY``); the tests start, SIGKILL and restart it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

# read by every trace provider the SDK and the plugin make: nothing is exported
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

from agents import (
    AgentOutputSchemaBase,
    Handoff,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    Tool,
    TResponseInputItem,
    set_tracing_disabled,
)
from temporalio.client import Client
from temporalio.contrib.openai_agents import (
    ModelActivityParameters,
    OpenAIAgentsPlugin,
)
from temporalio.contrib.openai_agents.testing import (
    ResponseBuilders,
    TestModelProvider,
)
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal.policy import Policy
from interlock_temporal.targets.payments import SimulatedPayments
from workflows.agent_case import AgentCase
from workflows.agent_refund import SERVICES, refund, refund_unguarded
from workflows.scripts import SHARED_SCRIPTS, Call, Say, Step

from .story_worker import serve, story_parser, story_parts
from .world import CASE, ORDER

set_tracing_disabled(True)


SCRIPTS: dict[str, tuple[Step, ...]] = {
    **SHARED_SCRIPTS,
    #: the naive baseline's model: the unguarded tool takes the whole request
    "naive": (
        Call(
            "refund_unguarded",
            {
                "r": {
                    "case_id": f"{CASE}-agent-naive",
                    "order_id": ORDER,
                    "amount_cents": 2000,
                    "reason": "overcharged",
                }
            },
        ),
        Say("Your refund is on its way."),
    ),
}


def _tool_outputs(input: str | list[TResponseInputItem]) -> list[str]:
    if isinstance(input, str):
        return []
    outputs = []
    for item in input:
        data = item if isinstance(item, dict) else getattr(item, "__dict__", {})
        if data.get("type") == "function_call_output":
            output = data.get("output")
            outputs.append(output if isinstance(output, str) else json.dumps(output))
    return outputs


@dataclass
class ScriptedModel(Model):
    """A model that answers from a script: at each turn, the step after as many steps as the
    run has tool outputs. The turn is read from the input, not counted here, so a worker that
    restarts mid-run (its history replayed, the model's earlier answers recorded) goes on where
    the run is. ``seen``: the tool outputs each call was given (what the agent was told)."""

    steps: Sequence[Step]
    seen: list[list[str]] = field(default_factory=list)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        **kwargs: Any,
    ) -> ModelResponse:
        outputs = _tool_outputs(input)
        self.seen.append(outputs)
        step = self.steps[min(len(outputs), len(self.steps) - 1)]
        if isinstance(step, Say):
            return ResponseBuilders.output_message(step.text)
        names = [getattr(t, "name", None) for t in tools]
        if step.tool not in names:
            raise ValueError(f"the script calls {step.tool!r}; the agent's tools are {names}")
        call_id = f"call_{len(outputs)}"
        return ResponseBuilders.tool_call(
            json.dumps(step.arguments), step.tool, call_id=call_id, item_id=call_id
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def agent_plugins(
    model: Model,
    journal: str,
    payments: SimulatedPayments,
    *,
    on_point: Callable[[str, str], None] | None = None,
    policy: Policy | str | Path | None = None,
) -> list[Any]:
    """The agents plugin first (its payload converter carries pydantic models), the gate after
    it (it keeps that converter), the refund's target bound by name."""
    return [
        OpenAIAgentsPlugin(
            model_provider=TestModelProvider(model),
            model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=30)),
        ),
        InterlockPlugin(journal, targets={"refund": payments}, on_point=on_point, policy=policy),
    ]


@asynccontextmanager
async def agent_worker(
    target: str,
    task_queue: str,
    model: Model,
    journal: str,
    payments: SimulatedPayments,
    **plugin_options: Any,
) -> AsyncIterator[Client]:
    """A worker for ``AgentCase`` on ``task_queue``, running while inside; yields its client."""
    client = await Client.connect(
        target, plugins=agent_plugins(model, journal, payments, **plugin_options)
    )
    SERVICES[task_queue] = payments
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[AgentCase],
        activities=[refund, refund_unguarded],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    try:
        async with worker:
            yield client
    finally:
        SERVICES.pop(task_queue, None)


async def main(argv: list[str] | None = None) -> None:
    args = story_parser(__doc__, SCRIPTS).parse_args(argv)
    payments, hook = story_parts(args)
    model = ScriptedModel(SCRIPTS[args.script])
    await serve(
        agent_worker(args.target, args.task_queue, model, args.journal, payments, on_point=hook)
    )


if __name__ == "__main__":
    asyncio.run(main())
