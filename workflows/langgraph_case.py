"""The support case, decided by a LangGraph agent on Temporal (``temporalio.langgraph``): a
model node the plugin runs as an activity, and a tool node in the workflow whose refund tool is
the gated ``refund`` activity, made a tool by ``effect_as_tool``.

The worker registers the graphs (``graphs()``): ``support``'s model node (the plugin makes it
an activity), and ``naive``, the same model with LangGraph's own ``ToolNode`` run as one
activity over an ungated refund (the naive baseline). The gated tool node is the workflow's,
built for each run from the case (the case and the order are the workflow's; the model fills in
only the amount and the reason, so whatever it re-decides names the same effect).

``LoopCase`` is langgraph #7780's shape: a node that refunds, then asks a person
(``interrupt()``) in a loop; each resume runs the node again from its top.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage, convert_to_messages
    from langchain_core.tools import StructuredTool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import Command, interrupt
    from temporalio.langgraph import graph

    from interlock_temporal.langgraph import GatedToolNode, ainvoke, effect_as_tool
    from interlock_temporal.workflow import act_as

    from .agent_case import INSTRUCTIONS, PRINCIPAL, AgentCaseFile, AgentCaseOutcome
    from .agent_refund import SERVICES, RefundAsked, refund, refund_unguarded

#: the node the plugin runs as an activity: the model's turn
MODEL_NODE = "agent"
TOOLS_NODE = "tools"


def _timeouts(case: AgentCaseFile) -> dict[str, Any]:
    return {
        "start_to_close_timeout": timedelta(seconds=case.start_to_close_s),
        "heartbeat_timeout": timedelta(seconds=case.heartbeat_s) if case.heartbeat_s else None,
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=0.5),
            maximum_interval=timedelta(seconds=2),
            maximum_attempts=case.maximum_attempts,
        ),
    }


#: the chat model each task queue's model node asks (set by the worker that serves it)
MODELS: dict[str, BaseChatModel] = {}


async def agent(state: MessagesState) -> dict[str, Any]:
    """The model's turn (an activity): the messages so far in, its answer (a message, maybe
    tool calls) out."""
    from temporalio import activity

    model = MODELS[activity.info().task_queue]
    return {"messages": [await model.ainvoke(state["messages"])]}


def _refund_unguarded(r: RefundAsked) -> str:
    from temporalio import activity

    landed = SERVICES[activity.info().task_queue].refund_sync(r.order_id, r.amount_cents)
    return landed.model_dump_json()


#: the naive baseline's tool: the whole request is the model's, and nothing gates the send
REFUND_UNGUARDED = StructuredTool.from_function(
    func=_refund_unguarded,
    name="refund_unguarded",
    description="Refund part of the customer's order: the case, the order, amount_cents.",
)


async def naive_tools(state: MessagesState) -> Any:
    """The naive baseline's tool node, run as one activity: LangGraph's ``ToolNode`` over the
    ungated refund. (The plugin hands an activity its state as plain data; the node makes
    messages of it again, which ``ToolNode`` needs.)"""
    messages = convert_to_messages(state["messages"])
    return await ToolNode([REFUND_UNGUARDED]).ainvoke({"messages": messages})


def graphs(**options: Any) -> dict[str, StateGraph[Any, Any, Any, Any]]:
    """The graphs a worker registers with ``LangGraphPlugin``: ``support``'s model node, and
    the naive graph (model and ``ToolNode``, each an activity). ``options``: the activities'."""
    activity = {"execute_in": "activity", **options}
    support: StateGraph[Any, Any, Any, Any] = StateGraph(MessagesState)
    support.add_node(MODEL_NODE, agent, metadata=dict(activity))
    support.add_edge(START, MODEL_NODE)
    naive: StateGraph[Any, Any, Any, Any] = StateGraph(MessagesState)
    naive.add_node(MODEL_NODE, agent, metadata=dict(activity))
    naive.add_node(TOOLS_NODE, naive_tools, metadata=dict(activity))
    _agent_loop(naive)
    return {"support": support, "naive": naive}


async def route(state: MessagesState) -> str:
    """After the model: its tool calls, or the end. Async: in the workflow, LangGraph would run
    a plain function (``tools_condition``) on an executor, which a workflow has not."""
    return str(tools_condition(dict(state)))


def _agent_loop(builder: StateGraph[Any, Any, Any, Any]) -> None:
    builder.add_edge(START, MODEL_NODE)
    builder.add_conditional_edges(MODEL_NODE, route, {TOOLS_NODE: TOOLS_NODE, END: END})
    builder.add_edge(TOOLS_NODE, MODEL_NODE)


def support_agent(tools: Sequence[Any]) -> Any:
    """The agent for this run: the registered model node (an activity), and a tool node in the
    workflow holding this run's gated tools; compiled with the in-memory checkpointer the
    plugin asks for (interrupts need one)."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(MessagesState)
    builder.add_node(MODEL_NODE, graph("support").nodes[MODEL_NODE].runnable)
    builder.add_node(TOOLS_NODE, GatedToolNode(tools))
    _agent_loop(builder)
    return builder.compile(checkpointer=InMemorySaver())


class LangGraphOutcome(AgentCaseOutcome):
    #: each tool message's status, in order ("success" or "error")
    statuses: list[str] = []
    #: the reviews the graph paused on (``interrupt()``), by review workflow id
    interrupts: list[str] = []


def _outcome(
    case: AgentCaseFile, result: dict[str, Any], interrupts: list[str]
) -> LangGraphOutcome:
    messages = result["messages"]
    told = [m for m in messages if isinstance(m, ToolMessage)]
    last = next((str(m.content) for m in reversed(messages) if isinstance(m, AIMessage)), "")
    return LangGraphOutcome(
        case_id=case.case_id,
        final_output=last,
        tool_outputs=[str(m.content) for m in told],
        statuses=[m.status for m in told],
        interrupts=interrupts,
    )


class LangGraphCaseFile(AgentCaseFile):
    #: a second order of the case the agent may refund (``refund_other``): two gated tools in
    #: one tool node, each call its own effect
    other_order_id: str | None = None
    #: how long the graph waits on a review before the model is told the refusal
    review_timeout_s: float | None = None


@workflow.defn
class LangGraphCase:
    def __init__(self) -> None:
        #: the reviews the graph paused on, by review workflow id (query ``paused``)
        self.paused: list[str] = []

    @workflow.query
    def paused_on(self) -> list[str]:
        return list(self.paused)

    @workflow.run
    async def run(self, case: LangGraphCaseFile) -> LangGraphOutcome:
        request = {"messages": [("system", INSTRUCTIONS), ("user", case.request)]}
        config: Any = {"configurable": {"thread_id": workflow.info().workflow_id}}
        if not case.gated:
            app = graph("naive").compile(checkpointer=InMemorySaver())
            return _outcome(case, await app.ainvoke(request, config), [])
        review: Literal["interrupt", "tell"] = "interrupt" if case.wait_for_review else "tell"
        orders = {"refund": case.order_id, "refund_other": case.other_order_id}
        tools = [
            effect_as_tool(
                refund,
                name=name,
                context={"case_id": case.case_id, "order_id": order_id, "premises": None},
                review=review,
                **_timeouts(case),
            )
            for name, order_id in orders.items()
            if order_id is not None
        ]
        with act_as(PRINCIPAL, lease=case.lease_id):
            result = await ainvoke(
                support_agent(tools),
                request,
                config,
                on_review=lambda r: self.paused.append(r.review_workflow_id),
                review_timeout=(
                    timedelta(seconds=case.review_timeout_s) if case.review_timeout_s else None
                ),
            )
        return _outcome(case, result, self.paused)


class LoopCaseFile(AgentCaseFile):
    #: how many times the person is asked (each answer resumes the node from its top)
    rounds: int = 3


class LoopOutcome(BaseModel):
    #: what the refund tool answered on each run of the node
    told: list[str]
    #: the person's answers, in order
    answers: list[str]


class LoopState(MessagesState):
    answers: list[str]


@workflow.defn
class LoopCase:
    """langgraph #7780: a node refunds, then asks a person, in a loop. Each answer resumes the
    graph, and LangGraph runs the node again from its top: its refund again, each time. The
    person's answers come by signal (``answer``)."""

    def __init__(self) -> None:
        self.inbox: list[str] = []
        self.told: list[str] = []

    @workflow.signal
    def answer(self, text: str) -> None:
        self.inbox.append(text)

    @workflow.run
    async def run(self, case: LoopCaseFile) -> LoopOutcome:
        tool = effect_as_tool(
            refund,
            context={"case_id": case.case_id, "order_id": case.order_id, "premises": None},
            **_timeouts(case),
        )

        async def refund_and_ask(state: LoopState) -> dict[str, Any]:
            answers: list[str] = []
            while len(answers) < case.rounds:  # #7780: the side effect, then the interrupt
                if case.gated:
                    call = {"type": "tool_call", "id": "refund-1", "name": "refund"}
                    said = await tool.ainvoke({**call, "args": {"amount_cents": 2000}})
                    self.told.append(str(said.content))
                else:  # the naive node: the refund activity, ungated
                    asked = RefundAsked(
                        case_id=case.case_id, order_id=case.order_id, amount_cents=2000, reason=""
                    )
                    landed = await workflow.execute_activity(
                        refund_unguarded, asked, **_timeouts(case)
                    )
                    self.told.append(landed.model_dump_json())
                answers.append(str(interrupt(f"round {len(answers) + 1}: anything else?")))
            return {"answers": answers}

        builder: StateGraph[Any, Any, Any, Any] = StateGraph(LoopState)
        builder.add_node("refund_and_ask", refund_and_ask)
        builder.add_edge(START, "refund_and_ask")
        app = builder.compile(checkpointer=InMemorySaver())
        config: Any = {"configurable": {"thread_id": workflow.info().workflow_id}}
        with act_as(PRINCIPAL, lease=case.lease_id):
            result = await app.ainvoke({"messages": [], "answers": []}, config)
            while result.get("__interrupt__"):
                await workflow.wait_condition(lambda: bool(self.inbox))
                result = await app.ainvoke(Command(resume=self.inbox.pop(0)), config)
        return LoopOutcome(told=self.told, answers=result["answers"])


__all__ = [
    "MODELS",
    "MODEL_NODE",
    "LangGraphCase",
    "LangGraphCaseFile",
    "LangGraphOutcome",
    "LoopCase",
    "LoopCaseFile",
    "LoopOutcome",
    "graphs",
    "support_agent",
]
