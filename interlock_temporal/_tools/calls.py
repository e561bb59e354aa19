"""One path from a framework's tool call to a gated call, whatever the framework.

The problem: every agent framework on Temporal (the OpenAI Agents SDK, MCP, LangGraph, Pydantic
AI) turns a model's tool call into work of its own, and none of them answers what happens when
a tool's side effect lands and its answer is lost. Written once per framework, the answer would
drift: one adapter would let the model name the effect, another would fail the run on a
refusal the model should have read.

The mechanism: ``register(activity, context=...)`` checks, once, in workflow code where the tool
is built, that the tool can be gated honestly: the activity is gated, its ``key=`` is declared
(over the fields the workflow decides, named by ``context``, so a model that re-decides an
amount names the same effect and the gate refuses the new payload), the context names fields of
the activity's input, and a declared tier is the target's. It returns a ``GatedTool``, whose
``call(arguments, call_id=...)`` is what every framework adapter runs for each call: validate
the model's arguments (fields named, never values), add the workflow's context, run the
activity as ``execute_effect`` does (under the workflow's ``act_as``; a review waited for in the
workflow, never in an activity), and answer with a ``ToolReply``: the result as text, or a
refusal (``REFUSALS``) as the error text the model reads; any other error fails the run. Each
call is one ``execute_tool`` span (``spans``). An adapter only translates: the framework's
arguments and call id in, the reply out as the framework's tool result.

The effect type is the gate's (``gated(effect_type=...)``, default the activity's name), the
same whichever framework calls it; a toolset or server is named with ``toolset=`` and recorded
on the span. Cost per call: one validation of the arguments and what ``execute_effect`` costs.
No framework is imported here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from temporalio.activity import _Definition  # private: no public API reads an activity's definition
from temporalio.exceptions import ActivityError, ApplicationError

from .._worker.errors import describe_invalid, receipt_from
from .._worker.gated import GateSpec, spec_of
from ..core.targets import capabilities
from ..workflow import WAIT_FOR, execute_effect, review_awaited
from .spans import ToolSpan

__all__ = ["REFUSALS", "GatedTool", "ToolReply", "refusal_text", "register"]

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
#: the state a refusal leaves the call in, on its span (the gate's own span's words)
_STATES = {
    "EffectRefused": "REFUSED",
    "InterlockDenied": "DENIED",
    "AmbiguousEffect": "AMBIGUOUS",
    "ApprovalRequired": "ESCALATED",
}


class ToolReply(BaseModel):
    """What a tool call answers the model: ``text`` (the result, or the refusal it reads),
    whether the call was refused (an adapter sets its framework's error flag from it, e.g.
    MCP's ``isError``), and, for a refusal a person must still decide, the review it waits on
    (an adapter defers the call, or pauses its framework for the person: LangGraph's
    ``interrupt()``)."""

    model_config = ConfigDict(frozen=True)

    text: str
    refused: bool = False
    #: the effect a person must still decide (the call was AMBIGUOUS, or needs an approval, and
    #: did not wait): an adapter may defer the call (``GatedTool.settle`` waits for the review)
    awaiting: str | None = None
    #: the kind of that effect's review (its workflow: ``review_id(awaiting_kind, awaiting)``)
    awaiting_kind: Literal["ambiguous", "approval"] | None = None


def _refusal(error: BaseException) -> tuple[ApplicationError, str | None] | None:
    """The refusal ``error`` is, as the workflow sees it, and its code; None: not a refusal."""
    cause: Any = error.cause if isinstance(error, ActivityError) else error
    if not isinstance(cause, ApplicationError) or cause.type not in REFUSALS:
        return None
    receipt = receipt_from(cause)
    details = list(cause.details)
    first = details[0] if details and isinstance(details[0], dict) else {}
    code = receipt.code if receipt is not None and receipt.code else first.get("code")
    return cause, code if isinstance(code, str) and code else None


def refusal_text(tool: str, error: BaseException) -> str | None:
    """What the model reads when ``error`` refused the call of ``tool``: the tool, what kind of
    refusal, its code and the gate's message (which names arguments, never their values).
    None: not a refusal (the run fails with the error)."""
    refused = _refusal(error)
    if refused is None:
        return None
    cause, code = refused
    kind = cause.type or ""
    why = f" ({code})" if code else ""
    return f"error: {tool} {REFUSALS[kind]}{why}: {cause.message}.{_ADVICE.get(kind, '')}"


def as_output(result: Any) -> str:
    """A tool's result as the text the model reads."""
    if result is None:
        return "done: a person attested that it happened (no result was recorded)"
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    if isinstance(result, str):
        return result
    return json.dumps(result, default=str, sort_keys=True)


def arguments_model(input_model: type[BaseModel], given: set[str]) -> type[BaseModel]:
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


def _gate_of(activity: Any, label: str) -> tuple[GateSpec, type[BaseModel]]:
    spec = spec_of(activity)
    if spec is None:
        raise TypeError(
            f"activity {label!r} is not gated: wrap it with gated(...) to make it a gated "
            "tool (temporalio's activity_as_tool makes tools of activities with no effect)"
        )
    hint = spec.arg_types[0] if len(spec.arg_types) == 1 else None
    if not (isinstance(hint, type) and issubclass(hint, BaseModel)):
        raise TypeError(
            f"gated activity {label!r} must take one pydantic model to be a tool (the model's "
            "fields and the workflow's in one input)"
        )
    return spec, hint


def _context_of(
    context: Mapping[str, Any] | BaseModel, input_model: type[BaseModel], label: str
) -> dict[str, Any]:
    given = context.model_dump() if isinstance(context, BaseModel) else dict(context)
    unknown = sorted(set(given) - set(input_model.model_fields))
    if unknown:
        raise TypeError(
            f"context names {', '.join(map(repr, unknown))}, not a field of "
            f"{input_model.__name__} (the input of {label!r})"
        )
    if not given:
        raise TypeError(
            f"context of {label!r} must name the fields the workflow decides (what key= reads): "
            "without them the model's arguments would name the effect"
        )
    fields: dict[str, Any] = {n: (input_model.model_fields[n].annotation, ...) for n in given}
    try:  # each value as its field declares it, so a bad one is refused here, not per call
        create_model(f"{input_model.__name__}Context", **fields).model_validate(given)
    except ValidationError as err:
        raise TypeError(
            f"context of {label!r} does not fit {input_model.__name__}: "
            f"{describe_invalid(err, 'context')}"
        ) from None
    return given


def _key_line(given: Mapping[str, Any]) -> str:
    """The ``@gated`` line to write: a key over the context's fields."""
    parts = ", ".join(f'"{name}": r.{name}' for name in given if name.isidentifier())
    return f"@gated(target=..., key=lambda r: {{{parts}}})"


def _tier_of(spec: GateSpec, tier: int | None, label: str) -> int | None:
    """The declared tier, checked against the target's where the activity declares its target
    (a target the worker binds is checked by the worker, not here)."""
    if tier is not None and (isinstance(tier, bool) or tier not in (0, 1, 2, 3)):
        raise TypeError(f"tool {label!r}: tier must be 0, 1, 2 or 3")
    if spec.target is None:
        return tier
    declared = getattr(spec.target, "tier", None)
    target_tier = declared if isinstance(declared, int) else capabilities(spec.target).tier
    if tier is not None and tier != target_tier:
        raise TypeError(
            f"tool {label!r} declares tier={tier}, but its activity's target "
            f"{getattr(spec.target, 'name', '?')!r} declares tier {target_tier}: a tool "
            "cannot promise more (or less) than its target can do"
        )
    return target_tier


@dataclass(frozen=True)
class GatedTool:
    """A gated activity as a tool of any framework (made by ``register``): what a framework
    shows the model (``name``, ``description``, ``params_json_schema``), the effect it names
    (``effect_type``, the ``tier``), and ``call``, which runs one call."""

    activity: Any
    name: str
    description: str
    effect_type: str
    tier: int | None
    toolset: str | None
    input_model: type[BaseModel]
    #: the input's fields the model fills in (extra fields forbidden)
    arguments: type[BaseModel]
    #: the input's fields the workflow decides, set on every call over the model's
    context: Mapping[str, Any]
    wait_for_review: bool = True
    review_timeout: timedelta | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: the spans of calls held open while they wait on a review (``hold=True``), by call id
    _held: dict[str, ToolSpan] = field(default_factory=dict, compare=False, repr=False)

    @property
    def params_json_schema(self) -> dict[str, Any]:
        """The arguments' JSON schema, as frameworks hand it to the model."""
        return self.arguments.model_json_schema()

    def _input(self, raw_arguments: str | Mapping[str, Any]) -> BaseModel:
        if isinstance(raw_arguments, str):
            decided = self.arguments.model_validate_json(raw_arguments or "{}")
        else:
            decided = self.arguments.model_validate(dict(raw_arguments))
        try:
            return self.input_model.model_validate({**decided.model_dump(), **self.context})
        except ValidationError as err:  # the workflow's context, not the model's arguments
            raise TypeError(
                f"tool {self.name!r}: the context does not fit {self.input_model.__name__}: "
                f"{describe_invalid(err, 'context')}"
            ) from None

    async def call(
        self,
        raw_arguments: str | Mapping[str, Any],
        *,
        call_id: str | None = None,
        hold: bool = False,
    ) -> ToolReply:
        """Run one call of the tool from workflow code: ``raw_arguments`` as the model sent
        them (JSON text or a mapping), ``call_id`` the framework's id of the call (None where
        the framework has none). Invalid arguments and refusals come back as a refused reply
        the model reads; any other error fails the run.

        ``hold``: a framework that pauses for the person and runs the call again when resumed
        (LangGraph's ``interrupt()``) asks the span of a call refused while it waits on a review
        to stay open; the next call with the same ``call_id`` goes on in it, so the call is one
        span however many times it was asked."""
        held = self._held.pop(call_id, None) if call_id else None
        span = held or ToolSpan.begin(
            self.name, call_id=call_id, tier=self.tier, toolset=self.toolset
        )
        return await self._run(
            raw_arguments,
            span,
            wait_for_review=self.wait_for_review,
            hold=call_id if hold else None,
        )

    async def settle(self, raw_arguments: str | Mapping[str, Any]) -> ToolReply:
        """The outcome of a call a person had to decide (its reply's ``awaiting``), from
        workflow code: waits in the workflow for the effect's review, as ``execute_effect``
        does (never in an activity), then answers as ``call`` does. The same arguments name the
        same effect, so the gate answers from the journal: the attested result, a resend after
        ``not_happened``, or the refusal. No span: the call's own span ended when it was
        deferred, naming the state it was left in (one span per call)."""
        span = ToolSpan(self.name, None, self.tier, self.toolset, enabled=False)
        return await self._run(raw_arguments, span, wait_for_review=True)

    async def _run(
        self,
        raw_arguments: str | Mapping[str, Any],
        span: ToolSpan,
        *,
        wait_for_review: bool,
        hold: str | None = None,
    ) -> ToolReply:
        with span.current():
            try:
                arg = self._input(raw_arguments)
            except ValidationError as err:
                span.end("INVALID", code="invalid_arguments", refused=True, error="ValidationError")
                return ToolReply(
                    text=f"error: {self.name} got invalid arguments: "
                    f"{describe_invalid(err, self.name)}",
                    refused=True,
                )
            try:
                result = await execute_effect(
                    self.activity,
                    arg,
                    wait_for_review=wait_for_review,
                    review_timeout=self.review_timeout,
                    **self.options,
                )
            except BaseException as err:
                return self._refused(span, err, hold)
            span.end("DONE")
            return ToolReply(text=as_output(result))

    def _refused(self, span: ToolSpan, err: BaseException, hold: str | None) -> ToolReply:
        """The reply to a call that raised ``err``: a refusal, or (raised again) a failure.
        ``hold``: the call id whose span stays open if the refusal waits on a review."""
        receipt = receipt_from(err)
        effect_id = receipt.effect_id if receipt is not None else None
        refused = _refusal(err)
        if refused is None:
            cause = err.cause if isinstance(err, ActivityError) else err
            kind = cause.type if isinstance(cause, ApplicationError) else None
            span.end("FAILED", effect_id=effect_id, error=kind or type(cause).__name__)
            raise err
        cause, code = refused
        kind = cause.type or ""
        awaiting = review_awaited(cause, receipt) if kind in WAIT_FOR else None
        if hold is not None and awaiting is not None:
            self._held[hold] = span  # ended by the call that goes on after the review
        else:
            span.end(_STATES[kind], effect_id=effect_id, code=code, refused=True, error=kind)
        text = refusal_text(self.name, err)
        awaiting_kind: Literal["ambiguous", "approval"] | None = None
        if awaiting is not None:
            awaiting_kind = "ambiguous" if kind == "AmbiguousEffect" else "approval"
        return ToolReply(
            text=text or kind, refused=True, awaiting=awaiting, awaiting_kind=awaiting_kind
        )


def register(
    activity: Any,
    *,
    context: Mapping[str, Any] | BaseModel,
    toolset: str | None = None,
    tier: int | None = None,
    name: str | None = None,
    description: str | None = None,
    wait_for_review: bool = True,
    review_timeout: timedelta | None = None,
    **options: Any,
) -> GatedTool:
    """The gated ``activity`` as a tool any framework adapter calls (``GatedTool.call``).

    - ``activity``: a gated activity (``@activity.defn`` + ``@gated(key=...)``) taking one
      pydantic model.
    - ``context``: the input's fields the workflow decides (a mapping, or a model holding only
      those fields): left out of the tool's arguments and set on every call over what the model
      sent. The gated ``key=`` must read only these, so the model re-deciding (another amount
      after an error) names the same effect, and the gate refuses the new payload
      (``conflicting_payload``) instead of sending it.
    - ``toolset``: the toolset or server the tool belongs to, recorded on its spans.
    - ``tier``: the tier the tool promises; refused when the activity's target declares another.
    - ``name`` / ``description``: default the activity's name and its docstring.
    - ``wait_for_review`` / ``review_timeout``: as ``execute_effect``'s.
    - ``options``: ``workflow.execute_activity``'s (``start_to_close_timeout``, ...).

    Refused here, with a ``TypeError`` that says what to write: an activity that is not gated,
    a gated activity without ``key=`` (its effect would be named by the model's arguments too),
    a context that is empty or names fields the input does not have, a tier that contradicts
    the target's.
    """
    defined = _Definition.from_callable(activity)
    label = defined.name if defined is not None and defined.name else repr(activity)
    spec, input_model = _gate_of(activity, label)
    given = _context_of(context, input_model, label)
    if spec.key is None:
        raise TypeError(
            f"gated activity {label!r} declares no key=: its effect would be named by the "
            "whole input, the model's arguments included, so a re-decided call would be a new "
            f"effect; declare key= over the fields the workflow decides: {_key_line(given)}"
        )
    doc = description or spec.fn.__doc__ or ""
    return GatedTool(
        activity=activity,
        name=name or label,
        description=" ".join(doc.split()),
        effect_type=spec.effect_type or label,
        tier=_tier_of(spec, tier, name or label),
        toolset=toolset,
        input_model=input_model,
        arguments=arguments_model(input_model, set(given)),
        context=given,
        wait_for_review=wait_for_review,
        review_timeout=review_timeout,
        options=dict(options),
    )
