"""Gated MCP tools for workflows that use ``temporalio-mcp`` (``temporalio.mcp``).

The problem: ``TemporalMCPClient.call_tool`` runs as one activity per server
(``temporalio.mcp.<server>.call-tool``), retried by Temporal like any other. When a tool's side
effect lands and its answer is lost (a worker crash, a dropped connection), the retry sends it
again: the MCP protocol gives a client no way to tell "never arrived" from "executed, response
lost". And one activity per server cannot carry a gate's declaration, which is per effect: what
names it (the key), what the server can promise about a resend (the tier).

The mechanism: declare the tools that have effects, per server, with ``McpServer``. Each
declared tool becomes a gated activity of its own, ``interlock.mcp.<server>.<tool>`` (effect
type ``mcp:<server>/<tool>``), which the worker registers (``server.activities(connect)``)
beside ``MCPPlugin``. In the workflow, ``GatedMCPClient`` stands where ``TemporalMCPClient``
stood: a declared tool's ``call_tool`` goes through the one path every framework's tool call
takes (docs/agents.md: the effect id from the declared key, the workflow's ``act_as``, the
durable DISPATCHED entry before the send, AMBIGUOUS and a person's review waited for in the
workflow). The activity sends the call with the effect id in the
request's ``_meta`` (``META_EFFECT_ID``), so a server that dedupes on it can. The tools named in
``passthrough`` go to the wrapped ``TemporalMCPClient`` ungated (reads the user vouches for);
any other tool is refused, as an error result, without a call: an undeclared tool is not
assumed harmless.

What the model reads: a ``CallToolResult``, always. The server's answer as the server gave it;
a refusal (the gate's, a policy's denial, a conflicting re-decision, an effect a person must
still decide) as ``isError: true`` with the gate's text, so the model can go on instead of the
run failing or the model's retries being spent.

Trust: the server is another party. Its tool annotations (``readOnlyHint``,
``idempotentHint``, ``destructiveHint``) are hints: ``GatedMCPClient.list_tools`` logs a
warning where one contradicts a declaration (``contradictions``), and none ever relaxes gating
(a declared tool the server calls read-only is gated all the same). Its answers are validated
as ``CallToolResult`` and recorded as given; an answer with ``isError: true`` is the tool's
answer, recorded like any other (the gate never takes the server's word that nothing happened,
so it never resends on it). The tier is the declaration's, never the server's claim: tier 3
unless declared (``dedupe_window``: the server dedupes a call by the ``_meta`` effect id;
``query_tool``: a tool that says whether the effect happened).

The cost: each gated call opens its own connection to the server with the worker-side factory
(``connect``, the one given to ``MCPPlugin``): for streamable HTTP, one initialize round trip;
for stdio, a process start. ``MCPPlugin``'s connection pool is not public API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

from ._tools.calls import GatedTool, register
from ._worker.gated import current_effect, gated
from .core.extras import needs_extra
from .core.models import Found
from .core.targets import BaseTarget, Classification

with needs_extra("mcp", "interlock_temporal.mcp"):
    from mcp import Client
    from mcp.types import (
        CallToolResult,
        ListToolsResult,
        RequestParamsMeta,
        TextContent,
        Tool,
        ToolAnnotations,
    )
    from temporalio.mcp import TemporalMCPClient
    from temporalio.workflow import ActivityConfig

__all__ = [
    "META_EFFECT_ID",
    "GatedMCPClient",
    "McpServer",
    "McpTool",
    "McpToolCall",
    "contradictions",
]

#: the ``_meta`` key a gated call carries its effect id under: a server that dedupes on it
#: (declared ``dedupe_window``) turns a resend of the same effect into its first answer
META_EFFECT_ID = "interlock-temporal/effect-id"
#: a server's and a tool's name: part of an activity name and of every effect id
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

#: what a worker-side factory returns: an MCP client, not yet entered (``MCPPlugin``'s form)
Connect = Callable[[], Client]


class McpTool(BaseModel):
    """What one MCP tool's effect is, declared by the user (never taken from the server).

    - ``key``: the argument names that name the effect (the order, the recipient): a call
      re-decided with another amount has the same key, so the gate refuses its payload
      (``conflicting_payload``) instead of sending it. Required: without it every re-decided
      argument would be a new effect.
    - ``dedupe_window`` (tier 1): the server dedupes a call that carries the same ``_meta``
      effect id (``META_EFFECT_ID``) inside this window, so the gate may resend into it.
    - ``query_tool`` (tier 2, or after a tier-1 window): the server's tool that says whether
      the effect happened. It is called with ``{"effect_id": ...}`` and answers with
      ``structuredContent`` ``{"found": true | false}``; its answer, when found, is recorded as
      the effect's result.
    - neither (tier 3, the default): a call left in doubt by a crash is AMBIGUOUS, for a
      person to decide.
    - ``tier``: optional; when given it must match what the declaration can do.
    - ``settle_time``: how long a call may still run at the server after its sender died
      ("not found" is believed only after it).
    - ``amount`` / ``resource``: the argument names a lease caps (integer cents, a resource).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: tuple[str, ...] = Field(min_length=1)
    dedupe_window: timedelta | None = None
    query_tool: str | None = None
    tier: Literal[1, 2, 3] | None = None
    settle_time: timedelta = timedelta(0)
    amount: str | None = None
    resource: str | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _tier_adds_up(self) -> McpTool:
        can = self.derived_tier
        if self.tier is not None and self.tier != can:
            needs = {
                1: "dedupe_window (the server dedupes on the _meta effect id)",
                2: "query_tool and no dedupe_window",
                3: "neither dedupe_window nor query_tool",
            }[self.tier]
            raise ValueError(f"tier {self.tier} needs {needs}")
        if self.dedupe_window is not None and self.dedupe_window <= timedelta(0):
            raise ValueError("dedupe_window must be positive")
        return self

    @property
    def derived_tier(self) -> int:
        """What the declaration can honestly promise."""
        if self.dedupe_window is not None:
            return 1
        return 2 if self.query_tool else 3


class McpToolCall(BaseModel):
    """A gated MCP tool call's input: the model's ``arguments`` and the workflow's
    ``context`` (arguments the workflow decides, sent over the model's). Its digest is the
    effect's payload digest; the declared key reads the arguments as sent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arguments: dict[str, Any] = Field(default_factory=dict)
    context: dict[str, Any] = Field(default_factory=dict)

    def sent(self) -> dict[str, Any]:
        """The arguments the server receives: the model's, with the workflow's over them."""
        return {**self.arguments, **self.context}


class _NotSent(Exception):
    """The connection to the server failed before the call was sent."""


class _ToolTarget(BaseTarget):
    """One declared tool as the gate's target: its tier is the declaration's."""

    def __init__(self, server: str, tool: str, spec: McpTool, connect: Connect | None) -> None:
        self.name = f"mcp:{server}"
        self.tier = spec.derived_tier
        self.dedupe_window = spec.dedupe_window
        self.settle_time = spec.settle_time
        self._server = server
        self._spec = spec
        self._connect = connect
        if spec.query_tool is not None:
            self.query = self._query

    def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        return {}  # an MCP server's facts are its own: none are captured

    async def _query(self, effect_id: str, args: Any) -> Found | None:
        assert self._spec.query_tool is not None
        async with _Connected(self._server, self._connect) as client:
            answer = await client.call_tool(self._spec.query_tool, {"effect_id": effect_id})
        found = answer.structured_content or {}
        if answer.is_error or found.get("found") is not True:
            return None
        return Found(result=_dump(answer))

    def classify(self, error: BaseException) -> Classification:
        return "not_sent" if isinstance(error, _NotSent) else "in_doubt"


class _Connected:
    """An entered client from ``connect``; a failure before the call is ``_NotSent``."""

    def __init__(self, server: str, connect: Connect | None) -> None:
        self._server = server
        self._connect = connect
        self._client: Client | None = None

    async def __aenter__(self) -> Client:
        if self._connect is None:
            raise ApplicationError(
                f"MCP server {self._server!r} has no connection on this worker: register "
                "server.activities(connect) (the factory given to MCPPlugin)",
                type="McpNotConnected",
                non_retryable=True,
            )
        try:
            self._client = self._connect()
            await self._client.__aenter__()
        except Exception as err:
            raise _NotSent(f"could not connect to MCP server {self._server!r}") from err
        return self._client

    async def __aexit__(self, *exc: Any) -> None:
        assert self._client is not None
        await self._client.__aexit__(*exc)


def _dump(result: CallToolResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _key(names: tuple[str, ...]) -> Callable[[McpToolCall], dict[str, Any]]:
    def key(call: McpToolCall) -> dict[str, Any]:
        sent = call.sent()
        return {name: sent.get(name) for name in names}

    return key


def _argument(name: str | None) -> Callable[[McpToolCall], Any] | None:
    if name is None:
        return None
    return lambda call: call.sent().get(name)


class McpServer:
    """The declared tools of one MCP server (its name is ``MCPPlugin``'s for it).

    Build it once, at module level, where both the worker and the workflow import it::

        PAYMENTS = McpServer("payments", {"refund": McpTool(key=("order_id",))})

    ``activities(connect)`` are the worker's gated activities, one per declared tool; the
    workflow's ``GatedMCPClient(PAYMENTS)`` calls them. Names are letters, digits, ``_`` and
    ``-``: they are part of activity names and effect ids.
    """

    def __init__(self, name: str, tools: Mapping[str, McpTool]) -> None:
        if not _NAME.match(name):
            raise ValueError("McpServer: name must be 1-64 letters, digits, '_' or '-'")
        bad = sorted(t for t in tools if not _NAME.match(t))
        if bad:
            raise ValueError(
                f"McpServer {name!r}: tool names {bad} must be 1-64 letters, digits, '_' or '-'"
            )
        if not tools:
            raise ValueError(f"McpServer {name!r}: declare at least one tool")
        for tool, spec in tools.items():
            if not isinstance(spec, McpTool):
                raise TypeError(
                    f"McpServer {name!r}: tool {tool!r} must be declared with McpTool(key=...)"
                )
            if spec.query_tool is not None and spec.query_tool in tools:
                raise ValueError(
                    f"McpServer {name!r}: query_tool {spec.query_tool!r} of {tool!r} is a "
                    "declared (gated) tool: a query must have no effect"
                )
        self.name = name
        self.tools: dict[str, McpTool] = dict(tools)
        self._declared = {tool: self._activity(tool, None) for tool in self.tools}

    def activity_name(self, tool: str) -> str:
        return f"interlock.mcp.{self.name}.{tool}"

    def effect_type(self, tool: str) -> str:
        return f"mcp:{self.name}/{tool}"

    def declared(self, tool: str) -> Any:
        """The gated activity of ``tool`` as the workflow refers to it (its body never runs
        there: the worker runs the one ``activities`` returned)."""
        return self._declared[tool]

    def activities(self, connect: Connect) -> list[Callable[..., Any]]:
        """The worker's gated activities, one per declared tool, each connecting with
        ``connect`` (``MCPPlugin``'s factory for this server: a new ``mcp.Client``)."""
        if not callable(connect):
            raise TypeError("McpServer.activities: connect must be a factory of mcp.Client")
        return [self._activity(tool, connect) for tool in self.tools]

    def _activity(self, tool: str, connect: Connect | None) -> Callable[..., Any]:
        spec = self.tools[tool]
        target = _ToolTarget(self.name, tool, spec, connect)
        server = self.name

        async def send(call: McpToolCall) -> dict[str, Any]:
            effect = current_effect()
            async with _Connected(server, connect) as client:
                # _meta takes any prefixed key; the SDK's type names only progressToken
                meta = cast(RequestParamsMeta, {META_EFFECT_ID: effect.effect_id})
                answer = await client.call_tool(tool, call.sent(), meta=meta)
            return _dump(CallToolResult.model_validate(answer))

        send.__name__ = send.__qualname__ = f"mcp_{server}_{tool}".replace("-", "_")
        send.__doc__ = spec.description
        body = gated(
            send,
            target=target,
            key=_key(spec.key),
            effect_type=self.effect_type(tool),
            amount=_argument(spec.amount),
            resource=_argument(spec.resource),
        )
        return activity.defn(name=self.activity_name(tool))(body)


def contradictions(tool: str, spec: McpTool, annotations: ToolAnnotations | None) -> list[str]:
    """Where the server's annotations of ``tool`` contradict its declaration: each a sentence
    for a warning. Annotations are hints from an untrusted party: none relaxes gating."""
    if annotations is None:
        return []
    found = []
    if annotations.read_only_hint is True:
        found.append(
            f"MCP tool {tool!r} is declared an effect, and its server says readOnlyHint: it "
            "stays gated"
        )
    if annotations.destructive_hint is False and annotations.read_only_hint is not True:
        found.append(
            f"MCP tool {tool!r} is declared an effect, and its server says it is not "
            "destructive (destructiveHint: false): it stays gated"
        )
    if annotations.idempotent_hint is False and spec.derived_tier == 1:
        found.append(
            f"MCP tool {tool!r} is declared tier 1 (deduped by its _meta effect id), and its "
            "server says it is not idempotent (idempotentHint: false): check the server dedupes"
        )
    if annotations.idempotent_hint is True and spec.derived_tier == 3:
        found.append(
            f"MCP tool {tool!r} is declared tier 3, and its server says idempotentHint: the "
            "gate does not resend on a hint (declare dedupe_window if the server dedupes on "
            "the _meta effect id)"
        )
    return found


def _error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _answer(text: str) -> CallToolResult:
    """A gated call's answer from the text the core path returns: the recorded
    ``CallToolResult`` (validated again: it came from the server), or, where a person attested
    the effect without a result, that text."""
    try:
        return CallToolResult.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return CallToolResult(content=[TextContent(type="text", text=text)])


class GatedMCPClient:
    """``TemporalMCPClient`` with the declared tools of ``server`` gated (workflow code).

    - ``call_tool(name, arguments)``: a declared tool runs its gated activity under the
      workflow's ``act_as``, the workflow's ``context`` set over the model's arguments; a
      refusal is an ``isError`` result. A tool in ``passthrough`` runs through the wrapped
      ``TemporalMCPClient`` (``MCPPlugin``'s activity), ungated. Any other tool is refused as
      an ``isError`` result, nothing called.
    - ``list_tools()``: the server's tools that may be called (declared or passthrough), with
      the workflow's ``context`` arguments taken out of their input schemas; a declared tool
      whose annotations contradict its declaration, or that the server does not offer, is
      logged as a warning.
    - ``wait_for_review`` / ``review_timeout``: as ``execute_effect``'s.
    - ``activity_config``: the wrapped client's (list_tools and passthrough calls);
      ``options``: ``workflow.execute_activity``'s for the gated calls (timeouts, retry policy).
    """

    def __init__(
        self,
        server: McpServer,
        *,
        context: Mapping[str, Any] | None = None,
        passthrough: Collection[str] = (),
        wait_for_review: bool = True,
        review_timeout: timedelta | None = None,
        activity_config: ActivityConfig | None = None,
        **options: Any,
    ) -> None:
        both = sorted(set(passthrough) & set(server.tools))
        if both:
            raise ValueError(f"GatedMCPClient: {both} are declared tools and in passthrough")
        self.server = server
        self.context = dict(context or {})
        self.passthrough = frozenset(passthrough)
        self.inner = TemporalMCPClient(server.name, activity_config=activity_config)
        self._tools: dict[str, GatedTool] = {
            name: register(
                server.declared(name),
                context={"context": self.context},
                toolset=server.name,
                tier=spec.derived_tier,
                name=name,
                description=spec.description,
                wait_for_review=wait_for_review,
                review_timeout=review_timeout,
                **options,
            )
            for name, spec in server.tools.items()
        }

    @property
    def name(self) -> str:
        return self.server.name

    async def list_tools(self) -> ListToolsResult:
        listed = await self.inner.list_tools()
        offered = {tool.name for tool in listed.tools}
        for name in sorted(set(self.server.tools) - offered):
            workflow.logger.warning(
                f"MCP tool {name!r} is declared for server {self.server.name!r}, which does "
                "not offer it"
            )
        shown: list[Tool] = []
        for tool in listed.tools:
            spec = self.server.tools.get(tool.name)
            if spec is None and tool.name not in self.passthrough:
                continue
            if spec is not None:
                for warning in contradictions(tool.name, spec, tool.annotations):
                    workflow.logger.warning(warning)
            shown.append(self._without_context(tool))
        return listed.model_copy(update={"tools": shown})

    def _without_context(self, tool: Tool) -> Tool:
        if not self.context or tool.name not in self.server.tools:
            return tool
        schema = dict(tool.input_schema)
        properties = {
            k: v for k, v in dict(schema.get("properties", {})).items() if k not in self.context
        }
        required = [r for r in schema.get("required", []) if r not in self.context]
        schema.update(properties=properties, required=required)
        return tool.model_copy(update={"input_schema": schema})

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        """Call tool ``name``. For a declared tool, ``meta`` is not sent: the gate sends its
        own (``META_EFFECT_ID``)."""
        gated_tool = self._tools.get(name)
        if gated_tool is None:
            if name in self.passthrough:
                return await self.inner.call_tool(name, arguments, meta=meta)
            return _error(
                f"error: {name} refused: the tool is neither declared (McpServer) nor in "
                "passthrough, so it is not called."
            )
        sent = {**(arguments or {}), **self.context}
        missing = [k for k in self.server.tools[name].key if sent.get(k) is None]
        if missing:
            return _error(
                f"error: {name} refused: the arguments that name the effect are missing: "
                f"{', '.join(missing)}."
            )
        reply = await gated_tool.call({"arguments": dict(arguments or {})})
        return _error(reply.text) if reply.refused else _answer(reply.text)
