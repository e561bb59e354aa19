"""A support case whose refund goes through an MCP server's ``refund`` tool, gated: the workflow
is the model here (a script of tool calls, no LLM), calling ``GatedMCPClient`` as an agent
framework would call ``TemporalMCPClient``.

The order is the workflow's (``context``): the script fills in only the amount and the
reason, so whatever it re-decides names the same effect."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from temporalio.mcp import TemporalMCPClient
    from temporalio.workflow import ActivityConfig

    from interlock_temporal.mcp import GatedMCPClient
    from interlock_temporal.workflow import act_as

    from .mcp_tools import SERVERS

#: who refunds: fixed in workflow code, never taken from the input or the model
PRINCIPAL = "refund-bot"


class McpStep(BaseModel):
    """The model calls ``tool`` with ``arguments``."""

    tool: str
    arguments: dict[str, Any] = {}


class McpCaseFile(BaseModel):
    case_id: str
    order_id: str
    lease_id: str | None = None
    server: str = "payments"
    steps: list[McpStep]
    #: show the model the tools first (MCPPlugin's list-tools activity, ungated)
    list_tools: bool = True
    #: False: the naive workflow, TemporalMCPClient's call-tool activity with no gate (the
    #: order set in the arguments by the workflow)
    gated: bool = True
    wait_for_review: bool = True
    start_to_close_s: float = 10.0
    heartbeat_s: float | None = 2.0
    maximum_attempts: int = 0


class McpCaseOutcome(BaseModel):
    case_id: str
    #: the tools the model was shown, each with the arguments its schema asks for
    tools: dict[str, list[str]]
    #: each call's CallToolResult, as the model read it (JSON, by alias: isError, content)
    results: list[dict[str, Any]]


@workflow.defn
class McpCase:
    @workflow.run
    async def run(self, case: McpCaseFile) -> McpCaseOutcome:
        if not case.gated:
            return await self.naive(case)
        client = GatedMCPClient(
            SERVERS[case.server],
            context={"order_id": case.order_id},
            passthrough=["order_status"],
            wait_for_review=case.wait_for_review,
            start_to_close_timeout=timedelta(seconds=case.start_to_close_s),
            heartbeat_timeout=timedelta(seconds=case.heartbeat_s) if case.heartbeat_s else None,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=0.5),
                maximum_interval=timedelta(seconds=2),
                maximum_attempts=case.maximum_attempts,
            ),
        )
        results = []
        with act_as(PRINCIPAL, lease=case.lease_id):
            listed = await client.list_tools() if case.list_tools else None
            for step in case.steps:
                answer = await client.call_tool(step.tool, step.arguments)
                results.append(answer.model_dump(mode="json", by_alias=True, exclude_none=True))
        return McpCaseOutcome(
            case_id=case.case_id,
            tools={t.name: sorted(t.input_schema.get("properties", {})) for t in listed.tools}
            if listed
            else {},
            results=results,
        )

    async def naive(self, case: McpCaseFile) -> McpCaseOutcome:
        """The same calls through temporalio-mcp alone: one call-tool activity, retried by
        Temporal after a crash as if it had never run."""
        client = TemporalMCPClient(
            case.server,
            activity_config=ActivityConfig(
                start_to_close_timeout=timedelta(seconds=case.start_to_close_s),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=0.5)),
            ),
        )
        results = []
        for step in case.steps:
            answer = await client.call_tool(
                step.tool, {**step.arguments, "order_id": case.order_id}
            )
            results.append(answer.model_dump(mode="json", by_alias=True, exclude_none=True))
        return McpCaseOutcome(case_id=case.case_id, tools={}, results=results)
