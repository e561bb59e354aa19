"""Operators who prove who they are (issue 32), in the core: the roster is signed journal
configuration, and a vote counts only with a proof by its operator's key (or an attester's),
over this very question. Each case reads the money outcome from the target: a tier-3 refund
that was in truth sent, whose review a vote without a valid proof tries to settle as
``not_happened`` (which would send it again)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.core.errors import Ambiguous, JournalCorrupt
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.journal.signing import Ed25519Key, parse_key
from interlock_temporal.core.models import Kind
from interlock_temporal.core.operators import (
    NO_ROSTER,
    RosterError,
    add_operator,
    revoke_operator,
    roster_of,
)
from interlock_temporal.core.policy import (
    Limits,
    Policy,
    PolicyGuard,
    Reason,
    call_binding,
    input_digest,
)
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.receipts import fold
from interlock_temporal.core.review import (
    NoDecision,
    ReviewRules,
    Vote,
    count_votes,
    record_approval,
    record_circuit_reset,
    record_resolution,
)
from interlock_temporal.core.review_config import rules_in_force
from interlock_temporal.core.vote_codes import FORMAT, MAX_FAILURES, VoteCodes, code_digest
from interlock_temporal.core.vote_proofs import (
    ballot_of,
    recheck,
    sign_vote,
    spend_codes,
    statement,
)

from .test_cli import cli
from .test_policy_store import search, wire_call
from .test_protocol import connect, journal, lease
from .test_protocol_records import Ledger, refund

__all__ = ["cli", "connect", "journal", "lease"]


def later() -> int:
    """An expiry ten minutes from now (computed when signing: the suite runs longer than that)."""
    return int(time.time()) + 600


class Keys:
    def __init__(self) -> None:
        self.carol, self.dave, self.app = (Ed25519Key.generate() for _ in range(3))


@pytest.fixture
def keys() -> Keys:
    return Keys()


async def sent_then_in_doubt(
    journal: Journal, lease: str, target: Ledger, case: str = "c-1"
) -> str:
    """A tier-3 refund that reached the target, whose worker died before recording it; the
    owner's last attempt finds it AMBIGUOUS (nobody can know)."""
    key = {"case": case, "order": "o-1"}
    ticket = await Gate(journal).begin(refund(lease, key=key), target)
    assert isinstance(ticket, Ticket)
    await target.send(ticket)
    ticket.release()
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(refund(lease, key=key, last_attempt=True), target)
    return ticket.effect_id


def decide(journal: Journal, eid: str, votes: list[Vote], rules: ReviewRules | None = None) -> Any:
    """What the record activity does with the votes a review sends."""
    decided, left_out = count_votes(journal, "ambiguous", eid, votes, rules or ReviewRules())
    return record_resolution(
        journal,
        eid,
        kind="ambiguous",
        decision=decided.decision,
        operators=decided.operators,
        note=decided.note,
        proofs=decided.proofs,
    ), left_out


async def resend_count(journal: Journal, lease: str, target: Ledger) -> int:
    """Run the owner's attempt again and say how many times the money went out."""
    try:
        answer = await Gate(journal).begin(refund(lease, last_attempt=True), target)
    except Ambiguous:
        return target.sends
    if isinstance(answer, Ticket):  # the gate sends again
        await target.send(answer)
        answer.release()
    return target.sends


def signed(
    journal: Journal, eid: str, vote: Vote, key: Ed25519Key, expires: int | None = None
) -> Vote:
    ballot = ballot_of(journal, roster_of(journal), "ambiguous", eid)
    assert ballot is not None
    return sign_vote(ballot, vote, key, later() if expires is None else expires)


def with_roster(journal: Journal, keys: Keys) -> None:
    add_operator(journal, "carol", keys.carol.public_text, notify=["mailto:carol@example.org"])
    add_operator(journal, "dave", keys.dave.public_text)


async def roster_and_doubt(journal: Journal, lease: str, keys: Keys) -> tuple[Ledger, str]:
    """carol and dave on the roster, and a tier-3 refund sent and in doubt: its target (whose
    sends are the money outcome) and its effect id."""
    with_roster(journal, keys)
    target = Ledger(tier=3)
    return target, await sent_then_in_doubt(journal, lease, target)


# -- the roster ----------------------------------------------------------------------------------


def test_the_roster_is_signed_configuration_an_edit_of_its_rows_cannot_change(
    keys: Keys, tmp_path: Path
) -> None:
    journal = open_journal(f"sqlite:///{tmp_path / 'journal.db'}", signing_key="11" * 32)
    assert roster_of(journal) is NO_ROSTER or not roster_of(journal).exists
    with_roster(journal, keys)
    roster = roster_of(journal)
    assert roster.exists and set(roster.operators) == {"carol", "dave"}
    assert roster.operators["carol"].notify == ("mailto:carol@example.org",)
    # the roster's chain is the journal's own record, not an effect
    assert all(not row.effect_id.startswith("config:") for row in journal.effects())
    # whoever can write the database but holds no key swaps carol's key for their own
    mallory = Ed25519Key.generate()
    db = sqlite3.connect(tmp_path / "journal.db")
    (body,) = db.execute(
        "SELECT body FROM entries WHERE effect_id = 'config:operators' ORDER BY seq LIMIT 1"
    ).fetchone()
    forged = bytes(body).replace(keys.carol.public_text.encode(), mallory.public_text.encode())
    assert forged != bytes(body)
    with db:
        db.execute(
            "UPDATE entries SET body = ? WHERE effect_id = 'config:operators' AND seq = "
            "(SELECT MIN(seq) FROM entries WHERE effect_id = 'config:operators')",
            (forged,),
        )
    db.close()
    with pytest.raises(JournalCorrupt):
        roster_of(journal)
    assert not journal.verify().ok
    journal.close()


def test_roster_changes_are_checked(journal: Journal, keys: Keys) -> None:
    with pytest.raises(RosterError, match="ed25519-public"):
        add_operator(journal, "carol", "not-a-key")
    with pytest.raises(RosterError, match="not hold"):
        add_operator(journal, "app", keys.app.public_text, attests_for=["carol"])
    with_roster(journal, keys)
    with pytest.raises(RosterError, match="already 'carol'"):
        add_operator(journal, "erin", keys.carol.public_text)
    with pytest.raises(RosterError, match="not on the roster"):
        revoke_operator(journal, "erin")
    with pytest.raises(RosterError, match="itself"):
        add_operator(journal, "app", keys.app.public_text, attests_for=["app"])


# -- votes that count, and votes that do not ----------------------------------------------------


async def test_without_a_proof_a_name_does_not_count_and_nothing_is_sent_again(
    journal: Journal, lease: str, keys: Keys
) -> None:
    target, eid = await roster_and_doubt(journal, lease, keys)
    # the allow-list is met by typing a name: it proves nothing
    with pytest.raises(NoDecision, match="carries no proof"):
        decide(journal, eid, [Vote(decision="not_happened", operator="carol")])
    # signed by dave's key in carol's name
    forged = signed(journal, eid, Vote(decision="not_happened", operator="carol"), keys.dave)
    with pytest.raises(NoDecision, match="does not prove 'carol'"):
        decide(journal, eid, [forged])
    # a key the roster does not hold
    stranger = signed(
        journal, eid, Vote(decision="not_happened", operator="carol"), Ed25519Key.generate()
    )
    with pytest.raises(NoDecision, match="roster does not hold"):
        decide(journal, eid, [stranger])
    # carol's signature on happened, sent as not_happened
    happened = signed(journal, eid, Vote(decision="happened", operator="carol"), keys.carol)
    altered = happened.model_copy(update={"decision": "not_happened"})
    with pytest.raises(NoDecision, match="does not match"):
        decide(journal, eid, [altered])
    # expired
    old = signed(journal, eid, Vote(decision="not_happened", operator="carol"), keys.carol, 1)
    with pytest.raises(NoDecision, match="expired"):
        decide(journal, eid, [old])
    assert fold(eid, journal.read(eid)).status is Kind.AMBIGUOUS
    # the money went out once, and the owner's next attempt sends nothing
    assert await resend_count(journal, lease, target) == 1


async def test_a_proven_vote_counts_and_its_proof_is_recorded(
    journal: Journal, lease: str, keys: Keys
) -> None:
    target, eid = await roster_and_doubt(journal, lease, keys)
    vote = signed(journal, eid, Vote(decision="happened", operator="carol"), keys.carol)
    recorded, left_out = decide(journal, eid, [vote])
    assert recorded.recorded and left_out == []
    (resolved,) = [e for e in journal.read(eid) if e.kind is Kind.RESOLVED]
    (proof,) = resolved.data["proofs"]
    assert proof["operator"] == "carol" and proof["key_id"] == keys.carol.key_id
    assert await resend_count(journal, lease, target) == 1


async def test_min_approvals_counts_distinct_proven_operators(
    journal: Journal, lease: str, keys: Keys
) -> None:
    target, eid = await roster_and_doubt(journal, lease, keys)
    two = ReviewRules(min_approvals=2)
    carol = signed(journal, eid, Vote(decision="happened", operator="carol"), keys.carol)
    # one person typing a second name: carol's key cannot prove dave's vote
    as_dave = signed(journal, eid, Vote(decision="happened", operator="dave"), keys.carol)
    with pytest.raises(NoDecision, match="2 distinct operator"):
        decide(journal, eid, [carol, as_dave], two)
    dave = signed(journal, eid, Vote(decision="happened", operator="dave"), keys.dave)
    # one bad vote beside the good ones does not drop them
    recorded, left_out = decide(journal, eid, [as_dave, carol, dave], two)
    assert recorded.recorded and len(left_out) == 1
    assert sorted(p["operator"] for p in journal.read(eid)[-1].data["proofs"]) == [
        "carol",
        "dave",
    ]
    assert await resend_count(journal, lease, target) == 1  # happened: nothing sent again


async def test_an_attester_signs_for_the_operators_it_names_only(
    journal: Journal, lease: str, keys: Keys
) -> None:
    with_roster(journal, keys)
    add_operator(journal, "review-app", keys.app.public_text, attests_for=["carol"])
    target = Ledger(tier=3)
    eid = await sent_then_in_doubt(journal, lease, target)
    # not for dave, and never in its own name
    for name in ("dave", "review-app"):
        vote = signed(journal, eid, Vote(decision="happened", operator=name), keys.app)
        with pytest.raises(NoDecision):
            decide(journal, eid, [vote])
    vote = signed(journal, eid, Vote(decision="happened", operator="carol"), keys.app)
    recorded, _ = decide(journal, eid, [vote])
    assert recorded.recorded
    assert journal.read(eid)[-1].data["proofs"][0]["signer"] == "review-app"


async def test_a_revoked_key_proves_nothing(journal: Journal, lease: str, keys: Keys) -> None:
    target, eid = await roster_and_doubt(journal, lease, keys)
    vote = signed(journal, eid, Vote(decision="not_happened", operator="carol"), keys.carol)
    revoke_operator(journal, "carol", note="left the team")
    with pytest.raises(NoDecision, match="roster does not hold"):
        decide(journal, eid, [vote])
    assert await resend_count(journal, lease, target) == 1


async def test_a_signature_from_one_episode_is_refused_on_the_next(
    journal: Journal, lease: str, keys: Keys
) -> None:
    """carol's ``not_happened`` settles one AMBIGUOUS episode; the effect is sent again and is
    in doubt again. The same signed vote, replayed, is refused: it names the first episode."""
    target, eid = await roster_and_doubt(journal, lease, keys)
    first = signed(journal, eid, Vote(decision="not_happened", operator="carol"), keys.carol)
    recorded, _ = decide(journal, eid, [first])
    assert recorded.recorded
    # the owner sends again (a person said it did not happen), and dies in doubt again
    ticket = await Gate(journal).begin(refund(lease), target)
    assert isinstance(ticket, Ticket)
    await target.send(ticket)
    ticket.release()
    with pytest.raises(Ambiguous):
        await Gate(journal).begin(refund(lease, last_attempt=True), target)
    assert target.sends == 2
    with pytest.raises(NoDecision, match="another episode"):
        decide(journal, eid, [first])
    assert await resend_count(journal, lease, target) == 2


async def test_without_a_roster_names_are_self_asserted(journal: Journal, lease: str) -> None:
    """The documented limit: with no roster nothing tells one person from another."""
    target = Ledger(tier=3)
    eid = await sent_then_in_doubt(journal, lease, target)
    recorded, _ = decide(journal, eid, [Vote(decision="happened", operator="anyone")])
    assert recorded.recorded and "proofs" not in journal.read(eid)[-1].data


def test_the_statement_binds_every_field_it_names(journal: Journal, keys: Keys) -> None:
    """Changing any part of the ballot or the vote changes the signed bytes."""
    from interlock_temporal.core.review_rules import Ballot

    ballot = Ballot(
        journal="j" * 64,
        kind="approval",
        binding="b",
        episode="e",
        proposed="p",
        approved="a",
        principal="refund-bot",
        epoch="1",
    )
    vote = Vote(decision="approve", operator="carol", scope="session")
    base = statement(ballot, vote, "k", 10)
    changed = [
        statement(ballot.model_copy(update={field: "x"}), vote, "k", 10)
        for field in ("journal", "binding", "episode", "proposed", "approved", "principal", "epoch")
    ]
    changed += [
        statement(ballot, vote.model_copy(update={"decision": "reject"}), "k", 10),
        statement(ballot, vote.model_copy(update={"operator": "dave"}), "k", 10),
        statement(ballot, vote.model_copy(update={"scope": "once"}), "k", 10),
        statement(ballot, vote.model_copy(update={"ttl_s": 5.0}), "k", 10),
        statement(ballot, vote.model_copy(update={"result": {"ok": 1}}), "k", 10),
        statement(ballot, vote, "k2", 10),
        statement(ballot, vote, "k", 11),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


# -- the command line: the roster, and proofs checked again offline -----------------------------


async def test_the_roster_from_the_command_line_and_proofs_checked_again_by_verify(
    tmp_path: Path, cli: Any
) -> None:
    """``interlock operators keygen/add``, a proven decision, and ``journal verify`` (with only
    the journal's public key) checking its proof again; a decision whose recorded proof does not
    verify (written by a worker that skipped the check: the journal's key signs it, so only the
    proof can show it) fails ``verify``."""
    journal_key = Ed25519Key.generate()
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    seed = f"ed25519:{journal_key.seed_hex()}"
    journal = open_journal(url, signing_key=seed)
    flags = ["--journal", url, "--signing-key", seed]
    assert cli("operators", "list", *flags).code == 0  # no roster yet: says so
    made = cli("operators", "keygen", str(tmp_path / "carol"))
    assert made.code == 0 and "interlock operators add carol --public-key" in made.out
    missing = cli("operators", "add", "carol", "--public-key", str(tmp_path / "no.pub"), *flags)
    assert missing.code == 2 and "no such file, and not a key" in missing.err
    assert oct((tmp_path / "carol").stat().st_mode)[-3:] == "600"
    added = cli("operators", "add", "carol", "--public-key", str(tmp_path / "carol.pub"), *flags)
    assert added.code == 0 and "now has an operator roster" in added.err
    listed = cli("operators", "list", "--json", *flags)
    assert [o["name"] for o in json.loads(listed.out)["operators"]] == ["carol"]
    carol = parse_key((tmp_path / "carol").read_text())
    assert isinstance(carol, Ed25519Key)

    lease = journal.leases.issue("refund-bot", activities=["refund_order_zq9"])
    target = Ledger(tier=3)
    eid = await sent_then_in_doubt(journal, lease, target)
    vote = signed(journal, eid, Vote(decision="happened", operator="carol"), carol)
    decide(journal, eid, [vote])
    public = ["--journal", url, "--public-key", journal_key.public_text]
    checked = cli("journal", "verify", *public)
    assert checked.code == 0, checked.err
    assert "1 re-checked against the roster: ok" in checked.out

    # another effect, decided by a worker that recorded a proof it never checked
    other = await sent_then_in_doubt(journal, lease, Ledger(tier=3), case="c-2")
    forged = dict(journal.read(eid)[-1].data["proofs"][0])  # carol's, for the first effect
    record_resolution(
        journal, other, kind="ambiguous", decision="happened", operators=["carol"], proofs=[forged]
    )
    failed = cli("journal", "verify", "--json", *public)
    assert failed.code == 1
    problems = json.loads(failed.out)["vote_proofs"]["problems"]
    assert len(problems) == 1 and other[:16] in problems[0] and "does not verify" in problems[0]
    journal.close()


def test_approval_and_circuit_proofs_are_recorded_and_checked_again_by_verify(
    journal: Journal, keys: Keys
) -> None:
    """An approval and a circuit reset decided with carol's key: each note records her proof
    beside the ballot it signed, and ``recheck`` (what ``journal verify`` adds) verifies both.
    A worker that records her approval's proof onto another approval (its note signed by the
    journal's key, so only the proof can show it) is named."""
    with_roster(journal, keys)
    roster = roster_of(journal)
    guard = PolicyGuard(
        Policy(Limits(hitl_activities=("wire",), max_repeat_calls=2)), journal.policy
    )

    def ask(amount: int, run: str) -> str:
        event, accounts = wire_call(amount, execution=run)
        assert guard.check(event, accounts, delivery=f"{run}/1").code == Reason.HITL_REQUIRED
        return call_binding("wire", input_digest(event.args), "bot")

    def proven(kind: str, subject: str, decision: str) -> Any:
        ballot = ballot_of(journal, roster, kind, subject)
        assert ballot is not None
        vote = sign_vote(ballot, Vote(decision=decision, operator="carol"), keys.carol, later())
        decided, left_out = count_votes(journal, kind, subject, [vote], ReviewRules())
        assert left_out == [] and len(decided.proofs) == 1 and decided.ballot is not None
        return decided

    first = ask(2000, "run/a")
    decided = proven("approval", first, "approve")
    assert record_approval(
        journal,
        first,
        decision="approve",
        operators=decided.operators,
        proofs=decided.proofs,
        ballot=decided.ballot,
    ).recorded
    for i in range(3):
        event, accounts = search("same", execution=f"run/s{i}")
        guard.check(event, accounts, delivery=f"run/s{i}/1")
    state = journal.policy.session("wf-1")
    assert state is not None and state.circuit is not None
    reset = proven("circuit", "wf-1", "reset")
    assert record_circuit_reset(
        journal, "wf-1", operators=reset.operators, proofs=reset.proofs, ballot=reset.ballot
    ).recorded
    (granted,) = [e for e in journal.policy.events() if e.data["event"] == "approval_granted"]
    assert granted.data["proofs"][0]["key_id"] == keys.carol.key_id
    assert granted.data["ballot"]["binding"] == first
    found = recheck(journal)
    assert (found.checked, found.problems) == (2, [])

    # carol's approval of the first, recorded onto a second approval with the first's ballot
    second = ask(3000, "run/b")
    assert record_approval(
        journal,
        second,
        decision="approve",
        operators=["carol"],
        proofs=decided.proofs,
        ballot=decided.ballot,
    ).recorded
    found = recheck(journal)
    assert found.checked == 3 and len(found.problems) == 1
    assert "approval_granted" in found.problems[0] and "no ballot" in found.problems[0]


# -- one-time codes (for the Web UI's forms) -----------------------------------------------------


def code_for(journal: Journal, eid: str, operator: str, decision: str) -> str:
    ballot = ballot_of(journal, roster_of(journal), "ambiguous", eid)
    assert ballot is not None
    return VoteCodes(journal.keyring).code(ballot, operator, decision)


async def test_a_one_time_code_proves_its_operator_and_decision_once(
    journal: Journal, lease: str, keys: Keys
) -> None:
    target, eid = await roster_and_doubt(journal, lease, keys)
    code = code_for(journal, eid, "carol", "happened")
    assert FORMAT.fullmatch(code) and len(code.replace("-", "")) * 5 >= 80
    # dave's code in carol's name; carol's code for another decision; a code with a result
    for vote in (
        Vote(
            decision="happened", operator="carol", code=code_for(journal, eid, "dave", "happened")
        ),
        Vote(
            decision="not_happened",
            operator="carol",
            code=code_for(journal, eid, "carol", "happened"),
        ),
    ):
        with pytest.raises(NoDecision, match="not their code"):
            decide(journal, eid, [vote])
    with pytest.raises(NoDecision, match="cannot attest a result"):
        decide(journal, eid, [Vote(decision="happened", operator="carol", code=code, result={})])
    recorded, _ = decide(journal, eid, [Vote(decision="happened", operator="carol", code=code)])
    assert recorded.recorded
    (proof,) = journal.read(eid)[-1].data["proofs"]
    assert proof["via"] == "code" and code not in str(proof)  # recorded by digest only
    spend_codes(journal, [proof])
    assert journal.code_uses.used(code_digest(code))
    # offered again: refused, nothing more recorded
    with pytest.raises(NoDecision, match="already used"):
        decide(journal, eid, [Vote(decision="happened", operator="carol", code=code)])
    assert [e.kind for e in journal.read(eid)].count(Kind.RESOLVED) == 1
    assert await resend_count(journal, lease, target) == 1


async def test_wrong_codes_lock_an_operator_out_of_the_question(
    journal: Journal, lease: str, keys: Keys
) -> None:
    target, eid = await roster_and_doubt(journal, lease, keys)
    for _ in range(MAX_FAILURES):
        with pytest.raises(NoDecision, match="not their code"):
            decide(journal, eid, [Vote(decision="not_happened", operator="carol", code="AAAA")])
    right = code_for(journal, eid, "carol", "not_happened")
    with pytest.raises(NoDecision, match="locked out"):
        decide(journal, eid, [Vote(decision="not_happened", operator="carol", code=right)])
    # dave is not locked out, and a key still proves carol
    signed_vote = signed(journal, eid, Vote(decision="happened", operator="carol"), keys.carol)
    recorded, _ = decide(journal, eid, [signed_vote])
    assert recorded.recorded
    assert await resend_count(journal, lease, target) == 1


# -- the review rules, as signed journal configuration -------------------------------------------


async def test_every_worker_counts_under_the_journals_rules(
    tmp_path: Path, cli: Any, keys: Keys
) -> None:
    """``interlock operators rules`` sets the rules in the journal: a worker given looser rules
    in code counts under the journal's; an edit of the rules' row without the key fails the
    read, and nothing is counted under it."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    journal = open_journal(url, signing_key="22" * 32)
    flags = ["--journal", url, "--signing-key", "22" * 32]
    assert "sets no review rules" in cli("operators", "rules", *flags).err
    worker = ReviewRules(min_approvals=1, deadline_s=60.0)
    assert rules_in_force(journal, worker) == worker
    set_two = cli("operators", "rules", "--min-approvals", "2", "--allowed", "carol,dave", *flags)
    assert set_two.code == 0, set_two.err
    assert json.loads(cli("operators", "rules", "--json", *flags).out) == {
        "allowed_operators": ["carol", "dave"],
        "min_approvals": 2,
    }
    in_force = rules_in_force(journal, worker)
    assert (in_force.min_approvals, in_force.allowed_operators, in_force.deadline_s) == (
        2,
        ["carol", "dave"],
        60.0,
    )
    lease = journal.leases.issue("refund-bot", activities=["refund_order_zq9"])
    target = Ledger(tier=3)
    eid = await sent_then_in_doubt(journal, lease, target)
    with pytest.raises(NoDecision, match="2 distinct operator"):
        count_votes(
            journal, "ambiguous", eid, [Vote(decision="not_happened", operator="carol")], in_force
        )
    # loosened in the database, without the key: the read fails
    db = sqlite3.connect(tmp_path / "journal.db")
    with db:
        db.execute(
            "UPDATE entries SET body = replace(body, '\"min_approvals\":2', '\"min_approvals\":1') "
            "WHERE effect_id = 'config:review-rules'"
        )
    db.close()
    with pytest.raises(JournalCorrupt):
        rules_in_force(journal, worker)
    journal.close()
