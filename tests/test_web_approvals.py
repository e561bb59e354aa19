"""Approvals from a web backend (docs/web-approvals.md): the page's Starlette application, run
under real uvicorn in its own process against a real Temporal dev server and a real worker with
the gate, decides a review over HTTP with its attester proof, and cannot decide without one.

The story: a tier-3 refund lands and its answer is lost on the last attempt, so the effect is
AMBIGUOUS and the workflow waits for a person. The journal has a roster: carol and dave with
keys of their own, and ``review-app``, the application's key, attesting for carol only."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from interlock_temporal.core import Kind
from interlock_temporal.core.journal.signing import Ed25519Key
from interlock_temporal.core.operators import add_operator
from interlock_temporal.core.review import review_id
from interlock_temporal.policy import CallEvent, Policy, escalate
from interlock_temporal.review import NotDecided, ReviewClient, Vote
from interlock_temporal.testing import DevServer, free_port
from workers.scenarios import ORDER

from .doc_snippets import ROOT, snippet
from .review_rig import effect_of, opened_with_one_waiting, rig
from .waiting import until

pytestmark = pytest.mark.server

APP = snippet("docs/web-approvals.md#7756a89ccdc3")
#: the placeholder login's header (the page labels it: not authentication)
LOGIN = "x-demo-operator"


@asynccontextmanager
async def served(
    tmp_path: Path, *, address: str, journal: str, key: Ed25519Key
) -> AsyncIterator[httpx.AsyncClient]:
    """The page's application in a uvicorn process of its own, configured as the page says (its
    environment), and an HTTP client of it."""
    folder = tmp_path / f"app-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "app.py").write_text(APP)
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
    environ.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [environ.get("PYTHONPATH")])]),
        TEMPORAL_ADDRESS=address,
        INTERLOCK_JOURNAL=journal,
        REVIEW_APP_KEY=f"ed25519:{key.seed_hex()}",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning"],
        cwd=folder,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:

            async def up() -> bool:
                assert process.poll() is None, process.communicate()[0].decode()
                try:
                    await http.get("/reviews")
                except httpx.TransportError:
                    return False
                return True

            await until(up, "the application answered")
            yield http
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def as_operator(name: str) -> dict[str, str]:
    return {LOGIN: name}


async def test_a_web_backend_decides_with_its_attester_proof_and_not_without(
    dev_server: DevServer, tmp_path: Path
) -> None:
    async with rig(dev_server, tmp_path, tier=3) as r:
        app_key = Ed25519Key.generate()
        add_operator(r.journal, "carol", Ed25519Key.generate().public_text)
        add_operator(r.journal, "dave", Ed25519Key.generate().public_text)
        add_operator(r.journal, "review-app", app_key.public_text, attests_for=["carol"])
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        handle = await r.start(case)
        await opened_with_one_waiting(r, eid)
        assert r.payments.refunded_cents(ORDER) == 2000

        # an impostor: a review started by hand under a review's id and type, on a queue no
        # worker polls; visibility lists it, the journal does not
        impostor = "f" * 48 + uuid.uuid4().hex[:16]
        await r.client.start_workflow(
            "EffectReview",
            {"kind": "ambiguous", "effect_id": impostor, "activity": "refund"},
            id=review_id("ambiguous", impostor),
            task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
        )
        direct = ReviewClient(r.client, r.journal, attester="review-app", attester_key=app_key)
        listed = {w.effect_id: w for w in await direct.waiting()}
        assert impostor not in listed and eid in listed

        async with served(tmp_path, address=r.address, journal=r.url, key=app_key) as http:
            # -- what waits: the genuine review, with what a person needs to decide it
            assert (await http.get("/reviews")).status_code == 401  # nobody logged in
            page = await http.get("/reviews", headers=as_operator("carol"))
            assert page.status_code == 200, page.text
            shown = {w["effect_id"]: w for w in page.json()}
            assert impostor not in shown
            waiting = shown[eid]
            assert (waiting["kind"], waiting["activity"], waiting["principal"]) == (
                "ambiguous",
                "refund",
                "refund-bot",
            )
            assert waiting["decisions"] == ["happened", "not_happened"]
            assert waiting["proposed"]["amount_cents"] == 2000
            assert waiting["proposed"]["order_id"] == ORDER
            assert waiting["opened_at"] and waiting["deadline"] > waiting["opened_at"]

            async def post(operator: str | None, body: dict[str, Any], effect: str = eid) -> Any:
                headers = {} if operator is None else as_operator(operator)
                return await http.post(f"/reviews/{effect}", json=body, headers=headers)

            # -- refused, nothing recorded: nobody logged in, an operator the application does
            # not attest for, a decision of another kind, an effect the journal does not hold
            assert (await post(None, {"decision": "happened"})).status_code == 401
            dave = await post("dave", {"decision": "happened"})
            assert (dave.status_code, dave.json()["code"]) == (403, "not_attester"), dave.text
            wrong = await post("carol", {"decision": "approve"})
            assert (wrong.status_code, wrong.json()["code"]) == (422, "invalid_decision")
            unknown = await post("carol", {"decision": "happened"}, effect="0" * 64)
            assert (unknown.status_code, unknown.json()["code"]) == (404, "unknown_effect")
            assert r.journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]

        # -- an application whose key the roster does not hold as an attester
        stranger = Ed25519Key.generate()
        async with served(tmp_path, address=r.address, journal=r.url, key=stranger) as http:
            refused = await http.post(
                f"/reviews/{eid}", json={"decision": "happened"}, headers=as_operator("carol")
            )
            assert (refused.status_code, refused.json()["code"]) == (403, "not_attester")

        # -- a vote without a proof, sent straight to the review as any client can: the worker
        # refuses it, and one signed by a key the roster does not hold
        from interlock_temporal._reviews.deciding import send_vote

        for key in (None, stranger):
            with pytest.raises(NotDecided) as unproven:
                await send_vote(
                    r.client, "ambiguous", eid, Vote(decision="happened", operator="carol"), key=key
                )
            assert unproven.value.code == "refused", unproven.value
        assert r.journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]

        # -- carol, logged in, decides: recorded with the application's proof for her
        async with served(tmp_path, address=r.address, journal=r.url, key=app_key) as http:
            decided = await http.post(
                f"/reviews/{eid}",
                json={"decision": "happened", "note": "on the statement"},
                headers=as_operator("carol"),
            )
            assert decided.status_code == 200, decided.text
            assert decided.json() == {
                "effect_id": eid,
                "kind": "ambiguous",
                "state": "decided",
                "decision": "happened",
                "operators": ["carol"],
                "reason": "",
            }
            again = await http.post(
                f"/reviews/{eid}", json={"decision": "happened"}, headers=as_operator("carol")
            )
            assert (again.status_code, again.json()["code"]) == (409, "not_waiting")
            after = await http.get("/reviews", headers=as_operator("carol"))
            assert eid not in [w["effect_id"] for w in after.json()]

        outcome = await asyncio.wait_for(handle.result(), 30)
        assert outcome.status == "RESOLVED"
        (resolved,) = [e for e in r.journal.read(eid) if e.kind is Kind.RESOLVED]
        assert (resolved.data["decision"], resolved.data["operators"]) == ("happened", ["carol"])
        (proof,) = resolved.data["proofs"]
        assert (proof["operator"], proof["signer"]) == ("carol", "review-app")
        # one refund, read from the payments service
        (refund,) = r.payments.refund_records(ORDER)
        assert refund.amount_cents == 2000 and r.payments.calls(ORDER) == 1
        await r.client.get_workflow_handle(review_id("ambiguous", impostor)).terminate()


async def test_a_decision_is_refused_where_the_journal_has_no_roster(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """Without a roster an attester's proof proves nothing (anyone may decide under any name):
    the client says so instead of sending a vote whose proof means nothing."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        await r.start(case)
        await opened_with_one_waiting(r, eid)
        reviews = ReviewClient(
            r.client, r.journal, attester="review-app", attester_key=Ed25519Key.generate()
        )
        with pytest.raises(NotDecided) as refused:
            await reviews.decide(eid, operator="carol", decision="happened")
        assert refused.value.code == "no_roster"
        assert r.journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="attester_key"):
            ReviewClient(
                r.client,
                r.journal,
                attester="review-app",
                attester_key=Ed25519Key.generate().public_text,
            )


def refunds_need_a_person(e: CallEvent) -> Any:
    if e.activity == "refund":
        return escalate("REFUNDS_NEED_A_PERSON", "every refund needs a person")
    return None


async def test_an_approval_is_decided_with_the_attester_proof_and_runs_once(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """An approval (a policy escalated the refund before anything was sent): listed from the
    journal, approved by the web backend for carol, and the refund runs once."""
    policy = Policy(rules=[refunds_need_a_person], policy_id="web")
    async with rig(dev_server, tmp_path, tier=2, policy=policy) as r:
        app_key = Ed25519Key.generate()
        add_operator(r.journal, "carol", Ed25519Key.generate().public_text)
        add_operator(r.journal, "review-app", app_key.public_text, attests_for=["carol"])
        handle = await r.start(r.case(wait_for_review=True))
        reviews = ReviewClient(r.client, r.journal, attester="review-app", attester_key=app_key)

        async def asked() -> list[Any]:
            return [w for w in await reviews.waiting() if w.kind == "approval"]

        (waiting,) = await until(asked, "the approval was asked")
        assert waiting.decisions == ["approve", "reject"]
        assert r.payments.calls(ORDER) == 0  # escalated: nothing sent
        with pytest.raises(NotDecided) as wrong:
            await reviews.decide(waiting.effect_id, operator="carol", decision="happened")
        assert wrong.value.code == "invalid_decision"
        decided = await reviews.decide(waiting.effect_id, operator="carol", decision="approve")
        assert (decided.state, decided.decision, decided.operators) == (
            "decided",
            "approve",
            ["carol"],
        )
        outcome = await asyncio.wait_for(handle.result(), 30)
        assert outcome.status == "REFUNDED"
        (refund,) = r.payments.refund_records(ORDER)
        assert refund.amount_cents == 2000 and r.payments.calls(ORDER) == 1
        assert await asked() == []


async def test_a_review_not_opened_by_the_workers_is_not_sent_a_vote(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """The genuine review ended and an impostor runs under its id (anyone with namespace
    access can start one): the client refuses to send it carol's vote, and nothing is
    recorded."""
    async with rig(dev_server, tmp_path, tier=3) as r:
        app_key = Ed25519Key.generate()
        add_operator(r.journal, "carol", Ed25519Key.generate().public_text)
        add_operator(r.journal, "review-app", app_key.public_text, attests_for=["carol"])
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=False, maximum_attempts=1)
        eid = effect_of(case)
        await r.start(case)
        await opened_with_one_waiting(r, eid)
        genuine = r.client.get_workflow_handle(review_id("ambiguous", eid))
        await genuine.terminate("replaced by an impostor")
        await r.client.start_workflow(
            "EffectReview",
            {"kind": "ambiguous", "effect_id": eid, "activity": "refund"},
            id=review_id("ambiguous", eid),
            task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
        )
        reviews = ReviewClient(r.client, r.journal, attester="review-app", attester_key=app_key)
        with pytest.raises(NotDecided) as refused:
            await reviews.decide(eid, operator="carol", decision="happened")
        assert refused.value.code == "not_genuine", refused.value
        assert r.journal.row(eid).status is Kind.AMBIGUOUS  # type: ignore[union-attr]
        await r.client.get_workflow_handle(review_id("ambiguous", eid)).terminate()
