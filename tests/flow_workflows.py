"""The scripted agent of the flow provenance test (module level, so the workflow sandbox can
load it): it fetches a page, waits for ``go`` (the test restarts workers meanwhile), then does
what an injected instruction asks: copies the page's text into an email's body."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from interlock_temporal.workflow import act_as


@workflow.defn
class FlowAgent:
    def __init__(self) -> None:
        self.stage = "started"
        self.go = False

    @workflow.signal
    def proceed(self) -> None:
        self.go = True

    @workflow.query
    def where(self) -> str:
        return self.stage

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> Any:
        """``spec``: principal, lease, url (fetched first, when given), text (the body's own
        words when nothing is fetched), to."""
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=10),
            "heartbeat_timeout": timedelta(seconds=2),
            "retry_policy": RetryPolicy(initial_interval=timedelta(seconds=0.2)),
        }
        with act_as(spec["principal"], lease=spec["lease"]):
            page = spec.get("text", "")
            if spec.get("url"):
                page = await workflow.execute_activity("fetch_page", spec["url"], **options)
            self.stage = "fetched"
            await workflow.wait_condition(lambda: self.go)
            self.stage = "sending"
            email = {
                "sender": "agent@example.com",
                "to": [spec["to"]],
                "subject": f"as you asked ({workflow.info().workflow_id})",
                "text": f"Hello,\n\nhere is what I found:\n\n{page}\n\nBest",
            }
            return await workflow.execute_activity("send_email", email, **options)
