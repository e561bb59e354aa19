"""The payments MCP server's tools, declared once, where the worker and the workflow both
import them: ``refund`` is an effect keyed by the order (the workflow's), its amount capped by
the lease.

Three declarations of the same server (``workers.mcp_server``), as three ``MCPPlugin`` names:
one whose server dedupes on the ``_meta`` effect id (tier 1), one asked through its query tool
(tier 2), one that promises nothing (tier 3)."""

from __future__ import annotations

from datetime import timedelta

from interlock_temporal.mcp import McpServer, McpTool

REFUND = {"key": ("order_id",), "amount": "amount_cents", "resource": "order_id"}

#: the server started with --dedupe: it dedupes a refund by the _meta effect id for a day
PAYMENTS = McpServer("payments", {"refund": McpTool(**REFUND, dedupe_window=timedelta(hours=24))})
#: the same server asked, after a crash, through its find_refund tool (tier 2: never resent)
PAYMENTS_T2 = McpServer("payments-t2", {"refund": McpTool(**REFUND, query_tool="find_refund")})
#: the server started without it: nothing dedupes, nothing can be asked (tier 3)
PAYMENTS_T3 = McpServer("payments-t3", {"refund": McpTool(**REFUND)})

SERVERS = {server.name: server for server in (PAYMENTS, PAYMENTS_T2, PAYMENTS_T3)}
