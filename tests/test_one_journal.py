"""One task queue, one journal (issue 33): a journal's signed id, and workers that refuse gated
work when their task queue is shared with a worker of another journal, on a real Temporal
server with real SQLite journals. The money is read from the payments service's own file."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from interlock_temporal import InterlockInterceptor, InterlockPlugin, current_effect, gated, receipt
from interlock_temporal._worker import journal_check
from interlock_temporal._worker.journal_check import QueueJournalCheck
from interlock_temporal.core.config_chain import append_config
from interlock_temporal.core.errors import JournalCorrupt
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.journal_identity import (
    JOURNAL_CHAIN,
    journal_id_of,
    journal_named_by,
)
from interlock_temporal.core.models import Kind
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer
from workers.world import ORDER
from workflows.activities import REFUND_EFFECT

from .server_workflows import CallActivity
from .waiting import until

KEY = "11" * 32
LEASE = "lease-shared"


# -- the journal's id -------------------------------------------------------------------------


def test_the_id_is_created_once_and_survives_reopen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    with open_journal(url, signing_key=KEY) as journal:
        assert journal_id_of(journal, create=False) is None  # a read creates nothing
        first = journal_id_of(journal)
        assert first is not None and len(first) == 32
        assert journal_id_of(journal) == first
        assert len(journal.read(JOURNAL_CHAIN)) == 1
        assert journal.verify().ok
        assert list(journal.effects()) == []  # the journal's own record, not an effect
    with open_journal(url, signing_key=KEY) as again:
        assert journal_id_of(again, create=False) == first
        assert journal_id_of(again) == first
        assert len(again.read(JOURNAL_CHAIN)) == 1
    with open_journal(f"sqlite:///{tmp_path / 'other.db'}", signing_key=KEY) as other:
        assert journal_id_of(other) != first


def _race(url: str, barrier: Any, out: Any) -> None:
    with open_journal(url, signing_key=KEY) as journal:
        barrier.wait()
        out.put(journal_id_of(journal))


def test_processes_racing_to_create_it_end_with_one_id(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    for round in range(3):
        url = f"sqlite:///{tmp_path / f'race{round}.db'}"
        open_journal(url, signing_key=KEY).close()  # the schema and key file, made once
        barrier = context.Barrier(4)
        out = context.Queue()
        racers = [context.Process(target=_race, args=(url, barrier, out)) for _ in range(4)]
        for p in racers:
            p.start()
        ids = [out.get(timeout=60) for _ in racers]
        for p in racers:
            p.join(60)
            assert p.exitcode == 0
        assert len(set(ids)) == 1, ids
        with open_journal(url, signing_key=KEY) as journal:
            assert len(journal.read(JOURNAL_CHAIN)) == 1  # one entry: the losers appended none
            assert journal_id_of(journal) == ids[0]


def test_an_edit_of_its_row_fails_the_read(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    with open_journal(f"sqlite:///{db}", signing_key=KEY) as journal:
        ours = journal_id_of(journal)
        # another entry after it: the id's entry is not the tail (the tail is checked at open)
        append_config(journal, "config:operators", {"change": "revoke", "name": "nobody"})
    assert ours is not None
    theirs = uuid.uuid4().hex
    connection = sqlite3.connect(db)
    (body,) = connection.execute(
        "SELECT body FROM entries WHERE effect_id = ?", (JOURNAL_CHAIN,)
    ).fetchone()
    forged = bytes(body).replace(ours.encode(), theirs.encode())
    assert forged != bytes(body)
    with connection:
        connection.execute(
            "UPDATE entries SET body = ? WHERE effect_id = ?", (forged, JOURNAL_CHAIN)
        )
    connection.close()
    with open_journal(f"sqlite:///{db}", signing_key=KEY) as journal:
        with pytest.raises(JournalCorrupt):
            journal_id_of(journal)
        assert not journal.verify().ok


# -- workers of two journals on a real server -------------------------------------------------


def refund_once(payments: SimulatedPayments, *, lose_first: bool = True) -> Any:
    """A tier-3 refund; with ``lose_first`` its first attempt sends and then loses the response
    (in doubt)."""

    @activity.defn(name="refund_once")
    @gated(target=payments, **REFUND_EFFECT)
    async def refund_once(r: RefundRequest) -> RefundResult:
        result = await payments.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().idempotency_key
        )
        if lose_first and activity.info().attempt == 1:
            await asyncio.sleep(0.5)  # the gate heartbeats meanwhile
            raise ConnectionError("the connection dropped after the refund was sent")
        return result

    return refund_once


@dataclass
class Site:
    """One journal (with the shared lease) and the plugin of a worker that uses it."""

    url: str
    journal: Journal

    @property
    def id(self) -> str:
        found = journal_id_of(self.journal)
        assert found is not None
        return found

    async def client(self, dev_server: DevServer) -> Client:
        return await Client.connect(
            dev_server.target,
            data_converter=pydantic_data_converter,
            plugins=[InterlockPlugin(self.url, signing_key=KEY)],
        )


def site(directory: Path) -> Site:
    directory.mkdir()
    url = f"sqlite:///{directory / 'interlock.db'}"
    journal = open_journal(url, signing_key=KEY)
    # each journal holds the lease (the case nothing else stops): one shared key, one lease id
    journal.leases.issue(
        "refund-bot",
        activities=["refund_once"],
        max_amount_cents=5000,
        resources=[f"order:{ORDER}"],
        lease_id=LEASE,
    )
    return Site(url, journal)


@asynccontextmanager
async def worker(
    client: Client, queue: str, payments: SimulatedPayments, *, lose_first: bool = True
) -> AsyncIterator[Worker]:
    activities = [refund_once(payments, lose_first=lose_first)]
    async with Worker(
        client, task_queue=queue, workflows=[CallActivity], activities=activities
    ) as running:
        yield running


def check_of(running: Worker) -> QueueJournalCheck:
    """The poller check of a worker's runtime (``InterlockPlugin`` made it)."""
    for interceptor in running.config(active_config=True)["interceptors"] or []:
        if isinstance(interceptor, InterlockInterceptor):
            check = interceptor.runtime.queue_check
            assert check is not None
            return check
    raise AssertionError("no Interlock interceptor on the worker")


def spec(case_id: str, **more: Any) -> dict[str, Any]:
    # no premises captured at decision time: each worker's gate captures them at dispatch, so
    # nothing but the journal check stands between a second journal and a second send
    request = RefundRequest(case_id=case_id, order_id=ORDER, amount_cents=2000)
    return {
        "activity": "refund_once",
        "arg": request.model_dump(mode="json"),
        "principal": "refund-bot",
        "lease": LEASE,
        **more,
    }


def mismatch_of(err: BaseException) -> ApplicationError:
    assert isinstance(err, WorkflowFailureError), err
    assert isinstance(err.cause, ActivityError), err.cause
    cause = err.cause.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.type == "JournalMismatch", (cause.type, cause.message)
    assert cause.non_retryable
    return cause


@pytest.fixture
def payments(tmp_path: Path) -> SimulatedPayments:
    service = SimulatedPayments(tmp_path / "payments.db", tier=3)
    service.open_order(ORDER, 10_000)
    return service


async def _never_answers(self: QueueJournalCheck) -> None:
    """A poller check whose ``DescribeTaskQueue`` never answers: no answer to act on."""


@pytest.mark.server
@pytest.mark.parametrize("refused_by", ["poller", "heartbeat"])
async def test_two_journals_on_one_task_queue_send_a_tier3_effect_once(
    dev_server: DevServer,
    tmp_path: Path,
    payments: SimulatedPayments,
    monkeypatch: pytest.MonkeyPatch,
    refused_by: str,
) -> None:
    """Attempt 1 sends on worker A and is left in doubt; attempt 2 lands on worker B, whose
    journal never heard of the effect: B refuses and sends nothing. ``poller``: B's task
    queue's poller list names A's journal. ``heartbeat``: B's poller check never answers (as
    when DescribeTaskQueue fails), and attempt 1's heartbeat details, which name A's journal,
    refuse it (defence in depth)."""
    a, b = site(tmp_path / "a"), site(tmp_path / "b")
    queue = f"one-journal-{uuid.uuid4().hex[:10]}"
    client_a = await a.client(dev_server)
    async with worker(client_a, queue, payments) as worker_a:
        # the worker names its journal in its Temporal identity
        assert journal_named_by(worker_a.config(active_config=True)["identity"] or "") == a.id
        assert worker_a.config(active_config=True)["identity"].startswith(client_a.identity)  # type: ignore[union-attr]
        handle = await client_a.start_workflow(
            CallActivity.run,
            spec(f"tq-{uuid.uuid4().hex[:8]}", heartbeat_s=1, retry_after_s=4),
            id=f"one-journal-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        await until(lambda: payments.refunded_cents(ORDER) == 2000, "attempt 1 sent")

        async def in_doubt() -> bool:
            description = await handle.describe()
            pending = description.raw_description.pending_activities
            return bool(pending) and pending[0].attempt == 2

        await until(in_doubt, "attempt 1 failed in doubt")
        # the gate's heartbeat details named A's journal
        description = await handle.describe()
        (details,) = pydantic_data_converter.payload_converter.from_payloads(
            list(description.raw_description.pending_activities[0].heartbeat_details.payloads)
        )
        assert details == {"interlock_journal": a.id}
    (row,) = list(a.journal.effects())
    assert row.status is Kind.DISPATCHED  # in doubt in A's journal

    if refused_by == "heartbeat":
        monkeypatch.setattr(QueueJournalCheck, "check", _never_answers)
    client_b = await b.client(dev_server)
    async with worker(client_b, queue, payments):
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = mismatch_of(failed.value)
    assert a.id in cause.message and b.id in cause.message
    if refused_by == "poller":
        assert f"poller '{client_a.identity} interlock-journal:{a.id}'" in cause.message
    else:
        assert "the heartbeat details of attempt 1" in cause.message
    assert "Point both workers at the same journal URL" in cause.message
    assert "its own task queue" in cause.message
    # sent once: the service's own record
    assert payments.refunded_cents(ORDER) == 2000
    assert len(payments.refund_records(ORDER)) == 1
    assert list(b.journal.effects()) == []  # B wrote nothing about it


@pytest.mark.server
async def test_workers_of_two_journals_both_refuse_once_they_see_each_other(
    dev_server: DevServer,
    tmp_path: Path,
    payments: SimulatedPayments,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both workers running: the one that started second sees the first at start, the first
    sees the second at its next periodic check; then a first attempt is refused wherever it
    lands, and nothing is sent."""
    monkeypatch.setattr(journal_check, "CHECK_EVERY_S", 0.3)
    a, b = site(tmp_path / "a"), site(tmp_path / "b")
    queue = f"one-journal-{uuid.uuid4().hex[:10]}"
    client_a, client_b = await a.client(dev_server), await b.client(dev_server)
    async with worker(client_a, queue, payments) as worker_a:
        check_a = check_of(worker_a)
        assert check_a.other is None  # alone on its task queue
        async with worker(client_b, queue, payments) as worker_b:
            check_b = check_of(worker_b)
            await until(
                lambda: check_a.other is not None and check_b.other is not None,
                "both workers see the other journal",
            )
            assert (check_a.other[0], check_b.other[0]) == (b.id, a.id)  # type: ignore[index]
            for _ in range(2):  # two workflows: at least one attempt per worker, likely
                with pytest.raises(WorkflowFailureError) as failed:
                    await client_b.execute_workflow(
                        CallActivity.run,
                        spec(f"tq-{uuid.uuid4().hex[:8]}"),
                        id=f"one-journal-{uuid.uuid4().hex[:8]}",
                        task_queue=queue,
                    )
                cause = mismatch_of(failed.value)
                assert a.id in cause.message and b.id in cause.message
    assert payments.refunded_cents(ORDER) == 0
    assert list(a.journal.effects()) == [] and list(b.journal.effects()) == []


@pytest.mark.server
async def test_one_worker_per_journal_on_separate_task_queues_is_unaffected(
    dev_server: DevServer, tmp_path: Path, payments: SimulatedPayments
) -> None:
    a, b = site(tmp_path / "a"), site(tmp_path / "b")
    queue_a = f"one-journal-a-{uuid.uuid4().hex[:10]}"
    queue_b = f"one-journal-b-{uuid.uuid4().hex[:10]}"
    client_a, client_b = await a.client(dev_server), await b.client(dev_server)
    async with (
        worker(client_a, queue_a, payments, lose_first=False),
        worker(client_b, queue_b, payments, lose_first=False),
    ):
        for client, queue, case in ((client_a, queue_a, "sep-a"), (client_b, queue_b, "sep-b")):
            result = await client.execute_workflow(
                CallActivity.run,
                spec(f"{case}-{uuid.uuid4().hex[:8]}", retry_after_s=0.2, heartbeat_s=2),
                id=f"one-journal-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
            assert result["amount_cents"] == 2000
    assert payments.refunded_cents(ORDER) == 4000
    assert len(payments.refund_records(ORDER)) == 2
    for s in (a, b):
        (row,) = list(s.journal.effects())
        assert row.status is Kind.COMMITTED
        # the receipt names the journal that holds the effect
        assert receipt(row.effect_id, journal=s.journal).journal_id == s.id


# -- reviews: each journal's own ----------------------------------------------------------------


@pytest.mark.server
async def test_reviews_list_shows_its_own_journals_reviews(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """A review carries its journal's id (sealed with its request); ``reviews list`` with
    another journal does not show it unless asked (``--all-journals``)."""
    from interlock_temporal.core.review import review_id

    from .review_rig import effect_of, interlock, opened_with_one_waiting
    from .review_rig import rig as cli_rig

    async with cli_rig(dev_server, tmp_path, tier=3) as r:
        r.payments.arm("after_commit", "reset")
        case = r.case(wait_for_review=True, maximum_attempts=1)
        eid = effect_of(case)
        handle = await r.start(case)
        await opened_with_one_waiting(r, eid)
        ours = journal_id_of(r.journal, create=False)  # the worker made it when it started
        assert ours is not None
        # the AmbiguousEffect the workflow saw carries a receipt that names the journal
        failed = [
            e.activity_task_failed_event_attributes.failure
            async for e in handle.fetch_history_events()
            if e.HasField("activity_task_failed_event_attributes")
        ]
        (failure,) = failed
        assert failure.application_failure_info.type == "AmbiguousEffect"
        (shown,) = pydantic_data_converter.payload_converter.from_payloads(
            list(failure.application_failure_info.details.payloads)
        )
        assert shown["effect_id"] == eid and shown["journal_id"] == ours
        (tmp_path / "other").mkdir()
        other_url = f"sqlite:///{tmp_path / 'other' / 'interlock.db'}"
        with open_journal(other_url) as other:
            theirs = journal_id_of(other)
        review = review_id("ambiguous", eid)

        mine = await r.cli("reviews", "list", "--json")
        assert mine.code == 0, mine.err
        (doc,) = [d for d in mine.json()["reviews"] if d["workflow_id"] == review]
        assert doc["status"]["journal_id"] == ours
        assert mine.json()["journal_id"] == ours

        async def listed(*more: str) -> Any:
            ran = await interlock(
                "reviews",
                "list",
                "--journal",
                other_url,
                "--address",
                r.address,
                *more,
                cwd=tmp_path,
            )
            assert ran.code == 0, ran.err
            return ran

        elsewhere = await listed("--json")
        assert elsewhere.json()["journal_id"] == theirs
        assert review not in [d["workflow_id"] for d in elsewhere.json()["reviews"]]
        assert elsewhere.json()["other_journals_hidden"] >= 1
        table = await listed()
        assert review not in table.out and "--all-journals" in table.err
        everything = await listed("--json", "--all-journals")
        assert review in [d["workflow_id"] for d in everything.json()["reviews"]]


def test_a_review_from_before_journal_ids_is_shown_as_before() -> None:
    from interlock_temporal._reviews.workflow import ReviewStatus
    from interlock_temporal.cli.reviews import _of

    old = ReviewStatus.model_validate({"kind": "ambiguous", "effect_id": "e", "state": "open"})
    assert old.journal_id is None and _of("a" * 32, old.journal_id)
    assert _of("a" * 32, "a" * 32)
    assert not _of("a" * 32, "b" * 32)
    assert _of(None, "b" * 32)  # no journal to compare


@pytest.mark.server
async def test_a_workers_identity_names_its_journal_keeping_the_users(
    dev_server: DevServer, tmp_path: Path, payments: SimulatedPayments
) -> None:
    a = site(tmp_path / "a")
    # the plugin: an identity the user set is kept, the tag appended
    client = await a.client(dev_server)
    activities = [refund_once(payments)]
    queue = f"one-journal-{uuid.uuid4().hex[:10]}"
    named = Worker(client, task_queue=queue, activities=activities, identity="refunds-7")
    assert named.config(active_config=True)["identity"] == f"refunds-7 interlock-journal:{a.id}"
    # the plain interceptor (no plugins): the same, and its poller check is made
    plain = await Client.connect(dev_server.target, data_converter=pydantic_data_converter)
    interceptor = InterlockInterceptor(a.url, signing_key=KEY)
    options = interceptor.worker_options(plain, task_queue=queue, activities=activities)
    assert options["identity"] == f"{plain.identity} interlock-journal:{a.id}"
    check = interceptor.runtime.queue_check
    assert check is not None and (check.task_queue, check.journal_id) == (queue, a.id)
    mine = interceptor.worker_options(
        plain, task_queue=queue, activities=activities, identity="mine"
    )
    assert mine["identity"] == f"mine interlock-journal:{a.id}"


@pytest.mark.server
async def test_when_describe_task_queue_fails_the_last_answer_is_kept(
    dev_server: DevServer,
    tmp_path: Path,
    payments: SimulatedPayments,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failing ``DescribeTaskQueue`` (here: a namespace the server does not have) neither
    blocks gated work nor forgets another journal already seen; it is logged once per streak."""
    a = site(tmp_path / "a")
    queue = f"one-journal-{uuid.uuid4().hex[:10]}"
    client_a = await a.client(dev_server)
    async with worker(client_a, queue, payments):
        check = QueueJournalCheck(uuid.uuid4().hex, client_a, queue)
        await until(lambda: _sees(check, a.id), "the check sees journal A's poller")
        check.client = await Client.connect(
            dev_server.target, namespace=f"missing-{uuid.uuid4().hex[:8]}"
        )
        with caplog.at_level("WARNING", logger="interlock_temporal"):
            await check.check()
            await check.check()
        assert check.other is not None and check.other[0] == a.id  # kept
        told = [r for r in caplog.records if "could not list the pollers" in r.getMessage()]
        assert len(told) == 1, told
        # and a check that never had an answer refuses nothing
        blind = QueueJournalCheck(uuid.uuid4().hex, check.client, queue)
        await blind.check()
        assert blind.other is None and not blind.checked


async def _sees(check: QueueJournalCheck, journal_id: str) -> bool:
    await check.check()
    return check.other is not None and check.other[0] == journal_id


def test_journal_id_prints_the_id_and_creates_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from interlock_temporal.cli import main

    url = f"sqlite:///{tmp_path / 'journal.db'}"
    open_journal(url).close()  # its key file beside it: the command finds it
    capsys.readouterr()
    env_key = ["--journal", url]
    assert main([*env_key, "journal", "id"]) == 1  # none yet, and the command makes none
    assert "has no id yet" in capsys.readouterr().err
    with open_journal(url) as journal:
        assert journal_id_of(journal, create=False) is None
        made = journal_id_of(journal)
    assert main([*env_key, "journal", "id"]) == 0
    assert capsys.readouterr().out.strip() == made
    assert main([*env_key, "journal", "id", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["journal_id"] == made
