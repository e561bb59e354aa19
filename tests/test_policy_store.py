"""The policy's state in the journal's SQLite store, and the policy inside the effect protocol:
shared by processes, updated atomically, retries charged once, resets journaled, and a
duplicate of a committed effect answered without reaching the policy."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from interlock_temporal import gated
from interlock_temporal._worker.gated import spec_of
from interlock_temporal.core.errors import Denied, InvalidCall, JournalUnavailable, NeedsApproval
from interlock_temporal.core.journal import SCHEMA_VERSION, Journal, open_journal, policy_chain
from interlock_temporal.core.models import Kind
from interlock_temporal.core.policy import (
    Accounts,
    CallEvent,
    Decision,
    Limits,
    Policy,
    PolicyGuard,
    Reason,
    Verdict,
    call_binding,
    deny_when,
    dump_session,
    enforce,
    input_digest,
    modify,
)
from interlock_temporal.core.protocol import Done, Gate, Ticket
from interlock_temporal.core.receipts import fold, receipt_of
from interlock_temporal.testing import PostgresServer

from .refund_story import Store, store  # noqa: F401 (a fixture)
from .test_protocol import KEY, NOTE, MemTarget, make_call, payload

#: what takes a store of schema 13 back to the entries and indexes of schema 12: no chain links
#: (``prev_seq``, and their index of successors), the index of chains (by effect and prev), and
#: the index of whole origins.
#: A test that rewrites a store as an older schema runs these too, so that the upgrade from it
#: fills the links again
BEFORE_SCHEMA_13 = (
    "DROP INDEX entries_next",
    "ALTER TABLE entries DROP COLUMN prev_seq",
    "CREATE UNIQUE INDEX entries_chain ON entries (effect_id, substr(prev, 1, 16))",
    "DROP INDEX effects_origin",
    "CREATE INDEX effects_origin ON effects (origin) WHERE origin IS NOT NULL",
)


@pytest.fixture(params=["sqlite", "postgres"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """Fresh, empty stores of one backend: SQLite files, or PostgreSQL databases on the
    session's throwaway cluster."""
    made: list[int] = []

    def make() -> str:
        made.append(1)
        if request.param == "sqlite":
            return f"sqlite:///{tmp_path / f'store-{len(made)}.db'}"
        server: PostgresServer = request.getfixturevalue("postgres")
        return server.database(f"policy_{uuid.uuid4().hex[:12]}")

    return make


@pytest.fixture
def journal(new_store: Callable[[], str]) -> Iterator[Journal]:
    j = open_journal(new_store(), signing_key=KEY)
    yield j
    report = j.verify()
    j.close()
    assert report.ok, str(report)


def search(
    query: str, session: str = "wf-1", execution: str = "run/1"
) -> tuple[CallEvent, Accounts]:
    event = CallEvent(activity="search", args=(query,), principal="bot", session=session)
    return event, Accounts.of(event, execution)


def test_a_retry_of_one_execution_is_charged_once_and_its_cost_recorded_once(
    journal: Journal,
) -> None:
    guard = PolicyGuard(
        Policy(Limits(session_budget_usd=1.0, costs={"search": 0.25})), journal.policy
    )
    event, accounts = search("q")
    assert guard.check(event, accounts, delivery="run/1/1").verdict is Verdict.ALLOW
    assert guard.check(event, accounts, delivery="run/1/2").code == "RETRY"
    state = journal.policy.session("wf-1")
    assert state is not None and state.spent_usd == pytest.approx(0.25) and state.total == 1
    assert journal.policy.spent("principal:bot") == pytest.approx(0.25)
    assert guard.record_cost(accounts, 0.10) is True
    assert guard.record_cost(accounts, 0.10) is False  # never counted twice
    state = journal.policy.session("wf-1")
    assert state is not None and state.spent_usd == pytest.approx(0.10)
    assert journal.policy.spent("principal:bot") == pytest.approx(0.10)


def test_a_replayed_delivery_is_denied_and_journaled(journal: Journal) -> None:
    guard = PolicyGuard(Policy(Limits()), journal.policy)
    event, accounts = search("q")
    assert guard.check(event, accounts, delivery="run/1/1").verdict is Verdict.ALLOW
    replay = guard.check(event, accounts, delivery="run/1/1")
    assert (replay.verdict, replay.code) == (Verdict.DENY, Reason.REPLAY)
    (entry,) = journal.read(policy_chain("wf-1"))
    assert entry.kind is Kind.POLICY and entry.data["code"] == "REPLAY"
    assert entry.data["tripped"] is False


def test_a_replay_is_denied_for_the_whole_session(journal: Journal) -> None:
    """SP/1.0 layer 2 and P9: a session remembers every delivery it allowed, not only its
    recent ones, and a replay trips nothing (a delivery is Temporal's, not the agent's)."""
    guard = PolicyGuard(Policy(Limits(max_total_calls=100)), journal.policy)
    for i in range(40):
        event, accounts = search(f"q{i}", execution=f"run/{i}")
        assert guard.check(event, accounts, delivery=f"run/{i}/1").verdict is Verdict.ALLOW
    first, accounts = search("q0", execution="run/0")
    replay = guard.check(first, accounts, delivery="run/0/1")
    assert (replay.verdict, replay.code) == (Verdict.DENY, Reason.REPLAY)
    state = journal.policy.session("wf-1")
    assert state is not None and state.circuit is None and state.total == 40
    # another session has nonces of its own
    other, other_scopes = search("q0", session="wf-2", execution="run/0")
    assert guard.check(other, other_scopes, delivery="run/0/1").verdict is Verdict.ALLOW
    # the session's document does not grow with the deliveries it has seen
    assert "run/" not in dump_session(state).decode()
    # nor does a person's reset of the circuit forget them
    capped = PolicyGuard(Policy(Limits(max_total_calls=40)), journal.policy)
    event, accounts = search("q40", execution="run/40")
    assert capped.check(event, accounts, delivery="run/40/1").code == Reason.GLOBAL_LIMIT
    assert journal.policy.reset("wf-1", operator="carol") is True
    assert guard.check(first, Accounts.of(first, "run/0"), delivery="run/0/1").code == "REPLAY"


def test_a_random_denial_reads_as_a_real_one_to_the_agent_but_not_to_operators(
    journal: Journal,
) -> None:
    """SP/1.0 section 3.7: the agent cannot tell a random denial from a cost over the budget;
    the journal's note tells the operator which it was."""
    limits = Limits(session_budget_usd=1.0, probabilistic_deny=True)
    guard = PolicyGuard(Policy(limits), journal.policy, rng=lambda: 0.0)

    def llm(session: str, n: int, cost: float) -> Decision:
        event = CallEvent("llm", ({"n": n, "cost_usd": cost},), principal="bot", session=session)
        return guard.check(event, Accounts.of(event, f"{session}/{n}"), delivery=f"{session}/{n}/1")

    seen = []
    # a tenth of the budget left: the small call is denied at random, the large one for real
    for session, cost in (("random", 0.01), ("real", 0.5)):
        assert llm(session, 1, 0.9).verdict is Verdict.ALLOW
        with pytest.raises(Denied) as denied:
            enforce(llm(session, 2, cost), session=session, binding="")
        seen.append((denied.value.code, str(denied.value), denied.value.circuit_open))
    assert seen[0] == seen[1]
    notes = {e.data["session"]: e.data for e in journal.policy.events()}
    assert (notes["random"]["probabilistic"], notes["real"]["probabilistic"]) == (True, False)


def test_a_check_the_store_cannot_record_fails_closed(tmp_path: Path) -> None:
    """SP/1.0's fail-closed principle: when the shared state cannot be read and written, the
    check raises (the activity's body never runs) and nothing is counted."""
    db = tmp_path / "journal.db"
    with open_journal(f"sqlite:///{db}?busy_timeout=0.2", signing_key=KEY) as j:
        guard = PolicyGuard(Policy(Limits(max_total_calls=5)), j.policy)
        event, accounts = search("q")
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(JournalUnavailable):
                guard.check(event, accounts, delivery="run/1/1")
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert j.policy.session("wf-1") is None
        assert guard.check(event, accounts, delivery="run/1/1").verdict is Verdict.ALLOW


def test_only_a_call_that_runs_records_its_delivery(journal: Journal) -> None:
    """SP/1.0 section 5: only an ALLOW records the nonce. A delivery that was escalated, or
    denied, and is checked again after a person acted, is not a replay."""
    guard, _ = ask_and_grant(journal, hitl(), 6000)
    asked = [e.data for e in journal.policy.events() if e.data["event"] == "escalate"]
    (delivery,) = [e["delivery"] for e in asked]
    event, accounts = wire_call(6000, execution=delivery.rsplit("/", 1)[0])
    again = guard.check(event, accounts, delivery=delivery)
    assert (again.verdict, again.code) == (Verdict.ALLOW, "APPROVED")
    assert guard.check(event, accounts, delivery=delivery).code == Reason.REPLAY

    capped = PolicyGuard(Policy(Limits(max_total_calls=1)), journal.policy)
    for i in (1, 2):
        event, accounts = search(f"q{i}", session="capped", execution=f"run/c{i}")
        capped.check(event, accounts, delivery=f"run/c{i}/1")
    assert journal.policy.reset("capped", operator="carol") is True
    again = capped.check(event, accounts, delivery="run/c2/1")
    assert (again.verdict, again.code) == (Verdict.ALLOW, "")


def test_a_store_of_the_previous_schema_keeps_its_sessions_and_their_deliveries(
    store: Store,  # noqa: F811 (the fixture)
) -> None:
    """A session's document of schema 4 (with its recent ``deliveries``) still loads, and the
    migration moves those deliveries into the store's table, so their replays stay denied."""
    with open_journal(store.url, signing_key=KEY) as j:
        guard = PolicyGuard(Policy(Limits(max_repeat_calls=5)), j.policy)
        event, accounts = search("q", execution="run/old")
        assert guard.check(event, accounts, delivery="run/old/1").verdict is Verdict.ALLOW
    old_doc = json.dumps(
        {
            "circuit": None,
            "last_call": "search\x00digest",
            "streak": 2,
            "total": 7,
            "spent_usd": 0.5,
            "windows": {"search": [1.0, 2.0]},
            "deliveries": ["run/a/1", "run/b/2"],
        }
    )
    store.sql("DROP TABLE policy_nonces")
    # lease charges as schema 4 kept them (schema 8 moved them onto the effects' rows)
    store.sql(
        "CREATE TABLE lease_charges (effect_id TEXT PRIMARY KEY, lease_id TEXT NOT NULL, "
        "cents BIGINT NOT NULL, active INTEGER NOT NULL)"
    )
    for column in ("charge_lease_id", "charge_cents", "charge_active"):
        store.sql(f"ALTER TABLE effects DROP COLUMN {column}")
    # and leases' rows unsealed, as before schema 10
    for column in ("head_seq", "head_hash", "seal"):
        store.sql(f"ALTER TABLE leases DROP COLUMN {column}")
    store.sql("ALTER TABLE lease_spend DROP COLUMN seal")
    # and the policy's rows unsealed, as before schema 11
    store.sql("ALTER TABLE policy_sessions DROP COLUMN head")
    for table in ("policy_sessions", "policy_spend", "policy_admissions", "policy_approvals"):
        store.sql(f"ALTER TABLE {table} DROP COLUMN seal")
    for statement in BEFORE_SCHEMA_13:
        store.sql(statement)
    store.sql("UPDATE policy_sessions SET doc = ? WHERE session = ?", old_doc, "wf-1")
    store.sql("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    with open_journal(store.url, signing_key=KEY) as j:
        assert j.schema_version() == SCHEMA_VERSION
        state = j.policy.session("wf-1")
        assert state is not None
        assert (state.total, state.streak, state.spent_usd) == (7, 2, 0.5)
        assert state.windows == {"search": (1.0, 2.0)}
        guard = PolicyGuard(Policy(Limits(max_repeat_calls=5)), j.policy)
        for delivery in ("run/a/1", "run/b/2"):
            event, accounts = search("q", execution=delivery.rsplit("/", 1)[0])
            assert guard.check(event, accounts, delivery=delivery).code == Reason.REPLAY
        event, accounts = search("q", execution="run/c")
        assert guard.check(event, accounts, delivery="run/c/1").verdict is Verdict.ALLOW
        assert j.verify().ok


def test_denials_trip_the_circuit_and_only_a_journaled_reset_closes_it(journal: Journal) -> None:
    guard = PolicyGuard(Policy(Limits(max_repeat_calls=2)), journal.policy)
    outcomes = []
    for i, q in enumerate(["same", "same", "same", "other"]):
        event, accounts = search(q, execution=f"run/{i}")
        outcomes.append(guard.check(event, accounts, delivery=f"run/{i}/1").code)
    assert outcomes == ["", "", "MAX_REPEAT_EXCEEDED", "CIRCUIT_OPEN"]
    assert journal.policy.reset("wf-1", operator="carol", note="looked at it") is True
    assert journal.policy.reset("wf-1", operator="carol") is False
    event, accounts = search("other", execution="run/9")
    assert guard.check(event, accounts, delivery="run/9/1").verdict is Verdict.ALLOW
    events = [e.data for e in journal.policy.events()]
    assert [e["event"] for e in events] == ["deny", "deny", "circuit_reset"]
    assert events[2]["operator"] == "carol" and events[2]["code"] == "MAX_REPEAT_EXCEEDED"
    # no argument value reaches the journal: the query text is only a digest
    assert all("same" not in json.dumps(e) for e in events)


def test_processes_sharing_one_journal_share_one_view(new_store: Callable[[], str]) -> None:
    """Two worker processes race 25 distinct calls each into a cap of 30 calls: exactly 30 are
    allowed, because every check reads and writes the state in one transaction."""
    script = textwrap.dedent(
        f"""
        import json, sys
        from interlock_temporal.core.journal import open_journal
        from interlock_temporal.core.policy import CallEvent, Limits, Policy, PolicyGuard, Accounts
        j = open_journal(sys.argv[1], signing_key="{KEY}")
        guard = PolicyGuard(Policy(Limits(max_total_calls=30)), j.policy)
        codes = []
        for i in range(25):
            event = CallEvent(activity="search", args=(f"{{sys.argv[2]}}-{{i}}",), session="s")
            accounts = Accounts.of(event, f"{{sys.argv[2]}}/{{i}}")
            codes.append(guard.check(event, accounts, delivery=f"{{sys.argv[2]}}/{{i}}/1").code)
        print(json.dumps(codes))
        """
    )
    url = new_store()
    procs = [
        subprocess.Popen([sys.executable, "-c", script, url, name], stdout=subprocess.PIPE)
        for name in ("a", "b")
    ]
    codes = [c for p in procs for c in json.loads(p.communicate(timeout=60)[0])]
    assert all(p.returncode == 0 for p in procs)
    assert codes.count("") == 30
    assert codes.count("GLOBAL_LIMIT") == 1
    assert codes.count("CIRCUIT_OPEN") == 19


# -- inside the effect protocol --------------------------------------------------------------


async def test_a_duplicate_of_a_committed_effect_never_reaches_the_policy(
    journal: Journal,
) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)
    open_gate = Gate(journal)
    step = await open_gate.begin(make_call(lease), target)
    assert isinstance(step, Ticket)
    await open_gate.commit(step, await target.send(step))
    # a policy that would deny anything: every call escalates, and the circuit is open
    guard = PolicyGuard(Policy(Limits(hitl_always=True)), journal.policy)
    strict = Gate(journal, policy=guard)
    again = await strict.begin(make_call(lease), target)
    assert isinstance(again, Done) and again.via == "duplicate"
    assert journal.policy.events() == []
    # a new effect does reach it
    with pytest.raises(NeedsApproval):
        await strict.begin(make_call(lease, amount=30, key={"case": "c-2"}), target)
    assert target.sends == 1


async def test_a_denied_effect_is_not_recorded_and_never_sent(journal: Journal) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)
    rule = deny_when(lambda e: e.argument("amount") > 10, code="TOO_LARGE", argument="amount")
    gate = Gate(
        journal, policy=PolicyGuard(Policy(rules=[rule], policy_id="refunds"), journal.policy)
    )
    call = make_call(lease, amount=20)
    with pytest.raises(Denied) as denied:
        await gate.begin(call, target)
    assert (denied.value.code, denied.value.policy_id, denied.value.argument) == (
        "TOO_LARGE",
        "deny_when(<lambda>)",
        "amount",
    )
    assert "20" not in str(denied.value) and NOTE not in str(denied.value)
    assert journal.read(Gate.identify(call)[0]) == []
    assert target.sends == 0 and target.captures == 0


async def test_monitor_mode_sends_and_the_receipt_says_what_would_have_happened(
    journal: Journal,
) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)
    rule = deny_when(lambda e: True, code="WOULD_BLOCK")
    gate = Gate(journal, policy=PolicyGuard(Policy(rules=[rule], mode="monitor"), journal.policy))
    step = await gate.begin(make_call(lease), target)
    assert isinstance(step, Ticket)
    await gate.commit(step, await target.send(step))
    r = receipt_of(fold(step.effect_id, journal.read(step.effect_id)))
    assert (r.final, r.observed, r.policy_code) == ("COMMITTED", True, "WOULD_BLOCK")
    assert r.policy_epoch == gate.policy.policy.epoch  # type: ignore[union-attr]
    (note,) = journal.policy.events()
    assert note.data["event"] == "observed" and note.data["code"] == "WOULD_BLOCK"


async def test_a_modify_rewrites_what_is_sent_but_not_the_identity(journal: Journal) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)

    def cap(e: CallEvent) -> object:
        return modify({**e.input, "amount": 10}) if e.argument("amount") > 10 else None

    gate = Gate(journal, policy=PolicyGuard(Policy(rules=[cap]), journal.policy))
    call = make_call(lease, amount=20)
    step = await gate.begin(call, target)
    assert isinstance(step, Ticket)
    assert step.effect_id == Gate.identify(call)[0]
    assert step.args[0]["amount"] == 10
    done = await gate.commit(step, await target.send(step))
    assert done.result["amount"] == 10
    view = fold(step.effect_id, journal.read(step.effect_id))
    assert view.payload_digest == Gate.identify(call)[1]
    assert journal.blob(step.effect_id, "approved")[0]["amount"] == 10


async def test_a_rules_in_place_edit_changes_nothing_sent_or_recorded(journal: Journal) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)

    def raises_it_in_place(e: CallEvent) -> None:
        e.input["amount"] = 4_000  # not a MODIFY: the rule only sees a copy

    gate = Gate(journal, policy=PolicyGuard(Policy(rules=[raises_it_in_place]), journal.policy))
    step = await gate.begin(make_call(lease, amount=20), target)
    assert isinstance(step, Ticket)
    done = await gate.commit(step, await target.send(step))
    assert done.result["amount"] == 20  # what the target was sent
    assert journal.blob(step.effect_id, "approved") == [payload(20)]


class Req(BaseModel):
    case: str
    order: str
    amount: int
    note: str


@gated(target=MemTarget(tier=2), key=lambda r: {"case": r.case, "order": r.order})
async def typed_refund(r: Req) -> dict[str, Any]:
    return {"amount": r.amount}


def typed_call(lease: str) -> Any:
    """A call as the adapter makes it: its rewrites decoded into the body's types."""
    spec = spec_of(typed_refund)
    assert spec is not None
    return dataclasses.replace(make_call(lease, amount=20), decode_args=spec.decode_json)


async def test_a_rewrite_reaches_the_body_in_its_types_exactly_as_recorded(
    journal: Journal,
) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)
    kept: list[dict[str, Any]] = []

    def cap(e: CallEvent) -> Any:
        rewrite = {**e.input, "amount": 10}  # JSON data, where the body takes a Req
        kept.append(rewrite)
        return modify(rewrite)

    def sneaky(e: CallEvent) -> None:
        e.input["amount"] = 4_000  # the rewrite as a later rule sees it: a copy too

    policy = Policy(rules=[cap, sneaky])
    gate = Gate(journal, policy=PolicyGuard(policy, journal.policy))
    step = await gate.begin(typed_call(lease), target)
    assert isinstance(step, Ticket)
    (sent,) = step.args
    assert isinstance(sent, Req) and sent.amount == 10
    assert journal.blob(step.effect_id, "approved") == [sent.model_dump()]
    kept[0]["amount"] = 9_000  # the rule's own object, changed after the decision
    assert sent.amount == 10
    await gate.commit(step, {"amount": sent.amount})


async def test_a_rewrite_the_body_cannot_take_is_refused_before_anything_is_recorded(
    journal: Journal,
) -> None:
    lease = journal.leases.issue("refund-bot", max_amount_cents=5000)
    target = MemTarget(tier=2)
    secret = "a-secret-amount"
    policy = Policy(rules=[lambda e: modify({**e.input, "amount": secret})])
    gate = Gate(journal, policy=PolicyGuard(policy, journal.policy))
    call = typed_call(lease)
    with pytest.raises(InvalidCall) as refused:
        await gate.begin(call, target)
    assert "policy rule rewrote the input" in str(refused.value)
    assert "r.amount" in str(refused.value) and secret not in str(refused.value)
    assert journal.read(Gate.identify(call)[0]) == [] and target.sends == 0


def test_a_result_rules_modify_without_a_value_keeps_the_result(journal: Journal) -> None:
    def empty(e: CallEvent) -> Any:
        return modify()

    guard = PolicyGuard(Policy(result_rules=[empty]), journal.policy)
    after = CallEvent("lookup", ("c-1",), phase="result", result={"customer": "c-1"})
    d = guard.check_result(after)
    assert d.verdict is Verdict.ALLOW and d.args is None


# -- approvals -----------------------------------------------------------------------------------


def wire_call(
    amount: int, principal: str = "bot", session: str = "wf-1", execution: str = "run/1"
) -> tuple[CallEvent, Accounts]:
    event = CallEvent(
        activity="wire",
        args=({"to": "ACME", "amount_cents": amount},),
        principal=principal,
        session=session,
    )
    return event, Accounts.of(event, execution)


def hitl(epoch_marker: int = 3) -> Policy:
    # the epoch follows the content: a different repeat limit is a different policy
    return Policy(Limits(hitl_activities=("wire",), max_repeat_calls=epoch_marker))


def ask_and_grant(
    journal: Journal, policy: Policy, amount: int, **grant: object
) -> tuple[PolicyGuard, str]:
    guard = PolicyGuard(policy, journal.policy)
    run = f"run/ask-{uuid.uuid4().hex[:6]}"
    event, accounts = wire_call(amount, execution=run)
    asked = guard.check(event, accounts, delivery=f"{run}/1")
    assert (asked.verdict, asked.code) == (Verdict.ESCALATE, Reason.HITL_REQUIRED)
    binding = call_binding("wire", input_digest(event.args), "bot")
    pending = journal.policy.approval(binding)
    assert pending is not None and pending.status == "pending"
    assert pending.proposal == {"to": "ACME", "amount_cents": amount}
    recorded, approval = journal.policy.decide_approval(
        binding,
        approve=True,
        operators=["carol"],
        **grant,  # type: ignore[arg-type]
    )
    assert recorded and approval.status == "approved"
    return guard, binding


def test_a_once_approval_is_consumed_by_its_first_use(journal: Journal) -> None:
    guard, binding = ask_and_grant(journal, hitl(), 6000)
    event, accounts = wire_call(6000, execution="run/2")
    used = guard.check(event, accounts, delivery="run/2/1")
    assert (used.verdict, used.code, used.approvers) == (Verdict.ALLOW, "APPROVED", ("carol",))
    assert journal.policy.approval(binding).status == "consumed"  # type: ignore[union-attr]
    # a Temporal retry of the admitted execution needs no second approval
    assert guard.check(event, accounts, delivery="run/2/2").verdict is Verdict.ALLOW
    event, accounts = wire_call(6000, execution="run/3")
    assert guard.check(event, accounts, delivery="run/3/1").verdict is Verdict.ESCALATE


def test_an_approval_does_not_cover_another_input_principal_or_epoch(
    new_store: Callable[[], str],
) -> None:
    cases = {
        "amount": (*wire_call(6001, execution="run/a"), hitl()),
        "principal": (*wire_call(6000, principal="other-bot", execution="run/b"), hitl()),
        "epoch": (*wire_call(6000, execution="run/c"), hitl(epoch_marker=4)),
        "session": (*wire_call(6000, session="wf-2", execution="run/d"), hitl()),
    }
    for name, (event, accounts, policy) in cases.items():
        with open_journal(new_store(), signing_key=KEY) as journal:
            guard, _ = ask_and_grant(journal, hitl(), 6000, scope="session")
            # the session's approval covers the very call it approved, again and again
            for run in ("run/e", "run/f"):
                same, same_scopes = wire_call(6000, execution=run)
                d = guard.check(same, same_scopes, delivery=f"{run}/1")
                assert (d.verdict, d.code) == (Verdict.ALLOW, "APPROVED")
            d = PolicyGuard(policy, journal.policy).check(event, accounts, delivery="x/1")
            assert d.verdict is Verdict.ESCALATE, (name, d)


def test_a_ttl_approval_expires(journal: Journal) -> None:
    policy = hitl()
    guard, _ = ask_and_grant(journal, policy, 6000, ttl_s=60)
    later = PolicyGuard(policy, journal.policy, clock=lambda: time.time() + 61)
    event, accounts = wire_call(6000, execution="run/2")
    assert guard.check(event, accounts, delivery="run/2/1").code == "APPROVED"
    event, accounts = wire_call(6000, execution="run/3")
    assert later.check(event, accounts, delivery="run/3/1").verdict is Verdict.ESCALATE


def test_a_decided_approval_is_not_decided_again(journal: Journal) -> None:
    _, binding = ask_and_grant(journal, hitl(), 6000)
    recorded, approval = journal.policy.decide_approval(
        binding, approve=False, operators=["mallory"]
    )
    assert not recorded and approval.status == "approved" and approval.operators == ["carol"]
    with pytest.raises(KeyError):
        journal.policy.decide_approval("call:unknown", approve=True, operators=["carol"])
    granted = [e.data for e in journal.policy.events() if e.data["event"] == "approval_granted"]
    assert len(granted) == 1 and granted[0]["operators"] == ["carol"]


def test_a_rejected_request_is_refused_without_asking_again_or_tripping_the_circuit(
    journal: Journal,
) -> None:
    """A person said no to this very request (input, principal, epoch): the same call is denied
    ``APPROVAL_REJECTED`` naming them, the rejection stays on file (nobody is asked again, so a
    waiting workflow does not loop through reviews), and the session's circuit stays closed however
    often the agent asks. A changed input, principal or epoch is a new question."""
    policy = hitl()
    guard = PolicyGuard(policy, journal.policy)

    def wire_as(amount: int, run: str, principal: str = "bot") -> tuple[CallEvent, Accounts]:
        # one binding, as a gated effect's (its effect id) is across inputs and principals
        event, accounts = wire_call(amount, principal=principal, execution=run)
        return event, dataclasses.replace(accounts, binding="effect-1")

    asked = guard.check(*wire_as(6000, "run/1"), delivery="run/1/1")
    assert asked.verdict is Verdict.ESCALATE
    journal.policy.decide_approval(
        "effect-1", approve=False, operators=["dave"], note="not this customer"
    )
    for i in range(2, 8):  # more than max_repeat_calls: a person's no is not the agent's loop
        d = guard.check(*wire_as(6000, f"run/{i}"), delivery=f"run/{i}/1")
        assert (d.verdict, d.code, d.rejected_by) == (
            Verdict.DENY,
            Reason.APPROVAL_REJECTED,
            ("dave",),
        )
        assert "rejected by dave: not this customer" in d.reason
        assert not d.circuit_open
        with pytest.raises(Denied) as denied:
            enforce(d, session="wf-1", binding="effect-1")
        assert denied.value.rejected_by == ("dave",) and not denied.value.circuit_open
    rejected = journal.policy.approval("effect-1")
    assert rejected is not None and (rejected.status, rejected.operators) == ("rejected", ["dave"])
    assert journal.policy.open_circuits() == {}
    state = journal.policy.session("wf-1")
    assert state is None or state.circuit is None
    denials = [e.data for e in journal.policy.events() if e.data["event"] == "deny"]
    assert {(n["code"], n["tripped"]) for n in denials} == {("APPROVAL_REJECTED", False)}
    # the session goes on: another activity runs
    assert guard.check(*search("status"), delivery="run/s/1").verdict is Verdict.ALLOW

    # a changed input, principal or policy epoch is a new question: a person is asked again
    for event, accounts, p in [
        (*wire_as(6001, "run/a"), policy),
        (*wire_as(6000, "run/b", principal="other-bot"), policy),
        (*wire_as(6000, "run/c"), hitl(epoch_marker=4)),
    ]:
        d = PolicyGuard(p, journal.policy).check(
            event, accounts, delivery=f"{accounts.execution}/1"
        )
        assert (d.verdict, d.code) == (Verdict.ESCALATE, Reason.HITL_REQUIRED)
        asked_again = journal.policy.approval("effect-1")
        assert asked_again is not None and asked_again.status == "pending"
        assert asked_again.payload_digest == input_digest(event.args)
