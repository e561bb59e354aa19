"""docs/targets.md's two example targets, run as written on a real dev server.

The page's Python blocks (named by their digests: ``tests/doc_snippets.py``) are written,
unedited, to the files their first line names
(``welcome_email.py``, ``crm.py``, ``signup.py``, ``worker.py``, ``lease.py``) in a directory of
their own, which is what a user's app would hold. The operator's ``lease.py`` and the
``worker.py`` run there as processes of their own; the signup is started with the page's
``temporal workflow start`` line and a review resolved with its ``temporal workflow signal``
line (only the ids, the task queue and the server's address are filled in). The mail server is
a real SMTP server (aiosmtpd) on loopback delivering into a Maildir; the CRM is the example's
own SQLite file. What happened is read from the mailbox and the CRM, never from the gate.

A crash is the worker SIGKILLing itself right after the named activity's send returned (the
gate's ``after_send`` point: the target has the request, the journal does not have its
result): the page's ``worker.py`` runs under a small harness that adds that hook and nothing
else. Then a fresh worker: the CRM contact is found by its effect id (tier 2,
``COMMITTED via recovery-query``); the email cannot be known (tier 3, ``AMBIGUOUS``), a review
opens, and a person's signal lets the workflow complete with one email in the mailbox.
"""

from __future__ import annotations

import asyncio
import json
import mailbox
import multiprocessing
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import RPCError
from temporalio.worker import SharedStateManager, Worker

from interlock_temporal import (
    BaseTarget,
    InterlockPlugin,
    current_effect,
    gated,
    open_journal,
    receipt,
)
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.review import review_id
from interlock_temporal.testing import DevServer, free_port, temporal_cli

from .doc_snippets import snippet
from .server_workflows import CallActivity
from .waiting import until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "targets.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_FILE = re.compile(r"# (\w+\.py)\b")
FILES = {"welcome_email.py", "crm.py", "signup.py", "worker.py", "lease.py"}

#: runs the page's worker.py as written, with one hook added: SIGKILL right after the send of
#: the activity named by KILL_AFTER_SEND returned, before the gate records its result
HARNESS = """\
import asyncio
import functools
import os

from temporalio import activity

import worker
from interlock_temporal import InterlockPlugin
from interlock_temporal.testing import kill_self


def on_point(point: str, effect_id: str) -> None:
    if point == "after_send" and activity.info().activity_type == os.environ["KILL_AFTER_SEND"]:
        kill_self()


if os.environ.get("KILL_AFTER_SEND"):
    worker.InterlockPlugin = functools.partial(InterlockPlugin, on_point=on_point)
asyncio.run(worker.main())
"""


def page_files() -> dict[str, str]:
    """The page's Python blocks by the file their first line names."""
    files = {}
    for text in (
        snippet("docs/targets.md#6053b38209dd"),
        snippet("docs/targets.md#a57c666e47f6"),
        snippet("docs/targets.md#e49b08aaccd4"),
        snippet("docs/targets.md#96b193545eaa"),
        snippet("docs/targets.md#607f8122b65d"),
    ):
        named = _FILE.match(text)
        assert named, f"a Python block on the page names no file: {text[:60]!r}"
        assert named.group(1) not in files, f"two blocks name {named.group(1)}"
        files[named.group(1)] = text
    return files


def page_command(start: str) -> list[str]:
    """The page's shell command that begins with ``start``, continuation lines joined."""
    for language, text in _FENCE.findall(PAGE.read_text()):
        if language == "sh":
            for line in text.replace("\\\n", " ").splitlines():
                if line.startswith(start):
                    return shlex.split(line)
    raise AssertionError(f"the page shows no `{start}` command")


def test_the_page_holds_both_examples_whole() -> None:
    files = page_files()
    assert set(files) == FILES
    assert "tier = 3" in files["welcome_email.py"] and "query" not in files["welcome_email.py"]
    assert "tier = 2" in files["crm.py"] and "async def query(" in files["crm.py"]
    assert "asyncio.to_thread(" in files["welcome_email.py"]  # the blocking client, off the loop
    assert "\ndef create_contact(" in files["crm.py"]  # a plain def, in the thread pool
    assert "activity_executor=ThreadPoolExecutor(" in files["worker.py"]
    assert page_command("temporal workflow start")[:3] == ["temporal", "workflow", "start"]
    assert page_command("temporal workflow signal")[:3] == ["temporal", "workflow", "signal"]


@dataclass
class App:
    """The page's app in a directory of its own, its SMTP server, its worker processes."""

    dev_server: DevServer
    client: Client
    path: Path
    smtp: Controller
    #: a task queue and a user of this test's own on the shared server
    queue: str = field(default_factory=lambda: f"signup-{uuid.uuid4().hex[:8]}")
    user: str = field(default_factory=lambda: f"u-{uuid.uuid4().hex[:8]}")
    workers: list[asyncio.subprocess.Process] = field(default_factory=list)
    started: list[WorkflowHandle[Any, Any]] = field(default_factory=list)
    journal: Journal | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
        # the app's directory first, then this checkout's package (not another installed copy)
        env["PYTHONPATH"] = os.pathsep.join([str(self.path), str(ROOT)])
        env["TEMPORAL_ADDRESS"] = self.dev_server.target
        env["SMTP_HOST"], env["SMTP_PORT"] = "127.0.0.1", str(self.smtp.port)
        return env

    def write(self) -> None:
        for name, text in page_files().items():
            if name == "worker.py":  # a task queue of this test's own (the one edit)
                assert text.count('task_queue="signup"') == 1
                text = text.replace('task_queue="signup"', f'task_queue="{self.queue}"')
            (self.path / name).write_text(text)
        (self.path / "harness.py").write_text(HARNESS)

    def issue_lease(self) -> str:
        """The operator runs the page's lease.py; it prints the lease id."""
        done = subprocess.run(
            [sys.executable, "lease.py"],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lease_id = done.stdout.strip().splitlines()[-1]
        self.journal = open_journal(f"sqlite:///{self.path / 'interlock.db'}")
        assert self.journal.leases.get(lease_id) is not None
        return lease_id

    async def start_worker(self, kill_after_send: str | None = None) -> asyncio.subprocess.Process:
        env = {**self.env, "KILL_AFTER_SEND": kill_after_send or ""}
        with (self.path / f"worker-{len(self.workers)}.log").open("w") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "harness.py", cwd=self.path, env=env, stdout=log, stderr=log
            )
        self.workers.append(process)
        return process

    def worker_logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.path.glob("worker-*.log")))

    async def start_signup(self, lease_id: str, *, email: str, name: str = "Ada") -> str:
        """The page's ``temporal workflow start`` line, with this test's ids filled in."""
        argv = page_command("temporal workflow start")
        workflow_id = f"signup-{self.user}-{len(self.started)}"
        argv[argv.index("--workflow-id") + 1] = workflow_id
        argv[argv.index("--task-queue") + 1] = self.queue
        given = json.loads(argv[argv.index("--input") + 1])
        assert given["lease_id"] == "LEASE_ID"
        given.update(lease_id=lease_id, user_id=self.user, email=email, name=name)
        argv[argv.index("--input") + 1] = json.dumps(given)
        await self.temporal(argv)
        self.started.append(self.client.get_workflow_handle(workflow_id))
        return workflow_id

    async def temporal(self, argv: list[str]) -> None:
        """Run a ``temporal`` CLI line from the page against this server."""
        assert argv[0] == "temporal"
        done = await asyncio.to_thread(
            subprocess.run,
            [temporal_cli(), *argv[1:], "--address", self.dev_server.target],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    async def result(self, workflow_id: str, timeout: float = 60) -> dict[str, Any]:
        handle = self.client.get_workflow_handle(workflow_id)
        try:
            return await asyncio.wait_for(handle.result(), timeout)  # type: ignore[no-any-return]
        except TimeoutError:
            raise AssertionError(f"{workflow_id} did not complete:\n{self.worker_logs()}") from None

    def mails(self) -> list[mailbox.MaildirMessage]:
        """The messages the SMTP server delivered into its Maildir."""
        return list(mailbox.Maildir(self.path / "Maildir", create=False))

    def contacts(self) -> list[dict[str, Any]]:
        db = sqlite3.connect(self.path / "crm.db")
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute("SELECT * FROM contacts ORDER BY id")]
        finally:
            db.close()

    def effect_of(self, activity: str) -> str:
        assert self.journal is not None
        (row,) = [r for r in self.journal.effects() if r.effect_type == activity]
        return row.effect_id

    async def close(self) -> None:
        for handle in self.started:
            try:
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("the test ended")
            except Exception:
                pass
        for process in self.workers:
            if process.returncode is None:
                process.terminate()
                await process.wait()
        if self.journal is not None:
            self.journal.close()


@pytest_asyncio.fixture(loop_scope="session")
async def app(dev_server: DevServer, client: Client, tmp_path: Path) -> AsyncIterator[App]:
    smtp = Controller(Mailbox(tmp_path / "Maildir"), hostname="127.0.0.1", port=free_port())
    smtp.start()
    made = App(dev_server, client, tmp_path, smtp)
    made.write()
    try:
        yield made
    finally:
        await made.close()
        smtp.stop()


async def killed(app: App, process: asyncio.subprocess.Process) -> None:
    try:
        code = await asyncio.wait_for(process.wait(), 60)
    except TimeoutError:
        raise AssertionError(f"the worker did not kill itself:\n{app.worker_logs()}") from None
    assert code == -9, f"the worker exited {code}, not by SIGKILL:\n{app.worker_logs()}"


async def test_a_signup_creates_one_contact_and_sends_one_email(app: App) -> None:
    """No crash: both effects are sent once; a second signup workflow for the same user is the
    same two effects, answered from the journal; a contact someone made by hand for another
    user's email stops that user's signup before anything is sent."""
    lease_id = app.issue_lease()
    await app.start_worker()
    email = f"{app.user}@example.com"
    first = await app.result(await app.start_signup(lease_id, email=email))
    again = await app.result(await app.start_signup(lease_id, email=email))
    assert first == again

    (contact,) = app.contacts()
    (mail,) = app.mails()
    email_effect, contact_effect = (
        app.effect_of("send_welcome_email"),
        app.effect_of("create_contact"),
    )
    assert first == {"contact_id": contact["id"], "welcome": f"<{email_effect}@example.com>"}
    assert (contact["email"], contact["interlock_effect_id"]) == (email, contact_effect)
    assert (mail["To"], mail["Message-ID"]) == (email, f"<{email_effect}@example.com>")
    assert mail["Subject"] == "Welcome, Ada"
    for eid, confirmation in (
        (contact_effect, f"contact {contact['id']}"),
        (email_effect, mail["Message-ID"]),
    ):
        done = receipt(eid, journal=app.journal)
        assert (done.final, done.via, done.confirmation) == ("COMMITTED", "dispatch", confirmation)

    # the CRM target's predicate: another contact with this email is a fact that no longer holds
    taken = f"taken-{app.user}@example.com"
    db = sqlite3.connect(app.path / "crm.db")
    with db:
        db.execute("INSERT INTO contacts (email, name) VALUES (?, 'by hand')", (taken,))
    db.close()
    app.user = f"{app.user}-2"
    workflow_id = await app.start_signup(lease_id, email=taken)
    with pytest.raises(WorkflowFailureError) as failed:
        await app.result(workflow_id)
    assert isinstance(failed.value.cause, ActivityError)
    cause = failed.value.cause.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "EffectRefused" and cause.message.startswith("stale_premise: ")
    assert "other_contacts" in cause.message
    assert [c["email"] for c in app.contacts()] == [email, taken]  # nothing more created
    assert len(app.mails()) == 1


async def test_a_crash_after_the_crm_stored_the_contact_is_found_by_asking_the_crm(
    app: App,
) -> None:
    """Tier 2: the worker dies after the CRM committed the contact and before the gate recorded
    it; a fresh worker's attempt asks the CRM, finds the contact by its effect id and records it
    COMMITTED via recovery-query. One contact, and the signup goes on to its one email."""
    lease_id = app.issue_lease()
    doomed = await app.start_worker(kill_after_send="create_contact")
    email = f"{app.user}@example.com"
    workflow_id = await app.start_signup(lease_id, email=email)
    await killed(app, doomed)

    (contact,) = app.contacts()  # the CRM has it; the journal only knows it was sent
    contact_effect = app.effect_of("create_contact")
    assert contact["interlock_effect_id"] == contact_effect
    assert app.journal is not None
    row = app.journal.row(contact_effect)
    assert row is not None and row.status is Kind.DISPATCHED
    assert app.mails() == []

    await app.start_worker()
    done = await app.result(workflow_id)
    assert app.contacts() == [contact]  # asked, not sent again
    (mail,) = app.mails()
    assert done == {"contact_id": contact["id"], "welcome": mail["Message-ID"]}
    found = receipt(contact_effect, journal=app.journal)
    assert (found.final, found.via, found.tier, found.executed) == (
        "COMMITTED",
        "recovery-query",
        2,
        True,
    )
    assert (found.dispatches, found.confirmation) == (1, f"contact {contact['id']}")


async def test_a_crash_after_the_mail_server_accepted_the_email_is_put_to_a_person(
    app: App,
) -> None:
    """Tier 3: the worker dies after the SMTP server accepted the email and before the gate
    recorded it; a fresh worker's attempt cannot know, so the effect is AMBIGUOUS, a review
    opens and the workflow waits. A person resolves it with the page's ``temporal workflow
    signal`` line (``happened``): the workflow completes, with one email in the mailbox."""
    lease_id = app.issue_lease()
    doomed = await app.start_worker(kill_after_send="send_welcome_email")
    email = f"{app.user}@example.com"
    workflow_id = await app.start_signup(lease_id, email=email)
    await killed(app, doomed)

    email_effect = app.effect_of("send_welcome_email")
    (mail,) = app.mails()  # the server has it; the journal only knows it was sent
    assert mail["Message-ID"] == f"<{email_effect}@example.com>"
    assert app.journal is not None
    row = app.journal.row(email_effect)
    assert row is not None and row.status is Kind.DISPATCHED

    await app.start_worker()
    review = app.client.get_workflow_handle(review_id("ambiguous", email_effect))

    async def review_open() -> bool:
        try:
            return (await review.describe()).status == WorkflowExecutionStatus.RUNNING
        except RPCError:
            return False

    await until(review_open, "the review of the email in doubt", detail=app.worker_logs)
    doubt = receipt(email_effect, journal=app.journal)
    assert (doubt.final, doubt.code, doubt.tier, doubt.executed) == (
        "AMBIGUOUS",
        "unknowable",
        3,
        "unknown",
    )
    signup = app.client.get_workflow_handle(workflow_id)
    assert (await signup.describe()).status == WorkflowExecutionStatus.RUNNING  # it waits
    assert len(app.mails()) == 1  # and nothing was sent again

    argv = page_command("temporal workflow signal")
    at = argv.index("--workflow-id") + 1
    assert argv[at] == "interlock-review-ambiguous-EFFECT_ID"
    argv[at] = argv[at].replace("EFFECT_ID", email_effect)
    assert json.loads(argv[argv.index("--input") + 1])["decision"] == "happened"
    await app.temporal(argv)

    done = await app.result(workflow_id)
    (contact,) = app.contacts()
    assert done == {"contact_id": contact["id"], "welcome": "attested by a person"}
    assert len(app.mails()) == 1
    resolved = receipt(email_effect, journal=app.journal)
    assert (resolved.final, resolved.executed, resolved.operator) == ("RESOLVED", True, "carol")
    assert resolved.dispatches == 1


# -- what the page says of plain def activities: a thread pool, never a process pool -------------


class _Outbox(BaseTarget):
    name = "outbox"
    tier = 3

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {}


_SENT = Path(tempfile.gettempdir()) / f"interlock-process-pool-{os.getpid()}"


@activity.defn
@gated(target=_Outbox())
def send_from_a_pool(note: str) -> str:
    _SENT.write_text(note)  # the send: never reached
    return current_effect().effect_id


async def test_a_plain_def_gated_activity_on_a_process_pool_is_refused_before_anything_is_sent(
    dev_server: DevServer, tmp_path: Path
) -> None:
    """In a process of a pool the body would see no gate, or, in a forked one, the gate's
    context as it was when the pool forked: the first effect's id, for every later effect (a
    tier-1 target would dedupe them all into the first). So the gate refuses the attempt
    before it journals or sends anything, saying what to give the worker instead."""
    journal = open_journal(f"sqlite:///{tmp_path / 'journal.db'}", signing_key="22" * 32)
    lease_id = journal.leases.issue("bot", activities=["send_from_a_pool"])
    plugin = InterlockPlugin(f"sqlite:///{tmp_path / 'journal.db'}", signing_key="22" * 32)
    client = await Client.connect(dev_server.target, plugins=[plugin])
    queue = f"pool-{uuid.uuid4().hex[:8]}"
    with multiprocessing.Manager() as manager, ProcessPoolExecutor(1) as pool:
        worker = Worker(
            client,
            task_queue=queue,
            workflows=[CallActivity],
            activities=[send_from_a_pool],
            activity_executor=pool,
            shared_state_manager=SharedStateManager.create_from_multiprocessing(manager),
        )
        async with worker:
            with pytest.raises(WorkflowFailureError) as failed:
                await client.execute_workflow(
                    CallActivity.run,
                    {
                        "activity": "send_from_a_pool",
                        "arg": "hi",
                        "principal": "bot",
                        "lease": lease_id,
                    },
                    id=f"pool-{uuid.uuid4().hex[:8]}",
                    task_queue=queue,
                )
    assert isinstance(failed.value.cause, ActivityError)
    cause = failed.value.cause.cause
    assert isinstance(cause, ApplicationError)
    assert (cause.type, cause.non_retryable) == ("InterlockNotInstalled", True)
    assert cause.message == (
        "gated activity 'send_from_a_pool' is a plain def and this worker's activity_executor is "
        "a ProcessPoolExecutor: the gate runs a plain def activity only in a thread of the "
        "worker's own process; give the worker activity_executor="
        "concurrent.futures.ThreadPoolExecutor(...), or make the activity async def"
    )
    assert journal.effects() == []  # nothing journaled
    assert not _SENT.exists()  # nothing sent
    journal.close()
