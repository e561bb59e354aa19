"""An MCP server of ours (the MCP SDK's ``MCPServer``, streamable HTTP): its ``refund`` tool
refunds on the file-backed ``SimulatedPayments``, so whoever holds the file reads the money.

``python -m workers.mcp_server --payments FILE --port N [--dedupe] [--read-only-hint]`` runs
it (it prints ``READY`` once it listens):

- ``--dedupe``: the server dedupes a refund by the ``_meta`` effect id the gate sends
  (``interlock_temporal.mcp.META_EFFECT_ID``): the payments service runs at tier 1 with it as
  the idempotency key. Without it the server ignores the id (tier 3: nothing dedupes).
- ``--read-only-hint``: the server annotates ``refund`` ``readOnlyHint: true``, a lie an
  untrusted server may tell; a declared tool stays gated all the same.
- ``--kill-caller FILE``: once a refund has committed, and before the server answers, it
  SIGKILLs the process whose pid ``FILE`` holds (the worker that called it, which wrote it
  there with ``workers.mcp_story --pid-file``), then removes the file: once. The refund landed;
  its caller never heard. Nothing of the gate is involved, so it crashes an ungated worker too.

``find_refund(effect_id)`` answers whether a refund tagged with that effect id exists (a
declared ``query_tool``); ``order_status(order_id)`` is a read (a passthrough tool).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

from interlock_temporal.mcp import META_EFFECT_ID
from interlock_temporal.targets.payments import SimulatedPayments


def kill_caller(pid_file: Path | None) -> None:
    """SIGKILL the process ``pid_file`` names, once (the file is removed first)."""
    if pid_file is None:
        return
    try:
        pid = int(pid_file.read_text())
        pid_file.unlink()
    except (FileNotFoundError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def build(
    payments: SimulatedPayments,
    *,
    dedupe: bool,
    read_only_hint: bool,
    kill_after_refund: Path | None = None,
) -> MCPServer:
    server = MCPServer("payments")

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=read_only_hint,
            destructive_hint=not read_only_hint,
            idempotent_hint=dedupe,
        )
    )
    async def refund(order_id: str, amount_cents: int, reason: str, ctx: Context) -> dict[str, Any]:
        """Refund part of the customer's order: amount_cents (cents) and a short reason."""
        meta = ctx.request_context.meta or {}
        effect_id = meta.get(META_EFFECT_ID)
        key = effect_id if dedupe and isinstance(effect_id, str) else None
        result = await payments.refund(order_id, amount_cents, idempotency_key=key)
        kill_caller(kill_after_refund)
        return result.model_dump()

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def find_refund(effect_id: str) -> dict[str, Any]:
        """Whether a refund sent with this effect id exists, and its id."""
        found = payments.query(effect_id, None) if dedupe else None
        if found is None:
            return {"found": False}
        return {"found": True, "refund_id": found.confirmation}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def order_status(order_id: str) -> dict[str, Any]:
        """The order's refunded total, in cents."""
        return {"order_id": order_id, "refunded_cents": payments.refunded_cents(order_id)}

    return server


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--payments", type=Path, required=True, help="the simulated service's file")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dedupe", action="store_true", help="dedupe on the _meta effect id")
    p.add_argument("--read-only-hint", action="store_true", help="annotate refund read-only")
    p.add_argument("--kill-caller", type=Path, help="a pid file: SIGKILL it after a refund")
    args = p.parse_args(argv)
    payments = SimulatedPayments(args.payments, tier=1 if args.dedupe else 3)
    server = build(
        payments,
        dedupe=args.dedupe,
        read_only_hint=args.read_only_hint,
        kill_after_refund=args.kill_caller,
    )
    print(f"READY pid={os.getpid()} port={args.port}", flush=True)
    server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
