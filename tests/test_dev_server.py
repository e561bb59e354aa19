"""``interlock_temporal.testing.DevServer`` (what ``make demo`` and the fault matrix start) on
the real Temporal CLI: a port another process took between its choosing and the server's bind
is chosen again; any other exit at start is raised with what the server said."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from temporalio.client import Client

from interlock_temporal.testing import DevServer

pytestmark = pytest.mark.server


async def test_a_port_taken_by_another_process_is_chosen_again() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        server = DevServer(port=port, ui_port=None)
        await server.start()
        try:
            assert server.port != port
            client = await Client.connect(server.target)
            assert (await client.service_client.check_health()) is not None
        finally:
            await server.stop()


async def test_another_exit_at_start_says_what_the_server_said(tmp_path: Path) -> None:
    # a database file that is a directory: the server cannot open it, and says so
    with pytest.raises(RuntimeError, match=r"exited at start: .*unable to open database file"):
        await DevServer(db_file=tmp_path, ui_port=None).start()
