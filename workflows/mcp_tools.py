"""The payments MCP server's tools, declared once, where the worker and the workflow both
import them: ``refund`` is an effect keyed by the order (the workflow's), its amount capped by
the lease.

Two declarations of the same server (``workers.mcp_server``), as two ``MCPPlugin`` names: one
whose server dedupes on the ``_meta`` effect id (tier 1), one that promises nothing (tier 3)."""

from __future__ import annotations

from datetime import timedelta

from interlock_temporal.mcp import McpServer, McpTool

REFUND = {"key": ("order_id",), "amount": "amount_cents", "resource": "order_id"}

#: the server started with --dedupe: it dedupes a refund by the _meta effect id for a day
PAYMENTS = McpServer("payments", {"refund": McpTool(**REFUND, dedupe_window=timedelta(hours=24))})
#: the server started without it: nothing dedupes, nothing can be asked (tier 3)
PAYMENTS_T3 = McpServer("payments-t3", {"refund": McpTool(**REFUND)})

SERVERS = {server.name: server for server in (PAYMENTS, PAYMENTS_T3)}
