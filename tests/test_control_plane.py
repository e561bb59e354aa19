"""A signed control plane (issue 33), as someone with write access to the journal's database and
none of its keys would try it, on SQLite and PostgreSQL: each edit of a lease's row or of what
its budget has reserved sends nothing and is named by ``verify``; an older row put back is
refused (a lease's document) or named by ``verify`` (a budget's row: a rollback, as a chain's
cut tail is). The money is read from the payments service, never from the gate."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from interlock_temporal.core.errors import JournalConfigError, NeedsApproval, Refused, RowCorrupt
from interlock_temporal.core.journal import SCHEMA_VERSION, lease_chain, open_journal
from interlock_temporal.core.journal.control_check import ChargeFold
from interlock_temporal.core.journal.signing import Ed25519Key
from interlock_temporal.core.models import ControlCheck, Kind
from interlock_temporal.core.policy import Accounts, CallEvent, Limits, Policy, PolicyGuard, Verdict
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.receipts import receipt
from interlock_temporal.targets.payments import RefundRequest, SimulatedCrash, SimulatedPayments

from .fixtures import make_release_journal as release
from .test_cli import cli
from .test_policy_store import BEFORE_SCHEMA_13, new_store

__all__ = ["cli", "new_store"]

KEY = "c7" * 32


def run_sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A statement run on the journal's database through a connection of its own, as the
    attacker's database client runs it (``?`` placeholders)."""
    if url.startswith("sqlite:///"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            return db.execute(statement, params).fetchall()
        finally:
            db.close()
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


class World:
    """A journal of one backend, a $30 budget on lease L ($50 per refund), and the payments
    service holding order #990 ($100 paid)."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.journal = open_journal(url, signing_key=KEY)
        self.payments = SimulatedPayments(tmp_path / f"pay-{id(self)}.db", tier=2)
        self.payments.open_order(release.ORDER, release.PAID_CENTS)
        self.lease = self.journal.leases.issue(
            "refund-bot", activities=["refund"], max_amount_cents=5_000, budget_cents=3_000
        )

    async def refund(self, case: str, cents: int, policy: PolicyGuard | None = None) -> Any:
        req = release.request(case, cents, self.payments)

        async def send(ticket: Ticket) -> Any:
            r: RefundRequest = ticket.input
            return await self.payments.refund(
                r.order_id, r.amount_cents, idempotency_key=ticket.effect_id
            )

        return await Gate(self.journal, policy=policy).run(
            release.call(req, self.lease, f"wf-{case}"), self.payments, send
        )

    @property
    def money(self) -> int:
        """What the payments service has refunded on the order."""
        return self.payments.refunded_cents(release.ORDER)

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return run_sql(self.url, statement, params)

    def doc(self) -> dict[str, Any]:
        ((doc,),) = self.sql("SELECT doc FROM leases WHERE lease_id = ?", (self.lease,))
        return dict(json.loads(doc))

    def put_doc(self, doc: dict[str, Any]) -> None:
        self.sql("UPDATE leases SET doc = ? WHERE lease_id = ?", (json.dumps(doc), self.lease))

    def problems(self) -> list[str]:
        report = self.journal.verify()
        assert report.control is not None, report  # the entries verified: the rows were checked
        assert report.ok is not bool(report.control.problems)
        return list(report.control.problems)

    def close(self) -> None:
        self.journal.close()
        self.payments.close()


@pytest.fixture(params=[False, True], ids=["separate", "combined"])
def world(
    new_store: Callable[[], str], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[World]:
    """A store with a budgeted lease; its dispatches written as separate entries, or combined
    as one of format 3 (whose authorization signs the lease head)."""
    w = World(new_store(), tmp_path)
    journal: Any = w.journal
    journal.combine_dispatch = request.param or journal.combine_dispatch
    yield w
    w.close()


async def test_a_lowered_reservation_sends_nothing_and_verify_names_it(world: World) -> None:
    await world.refund("a", 2_000)
    with pytest.raises(Refused, match="budget"):
        await world.refund("b", 2_000)
    assert world.problems() == []
    world.sql("UPDATE lease_spend SET reserved_cents = 0 WHERE lease_id = ?", (world.lease,))
    with pytest.raises(RowCorrupt, match=rf"lease_spend\[{world.lease}\].*seal does not match"):
        await world.refund("c", 2_000)
    assert world.money == 2_000
    (problem,) = world.problems()
    assert problem.startswith(f"lease_spend[{world.lease}]: reserved_cents is 0")


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"revoked_at": None}, id="un-revoked"),
        pytest.param({"revoked_at": None, "max_amount_cents": None}, id="limits-raised"),
    ],
)
async def test_an_edited_lease_sends_nothing_and_verify_names_it(
    world: World, edit: dict[str, Any]
) -> None:
    await world.refund("a", 2_000)
    assert world.journal.leases.revoke(world.lease)
    with pytest.raises(Refused, match="lease"):
        await world.refund("b", 500)
    world.put_doc({**world.doc(), **edit})
    with pytest.raises(RowCorrupt, match=rf"leases\[{world.lease}\].*seal does not match"):
        await world.refund("c", 500)
    with pytest.raises(RowCorrupt):
        world.journal.leases.get(world.lease)  # the tools refuse it too
    assert world.money == 2_000
    (problem,) = world.problems()
    assert problem.startswith(f"leases[{world.lease}]: its document is not the one")


async def test_an_older_lease_row_put_back_sends_nothing_and_verify_names_it(
    world: World,
) -> None:
    """The row as it stood before the revocation, seal and all: a seal proves who wrote a row,
    not that it is the latest; the chain's head does."""
    await world.refund("a", 1_000)
    before = world.sql(
        "SELECT doc, head_seq, head_hash, seal FROM leases WHERE lease_id = ?", (world.lease,)
    )[0]
    assert world.journal.leases.revoke(world.lease)
    world.sql(
        "UPDATE leases SET doc = ?, head_seq = ?, head_hash = ?, seal = ? WHERE lease_id = ?",
        (*before, world.lease),
    )
    with pytest.raises(RowCorrupt, match="not the latest of its chain's signed entries"):
        await world.refund("b", 1_000)
    assert world.money == 1_000
    (problem,) = world.problems()
    assert "an older row put back" in problem and problem.startswith(f"leases[{world.lease}]")


async def test_a_budget_row_rolled_back_is_named_by_verify(world: World) -> None:
    """Putting back the budget's row as it was sealed at issue (nothing reserved) is a
    rollback: a seal cannot tell it from the latest, and the dispatch reads it (as it would
    read a chain whose newest entries were deleted). ``verify`` derives the budget from the
    charges DISPATCHED signs and names the dispatch made against the lowered total, and the
    row; the operator guide says so."""
    issued = world.sql(
        "SELECT reserved_cents, seal FROM lease_spend WHERE lease_id = ?", (world.lease,)
    )[0]
    await world.refund("a", 2_000)
    world.sql(
        "UPDATE lease_spend SET reserved_cents = ?, seal = ? WHERE lease_id = ?",
        (*issued, world.lease),
    )
    await world.refund("b", 2_000)
    assert world.money == 4_000  # over the $30 budget: what verify must name
    problems = world.problems()
    assert any("dispatched against lease" in p and "0 cents reserved" in p for p in problems)
    assert any(
        p.startswith(f"lease_spend[{world.lease}]: reserved_cents is 2000") for p in problems
    )


async def test_a_dispatch_signs_the_lease_head_it_was_read_at(world: World) -> None:
    await world.refund("a", 1_000)
    (eid,) = [r.effect_id for r in world.journal.effects()]
    # the dispatch transaction's AUTHORIZED signs the lease as it read it, head and all
    (authorized,) = [e for e in world.journal.read(eid) if e.kind is Kind.AUTHORIZED]
    (issued,) = world.journal.read(lease_chain(world.lease))
    assert authorized.data["lease"]["head"] == f"{issued.seq}:{issued.hash}"
    assert issued.data["event"] == "issued" and issued.data["lease"]["budget_cents"] == 3_000


def test_a_lease_row_with_no_signed_entry_is_refused(world: World) -> None:
    """A lease inserted with a database client: no chain, no seal."""
    doc = {**world.doc(), "lease_id": "lease-forged", "max_amount_cents": 10_000}
    world.sql("INSERT INTO leases (lease_id, doc) VALUES (?, ?)", ("lease-forged", json.dumps(doc)))
    with pytest.raises(RowCorrupt, match=r"leases\[lease-forged\].*carries no seal"):
        world.journal.leases.get("lease-forged")
    assert any(p.startswith("leases[lease-forged]: no signed entry") for p in world.problems())


def test_the_upgrade_signs_the_leases_as_they_stand_and_needs_the_signing_key(
    new_store: Callable[[], str],
) -> None:
    """A journal of schema 9 with a lease: a process that can only verify cannot upgrade it;
    one with the signing key signs the lease as its row stands (a ``migrated`` entry) and seals
    it. The release fixture's upgrade, with an effect in doubt that recovers after it, is
    tests/test_journal_sqlite.py's."""
    url = new_store()
    key = Ed25519Key.generate()
    signing = f"ed25519:{key.seed_hex()}"
    with open_journal(url, signing_key=signing) as journal:
        journal.leases.issue("refund-bot", activities=["refund"])
    for statement in (
        "UPDATE meta SET value = '9' WHERE key = 'schema_version'",
        "ALTER TABLE leases DROP COLUMN head_seq",
        "ALTER TABLE leases DROP COLUMN head_hash",
        "ALTER TABLE leases DROP COLUMN seal",
        "ALTER TABLE lease_spend DROP COLUMN seal",
        # and the policy's rows unsealed (schema 11)
        "ALTER TABLE policy_sessions DROP COLUMN head",
        *(
            f"ALTER TABLE {table} DROP COLUMN seal"
            for table in (
                "policy_sessions",
                "policy_spend",
                "policy_admissions",
                "policy_approvals",
            )
        ),
        *BEFORE_SCHEMA_13,
    ):
        run_sql(url, statement)
    with pytest.raises(JournalConfigError, match="open it once with its signing key"):
        open_journal(url, public_keys=[key.public_text]).close()
    with open_journal(url, signing_key=signing) as journal:
        (lease,) = journal.leases.list()
        assert journal.verify().ok
        events = [e.data["event"] for e in journal.read(lease_chain(lease.lease_id))]
        assert events == ["issued", "migrated"]


def test_verify_on_the_command_line_names_the_row(world: World, cli: Any) -> None:
    """``interlock journal verify`` shows the rows it checked, and an edited one by name
    (exit 1), not as an entry's seq."""
    flags = ["--journal", world.url, "--signing-key", KEY]
    ok = cli("journal", "verify", *flags)
    rows = "1 lease(s), 1 budget(s), 0 dispatch(es), 0 policy row(s): ok"
    assert ok.code == 0 and rows in ok.out, ok.out
    world.sql("UPDATE lease_spend SET reserved_cents = 99 WHERE lease_id = ?", (world.lease,))
    bad = cli("journal", "verify", *flags)
    assert bad.code == 1
    assert "FAILED: a row the gate reads does not match" in bad.out
    assert f"lease_spend[{world.lease}]: reserved_cents is 99" in bad.out
    assert "seq None" not in bad.out


# -- the policy's rows ----------------------------------------------------------------------------


def hitl(world: World) -> PolicyGuard:
    """Every refund needs a person's approval."""
    return PolicyGuard(Policy(Limits(hitl_activities=("refund",))), world.journal.policy)


async def test_a_forged_approval_sends_nothing_and_verify_names_it(world: World) -> None:
    with pytest.raises(NeedsApproval) as asked:
        await world.refund("a", 2_000, hitl(world))
    binding = asked.value.binding
    ((doc,),) = world.sql("SELECT doc FROM policy_approvals WHERE binding = ?", (binding,))
    forged = {**json.loads(doc), "status": "approved", "operators": ["carol"], "scope": "once"}
    world.sql(
        "UPDATE policy_approvals SET doc = ? WHERE binding = ?", (json.dumps(forged), binding)
    )
    with pytest.raises(RowCorrupt, match=rf"policy_approvals\[{binding}\].*seal does not match"):
        await world.refund("a", 2_000, hitl(world))
    assert world.money == 0
    (problem,) = world.problems()
    assert problem.startswith(f"policy_approvals[{binding}]:")


async def test_a_used_approval_put_back_is_named_by_verify(world: World) -> None:
    """A once-approval, used, then its row put back as it was when approved (seal and all): a
    rollback, read as it stands (as a budget's row is), and named by ``verify`` against the
    notes that decided and used it."""
    with pytest.raises(NeedsApproval) as asked:
        await world.refund("a", 2_000, hitl(world))
    binding = asked.value.binding
    world.journal.policy.decide_approval(binding, approve=True, operators=["carol"])
    approved = world.sql("SELECT doc, seal FROM policy_approvals WHERE binding = ?", (binding,))[0]
    await world.refund("a", 2_000, hitl(world))
    assert world.money == 2_000 and world.problems() == []
    world.sql(
        "UPDATE policy_approvals SET doc = ?, seal = ? WHERE binding = ?", (*approved, binding)
    )
    (problem,) = world.problems()
    assert problem.startswith(f"policy_approvals[{binding}]: it says 'approved'")
    assert "approval_used" in problem


def trip(world: World, session: str = "wf-loop") -> PolicyGuard:
    """A session whose circuit a loop of identical calls tripped."""
    guard = PolicyGuard(Policy(Limits(max_repeat_calls=2)), world.journal.policy)
    for i in range(3):
        event = CallEvent(activity="search", args=("same",), principal="bot", session=session)
        guard.check(event, Accounts.of(event, f"run/{i}"), delivery=f"run/{i}/1")
    state = world.journal.policy.session(session)
    assert state is not None and state.circuit is not None
    return guard


def again(guard: PolicyGuard, session: str = "wf-loop") -> Verdict:
    event = CallEvent(activity="search", args=("other",), principal="bot", session=session)
    return guard.check(event, Accounts.of(event, "run/9"), delivery="run/9/1").verdict


def test_a_circuit_closed_by_an_edit_stays_closed_to_the_agent(world: World) -> None:
    guard = trip(world)
    ((doc,),) = world.sql("SELECT doc FROM policy_sessions WHERE session = ?", ("wf-loop",))
    closed = {**json.loads(doc), "circuit": None, "streak": 0}
    world.sql(
        "UPDATE policy_sessions SET doc = ? WHERE session = ?", (json.dumps(closed), "wf-loop")
    )
    with pytest.raises(RowCorrupt, match=r"policy_sessions\[wf-loop\].*seal does not match"):
        again(guard)
    assert any(p.startswith("policy_sessions[wf-loop]:") for p in world.problems())


def test_a_session_row_put_back_from_before_its_trip_is_refused(world: World) -> None:
    guard = PolicyGuard(Policy(Limits(max_repeat_calls=2)), world.journal.policy)
    event = CallEvent(activity="search", args=("same",), principal="bot", session="wf-loop")
    guard.check(event, Accounts.of(event, "run/0"), delivery="run/0/1")
    before = world.sql(
        "SELECT doc, head, seal FROM policy_sessions WHERE session = ?", ("wf-loop",)
    )[0]
    trip(world)
    world.sql(
        "UPDATE policy_sessions SET doc = ?, head = ?, seal = ? WHERE session = ?",
        (*before, "wf-loop"),
    )
    with pytest.raises(RowCorrupt, match="not the latest of its policy chain's notes"):
        again(guard)
    assert any("policy_sessions[wf-loop]" in p for p in world.problems())


def test_a_deleted_session_row_does_not_close_its_circuit(world: World) -> None:
    guard = trip(world)
    world.sql("DELETE FROM policy_sessions WHERE session = ?", ("wf-loop",))
    with pytest.raises(RowCorrupt, match=r"policy_sessions\[wf-loop\]"):
        again(guard)


@pytest.mark.parametrize("table", ["policy_spend", "policy_admissions"])
def test_a_lowered_spend_or_a_forged_admission_is_refused(world: World, table: str) -> None:
    """Lower spend lets more through a USD budget; an admission row says an execution was
    charged already (so it is not charged again)."""
    limits = Limits(costs={"search": 1.0}, principal_budget_usd=10.0)
    guard = PolicyGuard(Policy(limits), world.journal.policy)
    event = CallEvent(activity="search", args=("q",), principal="bot", session="wf-s")
    assert guard.check(event, Accounts.of(event, "run/1"), delivery="run/1/1").verdict is (
        Verdict.ALLOW
    )
    if table == "policy_spend":
        world.sql("UPDATE policy_spend SET spent_usd = 0")
    else:
        world.sql(
            "INSERT INTO policy_admissions (execution, session, principal, namespace, "
            "estimate_usd, ts) VALUES (?, ?, ?, ?, ?, ?)",
            ("run/2", "wf-s", "bot", "-", 0.0, 0.0),
        )
    with pytest.raises(RowCorrupt, match=rf"{table}\["):
        guard.check(event, Accounts.of(event, "run/2"), delivery="run/2/1")
    assert any(p.startswith(f"{table}[") for p in world.problems())


SCHEMA_9 = (
    "UPDATE meta SET value = '9' WHERE key = 'schema_version'",
    *(f"ALTER TABLE leases DROP COLUMN {c}" for c in ("head_seq", "head_hash", "seal")),
    "ALTER TABLE lease_spend DROP COLUMN seal",
    "ALTER TABLE policy_sessions DROP COLUMN head",
    *(
        f"ALTER TABLE {table} DROP COLUMN seal"
        for table in ("policy_sessions", "policy_spend", "policy_admissions", "policy_approvals")
    ),
    *BEFORE_SCHEMA_13,
)


async def test_an_effect_in_doubt_recovers_after_the_upgrade(world: World) -> None:
    """A journal of schema 9 (a budgeted lease, an effect whose refund landed and whose worker
    died before recording it, a session whose circuit a loop tripped): upgraded by its first
    open with the signing key, the effect recovers by asking the service (sent once, as the
    service shows), its charge on the budget kept; the tripped circuit stays open; every row
    checks against the entries."""
    trip(world)
    world.payments.arm("after_commit", "crash")
    with contextlib.suppress(SimulatedCrash):
        await world.refund("a", 2_000)
    (row,) = world.journal.in_doubt()
    world.journal.close()
    for statement in SCHEMA_9:
        run_sql(world.url, statement)
    world.journal = open_journal(world.url, signing_key=KEY)
    assert world.journal.schema_version() == SCHEMA_VERSION
    assert world.problems() == []
    done = await world.refund("a", 2_000)
    assert receipt(row.effect_id, journal=world.journal).via == "recovery-query"
    assert done is not None and world.money == 2_000  # the one refund, found
    lease = world.journal.leases.get(world.lease)
    assert lease is not None and lease.reserved_cents == 2_000
    state = world.journal.policy.session("wf-loop")
    assert state is not None and state.circuit is not None
    assert world.problems() == []


def test_each_dispatch_is_judged_against_its_lease_chain_as_it_stood_at_its_seq(
    tmp_path: Path,
) -> None:
    """The fold's check of the lease head a dispatch signs (``ChargeFold``): the chain's latest
    entry before the dispatch's seq, found by bisection. A dispatch that signs an entry the
    chain had moved on from (the gate fooled by an older row put back) is named; one that
    signs the latest of its time is not, on either side of the chain's next entry."""
    with open_journal(f"sqlite:///{tmp_path / 'j.db'}", signing_key="6b" * 32) as journal:
        lease = journal.leases.issue("bot", activities=["refund"])
        journal.leases.revoke(lease)
        issued, revoked = journal.read(lease_chain(lease))
    heads = {e.seq: f"{e.seq}:{e.hash}" for e in (issued, revoked)}
    cases = [
        (issued.seq + 1, heads[issued.seq], False),  # right after issue: its latest
        (revoked.seq + 1, heads[revoked.seq], False),  # after the revoke, against it
        (revoked.seq + 1, heads[issued.seq], True),  # after the revoke, against the issue
        (issued.seq, heads[issued.seq], True),  # before its own entry existed
    ]
    for seq, head, named in cases:
        fold = ChargeFold({lease: [issued, revoked]})
        fold.apply((seq, "e" * 64, Kind.AUTHORIZED.value, (lease, head), None))
        found = ControlCheck()
        fold.finish(found)
        assert found.dispatches == 1
        assert bool(found.problems) is named, (seq, head, found.problems)
        if named:
            assert f"dispatched against lease {lease}'s entry" in found.problems[0]
