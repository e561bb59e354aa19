"""The target and journal blocks that were the README's (docs/targets/git.md,
docs/targets/stripe.md, docs/operations/production.md), run as written on a real dev server.

Each block is written to the file its first line names and imported from there; the one edit
(the glue) is the placeholder the page shows for where the service lives:

- "A git repository as a target": ``edits.py``, with a real bare repository in place of
  ``/srv/agents.git``; what landed is read from git (the branch head, its trailer, the file).
- "Stripe refunds as a target": ``stripe_refunds.py``, with the Stripe fake's address given
  to ``StripeClient("sk_test_...")``; the money is read from the fake through the SDK.
- "Workers on many hosts": the plugin line, run once per worker with a real PostgreSQL in place
  of ``db.internal``; the money is read from the payments service, the receipt from PostgreSQL.

The workflow is the tests' ``CallActivity`` (the activity by name, under ``act_as``): the
pages show these activities, not a workflow for them.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import stripe
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, current_effect, gated, open_journal, receipt
from interlock_temporal.core.journal import Journal
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import (
    STRIPE_TEST_KEY,
    DevServer,
    PostgresServer,
    StripeMock,
)

from .doc_snippets import load, snippet, swap
from .server_workflows import CallActivity

pytestmark = pytest.mark.server

KEY = "44" * 32


def journal_at(path: Path) -> tuple[str, Journal]:
    url = f"sqlite:///{path / 'journal.db'}"
    return url, open_journal(url, signing_key=KEY)


async def run_activity(
    client: Client, queue: str, activity_name: str, arg: Any, principal: str, lease: str
) -> Any:
    return await client.execute_workflow(
        CallActivity.run,
        {
            "activity": activity_name,
            "arg": arg,
            "principal": principal,
            "lease": lease,
            "heartbeat_s": 2,
            "maximum_attempts": 3,
        },
        id=f"readme-{activity_name}-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )


# -- A git repository as a target --------------------------------------------------------------

MOD = "def alpha():\n    return 'a'\n\n\ndef beta():\n    return 'b'\n"


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=engineer", "-c", "user.email=e@localhost", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def bare_repository(where: Path) -> Path:
    """A bare repository whose branch ``agents`` holds ``mod.py`` (the README's path)."""
    work = where / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "mod.py").write_text(MOD)
    git("add", "mod.py", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    bare = where / "agents.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=where)
    git("branch", "agents", "main", cwd=bare)
    return bare


async def test_the_git_block_commits_one_edit_and_refuses_a_stale_one(
    dev_server: DevServer, tmp_path: Path
) -> None:
    bare = bare_repository(tmp_path)
    text = swap(snippet("docs/targets/git.md#291f840b3751"), '"/srv/agents.git"', repr(str(bare)))
    edits = load(text, tmp_path / "edits.py")
    url, journal = journal_at(tmp_path)
    lease = journal.leases.issue("coder-bot", activities=["edit"])
    start = git("rev-parse", "agents", cwd=bare)
    # two agents decide at the same commit, each relying on alpha as it reads it there
    first = edits.decide("alpha returns z", "def alpha():\n    return 'z'\n")
    stale = edits.decide("alpha returns y", "def alpha():\n    return 'y'\n")
    assert first.premises == stale.premises and first.premises is not None

    client = await Client.connect(
        dev_server.target, plugins=[InterlockPlugin(url, signing_key=KEY)]
    )
    queue = f"readme-git-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(4) as pool:  # edit is a plain def
        async with Worker(
            client,
            task_queue=queue,
            workflows=[CallActivity],
            activities=[edits.edit],
            activity_executor=pool,
        ):
            landed = await run_activity(
                client, queue, "edit", first.model_dump(mode="json"), "coder-bot", lease
            )
            with pytest.raises(WorkflowFailureError) as failed:
                await run_activity(
                    client, queue, "edit", stale.model_dump(mode="json"), "coder-bot", lease
                )

    head, parent, trailer = git(
        "log",
        "-1",
        "--format=%H%n%P%n%(trailers:key=Interlock-Effect,valueonly)",
        "agents",
        cwd=bare,
    ).splitlines()
    (row,) = [r for r in journal.effects() if r.status.value == "COMMITTED"]
    assert (landed["commit"], landed["branch"], landed["effect_id"]) == (head, "agents", trailer)
    assert (parent, trailer) == (start, row.effect_id)
    assert git("show", "agents:mod.py", cwd=bare) == MOD.replace("'a'", "'z'").strip()
    assert git("rev-parse", "main", cwd=bare) == start  # only the agents' branch moved
    done = receipt(row.effect_id, journal=journal)
    assert (done.final, done.via, done.dispatches, done.tier) == ("COMMITTED", "dispatch", 1, 2)

    # the second agent relied on alpha as it was: refused, naming the fact, nothing landed
    assert isinstance(failed.value.cause, ActivityError)
    cause = failed.value.cause.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "EffectRefused" and cause.message.startswith("stale_premise: ")
    assert "symbol:mod.py::alpha" in cause.message
    assert git("rev-parse", "agents", cwd=bare) == head
    journal.close()


# -- Stripe refunds as a target --------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stripe_mock() -> AsyncIterator[StripeMock]:
    mock = await StripeMock().start()
    try:
        yield mock
    finally:
        await mock.stop()


async def test_the_stripe_block_refunds_once_with_the_effect_id_as_its_key(
    dev_server: DevServer, stripe_mock: StripeMock, tmp_path: Path
) -> None:
    placeholder = 'stripe.StripeClient("sk_test_...")'
    address = {"api": stripe_mock.url}
    at_the_fake = f'stripe.StripeClient("sk_test_...", base_addresses={address!r})'
    module = load(
        swap(snippet("docs/targets/stripe.md#8e22f0551e32"), placeholder, at_the_fake),
        tmp_path / "stripe_refunds.py",
    )
    fake = stripe.StripeClient(STRIPE_TEST_KEY, base_addresses={"api": stripe_mock.url})
    charge = fake.v1.charges.create(
        params={
            "amount": 10_000,
            "currency": "usd",
            "source": "tok_visa",
            "metadata": {"refund_eligible": "true"},
        }
    ).id
    url, journal = journal_at(tmp_path)
    lease = journal.leases.issue("refund-bot", activities=["refund"], max_amount_cents=5000)
    # the agent, when it decides: the facts it relies on, as the README's comment says
    decision = module.RefundRequest(
        case_id="c-1", charge_id=charge, amount_cents=2000, premises=module.refunds.facts(charge)
    )
    assert decision.premises["metadata.refund_eligible"] == "true"

    client = await Client.connect(
        dev_server.target, plugins=[InterlockPlugin(url, signing_key=KEY)]
    )
    queue = f"readme-stripe-{uuid.uuid4().hex[:8]}"
    worker = Worker(client, task_queue=queue, workflows=[CallActivity], activities=[module.refund])
    async with worker:
        arg = decision.model_dump(mode="json")
        first = await run_activity(client, queue, "refund", arg, "refund-bot", lease)
        again = await run_activity(client, queue, "refund", arg, "refund-bot", lease)

    (refund,) = fake.v1.refunds.list(params={"charge": charge}).data  # one refund at Stripe
    (row,) = journal.effects()
    assert refund.metadata is not None
    assert (refund.amount, refund.metadata.to_dict()) == (2000, {"effect_id": row.effect_id})
    assert fake.v1.charges.retrieve(charge).amount_refunded == 2000
    assert first == again and first["refund_id"] == refund.id
    done = receipt(row.effect_id, journal=journal)
    assert (done.final, done.via, done.dispatches, done.tier) == ("COMMITTED", "dispatch", 1, 1)
    assert done.confirmation == refund.id
    journal.close()


# -- Workers on many hosts: the PostgreSQL journal ---------------------------------------------


async def test_the_postgres_block_lets_a_second_worker_see_what_the_first_sent(
    dev_server: DevServer,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two workers, each with the README's plugin line and the same INTERLOCK_SIGNING_KEY: a
    refund sent through the first is answered by the second from the shared journal, and
    nothing is sent again."""
    database = postgres.database(f"readme_{uuid.uuid4().hex[:8]}")
    line = snippet("docs/operations/production.md#bf047c20ee4a")
    monkeypatch.setenv("INTERLOCK_SIGNING_KEY", KEY)
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    payments.open_order("o-1", 5000)

    @activity.defn(name="refund")
    @gated(target=payments, key=lambda r: {"case": r.case_id, "order": r.order_id})
    async def refund(r: RefundRequest) -> RefundResult:
        return await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    operator = open_journal(database)
    lease = operator.leases.issue("refund-bot", activities=["refund"])
    operator.close()
    decision = RefundRequest(case_id="c-1", order_id="o-1", amount_cents=2000).model_dump()
    queue = f"readme-pg-{uuid.uuid4().hex[:8]}"
    results = []
    for host in ("a", "b"):  # one worker after the other, each its own plugin and client
        plugin = load(
            swap(line, '"postgresql://interlock@db.internal:5432/interlock"', repr(database)),
            tmp_path / f"worker_{host}.py",
        ).plugin
        client = await Client.connect(dev_server.target, plugins=[plugin])
        worker = Worker(client, task_queue=queue, workflows=[CallActivity], activities=[refund])
        async with worker:
            results.append(
                await run_activity(client, queue, "refund", decision, "refund-bot", lease)
            )

    assert results[0] == results[1]
    assert (payments.refunded_cents("o-1"), payments.calls("o-1")) == (2000, 1)
    journal = open_journal(database)
    try:
        (row,) = journal.effects()
        done = receipt(row.effect_id, journal=journal)
    finally:
        journal.close()
        payments.close()
    assert (done.final, done.dispatches, done.confirmation) == (
        "COMMITTED",
        1,
        results[0]["refund_id"],
    )


# -- the Targets table --------------------------------------------------------------------------


def _targets_table() -> list[list[str]]:
    text = (Path(__file__).resolve().parent.parent / "docs" / "targets.md").read_text()
    section = text[text.index("## Ready-made targets\n") :]
    section = section[: section.index("\n### ", 1)]
    lines = [ln for ln in section.splitlines() if ln.startswith("| `targets.")]
    return [[cell.strip() for cell in ln.strip("|").split("|")] for ln in lines]


def test_the_targets_table_names_every_ready_made_target_by_a_class_that_exists() -> None:
    """Each row's ``targets.<module>.<Class>`` imports, and every public module of
    ``interlock_temporal.targets`` has a row: a new target without one fails here."""
    import importlib
    import pkgutil

    import interlock_temporal.targets as package

    named: set[str] = set()
    for target, _tier, _needs in _targets_table():
        dotted = target.split("`")[1]
        module_name, cls = dotted.rsplit(".", 1)
        module = importlib.import_module(f"interlock_temporal.{module_name}")
        assert isinstance(getattr(module, cls), type), dotted
        named.add(module_name.split(".")[1])
    public = {m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")}
    assert named == public
