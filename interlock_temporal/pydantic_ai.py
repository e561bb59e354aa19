"""Gated tools for Pydantic AI agents on Temporal (``pydantic_ai.durable_exec.temporal``).

The problem: Pydantic AI's ``TemporalAgent`` runs each toolset's calls as an activity, which
Temporal retries after a crash; a refund whose answer was lost is sent again. And the framework's
own ways to say no spend something: ``ModelRetry`` spends the tool's retries (the run fails when
they are gone), a person's approval inside an activity holds a worker slot for hours.

The mechanism: ``GatedToolset`` is a toolset of gated activities, built in workflow code for the
run (``agent.run(..., toolsets=[toolset])``, where the workflow's fields are known) and run by the
agent in the workflow: each call goes through the one core path every framework uses
(``interlock_temporal._tools.calls``): the model's arguments with the workflow's ``context``
added, the gated activity run as ``execute_effect`` runs it, under the workflow's ``act_as``, one
``execute_tool`` span per call. The effect type is the gate's, per tool; the key is the
activity's ``key=``, which reads only the workflow's fields, so a re-decided amount names the
same effect and is refused as ``conflicting_payload``. What the model reads:

- a result: the tool's return;
- a refusal or a policy's denial: ``ToolFailed``, a failed tool return the model reads, which
  spends none of the tool's retries;
- an effect a person must decide (AMBIGUOUS, or an approval): ``CallDeferred``. The run ends
  with ``DeferredToolRequests``; ``run_gated`` (or ``GatedToolset.settle``) waits in the
  workflow for the ``EffectReview``, runs the call again (the gate answers from the journal:
  the attested result, a resend after ``not_happened``, or the refusal) and continues the run
  with ``DeferredToolResults``. No activity ever waits for a person.

The toolset is a leaf of its own, not a ``FunctionToolset``, so ``TemporalAgent`` does not wrap
it in an activity of its own: the gated activity is the call's activity. Cost per call: one
validation of the arguments and what ``execute_effect`` costs; a deferred call costs one more
run of the agent after the review.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from ._tools.calls import REFUSALS, GatedTool, ToolReply, refusal_text, register
from .core.extras import needs_extra

with needs_extra("pydantic-ai", "interlock_temporal.pydantic_ai"):
    from pydantic_ai import RunContext
    from pydantic_ai.agent import AbstractAgent, AgentRunResult
    from pydantic_ai.exceptions import CallDeferred, ToolFailed
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, core_schema

__all__ = ["DEFERRED", "REFUSALS", "GatedToolset", "refusal_text", "run_gated"]

#: the key of a deferred call's metadata that names the effect a person decides
DEFERRED = "interlock"
#: the model's arguments reach the core path as sent: it validates them against the activity's
#: input and answers a bad one as the tool's error (naming the field), not as a retry
_AS_SENT = SchemaValidator(core_schema.dict_schema())


class GatedToolset(AbstractToolset[Any]):
    """Gated activities as the tools of a Pydantic AI agent, run in the workflow.

    Build it in workflow code, ``add`` each gated activity with the fields the workflow decides
    (``context``), and pass it to the run: ``await run_gated(agent, prompt,
    toolsets=[toolset])``. The agent's ``output_type`` must admit ``DeferredToolRequests`` (an
    effect a person decides defers the call).

    - ``id``: the toolset's id (Pydantic AI's; recorded on the spans as the toolset).
    - ``max_retries``: how often Pydantic AI may ask the model again for arguments it cannot
      parse as JSON; nothing the gate decides spends them (a refusal is the tool's error).
    """

    def __init__(self, id: str, *, max_retries: int = 1) -> None:
        if not id:
            raise ValueError("GatedToolset: id must be a non-empty string")
        if max_retries < 0:
            raise ValueError("GatedToolset: max_retries must be 0 or more")
        self._toolset_id = id
        self.max_retries = max_retries
        self.tools: dict[str, GatedTool] = {}

    @property
    def id(self) -> str:
        return self._toolset_id

    def add(
        self,
        activity: Any,
        *,
        context: Mapping[str, Any] | BaseModel,
        name: str | None = None,
        description: str | None = None,
        tier: int | None = None,
        review_timeout: timedelta | None = None,
        **options: Any,
    ) -> GatedTool:
        """Add the gated ``activity`` as a tool; what the model sees is its input without the
        ``context`` fields. Arguments as ``register``'s (``options``:
        ``workflow.execute_activity``'s), refused as it refuses (``TypeError``): an activity not
        gated, no ``key=``, a context that is empty or names fields the input lacks, a tier the
        target contradicts. A name already in the toolset is refused (``ValueError``)."""
        tool = register(
            activity,
            context=context,
            toolset=self.id,
            tier=tier,
            name=name,
            description=description,
            wait_for_review=False,  # a person's decision defers the call (settle waits for it)
            review_timeout=review_timeout,
            **options,
        )
        if tool.name in self.tools:
            raise ValueError(f"GatedToolset {self.id!r}: a tool named {tool.name!r} is there")
        self.tools[tool.name] = tool
        return tool

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=name,
                    description=tool.description,
                    parameters_json_schema=tool.params_json_schema,
                ),
                max_retries=self.max_retries,
                args_validator=_AS_SENT,
            )
            for name, tool in self.tools.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> str:
        """One call, from workflow code: the result's text; ``ToolFailed`` for a refusal;
        ``CallDeferred`` for an effect a person decides (its metadata names the effect)."""
        reply = await self.tools[name].call(tool_args, call_id=ctx.tool_call_id or None)
        if reply.awaiting is not None:
            raise CallDeferred(
                metadata={DEFERRED: {"effect_id": reply.awaiting, "told": reply.text}}
            )
        return _told(reply)

    def deferred(self, requests: DeferredToolRequests) -> list[ToolCallPart]:
        """This toolset's calls among ``requests``: those it deferred for a person."""
        return [
            call
            for call in requests.calls
            if call.tool_name in self.tools
            and DEFERRED in requests.metadata.get(call.tool_call_id, {})
        ]

    async def settle(self, requests: DeferredToolRequests) -> DeferredToolResults:
        """The results of this toolset's deferred calls in ``requests``: each waits in the
        workflow for its effect's review, then runs again (``GatedTool.settle``): its result,
        or its refusal as ``ToolFailed``. Other toolsets' deferred calls are left out."""
        calls: dict[str, Any] = {}
        for call in self.deferred(requests):
            reply = await self.tools[call.tool_name].settle(call.args_as_dict())
            calls[call.tool_call_id] = ToolFailed(reply.text) if reply.refused else reply.text
        return DeferredToolResults(calls=calls)


def _told(reply: ToolReply) -> str:
    if reply.refused:
        raise ToolFailed(reply.text)
    return reply.text


async def run_gated(
    agent: AbstractAgent[Any, Any],
    prompt: str | None,
    *,
    toolsets: Sequence[GatedToolset],
    **run_options: Any,
) -> AgentRunResult[Any]:
    """Run ``agent`` with the gated ``toolsets`` until no gated call waits for a person.

    From workflow code. A run that ends with ``DeferredToolRequests`` holding only gated calls
    waits for their reviews (``GatedToolset.settle``) and runs again from its messages with
    their results. A run that ends otherwise is returned; so is one that also defers calls of
    other tools (approvals, external calls): the caller answers those, with
    ``GatedToolset.settle``'s results merged in. ``run_options``: ``agent.run``'s (``deps``,
    ``model``, ``message_history``, ...)."""
    history = run_options.pop("message_history", None)
    answers = run_options.pop("deferred_tool_results", None)
    while True:
        result = await agent.run(
            prompt,
            message_history=history,
            deferred_tool_results=answers,
            toolsets=toolsets,
            **run_options,
        )
        requests = result.output
        if not isinstance(requests, DeferredToolRequests):
            return result
        ours = {c.tool_call_id for t in toolsets for c in t.deferred(requests)}
        if not ours or requests.approvals or {c.tool_call_id for c in requests.calls} - ours:
            return result
        answers = DeferredToolResults()
        for toolset in toolsets:
            answers.update(await toolset.settle(requests))
        prompt, history = None, result.all_messages()
