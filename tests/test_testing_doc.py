"""docs/testing.md's pytest example, run as a user runs it: with pytest, in a process of its own,
from the app's directory.

The app is the README's (``refunds.py`` and ``support_case.py``, as the page says); the page's
block is written, unedited, to the ``tests/test_refunds.py`` its first line names. Nothing else
is added: the example starts its own dev server (``local_environment``) and journal
(``throwaway_journal``). Afterwards the money is read from the app's payments service: the
example's one test refunded once.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from interlock_temporal.targets.payments import SimulatedPayments

from .doc_snippets import snippet
from .test_readme_example import app_env, write_app


@pytest.mark.server  # a dev server of its own: the example starts it
def test_the_pytest_example_passes_in_an_app_of_its_own(tmp_path: Path) -> None:
    write_app(tmp_path, "localhost:7233")  # refunds.py and support_case.py are what it imports
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_refunds.py").write_text(snippet("docs/testing.md#25f8df6ba608"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_refunds.py"],
        cwd=tmp_path,
        env=app_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
    db = sqlite3.connect(tmp_path / "payments.db")
    try:
        (order,) = db.execute("SELECT order_id FROM orders").fetchall()  # the example's order
    finally:
        db.close()
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    try:
        assert payments.calls() == 1  # one refund request reached the service
        assert [r.amount_cents for r in payments.refund_records(order[0])] == [2000]
    finally:
        payments.close()
