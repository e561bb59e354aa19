"""The README's "Use it in three steps", run as written against a real dev server.

The four Python blocks of that section are taken from the README itself and placed, unedited
but for the server's address, where a user would put them: the operator's lease and step 1 in
the program that starts the worker, step 2 in the activities' module, step 3 in the body of the
``SupportCase`` workflow. The glue around them (the order, the workflow's input model, running
it) is the least a user must add. The program runs in its own process and directory; the money
is read from the payments service afterwards: the refund landed once, and a second run of the
same decision sent nothing more."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import DevServer

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)

ACTIVITIES = """\
from interlock_temporal.targets.payments import RefundRequest, RefundResult

{step2}
"""

WORKFLOWS = """\
from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from app_activities import refund
    from interlock_temporal.targets.payments import RefundRequest


class Case(BaseModel):
    lease_id: str
    decision: RefundRequest


@workflow.defn
class SupportCase:
    @workflow.run
    async def run(self, case: Case) -> dict:
        decision = case.decision
{step3}
        return result.model_dump()
"""

MAIN = """\
import asyncio
import json
import sys
from datetime import timedelta

from temporalio.worker import Worker

from app_activities import payments, refund
from app_workflows import Case, SupportCase
from interlock_temporal.targets.payments import RefundRequest


async def main() -> None:
{lease}
    payments.open_order("o-1", 5000)
    decision = RefundRequest(case_id="c-1", order_id="o-1", amount_cents=2000)
{step1}
    results = []
    async with worker:
        for run in ("first", "again"):
            results.append(
                await client.execute_workflow(
                    SupportCase.run,
                    Case(lease_id=lease_id, decision=decision),
                    id=f"case-c-1-{{run}}",
                    task_queue="refunds",
                )
            )
    print(json.dumps(results))


asyncio.run(main())
"""


def three_steps() -> list[str]:
    """The Python blocks of the README's "Use it in three steps", in order."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Use it in three steps")
    section = readme[start : readme.index("\n#", start + 1)]
    return [m.group(1) for m in _FENCE.finditer(section)]


def test_the_section_holds_the_three_steps_and_the_lease() -> None:
    step1, step2, step3, lease = three_steps()
    assert "InterlockPlugin(journal=" in step1 and "Worker(client" in step1
    assert "@gated(" in step2 and "async def refund" in step2
    assert "with act_as(" in step3 and "execute_effect(" in step3
    assert "leases.issue(" in lease


@pytest.mark.server
async def test_the_three_steps_run_as_written(dev_server: DevServer, tmp_path: Path) -> None:
    step1, step2, step3, lease = three_steps()
    assert '"localhost:7233"' in step1
    step1 = step1.replace('"localhost:7233"', "sys.argv[1]")
    (tmp_path / "app_activities.py").write_text(ACTIVITIES.format(step2=step2))
    (tmp_path / "app_workflows.py").write_text(
        WORKFLOWS.format(step3=textwrap.indent(step3, " " * 8))
    )
    (tmp_path / "app_main.py").write_text(
        MAIN.format(lease=textwrap.indent(lease, " " * 4), step1=textwrap.indent(step1, " " * 4))
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "app_main.py", dev_server.target],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, again = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["amount_cents"] == again["amount_cents"] == 2000
    assert first["refund_id"] == again["refund_id"]
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    try:
        assert payments.refunded_cents("o-1") == 2000
        assert payments.calls("o-1") == 1
    finally:
        payments.close()
