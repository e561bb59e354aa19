"""The README's example ("A gated refund, end to end"), run as written against a real dev server,
with the two other workers of docs/getting-started.md.

Its Python blocks are written to the files their first lines name, as a user's app would hold
them: ``refunds.py``, ``support_case.py``, ``worker.py``, the world's ``order.py``, the
starter's ``start.py`` and the operator's ``lease.py``. The glue, in the two programs that
connect: the server's address in place of ``localhost:7233``, and a task queue of the test's own
in place of ``refunds`` (the dev server is shared). Each program runs as a process of its own in
the app's directory, as the README says to run it.

The money is read from the payments service afterwards: the refund landed once, and starting
the same case again sent nothing more. The receipt is read from the journal the worker wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter

from interlock_temporal import open_journal, receipt
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer

from .doc_snippets import ROOT, snippet, swap


def at(text: str, address: str, queue: str) -> str:
    """A program of the README pointed at the server at ``address`` and the task queue
    ``queue`` (one of the test's own on the shared server) instead of ``refunds``."""
    text = swap(text, '"localhost:7233"', repr(address))
    return swap(text, 'task_queue="refunds"', f"task_queue={queue!r}")


def readme_app(address: str, queue: str) -> dict[str, str]:
    """The files of the README's app, by name."""
    return {
        "worker.py": at(snippet("README.md#e06d48d6957a"), address, queue),
        "refunds.py": snippet("README.md#bf636f2c37e6"),
        "support_case.py": snippet("README.md#2ec626084528"),
        "start.py": at(snippet("README.md#664fa8294d6f"), address, queue),
        "lease.py": snippet("README.md#004abbabe956"),
        "order.py": snippet("README.md#3eb7d3edcba3"),
        # the two other ways to build the worker: the target bound on the worker, no plugins
        "bound_worker.py": at(snippet("docs/getting-started.md#82995151d36e"), address, queue),
        "plain_worker.py": at(snippet("docs/getting-started.md#364d2f45ca65"), address, queue),
    }


def write_app(directory: Path, address: str) -> str:
    """The README's app in ``directory``; the task queue its programs use."""
    queue = f"refunds-{uuid.uuid4().hex[:8]}"
    for name, text in readme_app(address, queue).items():
        (directory / name).write_text(text)
    return queue


def app_env(directory: Path) -> dict[str, str]:
    """The app's directory first, then this checkout's package (not another installed copy);
    no ``INTERLOCK_`` setting of the caller's leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(directory), str(ROOT)])
    return env


def run(directory: Path, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=directory,
        env=app_env(directory),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"python {' '.join(argv)} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def test_each_block_is_the_file_it_says() -> None:
    app = readme_app("127.0.0.1:7233", "refunds-1")
    assert "InterlockPlugin(journal=" in app["worker.py"]
    assert "await run_worker(worker)" in app["worker.py"]
    assert "@gated(" in app["refunds.py"] and "async def refund" in app["refunds.py"]
    assert "with act_as(" in app["support_case.py"] and "execute_effect(" in app["support_case.py"]
    assert "data_converter=pydantic_data_converter" in app["start.py"]
    assert "leases.issue(" in app["lease.py"]
    assert ".open_order(" in app["order.py"]


@pytest.mark.server
@pytest.mark.parametrize("worker_py", ["worker.py", "bound_worker.py", "plain_worker.py"])
async def test_the_three_steps_run_as_written(
    dev_server: DevServer, tmp_path: Path, worker_py: str
) -> None:
    """With each of the README's workers: step 1's, the target bound on the worker
    (``gated(refund)``), and the interceptor without plugins."""
    write_app(tmp_path, dev_server.target)
    run(tmp_path, "order.py")  # the world: an order the case is about
    lease_id = run(tmp_path, "lease.py").strip().splitlines()[-1]
    with (tmp_path / "worker.log").open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, worker_py],
            cwd=tmp_path,
            env=app_env(tmp_path),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        first = run(tmp_path, "start.py", lease_id).strip().splitlines()[-1]
        again = run(tmp_path, "start.py", lease_id).strip().splitlines()[-1]
    finally:
        worker.terminate()
        stopped = worker.wait(30)
    # run_worker: SIGTERM shuts the worker down, and it exits 0 without a traceback
    assert stopped == 0 and "Traceback" not in (tmp_path / "worker.log").read_text()
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    try:
        (landed,) = payments.refund_records("o-1")  # one refund, by the gate
        assert (landed.amount_cents, landed.source) == (2000, "api")
        assert payments.calls("o-1") == 1  # the second start sent nothing
    finally:
        payments.close()
    assert first == again
    assert f"refund_id='{landed.refund_id}'" in first and "amount_cents=2000" in first

    journal = open_journal(f"sqlite:///{tmp_path / 'interlock.db'}")
    try:
        (row,) = journal.effects()
        done = receipt(row.effect_id, journal=journal)
    finally:
        journal.close()
    assert landed.effect_id == row.effect_id
    assert (done.final, done.via, done.dispatches) == ("COMMITTED", "dispatch", 1)
    assert (done.principal, done.lease_id, done.confirmation) == (
        "refund-bot",
        lease_id,
        landed.refund_id,
    )


class _Amount(BaseModel):
    value: Decimal


def test_a_starter_without_the_pydantic_converter_fails_as_the_readme_says() -> None:
    """Getting started's reason for the starter's converter: the default converter goes
    through the deprecated ``dict()`` and cannot encode a ``Decimal``; the pydantic one can."""
    readme = " ".join((ROOT / "docs" / "getting-started.md").read_text().split())
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(TypeError) as failed:
            DataConverter.default.payload_converter.to_payloads([_Amount(value=Decimal("20.00"))])
    assert f"`TypeError: {failed.value}`" in readme
    assert str(failed.value) == "Object of type Decimal is not JSON serializable"
    assert any("pydantic_data_converter" in str(w.message) for w in warned)
    assert any("`dict` method is deprecated" in str(w.message) for w in warned)

    (payload,) = pydantic_data_converter.payload_converter.to_payloads(
        [_Amount(value=Decimal("20.00"))]
    )
    assert json.loads(payload.data) == {"value": "20.00"}
