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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from temporalio.activity import _Definition  # private: no public API reads an activity's definition
from temporalio.exceptions import ActivityError, ApplicationError

from ._worker.errors import describe_invalid, receipt_from
from ._worker.gated import spec_of
from .core.extras import needs_extra
from .workflow import execute_effect

with needs_extra("agents", "interlock_temporal.agents"):
    from agents import FunctionTool, RunContextWrapper

__all__ = ["REFUSALS", "effect_as_tool", "refusal_text"]

#: the errors a tool call returns to the model as its error text (anything else fails the run):
#: what the gate or the policy decided, and an effect a person must still decide (when the
#: tool does not wait for the review, or the review expired)
REFUSALS: dict[str, str] = {
    "EffectRefused": "refused",
    "InterlockDenied": "denied by policy",
    "AmbiguousEffect": "outcome unknown",
    "ApprovalRequired": "waits for a person's approval",
}
#: what the model is told to do after an error of these types
_ADVICE = {
    "AmbiguousEffect": " A person decides whether it happened; do not ask for it again.",
    "ApprovalRequired": " A person decides; do not ask for it again.",
}


def refusal_text(tool: str, error: BaseException) -> str | None:
    """What the model reads when ``error`` refused the call of ``tool``: the tool, what kind of
    refusal, its code and the gate's message (which names arguments, never their values).
    None: not a refusal (the run fails with the error)."""
    cause: Any = error.cause if isinstance(error, ActivityError) else error
    if not isinstance(cause, ApplicationError) or cause.type not in REFUSALS:
        return None
    receipt = receipt_from(cause)
    details = list(cause.details)
    first = details[0] if details and isinstance(details[0], dict) else {}
    code = receipt.code if receipt is not None and receipt.code else first.get("code")
    why = f" ({code})" if isinstance(code, str) and code else ""
    advice = _ADVICE.get(cause.type, "")
    return f"error: {tool} {REFUSALS[cause.type]}{why}: {cause.message}.{advice}"


def _input_model(activity: Any, label: str) -> type[BaseModel]:
    spec = spec_of(activity)
    if spec is None:
        raise TypeError(
            f"effect_as_tool: activity {label!r} is not gated: wrap it with gated(...) "
            "(temporalio's activity_as_tool makes tools of activities with no effect)"
        )
    if spec.key is None:
        raise TypeError(
            f"effect_as_tool: gated activity {label!r} declares no key=: its effect would be "
            "named by the whole input, the model's arguments included, so a re-decided call "
            "would be a new effect; declare key= over the fields the workflow decides"
        )
    hint = spec.arg_types[0] if len(spec.arg_types) == 1 else None
    if not (isinstance(hint, type) and issubclass(hint, BaseModel)):
        raise TypeError(
            f"effect_as_tool: gated activity {label!r} must take one pydantic model "
            "(the model's fields and the workflow's in one input)"
        )
    return hint


def _arguments_model(input_model: type[BaseModel], given: set[str]) -> type[BaseModel]:
    """The input's fields the model fills in: all but the workflow's; nothing else accepted."""
    fields: dict[str, Any] = {
        name: (info.annotation, info)
        for name, info in input_model.model_fields.items()
        if name not in given
    }
    made: type[BaseModel] = create_model(  # type: ignore[call-overload]
        f"{input_model.__name__}Arguments",
        __config__=ConfigDict(extra="forbid"),
        __doc__=input_model.__doc__,
        **fields,
    )
    return made


def _as_output(result: Any) -> str:
    """A tool's result as the text the model reads."""
    if result is None:
        return "done: a person attested that it happened (no result was recorded)"
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    if isinstance(result, str):
        return result
    return json.dumps(result, default=str, sort_keys=True)


def effect_as_tool(
    activity: Any,
    *,
    context: Mapping[str, Any] | BaseModel,
    name: str | None = None,
    description: str | None = None,
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
    - ``wait_for_review`` / ``review_timeout``: as ``execute_effect``'s.
    - ``options``: ``workflow.execute_activity``'s (``start_to_close_timeout``,
      ``heartbeat_timeout``, ``retry_policy``, ...).

    The call runs under the workflow's ``act_as`` (call ``Runner.run`` inside it). A refusal
    (``REFUSALS``) is returned to the model as the tool's error text; other errors fail the run.
    """
    defined = _Definition.from_callable(activity)
    label = defined.name if defined is not None and defined.name else repr(activity)
    input_model = _input_model(activity, label)
    given = context.model_dump() if isinstance(context, BaseModel) else dict(context)
    unknown = sorted(set(given) - set(input_model.model_fields))
    if unknown:
        raise TypeError(
            f"effect_as_tool: context names {', '.join(map(repr, unknown))}, not a field of "
            f"{input_model.__name__} (the input of {label!r})"
        )
    if not given:
        raise TypeError(
            "effect_as_tool: context must name the fields the workflow decides (what key= reads)"
        )
    arguments = _arguments_model(input_model, set(given))
    tool_name = name or label
    spec = spec_of(activity)
    doc = description or (spec.fn.__doc__ if spec is not None else None) or ""

    async def invoke(ctx: RunContextWrapper[Any], raw: str) -> str:
        try:
            decided = arguments.model_validate_json(raw or "{}")
        except ValidationError as err:
            return f"error: {tool_name} got invalid arguments: {describe_invalid(err, tool_name)}"
        arg = input_model.model_validate({**decided.model_dump(), **given})
        try:
            result = await execute_effect(
                activity,
                arg,
                wait_for_review=wait_for_review,
                review_timeout=review_timeout,
                **options,
            )
        except (ActivityError, ApplicationError) as err:
            text = refusal_text(tool_name, err)
            if text is None:
                raise
            return text
        return _as_output(result)

    return FunctionTool(
        name=tool_name,
        description=" ".join(doc.split()),
        params_json_schema=arguments.model_json_schema(),
        on_invoke_tool=invoke,
        strict_json_schema=strict_json_schema,
    )
