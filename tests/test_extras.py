"""What the base install needs, and what an extra brings: the plugin, ``gated``, a SQLite journal,
the policy and the CLI never import stripe, psycopg or the OTLP exporter, and a part that needs a
missing extra says which to install. Each check runs in a fresh interpreter whose imports of the
extras' packages fail, as they do where the extra is not installed (tests/test_install.py does
the same in a real virtualenv without them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from interlock_temporal.core.extras import EXTRAS, MissingExtra, install_hint, needs_extra

ROOT = Path(__file__).resolve().parent.parent

#: makes these imports fail as if the packages were not installed
BLOCKER = """
import importlib.abc, sys
BLOCKED = ("stripe", "psycopg", "psycopg_pool", "psycopg_binary", "opentelemetry.exporter", "httpx",
           "mcp", "temporalio.mcp")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
"""


def run_blocked(code: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
    env["PYTHONPATH"] = str(ROOT)  # the package and workers/ from this checkout
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )


BASE = """
import asyncio, json, sys
from datetime import timedelta

import interlock_temporal
from interlock_temporal import BaseTarget, InterlockPlugin, gated, open_journal, receipt
from interlock_temporal.cli import main
from interlock_temporal.policy import Limits, Policy
from interlock_temporal.targets import Found
from interlock_temporal.targets.payments import SimulatedPayments
import interlock_temporal.review, interlock_temporal.testing, interlock_temporal.workflow
from temporalio import activity

for name in interlock_temporal.__all__:
    getattr(interlock_temporal, name)


class Crm(BaseTarget):
    name = "crm"
    tier = 2

    def capture(self, args, effect_id):
        return {}

    def query(self, effect_id, args):
        return None


@activity.defn
@gated(target=Crm(), key=lambda email: {"email": email})
async def add(email: str) -> str:
    return email


url = sys.argv[1]
journal = open_journal(url)
journal.leases.issue("bot", activities=["add"], ttl=timedelta(minutes=5))
InterlockPlugin(journal=journal, policy=Policy(Limits(max_repeat_calls=3)))
codes = [main(["--journal", url, "journal", "verify"]), main(["--journal", url, "leases", "list"])]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("stripe", "psycopg", "psycopg_pool"))
print(json.dumps({"codes": codes, "loaded": loaded}))
"""


def test_the_base_install_never_imports_an_extra(tmp_path: Path) -> None:
    ran = run_blocked(BASE, tmp_path, f"sqlite:///{tmp_path / 'journal.db'}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out == {"codes": [0, 0], "loaded": []}


def test_the_stripe_target_names_the_stripe_extra(tmp_path: Path) -> None:
    ran = run_blocked("import interlock_temporal.targets.stripe", tmp_path)
    assert ran.returncode == 1
    last = ran.stderr.strip().splitlines()[-1]
    assert last == (
        "interlock_temporal.core.extras.MissingExtra: interlock_temporal.targets.stripe needs "
        "the stripe extra (the stripe package): pip install 'interlock-temporal[stripe]' "
        "(No module named 'stripe')"
    )


def test_the_http_target_names_the_http_extra(tmp_path: Path) -> None:
    ran = run_blocked("import interlock_temporal.targets.http", tmp_path)
    assert ran.returncode == 1
    last = ran.stderr.strip().splitlines()[-1]
    assert last == (
        "interlock_temporal.core.extras.MissingExtra: interlock_temporal.targets.http needs "
        "the http extra (httpx): pip install 'interlock-temporal[http]' "
        "(No module named 'httpx')"
    )


def test_the_mcp_tools_name_the_mcp_extra(tmp_path: Path) -> None:
    ran = run_blocked("import interlock_temporal.mcp", tmp_path)
    assert ran.returncode == 1
    last = ran.stderr.strip().splitlines()[-1]
    assert last == (
        "interlock_temporal.core.extras.MissingExtra: interlock_temporal.mcp needs the mcp "
        "extra (temporalio-mcp and the MCP Python SDK): pip install 'interlock-temporal[mcp]' "
        "(No module named 'mcp')"
    )


OPEN_PG = """
from interlock_temporal import open_journal
try:
    open_journal("postgresql://agent:hunter2@127.0.0.1:1/journal", signing_key="00" * 32)
except ImportError as err:
    print(type(err).__name__, err.name, err)
"""


def test_a_postgresql_journal_names_the_postgres_extra(tmp_path: Path) -> None:
    ran = run_blocked(OPEN_PG, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == (
        "MissingExtra psycopg a PostgreSQL journal (postgresql://) needs the postgres extra "
        "(psycopg 3 and psycopg-pool): pip install 'interlock-temporal[postgres]' "
        "(No module named 'psycopg')"
    )


CLI_PG = """
import sys
from interlock_temporal.cli import main
sys.exit(main(["--journal", "postgresql://agent:hunter2@127.0.0.1:1/journal", "effects", "list"]))
"""


def test_the_cli_on_a_postgresql_journal_says_which_extra_in_one_line(tmp_path: Path) -> None:
    ran = run_blocked(CLI_PG, tmp_path)
    assert ran.returncode == 3
    assert ran.stderr == (
        "interlock: the journal cannot be opened: a PostgreSQL journal (postgresql://) needs the "
        "postgres extra (psycopg 3 and psycopg-pool): pip install "
        "'interlock-temporal[postgres]' (No module named 'psycopg')\n"
    )
    assert "hunter2" not in ran.stderr


def test_otlp_export_names_the_otlp_extra(tmp_path: Path) -> None:
    ran = run_blocked(
        "from workers.telemetry import otlp_plugins; otlp_plugins('http://c')", tmp_path
    )
    assert ran.returncode == 1
    assert ran.stderr == (
        "OTLP export needs the otlp extra (the OpenTelemetry OTLP exporter): "
        "pip install 'interlock-temporal[otlp]' "
        "(No module named 'opentelemetry.exporter')\n"
    )


NO_CLI = """
import os, sys
from interlock_temporal.testing import temporal_cli
os.environ["PATH"] = "/nonexistent"
sys.executable = "/nonexistent/python"
try:
    temporal_cli()
except RuntimeError as err:
    print(err)
"""


def test_the_dev_server_without_its_cli_names_the_testing_extra(tmp_path: Path) -> None:
    ran = run_blocked(NO_CLI, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == (
        "the temporal CLI is not installed: pip install 'interlock-temporal[testing]'\n"
    )


def test_needs_extra_keeps_the_original_error_as_its_cause() -> None:
    with pytest.raises(MissingExtra) as caught, needs_extra("stripe", "this test"):
        import interlock_temporal_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert isinstance(caught.value, ImportError)
    assert caught.value.extra == "stripe"
    assert caught.value.name == "interlock_temporal_no_such_module"
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_an_unknown_extra_is_a_bug_not_a_missing_package() -> None:
    with pytest.raises(ValueError, match="unknown extra 'stirpe'"), needs_extra("stirpe", "x"):
        pass
    assert install_hint("otlp") == "pip install 'interlock-temporal[otlp]'"
    assert set(EXTRAS) == {
        "stripe",
        "postgres",
        "otlp",
        "testing",
        "http",
        "agents",
        "mcp",
        "pydantic-ai",
        "langgraph",
    }


def test_the_extras_are_the_ones_pyproject_declares() -> None:
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = declared["optional-dependencies"]
    assert set(EXTRAS) | {"all", "dev"} == set(extras)
    assert extras["all"] == [f"interlock-temporal[{','.join(EXTRAS)}]"]
