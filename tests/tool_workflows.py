"""A workflow that calls the gated refund tool through the core path (``register`` and
``GatedTool.call``) with no agent framework, optionally inside an ``execute_tool`` span of its
own, as a framework that already makes one does (for tests/test_tool_spans.py)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from opentelemetry import trace

    from interlock_temporal._tools.calls import ToolReply, register
    from interlock_temporal._tools.spans import EXECUTE_TOOL, OPERATION, TOOL_CALL_ID, TOOL_NAME
    from interlock_temporal.workflow import act_as
    from workflows.agent_case import PRINCIPAL
    from workflows.agent_refund import refund


class ToolCallsFile(BaseModel):
    case_id: str
    order_id: str
    lease_id: str
    #: (call id, arguments as the model sent them) per call, in order
    calls: list[tuple[str, str]]
    #: make the call's execute_tool span here, as a framework that has its own does
    framework_span: bool = False


@workflow.defn
class ToolCalls:
    @workflow.run
    async def run(self, case: ToolCallsFile) -> list[ToolReply]:
        tool = register(
            refund,
            context={"case_id": case.case_id, "order_id": case.order_id, "premises": None},
            toolset="support",
            tier=2,  # the worker binds the target: the tier is declared here
            start_to_close_timeout=timedelta(seconds=10),
            heartbeat_timeout=timedelta(seconds=2),
        )
        replies = []
        with act_as(PRINCIPAL, lease=case.lease_id):
            for call_id, arguments in case.calls:
                if not case.framework_span:
                    replies.append(await tool.call(arguments, call_id=call_id))
                    continue
                attributes = {OPERATION: EXECUTE_TOOL, TOOL_NAME: tool.name, TOOL_CALL_ID: call_id}
                with workflow.unsafe.sandbox_unrestricted():
                    span = trace.get_tracer("a-framework").start_span(
                        f"{EXECUTE_TOOL} {tool.name}", attributes=attributes
                    )
                with trace.use_span(span, end_on_exit=False):
                    replies.append(await tool.call(arguments, call_id=call_id))
                if not workflow.unsafe.is_replaying():
                    with workflow.unsafe.sandbox_unrestricted():
                        span.end()
        return replies
