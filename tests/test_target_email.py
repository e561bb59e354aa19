"""The ready-made SMTP target (``interlock_temporal.targets.email``) against a real SMTP server
on loopback (aiosmtpd delivering into a Maildir). What the server accepted is read from its
Maildir, never from the gate.

Each way a send can fail is made by the server (a recipient refused, 451/554 to the message, a
connection dropped or a reply withheld once the message arrived, a closed port, a wrong
password) and classified from how far the SMTP dialogue got. On a real Temporal dev server, a
worker SIGKILLed right after the send: tier 3 puts the effect to a person (AMBIGUOUS, a review),
tier 2 (a query hook that searches the Maildir) finds it (``recovery-query``); either way the
mailbox holds exactly one message carrying the effect id."""

from __future__ import annotations

import asyncio
import mailbox
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox
from aiosmtpd.smtp import AuthResult, LoginPassword
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, TargetDeclarationError, open_journal, receipt
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.review_rules import review_id
from interlock_temporal.core.targets import check_declaration
from interlock_temporal.targets import Found
from interlock_temporal.targets.email import (
    DEFAULT_SETTLE_TIME,
    EFFECT_HEADER,
    Email,
    EmailInvalid,
    EmailSendError,
    EmailSent,
    SmtpEmail,
)
from interlock_temporal.testing import DevServer, WorkerProcess, free_port

from .doc_snippets import load, snippet
from .server_workflows import CallActivity

ROOT = Path(__file__).resolve().parent.parent
KEY = "5e" * 32
EID = "e" * 64
PASSWORD = "hunter2-s3cret"


class Server(Mailbox):
    """An SMTP server's behaviour, set by each test: refuse recipients or the sender, answer the
    message with a code, drop the connection or withhold the reply once the message arrived."""

    def __init__(self, maildir: Path) -> None:
        super().__init__(maildir)
        self.refuse: dict[str, str] = {}
        self.refuse_sender: str | None = None
        self.data_reply: str | None = None
        self.after_data: str | None = None  # "drop" | "stall"

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if self.refuse_sender is not None:
            return self.refuse_sender
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.data_reply is not None:
            return self.data_reply  # the server's answer to the message: not stored
        reply = await super().handle_DATA(server, session, envelope)  # stored
        if self.after_data == "drop":
            server.transport.abort()
        elif self.after_data == "stall":
            await asyncio.sleep(3)
        return reply

    def messages(self) -> list[mailbox.MaildirMessage]:
        return list(mailbox.Maildir(self.mail_dir, create=False))


def _authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
    ok = isinstance(data, LoginPassword) and data.password == PASSWORD.encode()
    return AuthResult(success=ok, handled=False)


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[tuple[Server, int]]:
    handler = Server(tmp_path / "Maildir")
    port = free_port()
    controller = Controller(
        handler,
        hostname="127.0.0.1",
        port=port,
        authenticator=_authenticate,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield handler, port
    finally:
        controller.stop()


def mail_to(port: int, **kwargs: Any) -> SmtpEmail:
    return SmtpEmail("127.0.0.1", port, security="none", timeout=1, **kwargs)


def email(*to: str) -> Email:
    return Email(
        sender="billing@example.com", to=list(to or ["ada@example.org"]), subject="Hi", text="Hello"
    )


# -- a send, what the server received -----------------------------------------------------------


async def test_a_message_carries_the_effect_id_as_its_message_id_and_in_a_header(
    smtp: tuple[Server, int],
) -> None:
    server, port = smtp
    sent = await mail_to(port).send(email("ada@example.org", "bob@example.org"), effect_id=EID)
    (stored,) = server.messages()
    assert stored["Message-ID"] == f"<{EID}@example.com>"  # the sender's domain by default
    assert stored[EFFECT_HEADER] == EID
    assert (stored["From"], stored["Subject"]) == ("billing@example.com", "Hi")
    assert stored["X-RcptTo"] == "ada@example.org, bob@example.org"
    assert sent == EmailSent(
        message_id=f"<{EID}@example.com>", accepted=["ada@example.org", "bob@example.org"]
    )
    assert mail_to(port).confirmation(sent) == sent.message_id

    # an EmailMessage is sent as a copy, its Bcc in the envelope only, the domain as configured
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Bcc"] = "a@example.com", "c@example.org", "hidden@example.org"
    msg["Subject"] = "Copy"
    msg.set_content("body")
    sent = await mail_to(port, domain="mail.example.net").send(msg, effect_id="f" * 64)
    stored = next(m for m in server.messages() if m["Subject"] == "Copy")
    assert stored["Message-ID"] == f"<{'f' * 64}@mail.example.net>" == sent.message_id
    assert stored["X-RcptTo"] == "c@example.org, hidden@example.org"
    headers = [value for name, value in stored.items() if name != "X-RcptTo"]  # the server's
    assert stored["Bcc"] is None and not any("hidden" in value for value in headers)
    assert msg["Message-ID"] is None and msg["Bcc"] == "hidden@example.org"  # not changed


async def test_a_recipient_refused_among_others_is_reported_and_the_message_is_sent(
    smtp: tuple[Server, int],
) -> None:
    server, port = smtp
    server.refuse["nobody@example.org"] = "550 5.1.1 no such user"
    sent = await mail_to(port).send(email("ada@example.org", "nobody@example.org"), effect_id=EID)
    assert sent.accepted == ["ada@example.org"]
    assert [(r.address, r.code, r.message) for r in sent.refused] == [
        ("nobody@example.org", 550, "5.1.1 no such user")
    ]
    (stored,) = server.messages()
    assert stored["X-RcptTo"] == "ada@example.org"


# -- each failure, classified by how far the dialogue got ----------------------------------------


@pytest.mark.parametrize(
    ("setup", "outcome", "stage", "code", "stored"),
    [
        ({"refuse": {"ada@example.org": "550 5.1.1 no such user"}}, "rejected", "rcpt", None, 0),
        ({"refuse": {"ada@example.org": "450 4.2.1 try later"}}, "not_sent", "rcpt", None, 0),
        ({"refuse_sender": "553 5.7.1 not yours"}, "rejected", "mail", 553, 0),
        ({"data_reply": "554 5.7.1 spam"}, "rejected", "message", 554, 0),
        ({"data_reply": "451 4.3.0 local error"}, "not_sent", "message", 451, 0),
        ({"after_data": "drop"}, "in_doubt", "message", None, 1),
        ({"after_data": "stall"}, "in_doubt", "message", None, 1),
    ],
    ids=["rcpt-550", "rcpt-450", "sender-553", "data-554", "data-451", "drop", "timeout"],
)
async def test_a_failed_send_is_classified_by_what_the_server_did(
    smtp: tuple[Server, int],
    setup: dict[str, Any],
    outcome: str,
    stage: str,
    code: int | None,
    stored: int,
) -> None:
    server, port = smtp
    for name, value in setup.items():
        setattr(server, name, value)
    target = mail_to(port)
    with pytest.raises(EmailSendError) as failed:
        await target.send(email(), effect_id=EID)
    error = failed.value
    assert (target.classify(error), error.stage, error.code) == (outcome, stage, code)
    assert len(server.messages()) == stored  # what the server holds, read from its store
    if outcome == "rejected" and code is not None:
        reply = setup.get("data_reply") or setup.get("refuse_sender")
        assert str(error) == f"the SMTP server rejected the message (at {stage}): {reply}"
    if stage == "rcpt":
        assert [r.code for r in error.refused] == [int(setup["refuse"]["ada@example.org"][:3])]
        assert "ada@example.org" not in str(error)  # addresses stay out of the error's text


async def test_a_closed_port_is_not_sent() -> None:
    target = mail_to(free_port())
    with pytest.raises(EmailSendError) as failed:
        await target.send(email(), effect_id=EID)
    assert (target.classify(failed.value), failed.value.stage) == ("not_sent", "connect")
    assert isinstance(failed.value.__cause__, ConnectionRefusedError)
    assert str(failed.value) == "the message was not sent (at connect) (ConnectionRefusedError)"


async def test_a_login_refused_is_not_sent_and_the_password_appears_nowhere(
    smtp: tuple[Server, int], caplog: pytest.LogCaptureFixture
) -> None:
    server, port = smtp
    wrong = mail_to(port, username="billing", password="not-" + PASSWORD)
    with pytest.raises(EmailSendError) as failed:
        await wrong.send(email(), effect_id=EID)
    assert (wrong.classify(failed.value), failed.value.stage, failed.value.code) == (
        "not_sent",
        "auth",
        535,
    )
    told = "".join(traceback.format_exception(failed.value)) + repr(wrong) + caplog.text
    assert PASSWORD not in told and "billing" not in str(failed.value)
    assert server.messages() == []

    right = mail_to(port, username="billing", password=PASSWORD)
    await right.send(email(), effect_id=EID)
    assert len(server.messages()) == 1
    assert PASSWORD not in repr(right) and PASSWORD not in repr(vars(right)["password"])


async def test_a_message_that_cannot_be_sent_is_refused_before_connecting() -> None:
    target = mail_to(free_port())  # nothing listens: a connection would fail differently
    no_one = Email(sender="billing@example.com", subject="Hi", text="x")
    with pytest.raises(EmailInvalid, match=r"^the message has no recipient \(To, Cc or Bcc\)$"):
        await target.send(no_one, effect_id=EID)
    own = EmailMessage()
    own["From"], own["To"], own["Message-ID"] = "a@example.com", "b@example.org", "<x@y>"
    with pytest.raises(EmailInvalid, match="carries a Message-ID of its own"):
        await target.send(own, effect_id=EID)
    assert target.classify(EmailInvalid("x")) == "not_sent"


def test_bare_smtplib_errors_classify_without_a_stage() -> None:
    import smtplib

    target = mail_to(25)
    assert target.classify(smtplib.SMTPServerDisconnected("gone")) == "in_doubt"
    assert target.classify(TimeoutError()) == "in_doubt"
    assert target.classify(ConnectionRefusedError()) == "not_sent"
    assert target.classify(smtplib.SMTPConnectError(554, b"no")) == "not_sent"
    assert target.classify(smtplib.SMTPDataError(554, b"no")) == "rejected"
    assert target.classify(smtplib.SMTPDataError(451, b"later")) == "not_sent"
    assert target.classify(smtplib.SMTPSenderRefused(553, b"no", "a@b")) == "rejected"
    refused = smtplib.SMTPRecipientsRefused({"a@b": (550, b"no"), "c@d": (451, b"later")})
    assert target.classify(refused) == "not_sent"


# -- the tier it declares ---------------------------------------------------------------------


def test_tier_3_by_default_and_tier_2_with_a_query_hook() -> None:
    plain = mail_to(25)
    assert plain.tier == 3 and plain.settle_time == DEFAULT_SETTLE_TIME == timedelta(minutes=10)
    assert not hasattr(plain, "query") and check_declaration(plain).tier == 3

    asked = mail_to(25, query=lambda effect_id, args: None)
    assert asked.tier == 2 and check_declaration(asked).tier == 2
    plain.tier = 2  # a tier it cannot keep is refused where @gated is applied
    with pytest.raises(TargetDeclarationError, match="declares tier 2 but has no query"):
        check_declaration(plain)


async def test_the_query_hook_may_be_sync_or_async() -> None:
    found = Found(result={"message_id": "<m@x>", "accepted": ["a@b"]}, confirmation="<m@x>")

    async def async_hook(effect_id: str, args: Any) -> Found | None:
        return found if effect_id == EID else None

    for hook in (async_hook, lambda effect_id, args: found if effect_id == EID else None):
        target = mail_to(25, query=hook)
        assert await target.query(EID, None) == found
        assert await target.query("0" * 64, None) is None


# -- the docs' example, on a real server ----------------------------------------------------------


@pytest.mark.server
async def test_the_docs_example_sends_once_on_a_real_worker(
    dev_server: DevServer, smtp: tuple[Server, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = smtp
    monkeypatch.setenv("SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("SMTP_PORT", str(port))
    monkeypatch.setenv("SMTP_SECURITY", "none")  # aiosmtpd here speaks no TLS
    example = load(snippet("docs/targets.md#8a76db6d4df5"), tmp_path / "invoice_mail.py")
    journal = open_journal(f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY)
    lease = journal.leases.issue("billing-bot", activities=["send_invoice"])
    client = await Client.connect(
        dev_server.target, plugins=[InterlockPlugin(journal.url, signing_key=KEY)]
    )
    queue = f"email-{uuid.uuid4().hex[:8]}"
    spec = {
        "activity": "send_invoice",
        "arg": {"invoice_id": "inv-7", "to": "ada@example.org"},
        "principal": "billing-bot",
        "lease": lease,
        "heartbeat_s": 2,
    }
    async with Worker(
        client, task_queue=queue, workflows=[CallActivity], activities=[example.send_invoice]
    ):
        first = await client.execute_workflow(
            CallActivity.run, spec, id=f"inv-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        again = await client.execute_workflow(
            CallActivity.run, spec, id=f"inv-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        # a recipient the server refuses (5xx): REFUSED, target_rejected, nothing stored
        server.refuse["nobody@example.org"] = "550 5.1.1 no such user"
        spec["arg"] = {"invoice_id": "inv-8", "to": "nobody@example.org"}
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                CallActivity.run, spec, id=f"inv-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
    assert isinstance(failed.value.cause, ActivityError)
    cause = failed.value.cause.cause
    assert isinstance(cause, ApplicationError) and cause.type == "EffectRefused"
    assert cause.message.startswith("target_rejected: ")
    smtp = cause.cause  # the target's own error, with the server's reply
    assert isinstance(smtp, ApplicationError) and smtp.type == "EmailSendError"
    assert "SMTP server rejected the message (at rcpt)" in smtp.message
    (effect,) = journal.effects(status=Kind.COMMITTED)
    (refused,) = journal.effects(status=Kind.REFUSED)
    no = receipt(refused.effect_id, journal=journal)
    assert (no.final, no.code, no.executed, no.dispatches) == (
        "REFUSED",
        "target_rejected",
        False,
        1,
    )
    # the server's reply code is recorded; its text (which may name the address) is not
    assert no.reason == "the target rejected the request (EmailSendError: SMTP 550 at rcpt)"
    (stored,) = server.messages()  # sent once: the second run was answered from the journal
    assert stored["Message-ID"] == f"<{effect.effect_id}@example.com>" == first["message_id"]
    assert stored[EFFECT_HEADER] == effect.effect_id and first == again
    done = receipt(effect.effect_id, journal=journal)
    assert (done.final, done.tier, done.confirmation) == ("COMMITTED", 3, stored["Message-ID"])
    journal.close()


# -- a worker SIGKILLed after the send, on a real server -------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    with open_journal(f"sqlite:///{tmp_path / 'journal.db'}", signing_key=KEY) as j:
        yield j


async def crash_after_send(
    client: Client, journal: Journal, smtp: tuple[Server, int], tmp_path: Path, tier: int
) -> tuple[Any, list[WorkerProcess]]:
    """Runs one send on two workers; the one that sends dies right after the server accepted
    the message. Returns the workflow's handle and the workers."""
    server, port = smtp
    queue = f"email-{uuid.uuid4().hex[:8]}"
    lease = journal.leases.issue("mail-bot", activities=["send_email"])

    def worker(*extra: str) -> WorkerProcess:
        argv = ["-m", "tests.email_worker", "--target", client.service_client.config.target_host]
        argv += ["--task-queue", queue, "--journal", journal.url, "--smtp-port", str(port)]
        argv += ["--maildir", str(server.mail_dir), "--tier", str(tier), *extra]
        return WorkerProcess(argv, cwd=ROOT, env={"INTERLOCK_SIGNING_KEY": KEY})

    # both start at once (startup is most of the time); the first to send dies (once: the marker)
    marker = str(tmp_path / "killed")
    workers = list(await asyncio.gather(*(worker("--kill-marker", marker).start() for _ in "ab")))
    run = await client.start_workflow(
        "CallActivity",
        {
            "activity": "send_email",
            "arg": email("ada@example.org").model_dump(mode="json"),
            "principal": "mail-bot",
            "lease": lease,
            "heartbeat_s": 1,
        },
        id=f"mail-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )
    waits = {asyncio.ensure_future(w.wait()): w for w in workers}
    done, _ = await asyncio.wait(waits, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    assert done, "no worker died"
    assert [waits[d].killed for d in done] == [True], [w.log for w in workers]
    for pending in waits:
        pending.cancel()
    (effect,) = journal.effects()
    (stored,) = server.messages()  # the server has it; the journal only that it was sent
    assert stored[EFFECT_HEADER] == effect.effect_id
    return run, workers


@pytest.mark.server
async def test_tier_3_a_crash_after_the_send_is_put_to_a_person(
    client: Client, journal: Journal, smtp: tuple[Server, int], tmp_path: Path
) -> None:
    run, workers = await crash_after_send(client, journal, smtp, tmp_path, tier=3)
    try:
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(run.result(), 60)
        assert isinstance(failed.value.cause, ActivityError)
        cause = failed.value.cause.cause
        assert isinstance(cause, ApplicationError) and cause.type == "AmbiguousEffect"
        (effect,) = journal.effects()
        doubt = receipt(effect.effect_id, journal=journal)
        assert (doubt.final, doubt.code, doubt.tier, doubt.executed) == (
            "AMBIGUOUS",
            "unknowable",
            3,
            "unknown",
        )
        review = client.get_workflow_handle(review_id("ambiguous", effect.effect_id))
        assert (await review.describe()).status == WorkflowExecutionStatus.RUNNING
        (stored,) = smtp[0].messages()  # exactly one message: nothing was sent again
        assert stored["Message-ID"] == f"<{effect.effect_id}@example.com>"
        await review.terminate("the test ended")
    finally:
        for w in workers:
            await w.stop()


@pytest.mark.server
async def test_tier_2_a_crash_after_the_send_is_found_by_the_query_hook(
    client: Client, journal: Journal, smtp: tuple[Server, int], tmp_path: Path
) -> None:
    run, workers = await crash_after_send(client, journal, smtp, tmp_path, tier=2)
    try:
        result = await asyncio.wait_for(run.result(), 60)
        (effect,) = journal.effects()
        (stored,) = smtp[0].messages()  # exactly one message: found, not sent again
        assert result["message_id"] == stored["Message-ID"] == f"<{effect.effect_id}@example.com>"
        found = receipt(effect.effect_id, journal=journal)
        assert (found.final, found.via, found.tier, found.executed, found.dispatches) == (
            "COMMITTED",
            "recovery-query",
            2,
            True,
            1,
        )
        assert found.confirmation == stored["Message-ID"]
    finally:
        for w in workers:
            await w.stop()


# -- TLS: STARTTLS and SSL, the certificate verified ---------------------------------------------


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (and the key), written to ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.mark.parametrize("security", ["starttls", "ssl"])
async def test_tls_with_a_verified_certificate_and_a_login(tmp_path: Path, security: str) -> None:
    """The server speaks TLS (STARTTLS, required before login; or SSL from the start) with a
    certificate the client is told to trust; a client that trusts only the system's CAs is
    refused by its own check before anything is sent."""
    import ssl

    cert, key = _certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    handler = Server(tmp_path / "Maildir")
    port = free_port()
    options: dict[str, Any] = (
        {"tls_context": server_tls, "require_starttls": True}
        if security == "starttls"
        # aiosmtpd counts only STARTTLS as TLS for AUTH: over SSL, say it need not
        else {"ssl_context": server_tls, "auth_require_tls": False}
    )
    controller = Controller(
        handler, hostname="127.0.0.1", port=port, authenticator=_authenticate, **options
    )
    controller.start()
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        target = SmtpEmail(
            "127.0.0.1",
            port,
            security=security,  # type: ignore[arg-type]
            username="billing",
            password=PASSWORD,
            tls_context=trusted,
            timeout=2,
        )
        sent = await target.send(email(), effect_id=EID)
        (stored,) = handler.messages()
        assert stored["Message-ID"] == sent.message_id == f"<{EID}@example.com>"

        untrusted = SmtpEmail("127.0.0.1", port, security=security, timeout=2)  # type: ignore[arg-type]
        with pytest.raises(EmailSendError) as failed:
            await untrusted.send(email(), effect_id=EID)
        assert isinstance(failed.value.__cause__, ssl.SSLCertVerificationError)
        want = "starttls" if security == "starttls" else "connect"
        assert (untrusted.classify(failed.value), failed.value.stage) == ("not_sent", want)
        assert len(handler.messages()) == 1
    finally:
        controller.stop()
