"""Gated tools for LangGraph graphs on Temporal (``temporalio.langgraph.LangGraphPlugin``).

The problem: under ``LangGraphPlugin`` a graph's node runs as an activity or in the workflow,
and a ``ToolNode`` runs every tool call of the model's message in one go. Put in one activity,
several refunds would share one retry: a crash after the first lands sends it again with the
others, and the gate, which gates one effect per activity, could not tell them apart. And
LangGraph's ``interrupt()`` re-runs the whole node on resume (langgraph #7780: an interrupt in
a loop repeats every side effect before it), so whatever the node sent before pausing is sent
again.

The mechanism: the tool node runs in the workflow (``execute_in: "workflow"``) and each call
of a gated tool is its own gated activity, through the core path every framework uses
(``interlock_temporal._tools.calls.register``): the effect type per tool, the key declared per
tool over the fields the workflow decides (``context``), the workflow's ``act_as`` authority,
one ``execute_tool`` span per call. ``effect_as_tool`` makes the gated activity a LangChain
tool; ``GatedToolNode`` is LangGraph's ``ToolNode`` with its synchronous path off, so the plugin
runs its asynchronous one in the workflow (the plugin prefers a node's synchronous function,
which would run the calls on threads, where no workflow code may run). A node that LangGraph
runs again (after an ``interrupt()``, a resume, a worker crash) asks the gate again for the
same effect, and the gate answers from its journal: sent once.

A refusal (the gate's, a conflicting payload, a policy's denial) is a ``ToolMessage`` with
``status="error"`` whose text the model reads. A call a person must decide (``AmbiguousEffect``,
``ApprovalRequired``) calls LangGraph's ``interrupt()`` with a ``ReviewRequest`` (the review
workflow to decide it in): the graph pauses, checkpointed, as LangGraph pauses for any person.
``ainvoke`` runs a compiled graph from the workflow and answers those interrupts itself: it
waits in the workflow for the review's wake-up and resumes the graph with a ``ReviewAnswer``;
the node runs again and the gate answers from the journal (happened: the attested result; not
happened or approved: sent, after the gate's re-checks; rejected: the refusal). A signal only
wakes the workflow: what the tool returns is what the journal records. Interrupts of the
graph's own are returned to the caller untouched.

Cost per call: what ``GatedTool.call`` costs; per review, one more gated activity when the
graph resumes. The graph needs a checkpointer for interrupts (``InMemorySaver``, as the plugin
asks: Temporal's history is what is durable).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from temporalio import workflow

from ._tools.calls import REFUSALS, GatedTool, ToolReply, refusal_text, register
from .core.extras import needs_extra
from .core.review_rules import review_id
from .workflow import woken_by_review

with needs_extra("langgraph", "interlock_temporal.langgraph"):
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, ToolException
    from langgraph.prebuilt import ToolNode
    from langgraph.types import Command, interrupt

__all__ = [
    "REFUSALS",
    "GatedLangGraphTool",
    "GatedToolNode",
    "ReviewAnswer",
    "ReviewRequest",
    "ainvoke",
    "effect_as_tool",
    "refusal_text",
]

#: how a wait for a review ends without a person's decision: the review ``expired``, or
#: ``ainvoke``'s ``review_timeout`` passed (``timed_out``)
GAVE_UP = ("expired", "timed_out")
#: the marker of an interrupt a gated tool raised (``ReviewRequest.interlock``)
REVIEW_INTERRUPT: Literal["effect-review"] = "effect-review"


class ReviewRequest(BaseModel):
    """What a gated tool's ``interrupt()`` carries: the call that waits and the review to decide
    it in (``temporal workflow signal --workflow-id <review_workflow_id> --name resolve``)."""

    model_config = ConfigDict(frozen=True)

    interlock: Literal["effect-review"] = REVIEW_INTERRUPT
    tool: str
    call_id: str | None
    kind: Literal["ambiguous", "approval"]
    effect_id: str
    review_workflow_id: str
    #: what the model would read if nobody decides (the refusal's text)
    text: str


class ReviewAnswer(BaseModel):
    """What the graph is resumed with for a ``ReviewRequest``: how the wait ended. ``state``
    ``resolved`` (a person decided: ``decision``, by ``operators``) or ``closed``: the tool asks
    the gate again; ``expired`` (nobody decided in time) or ``timed_out`` (``review_timeout``):
    the tool asks once more and answers the model with what the journal says (the refusal,
    unless a decision arrived meanwhile). The decision is shown, never trusted: the gate reads
    the outcome from the journal."""

    model_config = ConfigDict(frozen=True)

    state: str
    decision: str | None = None
    operators: list[str] = []


def _request(value: Any) -> ReviewRequest | None:
    if isinstance(value, Mapping) and value.get("interlock") == REVIEW_INTERRUPT:
        return ReviewRequest.model_validate(dict(value))
    return None


class GatedLangGraphTool(BaseTool):
    """A gated activity as a LangChain tool for LangGraph (made by ``effect_as_tool``). Called
    with a tool call (as ``ToolNode`` calls it) it answers a ``ToolMessage``, ``status="error"``
    on a refusal; called with the arguments alone, their text (a refusal raises
    ``ToolException``). It runs in workflow code only."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    gated: GatedTool
    #: on a call a person must decide: pause the graph (``interrupt``), or tell the model now
    review: Literal["interrupt", "tell"] = "interrupt"

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"tool {self.name!r} runs its gated activity from workflow code: await it "
            "(GatedToolNode, added with metadata={'execute_in': 'workflow'})"
        )

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self._run()

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if not workflow.in_workflow():
            raise RuntimeError(
                f"tool {self.name!r} runs in the workflow: add its tool node with "
                "metadata={'execute_in': 'workflow'} (each call is then an activity of its own)"
            )
        call_id: str | None = None
        arguments: Any = input
        if isinstance(input, Mapping) and input.get("type") == "tool_call":
            call_id = input.get("id") or None
            arguments = input.get("args") or {}
        reply = await self._call(arguments, call_id)
        if call_id is None:
            if reply.refused:
                raise ToolException(reply.text)
            return reply.text
        return ToolMessage(
            content=reply.text,
            tool_call_id=call_id,
            name=self.name,
            status="error" if reply.refused else "success",
        )

    async def _call(self, arguments: Any, call_id: str | None) -> ToolReply:
        """One call: while a person must decide, pause the graph; when resumed after a decision,
        ask the gate again (the journal says what happened)."""
        hold = self.review == "interrupt" and call_id is not None
        while True:
            reply = await self.gated.call(arguments, call_id=call_id, hold=hold)
            if reply.awaiting is None or self.review != "interrupt":
                return reply
            kind = reply.awaiting_kind or "ambiguous"
            request = ReviewRequest(
                tool=self.name,
                call_id=call_id,
                kind=kind,
                effect_id=reply.awaiting,
                review_workflow_id=review_id(kind, reply.awaiting),
                text=reply.text,
            )
            answer = ReviewAnswer.model_validate(interrupt(request.model_dump()))
            if answer.state in GAVE_UP:
                # nobody decided in time: asked once more (its span ends), the model reads
                # what the journal says now
                return await self.gated.call(arguments, call_id=call_id)
            # woken (a decision, a closed review): the gate answers from the journal


def effect_as_tool(
    activity: Any,
    *,
    context: Mapping[str, Any] | BaseModel,
    name: str | None = None,
    description: str | None = None,
    toolset: str | None = None,
    tier: int | None = None,
    review: Literal["interrupt", "tell"] = "interrupt",
    **options: Any,
) -> GatedLangGraphTool:
    """A LangChain tool that runs the gated ``activity`` from the workflow, one effect per call.

    - ``activity``: a gated activity (``@activity.defn`` + ``@gated(key=...)``) taking one
      pydantic model.
    - ``context``: the input's fields the workflow decides, left out of the tool's schema and
      set on every call; ``key=`` reads only them, so a re-decided amount names the same
      effect and is refused (``conflicting_payload``).
    - ``name`` / ``description`` / ``toolset`` / ``tier``: as ``register``'s.
    - ``review``: on a call a person must decide, ``"interrupt"`` pauses the graph with a
      ``ReviewRequest`` (``ainvoke`` waits for the review and resumes it); ``"tell"`` returns
      the refusal to the model at once (the review stays open for the person).
    - ``options``: ``workflow.execute_activity``'s (``start_to_close_timeout``, ...).

    Refused when built (``TypeError``), as ``register`` refuses.
    """
    gated = register(
        activity,
        context=context,
        toolset=toolset,
        tier=tier,
        name=name,
        description=description,
        wait_for_review=False,
        **options,
    )
    return GatedLangGraphTool(
        name=gated.name,
        description=gated.description or gated.name,
        args_schema=gated.arguments,
        gated=gated,
        review=review,
    )


class GatedToolNode(ToolNode):
    """LangGraph's ``ToolNode`` as a workflow-side node: its calls run concurrently in the
    workflow, each gated tool's call an activity of its own. Add it with
    ``metadata={"execute_in": "workflow"}``. ``LangGraphPlugin`` runs a node's synchronous
    function when it has one (on threads, for ``ToolNode``); this node has only its
    asynchronous one. Every tool in it runs in workflow code: a tool of yours beside the gated
    ones must be ``async`` and deterministic (or run an activity of its own)."""

    def __init__(self, tools: Sequence[BaseTool | Any], **kwargs: Any) -> None:
        super().__init__(tools, **kwargs)
        self.func = None  # type: ignore[assignment]


async def _answer(request: ReviewRequest, timeout: timedelta | None) -> ReviewAnswer:
    try:
        woken = await woken_by_review(request.effect_id, timeout)
    except TimeoutError:
        return ReviewAnswer(state="timed_out")
    return ReviewAnswer(state=woken.state, decision=woken.decision, operators=woken.operators)


async def ainvoke(
    app: Any,
    input: Any,
    config: RunnableConfig | None = None,
    *,
    review_timeout: timedelta | None = None,
    on_review: Callable[[ReviewRequest], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``app.ainvoke(input, config)`` from workflow code, answering the gated tools' reviews.

    While every pending interrupt is a gated tool's ``ReviewRequest``, wait in the workflow for
    each review's wake-up (at most ``review_timeout`` each) and resume the graph with a
    ``ReviewAnswer`` per interrupt; the tools ask the gate again. An interrupt of the graph's
    own (a person's approval step of yours) ends the call with LangGraph's result, its
    ``__interrupt__`` included, for you to resume (with this function again). ``app`` needs a
    checkpointer and ``config`` a thread id, as any interrupt does. ``on_review`` is called
    with each ``ReviewRequest`` the graph paused on, before the wait (to tell a person, or a UI).
    """
    result = await app.ainvoke(input, config, **kwargs)
    while True:
        pending = result.get("__interrupt__") if isinstance(result, Mapping) else None
        if not pending:
            return result
        requests = {item.id: _request(item.value) for item in pending}
        if any(r is None for r in requests.values()):
            return result  # a person's step of the graph's own: the caller answers it
        answers: dict[str, Any] = {}
        for iid, request in requests.items():
            if request is None:
                continue
            if on_review is not None:
                on_review(request)
            answers[iid] = (await _answer(request, review_timeout)).model_dump()
        result = await app.ainvoke(Command(resume=answers), config, **kwargs)
