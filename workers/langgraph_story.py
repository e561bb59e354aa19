"""The LangGraph agent's side of the story: a scripted chat model, and a worker that runs
``LangGraphCase`` (and ``LoopCase``) with ``LangGraphPlugin`` and the gate. No key and no
network: the model is a script (the OpenAI story's scripts, ``agent_story.SCRIPTS``).

``python -m workers.langgraph_story --target HOST:PORT --journal URL --payments FILE --script
NAME`` runs a worker process (it prints ``READY``); the tests start, SIGKILL and restart it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from temporalio.client import Client
from temporalio.langgraph import LangGraphPlugin
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal.policy import Policy
from interlock_temporal.targets.payments import SimulatedPayments
from workflows.agent_refund import SERVICES, refund, refund_unguarded
from workflows.langgraph_case import MODELS, LangGraphCase, LoopCase, graphs
from workflows.scripts import Call, Say, Step

from .agent_story import SCRIPTS
from .story_worker import serve, story_parser, story_parts


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model that answers from a script: at each turn, the step after as many
    steps as the conversation has tool messages. The turn is read from the messages, not
    counted here, so a worker that restarts mid-run goes on where the run is. ``seen``: the
    tool messages' texts each turn was given (what the agent was told)."""

    #: a step of several calls is one message with several tool calls
    steps: Sequence[Step | tuple[Call, ...]]
    seen: list[list[str]] = []

    #: the tools' names the model was shown (``bind_tools``); None: not bound, not checked
    bound: list[str] | None = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        """The model shown ``tools`` (OpenAI tool schemas, or tools): a call the script makes
        of a tool it was not shown fails, as a real model would not make it."""
        names = [convert_to_openai_tool(t)["function"]["name"] for t in tools]
        return self.model_copy(update={"bound": names})

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._generate(messages, stop, run_manager, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        outputs = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        self.seen.append(outputs)
        step = self.steps[min(len(outputs), len(self.steps) - 1)]
        if isinstance(step, Say):
            message = AIMessage(content=step.text)
        elif self.bound is not None and not {c.tool for c in _calls(step)} <= set(self.bound):
            raise ValueError(f"the script calls {step}; the model was shown {self.bound}")
        elif isinstance(step, Call):
            call = {"name": step.tool, "args": step.arguments, "id": f"call_{len(outputs)}"}
            message = AIMessage(content="", tool_calls=[call])
        else:
            calls = [
                {"name": c.tool, "args": c.arguments, "id": f"call_{len(outputs)}_{n}"}
                for n, c in enumerate(step)
            ]
            message = AIMessage(content="", tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=message)])


def _calls(step: Call | tuple[Call, ...]) -> tuple[Call, ...]:
    return step if isinstance(step, tuple) else (step,)


def langgraph_plugins(
    model: BaseChatModel,
    journal: str,
    payments: SimulatedPayments,
    *,
    on_point: Callable[[str, str], None] | None = None,
    policy: Policy | str | Path | None = None,
) -> list[Any]:
    """LangGraph's plugin (the model node an activity), then the gate, the refund's target
    bound by name."""
    return [
        LangGraphPlugin(
            graphs=graphs(),
            # the model node's and the naive tool node's: a SIGKILLed worker's attempt is
            # timed out, and run again, after this long
            default_activity_options={"start_to_close_timeout": timedelta(seconds=5)},
        ),
        InterlockPlugin(journal, targets={"refund": payments}, on_point=on_point, policy=policy),
    ]


@asynccontextmanager
async def langgraph_worker(
    target: str,
    task_queue: str,
    model: BaseChatModel,
    journal: str,
    payments: SimulatedPayments,
    *,
    max_cached_workflows: int = 1000,
    **plugin_options: Any,
) -> AsyncIterator[Client]:
    """A worker for the LangGraph cases on ``task_queue``, running while inside; yields its
    client. ``max_cached_workflows=0``: a worker that keeps no run in its cache, so every
    workflow task replays the run's history from its start."""
    client = await Client.connect(
        target, plugins=langgraph_plugins(model, journal, payments, **plugin_options)
    )
    SERVICES[task_queue] = payments
    MODELS[task_queue] = model
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[LangGraphCase, LoopCase],
        activities=[refund, refund_unguarded],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        max_cached_workflows=max_cached_workflows,
    )
    try:
        async with worker:
            yield client
    finally:
        SERVICES.pop(task_queue, None)
        MODELS.pop(task_queue, None)


async def main(argv: list[str] | None = None) -> None:
    args = story_parser(__doc__, SCRIPTS).parse_args(argv)
    payments, hook = story_parts(args)
    model = ScriptedChatModel(steps=SCRIPTS[args.script])
    await serve(
        langgraph_worker(args.target, args.task_queue, model, args.journal, payments, on_point=hook)
    )


if __name__ == "__main__":
    asyncio.run(main())
