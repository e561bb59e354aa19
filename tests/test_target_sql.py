"""``SqlTarget``: a write to a database you control, on SQLite and on PostgreSQL.

Tier 2 (a marker in the target's own database) and tier 0 (the journal's own database: the
dispatch, the body's write, the marker and COMMITTED in one transaction). The gate is driven
directly here, against real journals and real databases; every outcome is read back with SQL
and from the journal. The Temporal end of it (a worker refused at start, real SIGKILLs at each
point of the tier-0 transaction) is at the bottom, on a real dev server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from interlock_temporal import BaseTarget, InterlockPlugin, gated, open_journal
from interlock_temporal._worker.runtime import WorkerSetupError
from interlock_temporal.core.errors import Refused
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Change, Kind
from interlock_temporal.core.protocol import Call, Done, Gate, Ticket
from interlock_temporal.core.targets import TargetDeclarationError
from interlock_temporal.policy import CallEvent, Decision, Policy, modify
from interlock_temporal.targets.sql import SqlTarget, SqlTransaction, TimeLimitExceeded
from interlock_temporal.testing import DevServer, PostgresServer

from .doc_snippets import load, snippet
from .server_workflows import CallActivity
from .sql_app import (
    PRINCIPAL,
    SIGNING_KEY,
    Credit,
    Credited,
    create_credits,
    credit_activity,
    credit_body,
    kill_story,
    rows,
)

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Place:
    """A journal, and where the target's database is: the journal's own (tier 0) or another."""

    journal_url: str
    other_url: str
    journal: Journal

    def target(self, tier: int, **kwargs: Any) -> SqlTarget:
        url = self.journal_url if tier == 0 else self.other_url
        create_credits(url)
        target = SqlTarget("ledger", url, tier=tier, **kwargs)
        target.prepare()
        return target


@pytest.fixture(params=["sqlite", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "sqlite":
        journal_url = f"sqlite:///{tmp_path / 'journal.db'}"
        other_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        suffix = uuid.uuid4().hex[:8]
        journal_url = server.database(f"journal_{suffix}")
        other_url = server.database(f"ledger_{suffix}")
    journal = open_journal(journal_url, signing_key=SIGNING_KEY)
    journal.loop_shared = True  # as in a worker: every append goes through group commit
    try:
        yield Place(journal_url, other_url, journal)
    finally:
        journal.close()


def call_of(target: SqlTarget, req: Credit, lease_id: str | None, **kw: Any) -> Call:
    """One attempt at ``credit``, as the adapter builds it for an ``SqlTarget``."""
    return Call(
        effect_type="credit",
        activity="credit",
        input=req,
        args=(req,),
        key={"credit": req.credit_id},
        principal=PRINCIPAL,
        lease_id=lease_id,
        transaction=functools.partial(target.transact, credit_body),
        **kw,
    )


async def attempt(gate: Gate, target: SqlTarget, call: Call) -> Any:
    """``begin``, then at tier 2 (or a tier-0 resend) the body through the target's own
    transaction, then ``commit``: what the interceptor does."""
    step = await gate.begin(call, target)
    if isinstance(step, Done):
        return step
    try:
        result = await asyncio.to_thread(target.run, credit_body, step.args, step.effect_id)
    except Exception as err:
        await gate.fail(step, err, last_attempt=call.last_attempt)
        raise
    return await gate.commit(step, result)


def lease(journal: Journal) -> str:
    return journal.leases.issue(PRINCIPAL, activities=["credit"], ttl=timedelta(hours=1))


def credits(url: str, credit_id: str) -> int:
    return len(rows(url, "SELECT credit_id FROM credits WHERE credit_id = ?", (credit_id,)))


def markers(url: str, eid: str) -> int:
    return len(rows(url, "SELECT effect_id FROM interlock_markers WHERE effect_id = ?", (eid,)))


def kinds(journal: Journal, eid: str) -> list[str]:
    return [e.kind.value for e in journal.read(eid)]


def new_credit(cents: int = 250, **kw: Any) -> Credit:
    return Credit(credit_id=f"c-{uuid.uuid4().hex[:10]}", account="acct-7", cents=cents, **kw)


# -- tier 0: one transaction ------------------------------------------------------------------


async def test_tier_zero_commits_the_write_and_its_record_together(place: Place) -> None:
    target = place.target(0)
    gate = Gate(place.journal)
    req = new_credit()
    done = await attempt(gate, target, call_of(target, req, lease(place.journal)))
    assert isinstance(done, Done) and done.via == "dispatch"
    assert isinstance(done.result, Credited) and done.result.credit_id == req.credit_id
    eid = done.effect_id
    assert kinds(place.journal, eid) == ["PROPOSED", "AUTHORIZED", "DISPATCHED", "COMMITTED"]
    assert credits(place.journal_url, req.credit_id) == 1
    assert markers(place.journal_url, eid) == 1
    receipt = gate.receipt(eid)
    assert (receipt.final, receipt.executed, receipt.tier) == ("COMMITTED", True, 0)
    assert place.journal.in_doubt() == []
    again = await attempt(gate, target, call_of(target, req, lease(place.journal)))
    assert isinstance(again, Done) and again.via == "duplicate"
    assert again.result == done.result.model_dump()
    assert credits(place.journal_url, req.credit_id) == 1
    assert place.journal.verify().ok


async def test_tier_zero_refusals_write_no_row(place: Place) -> None:
    """A revoked lease and a stale premise stop the effect inside the transaction, before the
    body: the refusal is recorded, no row and no marker."""
    target = place.target(0)
    gate = Gate(place.journal)
    revoked = lease(place.journal)
    place.journal.leases.revoke(revoked)
    req = new_credit()
    with pytest.raises(Refused) as refused:
        await attempt(gate, target, call_of(target, req, revoked))
    assert (refused.value.code, refused.value.reason) == ("lease", "lease revoked")
    assert refused.value.receipt.executed is False
    assert credits(place.journal_url, req.credit_id) == 0

    class Stale(SqlTarget):
        def validate(self, recorded: Any, current: Any, payload: Any) -> list[Change]:
            return [Change(fact="balance", recorded=1, current=2)]

    stale = Stale("ledger", place.journal_url, tier=0)
    req = new_credit()
    with pytest.raises(Refused) as refused:
        await attempt(gate, stale, call_of(stale, req, lease(place.journal)))
    assert refused.value.code == "stale_premise"
    assert credits(place.journal_url, req.credit_id) == 0
    eid = refused.value.receipt.effect_id
    assert kinds(place.journal, eid) == ["PROPOSED", "REFUSED"]
    assert markers(place.journal_url, eid) == 0


async def test_tier_zero_body_error_rolls_everything_back(place: Place) -> None:
    """A time limit passed: the whole transaction is gone (no entry, no row, no marker), and
    a retry runs the effect afresh. A constraint the body breaks would fail again: refused,
    executed = false, still no row."""
    target = place.target(0, time_limit=timedelta(milliseconds=300))
    gate = Gate(place.journal)
    lease_id = lease(place.journal)
    slow = new_credit(linger_s=1.0)
    with pytest.raises(TimeLimitExceeded, match="ran past its time limit"):
        await attempt(gate, target, call_of(target, slow, lease_id))
    eid = Gate.identify(call_of(target, slow, lease_id))[0]
    assert place.journal.read(eid) == []
    assert credits(place.journal_url, slow.credit_id) == 0
    assert markers(place.journal_url, eid) == 0
    # nothing was recorded: the next attempt is a first dispatch (here one that is quick)
    quick = slow.model_copy(update={"linger_s": 0.0})
    retried = await attempt(gate, target, call_of(target, quick, lease_id))
    assert isinstance(retried, Done) and retried.effect_id == eid
    assert credits(place.journal_url, slow.credit_id) == 1
    bad = new_credit(cents=-5)
    with pytest.raises(Refused) as refused:
        await attempt(gate, target, call_of(target, bad, lease_id))
    assert refused.value.code == "target_rejected"
    assert "IntegrityError" in refused.value.reason or "CheckViolation" in refused.value.reason
    assert refused.value.receipt.executed is False
    assert credits(place.journal_url, bad.credit_id) == 0
    assert kinds(place.journal, refused.value.receipt.effect_id) == ["PROPOSED", "REFUSED"]
    assert place.journal.in_doubt() == []


async def test_tier_zero_decides_a_refusal_about_the_configuration_again(place: Place) -> None:
    """No act_as, then fixed: the REOPENED, the dispatch, the write and the commit in one
    transaction. A body the target rejects after such a re-decision records the REOPENED
    with its refusal (never a REFUSED straight after a REFUSED)."""
    target = place.target(0)
    gate = Gate(place.journal)
    lease_id = lease(place.journal)
    req = new_credit()
    forgot = dataclasses.replace(call_of(target, req, None), principal=None)
    with pytest.raises(Refused) as refused:
        await attempt(gate, target, forgot)
    assert refused.value.configuration == "no_act_as"
    done = await attempt(gate, target, call_of(target, req, lease_id))
    assert isinstance(done, Done) and done.via == "reopened"
    eid = done.effect_id
    assert kinds(place.journal, eid) == [
        "PROPOSED",
        "REFUSED",
        "REOPENED",
        "AUTHORIZED",
        "DISPATCHED",
        "COMMITTED",
    ]
    assert credits(place.journal_url, req.credit_id) == 1 and markers(place.journal_url, eid) == 1

    bad = new_credit(cents=-5)
    with pytest.raises(Refused):
        await attempt(gate, target, dataclasses.replace(call_of(target, bad, None), principal=None))
    with pytest.raises(Refused) as rejected:
        await attempt(gate, target, call_of(target, bad, lease_id))
    assert rejected.value.code == "target_rejected"
    assert kinds(place.journal, rejected.value.receipt.effect_id) == [
        "PROPOSED",
        "REFUSED",
        "REOPENED",
        "REFUSED",
    ]
    assert credits(place.journal_url, bad.credit_id) == 0
    assert place.journal.verify().ok


def _ends_its_transaction(tx: SqlTransaction, req: Credit) -> Credited:
    """A body that tries to commit its write early (a second statement after ``;``)."""
    tx.execute(
        f"INSERT INTO credits (credit_id, account, cents) VALUES ('{req.credit_id}', 'a', 1); "
        "COMMIT"
    )
    return Credited(credit_id=req.credit_id, balance=1)


def _commits(tx: SqlTransaction, req: Credit) -> Credited:
    credit_body(tx, req)
    tx.execute("COMMIT")
    return Credited(credit_id=req.credit_id, balance=0)


@pytest.mark.parametrize("body", [_ends_its_transaction, _commits])
async def test_a_tier_zero_body_cannot_end_the_journals_transaction(
    place: Place, body: Callable[..., Credited]
) -> None:
    """``COMMIT`` (or ``...; COMMIT`` smuggled after a first statement) would commit the
    dispatch and the write without COMMITTED, and leave the effect in doubt: refused, all of
    it rolled back, nothing in doubt."""
    target = place.target(0)
    lease_id = lease(place.journal)
    req = new_credit()
    call = call_of(target, req, lease_id)
    call = dataclasses.replace(call, transaction=functools.partial(target.transact, body))
    with pytest.raises(Refused) as refused:
        await attempt(Gate(place.journal), target, call)
    assert refused.value.code == "target_rejected"
    assert credits(place.journal_url, req.credit_id) == 0
    assert kinds(place.journal, refused.value.receipt.effect_id) == ["PROPOSED", "REFUSED"]
    assert place.journal.in_doubt() == []


async def test_a_tier_zero_result_is_sealed_by_the_codec_inside_the_transaction(
    place: Place,
) -> None:
    """With a codec, the tier-0 result is sealed on the journal's writer thread (a loop of its
    own, not the worker's): stored sealed, read back decoded by a duplicate attempt."""
    from interlock_temporal._worker.codec import CodecSealer
    from interlock_temporal.core.journal import value_of
    from interlock_temporal.core.sealing import Values, is_sealed

    from .test_journal_codec import AesCodec

    target = place.target(0)
    gate = Gate(place.journal, values=Values(place.journal.keyring, CodecSealer(AesCodec())))
    lease_id = lease(place.journal)
    req = new_credit()
    done = await attempt(gate, target, call_of(target, req, lease_id))
    assert isinstance(done, Done) and done.result.credit_id == req.credit_id
    stored = value_of(place.journal.read(done.effect_id), "result")
    assert is_sealed(stored) and req.credit_id not in str(stored)
    again = await attempt(gate, target, call_of(target, req, lease_id))
    assert isinstance(again, Done) and again.via == "duplicate"
    assert again.result == {"credit_id": req.credit_id, "balance": done.result.balance}
    assert credits(place.journal_url, req.credit_id) == 1


async def test_sqlite_time_limit_interrupts_a_long_statement(tmp_path: Path) -> None:
    """SQLite's progress handler stops a statement that runs past the limit (not only a body
    that returns late)."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    journal = open_journal(url, signing_key=SIGNING_KEY)
    create_credits(url)
    target = SqlTarget("ledger", url, tier=0, time_limit=timedelta(milliseconds=200))

    def endless(tx: Any, req: Credit) -> Credited:
        tx.execute(
            "INSERT INTO credits (credit_id, account, cents) VALUES (?, 'a', 1)", (req.credit_id,)
        )
        tx.fetchone(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"
        )
        raise AssertionError("not reached")

    req = new_credit()
    call = dataclasses_replace(
        call_of(target, req, lease(journal)), functools.partial(target.transact, endless)
    )
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeLimitExceeded):
        await Gate(journal).begin(call, target)
    assert asyncio.get_running_loop().time() - started < 5
    assert journal.read(Gate.identify(call)[0]) == []
    assert credits(url, req.credit_id) == 0
    journal.close()


def dataclasses_replace(call: Call, transaction: Any) -> Call:
    import dataclasses

    return dataclasses.replace(call, transaction=transaction)


# -- tier 2: a marker in the target's own database --------------------------------------------


async def test_marker_tier_finds_a_write_whose_record_was_lost(place: Place) -> None:
    """The body and its marker commit in the target's database; the worker dies before
    COMMITTED is recorded; the next attempt finds the marker: COMMITTED via recovery-query,
    one row."""
    target = place.target(2)
    gate = Gate(place.journal)
    req = new_credit()
    call = call_of(target, req, lease(place.journal))
    step = await gate.begin(call, target)
    assert isinstance(step, Ticket)
    await asyncio.to_thread(target.run, credit_body, step.args, step.effect_id)
    step.release()  # the crash: the claim dies with the worker, COMMITTED never written
    assert [r.effect_id for r in place.journal.in_doubt()] == [step.effect_id]
    done = await attempt(gate, target, call)
    assert isinstance(done, Done) and done.via == "recovery-query"
    assert done.result["credit_id"] == req.credit_id
    assert credits(place.other_url, req.credit_id) == 1
    assert markers(place.other_url, step.effect_id) == 1
    assert place.journal.in_doubt() == []
    assert gate.receipt(step.effect_id).tier == 2


async def test_marker_tier_failures_roll_back(place: Place) -> None:
    """A body that breaks a constraint: rolled back in the target's database (no row, no
    marker) and refused; a resend after a failure that may pass (a time limit) goes through."""
    target = place.target(2, time_limit=timedelta(milliseconds=300))
    gate = Gate(place.journal)
    lease_id = lease(place.journal)
    bad = new_credit(cents=0)
    with pytest.raises(Refused) as refused:
        await attempt(gate, target, call_of(target, bad, lease_id))
    assert refused.value.code == "target_rejected"
    eid = refused.value.receipt.effect_id
    assert (credits(place.other_url, bad.credit_id), markers(place.other_url, eid)) == (0, 0)
    slow = new_credit(linger_s=1.0)
    with pytest.raises(TimeLimitExceeded):
        await attempt(gate, target, call_of(target, slow, lease_id))
    assert credits(place.other_url, slow.credit_id) == 0
    eid = Gate.identify(call_of(target, slow, lease_id))[0]
    assert kinds(place.journal, eid)[-1] == "NOT_SENT"  # nothing happened: a retry may send
    assert markers(place.other_url, eid) == 0


# -- beside ordinary effects --------------------------------------------------------------------


class Notes(BaseTarget):
    """An ordinary target (tier 3) for the effects the tier-0 ones run beside."""

    name = "notes"
    tier = 3

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {}


async def test_tier_zero_beside_64_ordinary_effects(place: Place) -> None:
    """Tier-0 transactions (each holding the journal's write transaction for a while) run in
    the same process as 64 ordinary gated effects in flight at once: they queue behind each
    other, none fails (no `database is locked`), every effect is committed."""
    target = place.target(0)
    gate = Gate(place.journal)
    lease_id = place.journal.leases.issue(
        PRINCIPAL, activities=["credit", "note"], ttl=timedelta(hours=1)
    )
    notes = Notes()

    async def ordinary(i: int) -> Any:
        call = Call(
            effect_type="note",
            activity="note",
            input={"n": i},
            args=({"n": i},),
            principal=PRINCIPAL,
            lease_id=lease_id,
        )

        async def send(ticket: Ticket) -> dict[str, int]:
            await asyncio.sleep(0.001 * (i % 7))
            return {"n": i}

        return await gate.run(call, notes, send)

    reqs = [new_credit(linger_s=0.02) for _ in range(8)]
    outcomes = await asyncio.wait_for(
        asyncio.gather(
            *(ordinary(i) for i in range(64)),
            *(attempt(gate, target, call_of(target, r, lease_id)) for r in reqs),
            return_exceptions=True,
        ),
        60,
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert errors == []
    assert len(place.journal.effects(status=Kind.COMMITTED)) == 72
    assert place.journal.in_doubt() == []
    for r in reqs:
        assert credits(place.journal_url, r.credit_id) == 1
    assert place.journal.verify().ok


# -- what is refused, and when ------------------------------------------------------------------


def test_gated_refuses_tier_zero_without_the_transactional_protocol() -> None:
    class Claims(Notes):
        name = "claims"
        tier = 0

    with pytest.raises(TargetDeclarationError) as refused:

        @gated(target=Claims())
        async def write(x: int) -> int:
            return x

    assert str(refused.value).startswith(
        "target claims: declares tier 0 but cannot run its write inside the journal's "
        "transaction: it lacks `def transact("
    )
    assert "Use SqlTarget (interlock_temporal.targets.sql)" in str(refused.value)


def test_sql_target_declarations(tmp_path: Path) -> None:
    with pytest.raises(TargetDeclarationError, match="target ledger: tier must be 0"):
        SqlTarget("ledger", f"sqlite:///{tmp_path / 'x.db'}", tier=1)
    with pytest.raises(TargetDeclarationError, match="target ledger: database must be a"):
        SqlTarget("ledger", "mysql://db/x")
    with pytest.raises(TargetDeclarationError, match="time_limit must be a positive"):
        SqlTarget("ledger", f"sqlite:///{tmp_path / 'x.db'}", time_limit=timedelta(0))
    target = SqlTarget("ledger", "postgresql://u:hunter2@db.example:5433/books", tier=0)
    assert "hunter2" not in repr(target)
    with pytest.raises(TypeError, match="take it first, def credit\\(tx: SqlTransaction"):

        @gated(target=target)
        def credit() -> None: ...


# -- on a real Temporal dev server ----------------------------------------------------------------


@pytest.mark.server
async def test_worker_refuses_tier_zero_on_another_database(
    client: Client, tmp_path: Path, postgres: PostgresServer
) -> None:
    ledger = tmp_path / "ledger.db"
    journal_db = tmp_path / "journal.db"
    target = SqlTarget("ledger", f"sqlite:///{ledger}", tier=0)
    with pytest.raises(WorkerSetupError) as refused:
        Worker(
            client,
            task_queue=f"sql-{uuid.uuid4().hex[:8]}",
            activities=[credit_activity(target)],
            plugins=[InterlockPlugin(f"sqlite:///{journal_db}", signing_key=SIGNING_KEY)],
        )
    assert str(refused.value) == (
        "gated activity 'credit': target ledger declares tier 0 (its write commits in the "
        f"journal's own transaction), but its database sqlite:///{ledger} is not the "
        f"journal's (sqlite:///{journal_db}): point the target at the journal's database, or "
        "declare tier=2 (a marker table in the target's own database)"
    )
    # PostgreSQL: another database on the same server; the password never shown
    other = postgres.database(f"ledger_{uuid.uuid4().hex[:8]}").replace(
        "postgres@", "postgres:s3cret-pw@"
    )
    with pytest.raises(WorkerSetupError) as refused:
        Worker(
            client,
            task_queue=f"sql-{uuid.uuid4().hex[:8]}",
            activities=[credit_activity(SqlTarget("ledger", other, tier=0))],
            plugins=[InterlockPlugin(postgres.url, signing_key=SIGNING_KEY)],
        )
    assert "target ledger declares tier 0" in str(refused.value)
    assert "postgres:***@127.0.0.1" in str(refused.value)
    assert "s3cret-pw" not in str(refused.value)
    assert f"is not the journal's ({postgres.url})" in str(refused.value)
    # the journal's own database (spelled through a symlinked directory) is accepted
    (tmp_path / "alias").symlink_to(tmp_path)
    create_credits(f"sqlite:///{journal_db}")
    same = SqlTarget("ledger", f"sqlite:///{tmp_path / 'alias' / 'journal.db'}", tier=0)
    Worker(
        client,
        task_queue=f"sql-{uuid.uuid4().hex[:8]}",
        activities=[credit_activity(same)],
        plugins=[InterlockPlugin(f"sqlite:///{journal_db}", signing_key=SIGNING_KEY)],
    )
    assert rows(f"sqlite:///{journal_db}", "SELECT COUNT(*) FROM interlock_markers") == [(0,)]


@pytest.mark.server
async def test_tier_zero_end_to_end(client: Client, tmp_path: Path) -> None:
    """No crash: the workflow gets the body's result; one row, one marker, COMMITTED."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    open_journal(url, signing_key=SIGNING_KEY).close()
    create_credits(url)
    queue = f"sql-{uuid.uuid4().hex[:8]}"
    target = SqlTarget("ledger", url, tier=0)
    journal = open_journal(url, signing_key=SIGNING_KEY)
    lease_id = journal.leases.issue(PRINCIPAL, activities=["credit"])
    # the result rules see what a tier-0 body returned, as for any other tier
    seen: list[Any] = []

    def mask(e: CallEvent) -> Decision | None:
        seen.append(e.result)
        rich = e.result.balance > 1000
        return modify(e.result.model_copy(update={"balance": -1})) if rich else None

    policy = Policy(result_rules=[mask])
    plugin = InterlockPlugin(journal, signing_key=SIGNING_KEY, policy=policy)
    req = new_credit()
    async with Worker(
        client,
        task_queue=queue,
        workflows=[CallActivity],
        activities=[credit_activity(target)],
        plugins=[plugin],
    ):
        spec = {"activity": "credit", "arg": req.model_dump(), "principal": PRINCIPAL}
        result = await client.execute_workflow(
            CallActivity.run, {**spec, "lease": lease_id}, id=queue, task_queue=queue
        )
        assert result == {"credit_id": req.credit_id, "balance": 250}
        assert seen == [Credited.model_validate(result)]
        rich = new_credit(cents=5000)
        masked = await client.execute_workflow(
            CallActivity.run,
            {**spec, "arg": rich.model_dump(), "lease": lease_id},
            id=f"{queue}-rich",
            task_queue=queue,
        )
        assert masked == {"credit_id": rich.credit_id, "balance": -1}
        assert credits(url, rich.credit_id) == 1
        bad = new_credit(cents=-1)
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                CallActivity.run,
                {**spec, "arg": bad.model_dump(), "lease": lease_id},
                id=f"{queue}-bad",
                task_queue=queue,
            )
    cause = failed.value.cause.cause  # type: ignore[union-attr]
    assert cause.type == "EffectRefused" and cause.non_retryable
    assert "target_rejected: the target rejected the request (IntegrityError)" in str(cause)
    assert credits(url, req.credit_id) == 1 and credits(url, bad.credit_id) == 0
    assert journal.in_doubt() == []
    journal.close()


#: where a worker dies: before the transaction (before the body), inside it (before the body,
#: and after the body, the marker and COMMITTED, before the COMMIT), and after the commit,
#: before the result returns
KILL_POINTS = (
    "before_dispatch_tx",
    "atomic_before_body",
    "atomic_before_commit",
    "after_commit_tx",
)


@pytest.mark.server
async def test_tier_zero_sigkill_at_each_point(
    dev_server: DevServer, client: Client, tmp_path: Path
) -> None:
    """One real SIGKILL per point, workers in processes of their own, four stories at once on
    one SQLite journal (the make-faults matrix runs both databases, many times)."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    open_journal(url, signing_key=SIGNING_KEY).close()
    create_credits(url)
    stories = await asyncio.gather(
        *(kill_story(client, dev_server.target, url, p, tmp_path, ROOT) for p in KILL_POINTS)
    )
    for point, story in zip(KILL_POINTS, stories, strict=True):
        assert story["killed"], point
        assert story["result"]["credit_id"] == story["credit_id"], point
        assert (story["rows"], story["markers"]) == (1, 1), point
        assert (story["final"], story["executed"], story["ambiguous"]) == ("COMMITTED", True, 0)
        assert story["in_doubt"] == 0, point


@pytest.mark.server
async def test_the_docs_ledger_example(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/targets.md's ledger.py as written, on a worker whose plugin opens the same journal:
    the credit lands once, its record in the same transaction."""
    url = f"sqlite:///{tmp_path / 'interlock.db'}"
    monkeypatch.setenv("INTERLOCK_JOURNAL", url)
    ledger = load(snippet("docs/targets.md#b742b182a411"), tmp_path / "ledger.py")
    journal = open_journal(url, signing_key=SIGNING_KEY)
    create_credits(url)
    lease_id = journal.leases.issue(PRINCIPAL, activities=["credit"])
    queue = f"ledger-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[CallActivity],
        activities=[ledger.credit],
        plugins=[InterlockPlugin(journal=ledger.JOURNAL, signing_key=SIGNING_KEY)],
    ):
        arg = {"credit_id": "c-doc-1", "account": "acct-d", "cents": 700}
        spec = {"activity": "credit", "arg": arg, "principal": PRINCIPAL, "lease": lease_id}
        for run in range(2):  # the second is the same effect: answered from the journal
            result = await client.execute_workflow(
                CallActivity.run, spec, id=f"{queue}-{run}", task_queue=queue
            )
            assert result == {"credit_id": "c-doc-1", "balance": 700}
    assert rows(url, "SELECT account, cents FROM credits") == [("acct-d", 700)]
    (row,) = journal.effects()
    assert row.status is Kind.COMMITTED and journal.in_doubt() == []
    assert journal.read(row.effect_id)[0].data["tier"] == 0
    journal.close()


async def test_tier_zero_in_doubt_is_recovered_through_its_marker(place: Place) -> None:
    """A tier-0 effect is never left in doubt by a crash; one that is anyway (sent while its
    target was tier 2 on the same database, as here, or a journal edited by hand) is settled
    through the marker, never resent blindly: found, COMMITTED via recovery-query; absent
    (the send never committed), sent once, through a transaction of its own with the marker."""
    create_credits(place.journal_url)
    as_tier_two = SqlTarget("ledger", place.journal_url, tier=2)
    target = place.target(0)
    gate = Gate(place.journal)
    lease_id = lease(place.journal)
    landed, lost = new_credit(), new_credit()
    for req, sent in ((landed, True), (lost, False)):
        step = await gate.begin(call_of(as_tier_two, req, lease_id), as_tier_two)
        assert isinstance(step, Ticket)
        if sent:
            await asyncio.to_thread(as_tier_two.run, credit_body, step.args, step.effect_id)
        step.release()  # the crash
    assert len(place.journal.in_doubt()) == 2
    found = await attempt(gate, target, call_of(target, landed, lease_id))
    assert isinstance(found, Done) and found.via == "recovery-query"
    resent = await attempt(gate, target, call_of(target, lost, lease_id))
    assert isinstance(resent, Done) and resent.via == "recovery-reapply"
    for req in (landed, lost):
        assert credits(place.journal_url, req.credit_id) == 1
    assert place.journal.in_doubt() == []
