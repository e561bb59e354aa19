"""Gated tools for agents built with the OpenAI Agents SDK on Temporal
(``temporalio.contrib.openai_agents``).

``effect_as_tool(refund, context={...})`` turns a gated activity into an agents ``FunctionTool``.
The model fills in the activity's input except the fields the workflow decides (``context``: the
case, the order); the model never sees those fields and cannot set them, so the gated ``key=``,
which reads only them, names the same effect however the model re-decides. A call runs the
activity as ``execute_effect`` does (under the workflow's ``act_as``; on ``AmbiguousEffect`` or
``ApprovalRequired`` it waits for the person's review, then runs again or returns), and a
refusal (the gate's ``EffectRefused``, a conflicting payload, a policy's ``InterlockDenied``, an
effect a person must still decide) comes back to the model as the tool's error text: the
workflow goes on. Anything else (a worker without the gate, a rejected authority, a corrupt
journal) fails the run, as it fails any workflow.

Build the tool in workflow code (``Runner.run`` under ``act_as``), on a worker whose client
has ``OpenAIAgentsPlugin`` first and ``InterlockPlugin`` after it (the agents plugin's payload
converter carries pydantic models; the gate keeps it).

The tool is a thin adapter over the one core path every framework uses
(``interlock_temporal._tools.calls.register``): the SDK's arguments and its call id
(``ToolContext.tool_call_id``) in, the reply's text out. Each call is one ``execute_tool`` span
carrying that call id, when the user opts in (``OTEL_SEMCONV_STABILITY_OPT_IN``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from ._tools.calls import REFUSALS, refusal_text, register
from .core.extras import needs_extra

with needs_extra("agents", "interlock_temporal.agents"):
    from agents import FunctionTool
    from agents.tool_context import ToolContext

__all__ = ["REFUSALS", "effect_as_tool", "refusal_text"]


def effect_as_tool(
    activity: Any,
    *,
    context: Mapping[str, Any] | BaseModel,
    name: str | None = None,
    description: str | None = None,
    toolset: str | None = None,
    tier: int | None = None,
    wait_for_review: bool = True,
    review_timeout: timedelta | None = None,
    strict_json_schema: bool = True,
    **options: Any,
) -> FunctionTool:
    """An agents tool that runs the gated ``activity`` from the workflow, as ``execute_effect``.

    - ``activity``: a gated activity (``@activity.defn`` + ``@gated(key=...)``) taking one
      pydantic model.
    - ``context``: the input's fields the workflow decides (a mapping, or a model holding only
      those fields): left out of the tool's schema and set on every call over what the model
      sent. The gated ``key=`` must read only these, so the model re-deciding (another amount
      after an error) names the same effect, and the gate refuses the new payload
      (``conflicting_payload``) instead of sending it.
    - ``name`` / ``description``: default the activity's name and its docstring.
    - ``toolset`` / ``tier``: as ``register``'s (the toolset on the spans; a tier the target
      must declare).
    - ``wait_for_review`` / ``review_timeout``: as ``execute_effect``'s.
    - ``options``: ``workflow.execute_activity``'s (``start_to_close_timeout``,
      ``heartbeat_timeout``, ``retry_policy``, ...).

    The call runs under the workflow's ``act_as`` (call ``Runner.run`` inside it). A refusal
    (``REFUSALS``) is returned to the model as the tool's error text; other errors fail the run.
    Refused when built (``TypeError``), as ``register`` refuses.
    """
    tool = register(
        activity,
        context=context,
        toolset=toolset,
        tier=tier,
        name=name,
        description=description,
        wait_for_review=wait_for_review,
        review_timeout=review_timeout,
        **options,
    )

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        # the SDK hands a function tool its ToolContext: the call id the model gave the call
        reply = await tool.call(raw, call_id=ctx.tool_call_id or None)
        return reply.text

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=tool.params_json_schema,
        on_invoke_tool=invoke,
        strict_json_schema=strict_json_schema,
    )
