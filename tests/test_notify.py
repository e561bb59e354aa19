"""People are told when a decision waits: notifiers called from the EffectReview workflow's
activity, against real receivers on loopback (a stdlib HTTP server, aiosmtpd), with short real
timers. The signatures are checked here with the Standard Webhooks library a receiver uses
(``standardwebhooks``) and, for the deprecated ``Interlock-Signature`` header, independently
(hmac/hashlib), never with the package's own code."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from datetime import timedelta
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
from aiosmtpd.controller import Controller
from pydantic import SecretStr, ValidationError
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal._reviews.workflow import EffectReview, ReviewRequest
from interlock_temporal.core.journal.signing import Ed25519Key
from interlock_temporal.core.models import Kind
from interlock_temporal.core.operators import add_operator
from interlock_temporal.core.policy import Policy
from interlock_temporal.core.review import ReviewRules
from interlock_temporal.notify import (
    DEFAULT_REMINDER_EVERY,
    DEFAULT_REVIEW_DEADLINE,
    SCHEMA,
    Email,
    Notification,
    Slack,
    Webhook,
    new_secret,
    standard_headers,
)
from interlock_temporal.testing import DevServer, free_port
from workers.scenarios import ORDER

from . import test_policy_server as approvals
from . import test_reviews as reviews
from .doc_snippets import load, snippet
from .sealed import sealed
from .test_policy_server import EXTRA, fresh_payee, over_threshold, ran, wire  # noqa: F401
from .test_reviews import fresh_case, until  # noqa: F401
from .test_server import rig

pytestmark = pytest.mark.server

#: Standard Webhooks secrets (``whsec_`` and the base64 of 32 bytes)
SECRET = "whsec_" + base64.b64encode(b"notify-" + b"ab" * 12 + b"!").decode()
SLACK_SECRET = new_secret()
MAIL_SECRET = new_secret()
#: a secret in the form of earlier releases (deprecated): its text is the key
OLD_SECRET = "whsec-notify-" + "ab" * 16


class Receiver:
    """A webhook receiver on loopback: every POST kept as (path, headers, body, arrival).
    ``answer(path, headers, body)`` says the HTTP status to reply with (default 204)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.got: list[tuple[str, dict[str, str], bytes, float]] = []
        self._server: ThreadingHTTPServer | None = None
        self.answer: Any = lambda path, headers, body: 204

    def start(self) -> Receiver:
        got = self.got
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append((self.path, dict(self.headers), body, time.monotonic()))
                self.send_response(receiver.answer(self.path, dict(self.headers), body))
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def events(self, path: str = "/hook") -> list[dict[str, Any]]:
        return [json.loads(body) for p, _, body, _ in self.got if p == path]

    async def wait_for(self, path: str, count: int, timeout: float = 20) -> None:
        async def enough() -> bool:
            return len([g for g in self.got if g[0] == path]) >= count

        await until(enough, timeout)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def check_signature(secret: str, header: str, body: bytes) -> None:
    """The receiver's check, written here from the documented format, not the package's."""
    fields = dict(part.strip().split("=", 1) for part in header.split(","))
    expected = hmac.new(
        secret.encode(), fields["t"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(expected, fields["v1"]), "the signature does not verify"
    assert abs(time.time() - int(fields["t"])) < 60


def standard(secret: str | bytes, headers: dict[str, str], body: bytes) -> Any:
    """The receiver's check of the Standard Webhooks headers, with the ``standardwebhooks``
    package as a receiver runs it: the body, parsed, or ``WebhookVerificationError``."""
    return standardwebhooks.Webhook(secret).verify(body, headers)


def leaked(value: str, raw: bytes) -> bool:
    """Whether ``value`` (a short id such as "881") stands in ``raw`` as a value of its own: the
    review and effect ids (hex) and the numbers (timestamps) may hold its digits by chance."""
    text = raw.decode().replace(reviews.REVIEW, "").replace(reviews.EFFECT, "")
    return re.search(rf"(?<![0-9A-Za-z.]){re.escape(value)}(?![0-9A-Za-z.])", text) is not None


async def interlock(*argv: str) -> tuple[int, str]:
    """The ``interlock`` CLI in a subprocess, from this checkout (``python -m``)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
    environ["INTERLOCK_SIGNING_KEY"] = "11" * 32
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "interlock_temporal.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=environ,
        cwd=Path(__file__).parents[1],
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def report(db: Path) -> tuple[int, str]:
    return await interlock("report", "--journal", f"sqlite:///{db}")


def webhook(receiver: Receiver, **kw: Any) -> Webhook:
    return Webhook(url=receiver.url("/hook"), secret=SecretStr(SECRET), **kw)


async def test_ambiguous_review_is_told_reminded_escalated_stays_open_and_resolves(
    dev_server: DevServer, tmp_path: Path, receiver: Receiver
) -> None:
    notify = [
        webhook(receiver, ui_url="http://ui.example:8080/"),
        Slack(url=SecretStr(receiver.url("/slack")), secret=SecretStr(SLACK_SECRET)),
    ]
    options = {
        "notify": notify,
        "review_deadline": timedelta(seconds=2),
        "reminder_every": timedelta(seconds=1),
    }
    async with rig(dev_server, tmp_path, tier=3, plugin_options=options) as r:
        case, review = await reviews.ambiguous(r)
        await receiver.wait_for("/hook", 3)
        events = receiver.events()
        assert [e["event"] for e in events[:3]] == ["opened", "reminder", "escalated"]
        opened, reminder, escalated = events[:3]
        # the timers are the workflow's: a reminder 1 s after it opened, the deadline at 2 s
        assert 0.9 <= reminder["at"] - opened["at"] <= 1.6
        assert 1.9 <= escalated["at"] - opened["at"] <= 2.6
        arrived = [t for p, _, _, t in receiver.got if p == "/hook"]
        assert 1.5 <= arrived[2] - arrived[0] <= 6  # delivered as they happened, in order
        assert escalated["deadline_at"] == pytest.approx(opened["opened_at"] + 2, abs=0.01)
        assert escalated["state"] == "escalated" and "stays open" in escalated["summary"]
        for path, headers, body, _ in receiver.got:
            if path == "/hook":
                standard(SECRET, headers, body)
                check_signature(SECRET, headers["Interlock-Signature"], body)
        assert opened["schema"] == SCHEMA and opened["kind"] == "ambiguous"
        assert opened["review_id"] == reviews.REVIEW and opened["effect_id"] == reviews.EFFECT
        assert opened["ui_url"] == (
            f"http://ui.example:8080/namespaces/default/workflows/{reviews.REVIEW}"
        )
        assert opened["resolve_command"].startswith(
            f"temporal workflow signal --namespace default --workflow-id {reviews.REVIEW} "
            "--name resolve --input "
        )
        assert opened["decisions"] == ["happened", "not_happened"]
        # no argument values by default: the order id and the case id are nowhere
        raw = b"".join(body for _, _, body, _ in receiver.got)
        assert not leaked(ORDER, raw) and not leaked(reviews.CASE, raw)
        assert opened["values"] is None
        # the Slack message, signed with its own secret
        slack = [(h, b) for p, h, b, _ in receiver.got if p == "/slack"]
        headers, body = slack[0]
        assert standard(SLACK_SECRET, headers, body)["text"].startswith("Effect in doubt")
        check_signature(SLACK_SECRET, headers["Interlock-Signature"], body)
        message = json.loads(body)
        assert message["text"].startswith("Effect in doubt (opened): refund")
        assert reviews.REVIEW in json.dumps(message["blocks"])

        # escalated, yet open: marked in the status and in the Web UI's details
        status = await review.query("status")
        assert status["state"] == "open" and status["escalated"] is True
        page = (await review.query("__temporal_workflow_metadata")).current_details
        assert "**Review state: open (escalated)**" in page
        where = ["--journal", f"sqlite:///{tmp_path / 'journal.db'}"]
        code, listed = await interlock("reviews", "list", *where, "--address", dev_server.target)
        (line,) = [x for x in listed.splitlines() if reviews.EFFECT[:16] in x]
        assert code == 0 and "open (escalated)" in line, listed
        # a person can still decide, after the deadline
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        outcome = await asyncio.wait_for(case.result(), 30)
        assert outcome.status == "RESOLVED"
        final = await asyncio.wait_for(review.result(), 30)
        assert final["state"] == "resolved"
        resolved = [e for e in receiver.events() if e["event"] == "resolved"]
        assert len(resolved) == 1
        assert resolved[0]["decision"] == "happened" and resolved[0]["operators"] == ["carol"]
        assert r.journal.notifications.failures() == []


async def test_a_real_reviews_webhooks_verify_with_the_standard_webhooks_library(
    dev_server: DevServer, tmp_path: Path, receiver: Receiver
) -> None:
    """A real worker, an AMBIGUOUS refund, its review: every webhook the review sends is checked
    as it arrives by the ``standardwebhooks`` package in the receiver. The first two deliveries
    of ``opened`` are answered 503, so Temporal retries it: each retry carries the same
    ``webhook-id`` (a receiver dedupes by it), ``resolved`` another. A tampered body, a changed
    id or another secret fails the library's check; the deprecated ``Interlock-Signature`` is
    still sent, and still verifies."""
    hook = standardwebhooks.Webhook(SECRET)
    verified: list[tuple[str, dict[str, Any]]] = []
    refused: list[str] = []

    def answer(path: str, headers: dict[str, str], body: bytes) -> int:
        try:
            payload = hook.verify(body, headers)
        except standardwebhooks.WebhookVerificationError as err:
            refused.append(str(err))
            return 401
        verified.append((headers["Webhook-Id"], payload))
        opened = [p for _, p in verified if p["event"] == "opened"]
        return 503 if payload["event"] == "opened" and len(opened) <= 2 else 204

    receiver.answer = answer
    options = {"notify": [webhook(receiver)], "review_deadline": None, "reminder_every": None}
    async with rig(dev_server, tmp_path, tier=3, plugin_options=options) as r:
        case, review = await reviews.ambiguous(r)
        await receiver.wait_for("/hook", 3, timeout=30)  # refused twice, then taken
        await review.signal("resolve", {"decision": "happened", "operator": "carol"})
        assert (await asyncio.wait_for(case.result(), 30)).status == "RESOLVED"
        await receiver.wait_for("/hook", 4)
        (failures,) = r.journal.notifications.failures()
        assert failures.count == 2 and "HTTP 503" in failures.last_error
    assert refused == []
    assert [p["event"] for _, p in verified] == ["opened", "opened", "opened", "resolved"]
    assert all(p["review_id"] == reviews.REVIEW for _, p in verified)
    ids = [i for i, _ in verified]
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert all(re.fullmatch(r"msg_[0-9a-f]{32}", i) for i in ids)
    _, headers, body, _ = receiver.got[-1]
    assert json.loads(body)["event"] == "resolved"
    check_signature(SECRET, headers["Interlock-Signature"], body)  # deprecated, still sent
    tampered = body.replace(b'"decision":"happened"', b'"decision":"not_happened"')
    assert tampered != body
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        hook.verify(tampered, headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        hook.verify(body, {**headers, "Webhook-Id": ids[0]})  # replayed under another id
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(body, headers)
    assert hook.verify(body, headers)["decision"] == "happened"  # as sent, it verifies


def test_a_secret_of_an_earlier_release_still_signs_with_a_warning(receiver: Receiver) -> None:
    """A secret not in the ``whsec_`` form is deprecated: accepted with a warning that says
    what to do; its text's bytes are the key, which the library takes as bytes. A ``whsec_``
    secret that is not one is refused, naming what is wrong."""
    with pytest.warns(DeprecationWarning) as warned:
        hook = Webhook(url=receiver.url("/hook"), secret=SecretStr(OLD_SECRET))
    (warning,) = warned
    assert str(warning.message) == (
        "Webhook: a secret not in the Standard Webhooks form whsec_<base64> is deprecated: its "
        "UTF-8 bytes are the key (a receiver's library takes them as bytes, "
        "standardwebhooks.Webhook(secret.encode())); give one from "
        "interlock_temporal.notify.new_secret() to the notifier and its receiver; refused from "
        "0.3.0"
    )
    assert warning.filename == __file__  # the line that built the notifier
    told = Notification(
        event="opened",
        review_id="interlock-review-ambiguous-e1",
        kind="ambiguous",
        effect_id="e1",
        state="open",
        summary="s",
        opened_at=1.0,
        at=1.5,
        ui_url="http://ui/x",
        resolve_command="temporal ...",
    )
    hook.deliver(told)
    hook.deliver(told)  # a retry
    (_, first, body, _), (_, again, _, _) = receiver.got
    shown = standard(OLD_SECRET.encode(), first, body)
    assert shown["review_id"] == "interlock-review-ambiguous-e1"
    check_signature(OLD_SECRET, first["Interlock-Signature"], body)
    assert first["Webhook-Id"] == again["Webhook-Id"] == told.message_id("webhook")
    assert told.message_id("other") != told.message_id("webhook")
    assert told.model_copy(update={"at": 2.5}).message_id("webhook") != first["Webhook-Id"]
    mine = told.model_copy(update={"for_operator": "erin"})
    assert mine.message_id("webhook") != first["Webhook-Id"]
    for bad, says in [
        ("whsec_not base64!", "the secret starts with whsec_ but what follows is not"),
        ("whsec_" + base64.b64encode(b"short").decode(), "the secret's key is 5 bytes"),
        ("", "secret is empty"),
    ]:
        with pytest.raises(ValidationError) as refused:
            Webhook(url=receiver.url("/hook"), secret=SecretStr(bad))
        assert f"Webhook: {says}" in str(refused.value), refused.value
        assert bad not in str(refused.value) or not bad
    fresh = new_secret()
    assert fresh.startswith("whsec_") and len(base64.b64decode(fresh[6:])) == 32


async def test_a_receiver_that_is_down_gets_it_once_back_and_the_failures_are_reported(
    dev_server: DevServer, tmp_path: Path
) -> None:
    down = Receiver()  # its port is chosen, nothing listens on it yet
    options = {
        "notify": [webhook(down, include_values=True)],
        "review_deadline": None,
        "reminder_every": None,
    }
    try:
        async with rig(dev_server, tmp_path, tier=3, plugin_options=options) as r:
            case, review = await reviews.ambiguous(r)  # the review opened anyway
            assert (await review.query("status"))["state"] == "open"

            async def failed_twice() -> bool:
                found = r.journal.notifications.failures()
                return bool(found) and found[0].count >= 2

            await until(failed_twice, timeout=20)
            down.start()
            await down.wait_for("/hook", 1)
            (opened,) = down.events()
            assert opened["event"] == "opened" and opened["review_id"] == reviews.REVIEW
            check_signature(SECRET, down.got[0][1]["Interlock-Signature"], down.got[0][2])
            # include_values=True: the recorded arguments are in it
            assert opened["values"]["order_id"] == ORDER
            assert opened["values"]["case_id"] == reviews.CASE
            (failures,) = r.journal.notifications.failures()
            assert failures.notifier == "webhook" and failures.review_id == reviews.REVIEW
            assert failures.last_event == "opened"
            assert "could not reach the receiver (ConnectionRefusedError" in failures.last_error
            assert down.url("/hook") not in failures.last_error
            # not in the effect's chain: the chain is as it was
            kinds = [e.kind.value for e in r.journal.read(reviews.EFFECT)]
            assert "NOTIFY" not in " ".join(kinds)
            code, shown = await report(tmp_path / "journal.db")
            assert code == 0, shown
            assert f"notification failures: {failures.count}" in shown
            assert f"{failures.count} failed for {reviews.REVIEW} (last: opened" in shown
            await review.signal("resolve", {"decision": "not_happened", "operator": "carol"})
            await asyncio.wait_for(case.result(), 30)
            await down.wait_for("/hook", 2)
            assert [e["event"] for e in down.events()] == ["opened", "resolved"]
    finally:
        down.stop()


async def test_an_approval_at_its_deadline_expires_and_the_call_is_refused(
    dev_server: DevServer, tmp_path: Path, receiver: Receiver
) -> None:
    options = {
        "policy": Policy(rules=[over_threshold]),
        "notify": [webhook(receiver)],
        "review_deadline": timedelta(seconds=2),
        "reminder_every": timedelta(seconds=1),
    }
    async with rig(dev_server, tmp_path, extra=[*EXTRA, wire], plugin_options=options) as r:
        case = await approvals.start_approved(r, 6_000)
        review, binding = await approvals.approval_review(r, 6_000)
        outcome = await asyncio.wait_for(case.result(), 30)
        # refused as an expired approval always was: the call fails, unapproved
        assert outcome["error"] == "ApprovalRequired", outcome
        assert ran(case.id) == []  # the wire never ran
        assert (await review.result())["state"] == "expired"
        await receiver.wait_for("/hook", 3)
        events = receiver.events()
        assert [e["event"] for e in events] == ["opened", "reminder", "expired"]
        assert 1.9 <= events[2]["at"] - events[0]["at"] <= 2.6
        assert events[0]["kind"] == "approval" and events[0]["effect_id"] == binding
        assert "waits for a person's approval (rule OVER_THRESHOLD)" in events[0]["summary"]
        assert events[2]["state"] == "expired" and "the call is refused" in events[2]["summary"]
        raw = b"".join(body for _, _, body, _ in receiver.got)
        assert not leaked(approvals.PAYEE, raw) and not leaked("6000", raw)


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


async def test_email_is_sent_over_smtp(dev_server: DevServer, tmp_path: Path) -> None:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    notifier = Email(
        host="127.0.0.1",
        port=port,
        security="none",
        sender="interlock@ops.example",
        to=["oncall@ops.example"],
        secret=SecretStr(MAIL_SECRET),
    )
    plugin = InterlockPlugin(
        f"sqlite:///{tmp_path / 'journal.db'}",
        signing_key="11" * 32,
        notify=[notifier],
        reminder_every=None,
    )
    try:
        client = await Client.connect(dev_server.target, plugins=[plugin])
        queue = f"notify-{uuid.uuid4().hex[:8]}"
        binding = uuid.uuid4().hex
        review_id = f"interlock-review-approval-{binding}"
        request = ReviewRequest(
            kind="approval",
            effect_id=binding,
            activity="wire",
            principal="payments-agent",
            rules=ReviewRules(deadline_s=1.0),
            notifiers=["email"],
        )
        async with Worker(client, task_queue=queue):
            handle = await client.start_workflow(
                EffectReview.run,
                sealed(request, review_id, "11" * 32),
                id=review_id,
                task_queue=queue,
            )

            assert (await asyncio.wait_for(handle.result(), 30)).state == "expired"
            # the review ended once its notifications went
            assert len(inbox.messages) == 2
    finally:
        controller.stop()
    (to, first), (_, second) = inbox.messages
    assert to == ["oncall@ops.example"]
    assert first["Subject"] == f"[interlock] Approval needed (opened): wire {binding[:12]}"
    text = first.get_payload(decode=True).decode().replace("\r\n", "\n")
    assert f"/namespaces/default/workflows/{review_id}" in text
    assert f"--workflow-id {review_id} --name resolve" in text
    mailed = {k: str(v) for k, v in first.items()}
    standardwebhooks.Webhook(MAIL_SECRET).verify(text.encode(), mailed, json_parse=False)
    check_signature(MAIL_SECRET, first["Interlock-Signature"], text.encode())
    assert second["Subject"] == f"[interlock] Approval needed (expired): wire {binding[:12]}"
    assert "the call is refused" in second.get_payload(decode=True).decode()


class Mailroom(Inbox):
    """An SMTP server's handler that refuses the addresses in ``refuse`` (550) while they are
    there, and keeps what it accepts as (recipients, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[str] = set()

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    def texts(self, address: str) -> list[str]:
        return [
            m.get_payload(decode=True).decode().replace("\r\n", "\n")
            for to, m in self.messages
            if address in to
        ]


#: a one-time code as a message shows it (``core.vote_codes.FORMAT``)
CODE = re.compile(r"\b[A-Z2-7]{4}(?:-[A-Z2-7]{4}){4}\b")


def codes_in(text: str) -> dict[str, str]:
    """The codes a message lists, by decision (lines like "  happened: ABCD-EFGH-...")."""
    return dict(re.findall(r"^  (\w+): ([A-Z2-7]{4}(?:-[A-Z2-7]{4}){4})$", text, re.M))


async def test_operators_get_their_one_time_codes_by_email_and_no_history_holds_one(
    dev_server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With an operator roster, the ``opened`` notification sends each operator their codes at
    their own address on the roster, through the worker's Email notifier (a real SMTP server on
    loopback): carol gets one per decision, with the exact JSON to paste; the team's address
    and the attester's get none. dave's address refuses at first: the attempt fails, is
    recorded as a notification failure (with no code in it) and is retried until his codes go.
    No code is in any event of the review's history, a failure or a log line, until carol
    sends hers, which decides the review with a proof by code."""
    caplog.set_level(logging.DEBUG)
    mail = Mailroom()
    mail.refuse.add("dave@example.org")
    port = free_port()
    controller = Controller(mail, hostname="127.0.0.1", port=port)
    controller.start()
    notifier = Email(
        host="127.0.0.1",
        port=port,
        security="none",
        sender="interlock@ops.example",
        to=["oncall@ops.example"],
        ui_url="http://ui.example:8080",
    )
    options = {"notify": [notifier], "reminder_every": None}
    try:
        async with rig(dev_server, tmp_path, tier=3, plugin_options=options) as r:
            carol, dave, app = (Ed25519Key.generate() for _ in range(3))
            add_operator(r.journal, "carol", carol.public_text, notify=["mailto:carol@example.org"])
            # dave's webhook URL: an Email notifier does not reach it
            reach_dave = ["https://hooks.example/dave", "mailto:dave@example.org"]
            add_operator(r.journal, "dave", dave.public_text, notify=reach_dave)
            add_operator(
                r.journal,
                "review-app",
                app.public_text,
                attests_for=["carol"],
                notify=["mailto:app@example.org"],
            )
            case, review = await reviews.ambiguous(r)

            async def dave_refused() -> bool:
                found = r.journal.notifications.failures()
                return bool(found) and bool(mail.texts("carol@example.org"))

            await until(dave_refused, "carol's codes sent and dave's refusal recorded")
            (failed,) = r.journal.notifications.failures()
            assert failed.notifier == "email" and failed.last_event == "opened"
            assert "one-time codes to operator 'dave'" in failed.last_error
            assert "550" in failed.last_error and not CODE.search(failed.last_error)
            mail.refuse.clear()

            async def dave_told() -> bool:
                return bool(mail.texts("dave@example.org"))

            await until(dave_told, "dave's codes sent on a retry", timeout=30)

            (carols, *again) = mail.texts("carol@example.org")
            codes = codes_in(carols)
            assert list(codes) == ["happened", "not_happened"]
            assert all(codes_in(text) == codes for text in again)  # a retry sends the same
            assert len(set(codes.values())) == 2
            for decision, code in codes.items():
                line = json.dumps({"decision": decision, "operator": "carol", "code": code})
                assert f"  {line}" in carols.splitlines()
            assert '{"decision": "happened", "operator": "carol", "code": "' in carols
            assert "yours alone" in carols and "each works once" in carols
            assert "Send a Signal" in carols and "`resolve`" in carols
            assert f"http://ui.example:8080/namespaces/default/workflows/{reviews.REVIEW}" in carols
            (subject,) = {m["Subject"] for to, m in mail.messages if to == ["carol@example.org"]}
            assert subject.startswith("[interlock] Your one-time codes (carol): Effect in doubt")
            davids = codes_in(mail.texts("dave@example.org")[0])
            assert list(davids) == ["happened", "not_happened"]
            assert set(davids.values()).isdisjoint(codes.values())  # each operator's own
            every_code = [*codes.values(), *davids.values()]

            # the team's messages and the attester's: no code, no codes section
            team = mail.texts("oncall@ops.example")
            assert team  # opened, and again with each retry (at least once)
            for text in team:
                assert not CODE.search(text) and "one-time codes for this review" not in text
            assert mail.texts("app@example.org") == []
            recipients = sorted({a for to, _ in mail.messages for a in to})
            assert recipients == ["carol@example.org", "dave@example.org", "oncall@ops.example"]

            # nowhere in the review's history: every event, every payload, as stored
            history = await review.fetch_history()
            raw = b"".join(event.SerializeToString() for event in history.events)
            assert b"refund-bot" in raw  # the search reads the payloads' bytes
            for code in every_code:
                assert code.encode() not in raw and code.replace("-", "").encode() not in raw
            # nor in a log line of the worker's (the SMTP server's own, mail.log, is the
            # mailbox's side), nor in a recorded failure
            logged = "\n".join(
                record.getMessage() for record in caplog.records if record.name != "mail.log"
            )
            assert "Completing activity" in logged  # the SDK's debug lines are in it
            assert "one-time codes to operator 'dave'" in logged
            failures = json.dumps([f.model_dump() for f in r.journal.notifications.failures()])
            for code in every_code:
                assert code not in logged and code not in failures

            # carol pastes her code for what she saw: the review decides, with her proof
            await review.signal(
                "resolve", {"decision": "happened", "operator": "carol", "code": codes["happened"]}
            )
            outcome = await asyncio.wait_for(case.result(), 30)
            assert outcome.status == "RESOLVED"
            (resolved,) = [e for e in r.journal.read(reviews.EFFECT) if e.kind is Kind.RESOLVED]
            assert [(p["operator"], p["via"]) for p in resolved.data["proofs"]] == [
                ("carol", "code")
            ]
            assert r.payments.refunded_cents(ORDER) == 2000  # once
            # the signal she sent is in the history now: the search above would have seen it
            history = await review.fetch_history()
            raw = b"".join(event.SerializeToString() for event in history.events)
            assert codes["happened"].encode() in raw
    finally:
        controller.stop()


async def test_a_webhook_notifier_sends_an_operators_codes_to_their_webhook_when_reminded(
    dev_server: DevServer, tmp_path: Path, receiver: Receiver
) -> None:
    """A ``Webhook`` notifier reaches an operator's own webhook on the roster (``http://`` on
    loopback here; ``https://`` elsewhere): erin's copy of ``opened`` and of each ``reminder``
    carries her codes, signed with the notifier's secret; the team's never does (``codes``:
    null); ``escalated`` and ``resolved`` carry none. Her code decides the review."""
    options = {
        "notify": [webhook(receiver)],
        "review_deadline": timedelta(seconds=2),
        "reminder_every": timedelta(seconds=1),
    }
    async with rig(dev_server, tmp_path, tier=3, plugin_options=options) as r:
        erin = Ed25519Key.generate()
        add_operator(r.journal, "erin", erin.public_text, notify=[receiver.url("/erin")])
        case, review = await reviews.ambiguous(r)
        await receiver.wait_for("/hook", 3)  # opened, reminder, escalated
        await receiver.wait_for("/erin", 2)
        team, hers = receiver.events("/hook"), receiver.events("/erin")
        assert [e["event"] for e in hers[:2]] == ["opened", "reminder"]
        assert all(e["codes"] is None and e["for_operator"] is None for e in team)
        assert not CODE.search(json.dumps(team))
        codes = hers[0]["codes"]
        assert list(codes) == ["happened", "not_happened"] and hers[1]["codes"] == codes
        assert hers[0]["for_operator"] == "erin" and hers[0]["review_id"] == reviews.REVIEW
        for _, headers, body, _ in receiver.got:
            standard(SECRET, headers, body)
            check_signature(SECRET, headers["Interlock-Signature"], body)
        await review.signal(
            "resolve", {"decision": "happened", "operator": "erin", "code": codes["happened"]}
        )
        assert (await asyncio.wait_for(case.result(), 30)).status == "RESOLVED"
        await receiver.wait_for("/hook", 4)
        assert receiver.events("/hook")[-1]["event"] == "resolved"
        assert {e["event"] for e in receiver.events("/erin")} <= {"opened", "reminder"}
        assert r.journal.notifications.failures() == []


def test_defaults_and_explicit_none() -> None:
    plugin = InterlockPlugin("sqlite:///unused.db")
    assert plugin._review["review_rules"].deadline_s == DEFAULT_REVIEW_DEADLINE.total_seconds()
    assert plugin._review["reminder_s"] == DEFAULT_REMINDER_EVERY.total_seconds()
    assert timedelta(hours=24) == DEFAULT_REVIEW_DEADLINE
    assert timedelta(hours=4) == DEFAULT_REMINDER_EVERY
    none = InterlockPlugin("sqlite:///unused.db", review_deadline=None, reminder_every=None)
    assert none._review["review_rules"].deadline_s is None and none._review["reminder_s"] is None


def test_settings_are_checked_naming_the_argument() -> None:
    hook = Webhook(url="http://127.0.0.1:9/hook", secret=SecretStr(SECRET))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"review_deadline": timedelta(0)}, "review_deadline must be a positive timedelta"),
        ({"reminder_every": timedelta(seconds=-1)}, "reminder_every must be a positive"),
        ({"notify": [hook, hook]}, "notify: two notifiers are named 'webhook'"),
        ({"notify": ["http://x"]}, "notify takes notifiers from interlock_temporal.notify"),
        (
            {"review": ReviewRules(deadline_s=5), "review_deadline": timedelta(seconds=5)},
            "review_deadline and ReviewRules(deadline_s=...) both set",
        ),
    ]
    for options, says in cases:
        with pytest.raises(ValueError) as refused:
            InterlockPlugin("sqlite:///unused.db", **options)
        assert says in str(refused.value)
    # ReviewRules(deadline_s=None) given explicitly: no deadline
    plugin = InterlockPlugin("sqlite:///unused.db", review=ReviewRules(deadline_s=None))
    assert plugin._review["review_rules"].deadline_s is None
    # a notifier's secret is never in its repr
    assert SECRET not in repr(hook)
    with pytest.raises(ValidationError):
        Webhook(url="http://127.0.0.1:9/hook")  # type: ignore[call-arg]


def test_the_operator_guides_notifier_configuration_builds(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the guide's secret is in the form this release wants
        worker = load(snippet("docs/operator-guide.md#eb24604ecbe5"), tmp_path / "notify_worker.py")
    settings = worker.plugin._review
    assert settings["review_rules"].deadline_s == 8 * 3600 and settings["reminder_s"] == 7200
    assert list(settings["notifiers"]) == ["webhook", "slack", "email"]


def test_the_operator_guides_receiver_accepts_fresh_and_refuses_old_or_forged(
    tmp_path: Path,
) -> None:
    """The guide's receiver (the ``standardwebhooks`` package) against what the package's
    notifier signs: fresh and signed, the notification; changed, another secret, another id or
    older than 5 minutes, None."""
    receiver = load(snippet("docs/operator-guide.md#d07a2e5c7854"), tmp_path / "receiver.py")
    secret = receiver.SECRET
    body = b'{"schema":"interlock.notification/v1","event":"opened"}'
    now = int(time.time())
    msg = "msg_" + "0" * 32
    opened = {"schema": "interlock.notification/v1", "event": "opened"}
    assert receiver.notification(body, standard_headers(secret, msg, body, now)) == opened
    assert receiver.notification(body, standard_headers(secret, msg, body, now - 299)) == opened
    assert receiver.notification(body, standard_headers(secret, msg, body, now - 301)) is None
    assert receiver.notification(body, standard_headers(new_secret(), msg, body, now)) is None
    assert receiver.notification(body + b" ", standard_headers(secret, msg, body, now)) is None
    forged = {**standard_headers(secret, msg, body, now), "webhook-id": "msg_" + "1" * 32}
    assert receiver.notification(body, forged) is None


def test_the_interceptor_takes_the_same_settings() -> None:
    from interlock_temporal import InterlockInterceptor

    hook = Webhook(url="http://127.0.0.1:9/hook", secret=SecretStr(SECRET), name="ops")
    interceptor = InterlockInterceptor(
        "sqlite:///unused.db", notify=[hook], review_deadline=None, reminder_every=timedelta(60)
    )
    runtime = interceptor.runtime
    assert dict(runtime.notifiers) == {"ops": hook}
    assert runtime.review_rules.deadline_s is None and runtime.reminder_s == 60 * 86400
    # an Email notifier is configured with "from" as a configuration file says it
    mail = Email.model_validate({"host": "smtp.example", "from": "a@x.example", "to": ["b@x"]})
    assert mail.sender == "a@x.example"
