"""``interlock reviews``, ``interlock reconcile`` and ``interlock effects reopen`` against a real
Temporal dev server, real workers (in-process, and worker processes killed with SIGKILL) and
real journals. The command runs as its console script in a subprocess, as an operator runs it."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.worker import Worker

from interlock_temporal import gated
from interlock_temporal._reviews.reconciler import ReconcileOutcome, ReconcileReport
from interlock_temporal.cli import main, needs_nobody
from interlock_temporal.cli._args import parse_age as _age
from interlock_temporal.cli._render import (
    ReviewLine,
    reconcile_summary,
    render_reconcile,
    render_reviews,
)
from interlock_temporal.core import Call, Gate, Journal, Kind, open_journal, receipt
from interlock_temporal.core.models import Found
from interlock_temporal.core.review import review_id
from interlock_temporal.core.review_rules import SENT_BY_CAVEAT
from interlock_temporal.targets import BaseTarget
from interlock_temporal.targets.payments import (
    RefundRequest,
    RefundResult,
    SimulatedCrash,
)
from interlock_temporal.testing import DevServer, free_port
from workers.scenarios import ORDER
from workers.server_world import ServerWorld

from .review_rig import (
    CONSOLE_SCRIPT,
    ROOT,
    Ran,
    Rig,
    effect_of,
    interlock,
    opened_with_one_waiting,
    review_status,
    rig,
)
from .test_cli import build_world
from .waiting import until

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("INTERLOCK_", "TEMPORAL_")):
            monkeypatch.delenv(name, raising=False)


# -- running the command --------------------------------------------------------------------


def one_line(ran: Ran) -> str:
    """The error, which must be one line on stderr and no traceback."""
    assert "Traceback" not in ran.err, ran.err
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1, ran.err
    assert lines[0].startswith("interlock: "), ran.err
    return lines[0]


def fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key.startswith(" "):
            out.setdefault(key, value.strip())
    return out


def kinds(journal: Journal, effect_id: str) -> list[Kind]:
    return [e.kind for e in journal.read(effect_id)]


# -- reviews: list, resolve -------------------------------------------------------------------


async def test_list_and_resolve_a_review_a_workflow_waits_on(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """Tier 3, the connection drops after the refund landed, no attempt left: AMBIGUOUS, and
    the workflow waits for a person. The operator finds it, is refused a wrong decision, decides
    it happened, and cannot decide it twice."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        handle = await r.start(case)

        await opened_with_one_waiting(r, eid)
        assert r.journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        assert r.payments.refunded_cents(ORDER) == 2000

        # -- list: the review, with the workflow waiting; not reported as lacking a review
        async def listed() -> Ran | None:
            ran = await r.cli("reviews", "list", "--json")
            assert ran.code == 0, ran.err
            assert ran.out.lstrip().startswith("{"), ran.out[:2000]
            ids = [doc["workflow_id"] for doc in ran.json()["reviews"]]
            return ran if review_id("ambiguous", eid) in ids else None

        as_json = (await until(listed, "the review listed")).json()
        (doc,) = [d for d in as_json["reviews"] if d["effect_id"] == eid]
        assert (doc["kind"], doc["state"], doc["waiting"], doc["votes"]) == (
            "ambiguous",
            "open",
            1,
            [],
        )
        assert doc["status"]["subscribers"] == 1
        assert eid not in as_json["ambiguous_without_review"]

        table = await r.cli("reviews", "list")
        assert table.code == 0, table.err
        lines = table.out.splitlines()
        # other tests' reviews may share the server (a NOTE column appears for those no worker
        # answers for); the columns this test reads come first
        assert lines[0].split()[:6] == ["KIND", "EFFECT", "STATE", "VOTES", "WAITING", "STARTED"]
        (row,) = [line.split() for line in lines[1:] if line.split()[1:2] == [eid[:16]]]
        assert row[0] == "ambiguous" and row[2:5] == ["open", "-", "1"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row[5])
        assert f"AMBIGUOUS with no open review: {eid}" not in table.out

        # -- a decision the review's validator refuses: exit 1, its message, nothing recorded
        before = kinds(r.journal, eid)
        wrong = await r.cli(
            "reviews", "resolve", eid[:10], "--decision", "approve", "--operator", "carol"
        )
        assert wrong.code == 1, (wrong.out, wrong.err)
        assert (
            "'approve' is not a decision for ambiguous reviews: send one of happened, not_happened"
        ) in one_line(wrong)
        assert wrong.out == ""
        own = await r.cli(
            "reviews", "resolve", eid, "--decision", "happened", "--operator", "refund-bot"
        )
        assert own.code == 1 and "no self-approval" in one_line(own)
        assert kinds(r.journal, eid) == before
        still = await review_status(r.client, eid)
        assert still is not None and still.state == "open" and still.votes == []

        # -- the right decision: recorded, and the waiting workflow finishes
        decided = await r.cli(
            "reviews",
            "resolve",
            eid[:12],
            "--decision",
            "happened",
            "--operator",
            "carol",
            "--note",
            "the refund is on the statement",
        )
        assert decided.code == 0, decided.err
        shown = fields(decided.out)
        assert shown["review"] == review_id("ambiguous", eid)
        assert shown["effect"] == eid
        assert (shown["state"], shown["decision"], shown["operators"]) == (
            "resolved",
            "happened",
            "carol",
        )
        assert (shown["final"], shown["executed"], shown["operator"]) == (
            "RESOLVED",
            "yes",
            "carol",
        )
        # beside carol: the identity Temporal recorded for the command's Update (the SDK's
        # default, pid@host), and what it is worth
        cli_identity = r"\d+@" + re.escape(socket.gethostname())
        assert re.fullmatch(
            rf"carol: {cli_identity} \({re.escape(SENT_BY_CAVEAT)}\)", shown["sent by"]
        ), shown["sent by"]
        outcome = await asyncio.wait_for(handle.result(), 15)
        assert outcome.status == "RESOLVED"
        found = receipt(eid, journal=r.journal)
        assert (found.final, found.operator, found.executed) == ("RESOLVED", "carol", True)
        resolved = [e for e in r.journal.read(eid) if e.kind is Kind.RESOLVED]
        assert len(resolved) == 1
        assert resolved[0].data["operator"] == "carol"
        assert resolved[0].data["decision"] == "happened"

        # -- again: the review has ended; nothing more is recorded
        await until(lambda: _ended(r.client, eid), "the review ended")
        again = await r.cli(
            "reviews", "resolve", eid, "--decision", "not_happened", "--operator", "dave"
        )
        assert again.code == 1, (again.out, again.err)
        line = one_line(again)
        assert "no open review" in line and "already resolved: happened by carol" in line
        assert [e.kind for e in r.journal.read(eid)].count(Kind.RESOLVED) == 1

        # the ended review is no longer listed as open, and --all shows how it ended
        after = await r.cli("reviews", "list", "--json")
        assert eid not in [d["effect_id"] for d in after.json()["reviews"]]
        everything = await r.cli("reviews", "list", "--all", "--json")
        assert everything.code == 0, everything.err
        (ended,) = [d for d in everything.json()["reviews"] if d["effect_id"] == eid]
        assert ended["state"] == "resolved"
        assert ended["status"]["operators"] == ["carol"]
        (vote,) = ended["votes"]
        assert re.fullmatch(cli_identity, vote.pop("sent_by")), ended["votes"]
        assert vote == {
            "decision": "happened",
            "operator": "carol",
            "note": "the refund is on the statement",
        }
        assert re.fullmatch(cli_identity, resolved[0].data["sent_by"]["carol"])


async def test_with_a_roster_only_a_signed_vote_decides(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """The journal has an operator roster (``interlock operators keygen/add``). carol's name
    alone, typed into the CLI or sent as a signal by anyone with namespace access, records
    nothing; ``reviews resolve --key`` signs the review's ballot with her key, and the decision
    is recorded with its proof. The refund went out once, read from the payments service."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        local = {"cwd": r.workdir}
        keygen = await interlock("operators", "keygen", str(tmp_path / "carol"), **local)
        assert keygen.code == 0, keygen.err
        added = await interlock(
            "operators",
            "add",
            "carol",
            "--public-key",
            str(tmp_path / "carol.pub"),
            "--journal",
            r.url,
            **local,
        )
        assert added.code == 0, added.err
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        handle = await r.start(case)

        await opened_with_one_waiting(r, eid)
        status = await review_status(r.client, eid)
        assert status is not None and status.ballot is not None
        assert status.ballot.binding == eid and status.ballot.principal == "refund-bot"

        # the name alone: from the CLI, and as an outsider's signal
        unsigned = await r.cli(
            "reviews", "resolve", eid, "--decision", "not_happened", "--operator", "carol"
        )
        assert unsigned.code == 1, (unsigned.out, unsigned.err)
        assert "carries no proof" in one_line(unsigned)
        plain = await Client.connect(dev_server.target)  # no plugin, no key
        await plain.get_workflow_handle(review_id("ambiguous", eid)).signal(
            "resolve", {"decision": "not_happened", "operator": "carol"}
        )
        await asyncio.sleep(1.0)
        assert r.journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]

        # signed with her key: recorded, with its proof
        decided = await r.cli(
            "reviews",
            "resolve",
            eid,
            "--decision",
            "happened",
            "--operator",
            "carol",
            "--key",
            str(tmp_path / "carol"),
        )
        assert decided.code == 0, (decided.out, decided.err)
        outcome = await asyncio.wait_for(handle.result(), 30)
        assert outcome.status == "RESOLVED"
        (resolved,) = [e for e in r.journal.read(eid) if e.kind is Kind.RESOLVED]
        assert resolved.data["decision"] == "happened"
        assert [p["operator"] for p in resolved.data["proofs"]] == ["carol"]
        assert r.payments.refunded_cents(ORDER) == 2000  # once
        verified = await interlock("journal", "verify", "--journal", r.url, **local)
        assert verified.code == 0 and "1 re-checked against the roster: ok" in verified.out


async def test_an_attester_decides_for_the_operator_its_login_authenticated(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """A web backend registered as attesting for carol signs her vote with its own key, by hand
    as a backend without ``ReviewClient`` would (query the review's ballot, ``sign_vote``, the
    Update ``decide``): the
    decision is recorded with its proof, signed by the attester; the same backend cannot decide
    in its own name, nor for dave."""
    from interlock_temporal.core.journal.signing import Ed25519Key, parse_key
    from interlock_temporal.core.operators import add_operator
    from interlock_temporal.core.review_rules import Ballot, Vote
    from interlock_temporal.core.vote_proofs import sign_vote

    async with rig(dev_server, tmp_path, tier=3) as r:
        app_key = Ed25519Key.generate()
        app_text = f"ed25519:{app_key.seed_hex()}"  # what the backend keeps in its secrets
        add_operator(r.journal, "carol", Ed25519Key.generate().public_text)
        add_operator(r.journal, "dave", Ed25519Key.generate().public_text)
        add_operator(r.journal, "review-app", app_key.public_text, attests_for=["carol"])
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        handle = await r.start(case)

        await opened_with_one_waiting(r, eid)
        review = r.client.get_workflow_handle(review_id("ambiguous", eid))
        expires = int(time.time()) + 300

        async def decide_as(operator: str) -> Any:
            status = await review.query("status", result_type=dict)
            vote = sign_vote(
                Ballot.model_validate(status["ballot"]),
                Vote(decision="happened", operator=operator),
                parse_key(app_text),  # type: ignore[arg-type]
                expires,
            )
            return await review.execute_update(
                "decide", vote.model_dump(mode="json", exclude_none=True), result_type=dict
            )

        for outsider in ("review-app", "dave"):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await decide_as(outsider)
            assert "does not prove" in str(refused.value.cause), refused.value.cause
        assert r.journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        decided = await decide_as("carol")
        assert decided["state"] == "resolved", decided
        assert (await asyncio.wait_for(handle.result(), 30)).status == "RESOLVED"
        (resolved,) = [e for e in r.journal.read(eid) if e.kind is Kind.RESOLVED]
        (proof,) = resolved.data["proofs"]
        assert (proof["operator"], proof["signer"]) == ("carol", "review-app")
        assert r.payments.refunded_cents(ORDER) == 2000  # once


async def test_list_tells_another_journals_review_apart_when_no_worker_answers_for_it(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """A review whose worker has stopped cannot be asked its status: ``reviews list`` reads the
    journal that opened it from the request it was started with, so another journal's listing
    leaves it out (it used to show it, with state ``?``), and its own journal's shows it, ``?``
    with the reason."""
    from interlock_temporal.core.journal_identity import journal_id_of

    async with rig(dev_server, tmp_path, tier=3) as r:
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        handle = await r.start(case)
        await opened_with_one_waiting(r, eid)
        ours = journal_id_of(r.journal, create=False)
        assert ours is not None
    # the worker is gone: nobody answers the review's status query now
    review = review_id("ambiguous", eid)
    (tmp_path / "other").mkdir()
    other_url = f"sqlite:///{tmp_path / 'other' / 'interlock.db'}"
    with open_journal(other_url) as other:
        theirs = journal_id_of(other)

    async def listed(url: str, *more: str) -> Ran:
        ran = await interlock(
            "reviews", "list", "--journal", url, "--address", r.address, *more, cwd=tmp_path
        )
        assert ran.code == 0, ran.err
        return ran

    try:
        elsewhere = await listed(other_url, "--json")
        assert elsewhere.json()["journal_id"] == theirs
        assert review not in [d["workflow_id"] for d in elsewhere.json()["reviews"]]
        assert elsewhere.json()["other_journals_hidden"] >= 1
        table = await listed(other_url)
        assert eid[:16] not in table.out
        assert "review(s) of other journals not shown" in table.err, table.err
        everything = await listed(other_url, "--json", "--all-journals")
        (doc,) = [d for d in everything.json()["reviews"] if d["workflow_id"] == review]
        assert (doc["state"], doc["journal_id"], doc["status"]) == ("?", ours, None)
        assert doc["note"] == "no worker answered its status query"
        mine = await listed(r.url, "--json")
        (doc,) = [d for d in mine.json()["reviews"] if d["workflow_id"] == review]
        assert (doc["state"], doc["journal_id"]) == ("?", ours)
    finally:
        await handle.terminate("the test is over")
        await r.client.get_workflow_handle(review).terminate("the test is over")


async def test_a_refused_decision_is_one_line_in_the_workers_log(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``reviews resolve --result`` with a result the activity could not have returned: the
    command says why (exit 1), nothing is recorded, and the worker's log has one line for it,
    at WARNING, with no traceback (the worker's own SDK logs the failed activity at DEBUG)."""
    import logging

    caplog.set_level(logging.INFO)
    async with rig(dev_server, tmp_path, tier=3) as r:
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        await r.start(case)
        await opened_with_one_waiting(r, eid)
        before = kinds(r.journal, eid)
        caplog.clear()
        refused = await r.cli(
            "reviews",
            "resolve",
            eid,
            "--decision",
            "happened",
            "--operator",
            "carol",
            "--result",
            '{"refund_id": 7}',
        )
        assert refused.code == 1, (refused.out, refused.err)
        said = one_line(refused)
        assert said.startswith(
            "interlock: refused: the attested result does not match what refund returns: "
        ), said
        assert kinds(r.journal, eid) == before
        records = [x for x in caplog.records if x.levelno >= logging.INFO]
        shown = [
            f"{x.name} {x.levelname} {x.getMessage()}"
            + (" [traceback]" if x.exc_info or x.stack_info else "")
            for x in records
        ]
        # the worker's log as it shows by default (WARNING and up): that one line alone
        assert [x for x in shown if " INFO " not in x] == [
            f"interlock_temporal.review WARNING review of {eid[:16]}: decision not recorded: "
            + said.removeprefix("interlock: refused: ")
        ], shown
        assert not [x for x in shown if "[traceback]" in x], shown
        await r.client.get_workflow_handle(review_id("ambiguous", eid)).terminate("test over")


async def _ended(client: Client, effect_id: str) -> bool:
    description = await client.get_workflow_handle(review_id("ambiguous", effect_id)).describe()
    return description.status == WorkflowExecutionStatus.COMPLETED


async def test_list_reports_ambiguous_effects_nobody_reviews(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """An AMBIGUOUS effect whose review never opened (here: the gate ran with no Temporal) is
    named; with no journal the command lists reviews only and says so."""
    world = await asyncio.to_thread(build_world, tmp_path)
    address = dev_server.target

    ran = await interlock(
        "reviews", "list", "--journal", world.url, "--address", address, cwd=tmp_path
    )
    assert ran.code == 0, ran.err
    assert f"AMBIGUOUS with no open review: {world.ambiguous}" in ran.out.splitlines()
    # only AMBIGUOUS effects: the one in doubt, refused or committed is not named
    for other in (world.in_doubt, world.refused, world.committed):
        assert other not in ran.out
    assert "1 AMBIGUOUS effect(s) have no open review" in ran.err

    as_json = await interlock(
        "reviews", "list", "--json", "--journal", world.url, "--address", address, cwd=tmp_path
    )
    assert as_json.json()["ambiguous_without_review"] == [world.ambiguous]

    # the journal and the address from the environment, the options on the group
    from_env = await interlock(
        "reviews",
        "--address",
        address,
        "list",
        "--json",
        cwd=tmp_path,
        env={"INTERLOCK_JOURNAL": world.url},
    )
    assert from_env.code == 0 and from_env.json()["ambiguous_without_review"] == [world.ambiguous]
    by_env = await interlock(
        "reviews",
        "list",
        "--json",
        "--journal",
        world.url,
        cwd=tmp_path,
        env={"TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": "default"},
    )
    assert by_env.code == 0 and by_env.json()["ambiguous_without_review"] == [world.ambiguous]

    missing = f"sqlite:///{tmp_path / 'nowhere.db'}"
    blind = await interlock(
        "reviews", "list", "--journal", missing, "--address", address, cwd=tmp_path
    )
    assert blind.code == 0, blind.err
    assert "AMBIGUOUS with no open review" not in blind.out
    assert "Traceback" not in blind.err
    note = blind.err.strip().splitlines()[-1]
    assert note.startswith("interlock: journal ")
    assert "nowhere.db" in note and "listing reviews only" in note
    assert not (tmp_path / "nowhere.db").exists()
    blind_json = await interlock(
        "reviews", "list", "--json", "--journal", missing, "--address", address, cwd=tmp_path
    )
    assert blind_json.code == 0 and blind_json.json()["ambiguous_without_review"] is None


async def test_resolve_without_a_review(dev_server: DevServer, tmp_path: Path) -> None:
    world = await asyncio.to_thread(build_world, tmp_path)
    address = dev_server.target
    with world.open() as journal:
        before = kinds(journal, world.ambiguous)

    nobody = await interlock(
        "reviews",
        "resolve",
        world.ambiguous[:10],
        "--decision",
        "happened",
        "--operator",
        "carol",
        "--journal",
        world.url,
        "--address",
        address,
        cwd=tmp_path,
    )
    assert nobody.code == 2, (nobody.out, nobody.err)
    assert f"no open review for effect {world.ambiguous}" in one_line(nobody)
    with world.open() as journal:
        assert kinds(journal, world.ambiguous) == before

    # a prefix needs the journal; a full id does not
    no_journal = ["--journal", f"sqlite:///{tmp_path / 'nowhere.db'}", "--address", address]
    prefix = await interlock(
        "reviews",
        "resolve",
        world.ambiguous[:10],
        "--decision",
        "happened",
        "--operator",
        "carol",
        *no_journal,
        cwd=tmp_path,
    )
    assert prefix.code == 2 and "full effect id" in one_line(prefix)
    full = await interlock(
        "reviews",
        "resolve",
        world.ambiguous.upper(),
        "--decision",
        "happened",
        "--operator",
        "carol",
        *no_journal,
        cwd=tmp_path,
    )
    assert full.code == 2 and f"no open review for effect {world.ambiguous}" in one_line(full)

    unknown = await interlock(
        "reviews",
        "resolve",
        "0123456789ab",
        "--decision",
        "happened",
        "--operator",
        "carol",
        "--journal",
        world.url,
        "--address",
        address,
        cwd=tmp_path,
    )
    assert unknown.code == 2 and "no effect 0123456789ab" in one_line(unknown)

    bad_result = await interlock(
        "reviews",
        "resolve",
        world.ambiguous,
        "--decision",
        "happened",
        "--operator",
        "carol",
        "--result",
        "{not json",
        "--address",
        address,
        cwd=tmp_path,
    )
    assert bad_result.code == 2 and "--result is not JSON" in bad_result.err


async def test_unreachable_server_exits_3_naming_the_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    for argv in (
        ["reviews", "list"],
        ["reviews", "resolve", "a" * 64, "--decision", "happened", "--operator", "carol"],
        ["reconcile", "--task-queue", "q"],
    ):
        ran = await interlock(*argv, "--address", address, cwd=tmp_path)
        assert ran.code == 3, (argv, ran.err)
        assert ran.out == ""
        assert f"Temporal at {address} cannot be reached" in one_line(ran)
    from_env = await interlock("reviews", "list", cwd=tmp_path, env={"TEMPORAL_ADDRESS": address})
    assert from_env.code == 3 and address in one_line(from_env)


async def test_unknown_namespace_exits_3(dev_server: DevServer, tmp_path: Path) -> None:
    ran = await interlock(
        "reviews",
        "list",
        "--address",
        dev_server.target,
        "--namespace",
        "no-such-namespace",
        "--journal",
        f"sqlite:///{tmp_path / 'none.db'}",
        cwd=tmp_path,
    )
    assert ran.code == 3
    assert "namespace no-such-namespace not found" in ran.err
    assert "Traceback" not in ran.err


# -- reconcile ----------------------------------------------------------------------------------


async def _left_in_doubt(world: ServerWorld) -> str:
    """The worker is SIGKILLed after DISPATCHED, before the send; the workflow is then
    terminated, so no attempt will come back for the effect; a fresh worker starts."""
    world.setup()
    world.payments.arm("before_send", "kill")
    # a case id of its own: a review this test opens is this test's alone on the shared server
    case = world.case().model_copy(update={"case_id": f"cli-{uuid.uuid4().hex[:10]}"})
    handle = await world.start(case)
    await world.crashed(handle)
    eid = effect_of(case)
    row = world.journal.row(eid)
    assert row is not None and row.status is Kind.DISPATCHED
    assert not world.journal.is_claimed(eid)  # the kernel released the dead worker's claim
    await handle.terminate("left in doubt for the reconciler")
    assert world.payments.refunded_cents(ORDER) == 0
    await world.spawn()
    return eid


async def test_reconcile_refuses_an_effect_its_terminated_workflow_left_unsent_at_tier_2(
    client: Client, tmp_path: Path
) -> None:
    """The reconciler, run from the command on the fresh worker, asks the target, finds
    nothing sent, and never sends it (only the terminated workflow owned it): REFUSED
    ``cancelled``, executed false."""
    world = await ServerWorld.create(client, tmp_path, 2, "gated")
    try:
        eid = await _left_in_doubt(world)
        argv = ["--address", client.service_client.config.target_host]
        ran = await interlock(
            "reconcile",
            "--task-queue",
            world.task_queue,
            "--older-than",
            "0s",
            "--json",
            *argv,
            cwd=tmp_path,
        )
        assert ran.code == 0, (ran.out, ran.err)
        report = ran.json()
        assert report["ok"] is True and report["in_doubt"] == 1 and report["unsettled"] == []
        (outcome,) = report["outcomes"]
        assert outcome["effect_id"] == eid
        assert (outcome["activity"], outcome["final"], outcome["code"], outcome["review"]) == (
            "refund",
            "REFUSED",
            "cancelled",
            None,
        )
        assert "was terminated" in outcome["note"]

        found = receipt(eid, journal=world.journal)
        assert (found.final, found.tier, found.executed) == ("REFUSED", 2, False)
        assert world.payments.refunded_cents(ORDER) == 0
        assert world.payments.calls(ORDER) == 0

        # nothing left: the table form says so, and exits 0
        again = await interlock(
            "reconcile", "--task-queue", world.task_queue, "--older-than", "0s", *argv, cwd=tmp_path
        )
        assert again.code == 0, again.err
        assert again.out.strip() == "0 in doubt; all settled"
        assert world.payments.refunded_cents(ORDER) == 0
    finally:
        await world.close()


async def test_reconcile_puts_an_effect_it_cannot_close_out_in_front_of_a_person(
    client: Client, tmp_path: Path
) -> None:
    """Tier 3 cannot be asked: the reconciler records AMBIGUOUS and opens a review (exit 0:
    a person is asked); the review is listed, and resolved from the command."""
    world = await ServerWorld.create(client, tmp_path, 3, "gated")
    try:
        eid = await _left_in_doubt(world)
        argv = ["--address", client.service_client.config.target_host]
        ran = await interlock(
            "reconcile", "--task-queue", world.task_queue, "--older-than", "0s", *argv, cwd=tmp_path
        )
        assert ran.code == 0, (ran.out, ran.err)
        lines = ran.out.strip().splitlines()
        assert (
            lines[1].split()[:5]
            == [
                eid[:16],
                "refund",
                "AMBIGUOUS",
                "unknowable",  # its code: tier 3 cannot be asked
                f"interlock-review-ambiguous-{eid[:16]}",
            ]
        )
        assert lines[-1] == "1 in doubt: 1 AMBIGUOUS; all settled"
        assert receipt(eid, journal=world.journal).final == "AMBIGUOUS"

        journal = ["--journal", world.journal.url]

        async def listed() -> Any:
            out = await interlock("reviews", "list", "--json", *journal, *argv, cwd=tmp_path)
            assert out.code == 0, out.err
            docs = [d for d in out.json()["reviews"] if d["effect_id"] == eid]
            return (docs, out.json()["ambiguous_without_review"]) if docs else None

        (doc,), orphans = await until(listed, "the reconciler's review listed")
        assert (doc["state"], doc["waiting"]) == ("open", 0)  # nobody waits: it was terminated
        assert eid not in orphans

        decided = await interlock(
            "reviews",
            "resolve",
            eid[:8],
            "--decision",
            "not_happened",
            "--operator",
            "carol",
            *journal,
            *argv,
            cwd=tmp_path,
        )
        assert decided.code == 0, decided.err
        assert fields(decided.out)["decision"] == "not_happened"
        found = receipt(eid, journal=world.journal)
        assert (found.final, found.operator, found.executed) == ("RESOLVED", "carol", False)
        assert world.payments.refunded_cents(ORDER) == 0
    finally:
        await world.close()


async def test_reconcile_exits_1_for_an_effect_it_cannot_close_out(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """An effect in doubt whose gated activity this worker does not have is skipped: exit 1,
    and the table names it. One dispatched a moment ago is not touched under --older-than."""
    async with rig(dev_server, tmp_path, tier=2) as r:
        lease = r.journal.leases.issue("refund-bot", activities=["mystery"])
        req = RefundRequest(case_id="mystery-1", order_id=ORDER, amount_cents=100)
        call = Call(
            effect_type="mystery",
            activity="mystery",
            input=req,
            args=(req,),
            key={"case": req.case_id},
            principal="refund-bot",
            lease_id=lease,
        )

        async def dies(_: Any) -> Any:
            raise SimulatedCrash("before the answer")

        with suppress(SimulatedCrash):
            await Gate(r.journal).run(call, r.payments, dies)
        eid = Gate.identify(call)[0]
        assert r.journal.row(eid).status is Kind.DISPATCHED  # type: ignore[union-attr]

        young = await r.cli(
            "reconcile", "--task-queue", r.task_queue, "--older-than", "1h", "--json"
        )
        assert young.code == 0, young.err
        assert young.json()["in_doubt"] == 0 and young.json()["ok"] is True

        ran = await r.cli("reconcile", "--task-queue", r.task_queue, "--older-than", "0s")
        assert ran.code == 1, (ran.out, ran.err)
        lines = ran.out.strip().splitlines()
        assert lines[0].split() == ["EFFECT", "ACTIVITY", "FINAL", "VIA/CODE", "REVIEW", "NOTE"]
        assert lines[1].split()[:5] == [eid[:16], "mystery", "skipped", "-", "-"]
        assert "no gated activity 'mystery' on this worker" in lines[1]
        assert lines[-1] == "1 in doubt: 1 skipped; 1 still need attention"
        assert kinds(r.journal, eid)[-1] is Kind.DISPATCHED  # left as it was


class SlowQuery(BaseTarget):
    """A tier-2 target whose ``query`` takes ``delay_s`` to say "not found": a reconciler that
    asks it is in progress that long. ``asked`` counts the queries."""

    name = "slow"
    tier = 2

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.asked = 0

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {}

    async def query(self, effect_id: str, args: Any) -> Found | None:
        self.asked += 1
        await asyncio.sleep(self.delay_s)
        return None


@asynccontextmanager
async def slow_reconcile(r: Rig, delay_s: float) -> AsyncIterator[tuple[str, SlowQuery, str]]:
    """A worker on a queue of its own with a gated ``slow`` activity whose target answers in
    ``delay_s``, and one of its effects left DISPATCHED by an attempt that died: (the queue, the
    target, the effect id)."""
    target = SlowQuery(delay_s)

    @activity.defn(name="slow")
    async def slow(req: RefundRequest) -> RefundResult:
        raise AssertionError("the reconciler never sends")

    queue = f"slow-{uuid.uuid4().hex[:10]}"
    lease = r.journal.leases.issue("refund-bot", activities=["slow"])
    req = RefundRequest(case_id=f"slow-{uuid.uuid4().hex[:8]}", order_id=ORDER, amount_cents=100)
    call = Call(
        effect_type="slow",
        activity="slow",
        input=req,
        args=(req,),
        key={"case": req.case_id},
        principal="refund-bot",
        lease_id=lease,
    )

    async def dies(_: Any) -> Any:
        raise SimulatedCrash("before the answer")

    with suppress(SimulatedCrash):
        await Gate(r.journal).run(call, target, dies)
    eid = Gate.identify(call)[0]
    assert kinds(r.journal, eid)[-1] is Kind.DISPATCHED
    async with Worker(r.client, task_queue=queue, activities=[gated(slow, target=target)]):
        yield queue, target, eid


async def reconcile_process(r: Rig, queue: str) -> asyncio.subprocess.Process:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [environ.get("PYTHONPATH")])])
    return await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT),
        "reconcile",
        "--task-queue",
        queue,
        "--older-than",
        "0s",
        "--address",
        r.address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environ,
        cwd=r.workdir,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_stopped_reconcile_cancels_its_reconciler_and_says_so(
    dev_server: DevServer, tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C (or SIGTERM) while the reconciler asks a target: the command cancels the
    reconciler workflow it waits on, says so in one line and exits 128 + the signal."""
    async with rig(dev_server, tmp_path, tier=2) as r, slow_reconcile(r, 60) as (queue, slow, _):
        process = await reconcile_process(r, queue)
        try:
            await until(lambda: slow.asked == 1, "the reconciler asks the target")
            process.send_signal(sig)
            out, err = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
        ran = Ran(process.returncode or 0, out.decode(), err.decode())
        assert ran.code == 128 + sig, (ran.out, ran.err)
        workflow_id = f"interlock-reconcile-once-{queue}"
        assert one_line(ran) == (
            f"interlock: interrupted ({sig.name}): reconciler workflow {workflow_id} cancelled; "
            "what it closed out before stays recorded in the journal"
        )
        assert ran.out == ""
        described = await r.client.get_workflow_handle(workflow_id).describe()
        assert described.status == WorkflowExecutionStatus.CANCELED


async def test_a_killed_reconcile_leaves_its_reconciler_to_the_next_which_says_so(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """SIGKILL cannot be caught: the reconciler runs on. The next command waits on that one
    (it says so) instead of starting another, and prints its report."""
    async with rig(dev_server, tmp_path, tier=2) as r, slow_reconcile(r, 4) as (queue, slow, eid):
        process = await reconcile_process(r, queue)
        await until(lambda: slow.asked == 1, "the reconciler asks the target")
        process.kill()
        await process.wait()
        workflow_id = f"interlock-reconcile-once-{queue}"
        handle = r.client.get_workflow_handle(workflow_id)
        first = await handle.describe()
        assert first.status == WorkflowExecutionStatus.RUNNING
        ran = await r.cli("reconcile", "--task-queue", queue, "--older-than", "0s", "--json")
        assert ran.code == 0, (ran.out, ran.err)
        (said,) = ran.err.strip().splitlines()
        assert said.startswith(
            f"interlock: reusing reconciler workflow {workflow_id}, still running since "
        ), said
        assert said.endswith(
            "(an earlier `interlock reconcile` was killed before it could cancel it): waiting for "
            "its report, made with the --older-than and --limit it was started with"
        ), said
        report = ran.json()
        assert report["workflow_id"] == workflow_id and report["in_doubt"] == 1
        (outcome,) = report["outcomes"]
        assert (outcome["effect_id"], outcome["final"]) == (eid, "REFUSED")
        after = await handle.describe()
        assert (after.run_id, after.status) == (first.run_id, WorkflowExecutionStatus.COMPLETED)
        assert slow.asked == 1  # one reconciler asked, once


async def test_reconcile_with_no_worker_times_out(dev_server: DevServer, tmp_path: Path) -> None:
    queue = f"nobody-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    ran = await interlock(
        "reconcile",
        "--task-queue",
        queue,
        "--timeout",
        "2s",
        "--address",
        dev_server.target,
        cwd=tmp_path,
    )
    assert ran.code == 1
    assert time.monotonic() - started < 15
    lines = ran.err.strip().splitlines()
    assert f"no worker has polled task queue {queue}" in lines[0]
    assert "did not finish within 0:00:02" in lines[-1] and queue in lines[-1]
    assert "Traceback" not in ran.err


# -- effects reopen (the journal only) --------------------------------------------------------


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    def run(*argv: str) -> Ran:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


def test_reopen_a_refused_effect(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    world = build_world(tmp_path)
    with world.open() as journal:
        before = kinds(journal, world.refused)
    assert before[-1] is Kind.REFUSED

    ran = cli(
        "--journal",
        world.url,
        "effects",
        "reopen",
        world.refused[:10],
        "--operator",
        "dave",
        "--note",
        "the customer called back",
    )
    assert ran.code == 0, ran.err
    assert ran.out.startswith(f"reopened {world.refused} by dave")
    assert fields(ran.out)["final"] == "REOPENED"
    with world.open() as journal:
        entries = journal.read(world.refused)
        assert [e.kind for e in entries] == [*before, Kind.REOPENED]
        assert entries[-1].data["operator"] == "dave"
        assert entries[-1].data["note"] == "the customer called back"
        assert entries[-1].data["refused_code"] == "lease"
        assert journal.verify().ok

    # reopened once: it is no longer REFUSED
    twice = cli("--journal", world.url, "effects", "reopen", world.refused, "--operator", "dave")
    assert twice.code == 1 and "only a REFUSED effect can be reopened" in twice.err


@pytest.mark.parametrize("which", ["committed", "ambiguous", "in_doubt"])
def test_reopen_refuses_an_effect_that_is_not_refused(
    tmp_path: Path, cli: Callable[..., Ran], which: str
) -> None:
    world = build_world(tmp_path)
    effect_id = getattr(world, which)
    with world.open() as journal:
        before = kinds(journal, effect_id)
    ran = cli("--journal", world.url, "effects", "reopen", effect_id, "--operator", "dave")
    assert ran.code == 1
    assert ran.out == ""
    assert "only a REFUSED effect can be reopened" in ran.err
    assert len(ran.err.strip().splitlines()) == 1
    with world.open() as journal:
        assert kinds(journal, effect_id) == before


def test_reopen_usage(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    world = build_world(tmp_path)
    no_operator = cli("--journal", world.url, "effects", "reopen", world.refused)
    assert no_operator.code == 2 and "--operator" in no_operator.err
    blank = cli("--journal", world.url, "effects", "reopen", world.refused, "--operator", " ")
    assert blank.code == 2  # a usage error, as for `circuit reset` and `reviews resolve`
    assert "argument --operator: must name the person" in blank.err
    unknown = cli("--journal", world.url, "effects", "reopen", "f" * 64, "--operator", "dave")
    assert unknown.code == 2 and "no effect" in unknown.err
    with world.open() as journal:
        assert kinds(journal, world.refused)[-1] is Kind.REFUSED


# -- the pieces ---------------------------------------------------------------------------------


def test_only_the_server_commands_import_temporal(tmp_path: Path) -> None:
    world = build_world(tmp_path)
    probe = (
        "import sys\n"
        "from interlock_temporal.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'temporalio']\n"
        "print('PROBE', code, len(loaded))\n"
    )

    def run(*argv: str) -> tuple[int, int]:
        done = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")},
        )
        line = done.stdout.strip().splitlines()[-1].split()
        assert line[0] == "PROBE", done.stdout
        return int(line[1]), int(line[2])

    for argv in (["journal", "verify"], ["effects", "list"], ["leases", "list"]):
        assert run("--journal", world.url, *argv) == (0, 0), argv
    code, loaded = run("reviews", "list", "--address", f"127.0.0.1:{free_port()}")
    assert code == 3 and loaded > 0  # the probe sees Temporal when a command needs it


def test_usage_of_the_server_commands(cli: Callable[..., Ran]) -> None:
    assert cli("reconcile").code == 2  # --task-queue is required
    assert cli("reconcile", "--task-queue", "q", "--older-than", "soon").code == 2
    assert cli("reviews").code == 2
    assert cli("reviews", "resolve", "a" * 64, "--operator", "carol").code == 2
    assert cli("reviews", "resolve", "a" * 64, "--decision", "happened").code == 2
    kind = cli(
        "reviews", "resolve", "a" * 64, "--decision", "x", "--operator", "o", "--kind", "other"
    )
    assert kind.code == 2


@pytest.mark.parametrize(
    ("text", "seconds"), [("0s", 0), ("0m0s", 0), ("90s", 90), ("1h30m", 5400)]
)
def test_age_allows_zero(text: str, seconds: int) -> None:
    assert _age(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0", "60", ""])
def test_an_age_needs_a_unit_too(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        _age(text)


def test_outcomes_that_need_nobody() -> None:
    def outcome(final: str, **kw: Any) -> ReconcileOutcome:
        return ReconcileOutcome(effect_id="e" * 64, final=final, **kw)

    assert needs_nobody(outcome("COMMITTED", via="recovery-query"))
    assert needs_nobody(outcome("REFUSED", code="lease"))
    assert needs_nobody(outcome("AMBIGUOUS", review=review_id("ambiguous", "e" * 64)))
    assert not needs_nobody(outcome("AMBIGUOUS"))
    assert needs_nobody(outcome("skipped", skipped="live_attempt", note="a live attempt holds it"))
    assert not needs_nobody(
        outcome("skipped", skipped="unknown_activity", note="no gated activity")
    )
    assert not needs_nobody(
        outcome("skipped", note="a live attempt holds it")
    )  # the reason decides
    assert not needs_nobody(outcome("DISPATCHED", note="in flight"))


def test_render_reviews_and_reconcile() -> None:
    table = render_reviews(
        [
            ReviewLine(
                workflow_id=review_id("ambiguous", "a" * 64),
                kind="ambiguous",
                effect_id="a" * 64,
                state="open",
                votes=[{"decision": "happened", "operator": "bob", "note": ""}],
                waiting=2,
            ),
            ReviewLine(
                workflow_id=review_id("approval", "b" * 64),
                kind="approval",
                effect_id="b" * 64,
                state="?",
                note="no worker answered its status query",
            ),
        ]
    ).splitlines()
    assert table[0].split() == ["KIND", "EFFECT", "STATE", "VOTES", "WAITING", "STARTED", "NOTE"]
    assert table[1].split() == ["ambiguous", "a" * 16, "open", "bob=happened", "2", "-", "-"]
    assert table[2].split()[:6] == ["approval", "b" * 16, "?", "-", "-", "-"]
    assert table[2].endswith("no worker answered its status query")
    assert render_reviews([]) == "(no reviews)"

    report = ReconcileReport(
        in_doubt=3,
        outcomes=[
            ReconcileOutcome(
                effect_id="c" * 64, activity="refund", final="COMMITTED", via="recovery-query"
            ),
            ReconcileOutcome(
                effect_id="d" * 64,
                activity="refund",
                final="AMBIGUOUS",
                review=review_id("ambiguous", "d" * 64),
            ),
        ],
    )
    lines = render_reconcile(report).splitlines()
    assert lines[1].split() == ["c" * 16, "refund", "COMMITTED", "recovery-query", "-", "-"]
    assert lines[2].split()[:5] == [
        "d" * 16,
        "refund",
        "AMBIGUOUS",
        "-",
        "interlock-review-ambiguous-" + "d" * 16,
    ]
    assert reconcile_summary(report, 1) == (
        "3 in doubt: 1 AMBIGUOUS, 1 COMMITTED, 1 not reached (limit); 1 still need attention"
    )
    assert render_reconcile(ReconcileReport(in_doubt=0)) == "(no effects in doubt)"
    assert reconcile_summary(ReconcileReport(in_doubt=0), 0) == "0 in doubt; all settled"
