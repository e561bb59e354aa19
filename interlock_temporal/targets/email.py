"""Email through an SMTP server, as an effect target (the standard library's ``smtplib`` only).

What an SMTP server can honestly promise (tier 3 by default): nothing after a crash. It
accepts a message or refuses it; it cannot dedupe a second copy, and plain SMTP cannot be asked
whether it accepted the first. So a send that may have landed (the worker died, or the
connection dropped once the message was handed over) becomes AMBIGUOUS and a person decides,
searching the mail log for the effect id every message carries twice: as its ``Message-ID``
(``<effect_id@domain>``, which mail servers log) and in the ``X-Interlock-Effect-Id`` header.

A provider that *can* be asked (a sending API with a message log, an IMAP ``Sent`` folder a
relay copies to) is given as ``query``: a callable ``(effect_id, args) -> Found | None``, sync
or async, and the target then declares tier 2: recovery asks it instead of a person.

``SmtpEmail.send`` is what the gated activity's body calls. It tracks how far the SMTP dialogue
got, so a failure is classified exactly (``classify``): nothing of the message left before the
server answered ``354`` to ``DATA``; once the message went, only the server's reply says what
happened, and a lost reply is in doubt.

Credentials are a pydantic ``SecretStr``: never in an error, a receipt, a log or a repr.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import re
import smtplib
import ssl
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from email.message import EmailMessage
from email.policy import EmailPolicy
from email.utils import getaddresses, parseaddr
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ..core.models import Found
from ..core.targets import BaseTarget, Classification

__all__ = [
    "DEFAULT_SETTLE_TIME",
    "EFFECT_HEADER",
    "Email",
    "EmailInvalid",
    "EmailSendError",
    "EmailSent",
    "RefusedRecipient",
    "SmtpEmail",
    "Stage",
]

#: the header that carries the effect id (beside the Message-ID), for searching a mailbox
EFFECT_HEADER = "X-Interlock-Effect-Id"
#: RFC 5321 (4.5.3.2.6) has a client wait up to 10 minutes for the reply to the end of a
#: message: a server may take that long to accept one it holds whole, even once its sender died
DEFAULT_SETTLE_TIME = timedelta(minutes=10)

#: how far an SMTP dialogue got, in order. Nothing of the message leaves before ``message``
#: (the server answered 354 to DATA); from then on only the server's reply says what happened.
Stage = Literal["connect", "hello", "starttls", "auth", "mail", "rcpt", "data", "message", "sent"]
_STAGES: tuple[str, ...] = (
    "connect",
    "hello",
    "starttls",
    "auth",
    "mail",
    "rcpt",
    "data",
    "message",
    "sent",
)
#: the SMTP command that opens each stage (any other command leaves the stage as it is)
_COMMANDS: dict[str, Stage] = {
    "ehlo": "hello",
    "helo": "hello",
    "starttls": "starttls",
    "auth": "auth",
    "mail": "mail",
    "rcpt": "rcpt",
    "data": "data",
}

QueryHook = Callable[[str, Any], Found | Awaitable[Found | None] | None]


class Email(BaseModel):
    """A message by its fields (what an activity's input can carry; an ``EmailMessage`` is
    accepted too). ``bcc`` goes to the envelope only, never into a header."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sender: str
    to: list[str] = Field(default_factory=list)
    cc: list[str] = Field(default_factory=list)
    bcc: list[str] = Field(default_factory=list)
    subject: str
    text: str
    html: str | None = None
    reply_to: str | None = None
    #: more headers (not Message-ID, From, To, Cc, Bcc, Subject: those come from the fields)
    headers: dict[str, str] = Field(default_factory=dict)


class RefusedRecipient(BaseModel):
    address: str
    code: int
    message: str


class EmailSent(BaseModel):
    """What a send returns (and what its receipt cites: the Message-ID)."""

    message_id: str
    accepted: list[str]
    #: recipients the server refused while it accepted the message for the others
    refused: list[RefusedRecipient] = Field(default_factory=list)


class EmailInvalid(ValueError):
    """The message cannot be sent as given (no sender, no recipient, its own Message-ID):
    raised before anything is sent. The message names the field, never its value."""


class EmailSendError(Exception):
    """A send that failed, with how far it got (``stage``), what it means (``outcome``, what
    ``SmtpEmail.classify`` answers) and the server's reply where there was one. Raised from
    the ``smtplib`` or socket error (``__cause__``). Its text carries no credential, and no
    recipient's address (a server's own reply, quoted for a refused sender or message, may
    name one)."""

    def __init__(
        self,
        outcome: Classification,
        stage: Stage,
        *,
        code: int | None = None,
        reply: str = "",
        refused: list[RefusedRecipient] | None = None,
        error: BaseException | None = None,
    ) -> None:
        self.outcome: Classification = outcome
        self.stage: Stage = stage
        self.code = code
        self.reply = reply
        self.refused = refused or []
        #: recorded in the refusal's reason (the reply's code; its text may name an address)
        codes = [code] if code is not None else sorted({r.code for r in self.refused})
        said_codes = "/".join(str(c) for c in codes)
        self.refusal_detail = f"SMTP {said_codes} at {stage}" if codes else f"at {stage}"
        said = f": {code} {reply}".rstrip() if code is not None else (f": {reply}" if reply else "")
        what = {
            "rejected": "the SMTP server rejected the message",
            "not_sent": "the message was not sent",
            "in_doubt": "the SMTP server may or may not have accepted the message",
        }[outcome]
        cause = f" ({type(error).__name__})" if error is not None and not said else ""
        super().__init__(f"{what} (at {stage}){said}{cause}")


_TOKEN = re.compile(r"[A-Za-z0-9._-]+")


class _UnfoldedEffectId(EmailPolicy):
    """The message's policy, but the effect id header stays on one line (87 characters, well
    under SMTP's 998), so ``grep "X-Interlock-Effect-Id: <id>"`` finds it in a raw mailbox."""

    def fold(self, name: str, value: str) -> str:
        if name.lower() == EFFECT_HEADER.lower():
            return f"{name}: {value}{self.linesep}"
        return str(super().fold(name, value))

    def fold_binary(self, name: str, value: str) -> bytes:
        if name.lower() == EFFECT_HEADER.lower():
            return self.fold(name, value).encode("ascii")
        return super().fold_binary(name, value)


def _keeping_the_id_whole(policy: Any) -> Any:
    if not isinstance(policy, EmailPolicy):
        return policy  # compat32: folded as that policy folds
    return _UnfoldedEffectId().clone(
        max_line_length=policy.max_line_length,
        linesep=policy.linesep,
        cte_type=policy.cte_type,
        utf8=policy.utf8,
        raise_on_defect=policy.raise_on_defect,
    )


class _Tracked:
    """An ``smtplib`` client that remembers which stage its dialogue reached. Only the
    command's verb is read (AUTH's continuation lines, which carry the credentials, match no
    verb and are never kept)."""

    stage: Stage = "connect"

    def putcmd(self, cmd: str, args: str = "") -> None:
        self.stage = _COMMANDS.get(cmd.lower(), self.stage)
        super().putcmd(cmd, args)  # type: ignore[misc]

    def getreply(self) -> tuple[int, bytes]:
        code, text = super().getreply()  # type: ignore[misc]
        if self.stage == "data" and code == 354:
            self.stage = "message"  # the server waits for the message: it goes now
        return code, text


class _Smtp(_Tracked, smtplib.SMTP):
    pass


class _SmtpSsl(_Smtp, smtplib.SMTP_SSL):
    pass


def _text(reply: bytes | str) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)


def _by_code(code: int, stage: Stage) -> Classification:
    """What a server's reply code means: 5xx a permanent refusal, 4xx "not now" (nothing was
    accepted); anything else before the message went means nothing went."""
    if 500 <= code <= 599:
        return "rejected"
    if 400 <= code <= 499 or _STAGES.index(stage) < _STAGES.index("message"):
        return "not_sent"
    return "in_doubt"


def _failure(error: BaseException, stage: Stage) -> EmailSendError:
    """The send's failure at ``stage``, classified."""
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        refused = [
            RefusedRecipient(address=a, code=c, message=_text(m))
            for a, (c, m) in error.recipients.items()
        ]
        codes = {r.code for r in refused}
        outcome: Classification = (
            "rejected" if refused and all(500 <= c <= 599 for c in codes) else "not_sent"
        )
        reply = ", ".join(str(c) for c in sorted(codes))
        return EmailSendError(
            outcome,
            stage,
            reply=f"every recipient refused ({len(refused)}: {reply})",
            refused=refused,
            error=error,
        )
    if isinstance(error, smtplib.SMTPSenderRefused | smtplib.SMTPDataError):
        code, reply = error.smtp_code, _text(error.smtp_error)
        return EmailSendError(_by_code(code, stage), stage, code=code, reply=reply, error=error)
    if stage in ("message", "sent"):
        # the message was handed over (or being handed over) and no reply came back
        return EmailSendError("in_doubt", stage, error=error)
    smtp_code = getattr(error, "smtp_code", None)
    said = _text(getattr(error, "smtp_error", b"")) if smtp_code is not None else ""
    return EmailSendError("not_sent", stage, code=smtp_code, reply=said, error=error)


class SmtpEmail(BaseTarget):
    """An SMTP server as an effect target.

    ``host``/``port`` (default 587 with ``security="starttls"``, 465 with ``"ssl"``, 25 with
    ``"none"``); ``username``/``password`` to log in (the password is kept as a ``SecretStr``);
    ``timeout`` (seconds, each socket operation: keep it under the activity's
    ``start_to_close_timeout``); ``tls_context`` (default: ``ssl.create_default_context()``,
    which verifies the server's certificate). ``domain``: the right side of the Message-ID
    (default: the sender's domain). ``settle_time``: see ``DEFAULT_SETTLE_TIME``. ``query``:
    a hook that can say whether an effect's message was accepted; with it the target is
    tier 2. ``name``: recorded with every effect.
    """

    name = "smtp-email"
    tier = 3

    def __init__(
        self,
        host: str,
        port: int | None = None,
        *,
        security: Literal["starttls", "ssl", "none"] = "starttls",
        username: str | None = None,
        password: SecretStr | str | None = None,
        timeout: float = 30.0,
        tls_context: ssl.SSLContext | None = None,
        domain: str | None = None,
        settle_time: timedelta = DEFAULT_SETTLE_TIME,
        query: QueryHook | None = None,
        name: str | None = None,
    ) -> None:
        if security not in ("starttls", "ssl", "none"):
            raise ValueError('security must be "starttls", "ssl" or "none"')
        if (username is None) != (password is None):
            raise ValueError("username and password go together: give both or neither")
        if not timeout > 0:
            raise ValueError("timeout must be a positive number of seconds")
        if query is not None and not callable(query):
            raise ValueError("query must be a callable (effect_id, args) -> Found | None")
        self.host = host
        self.port = port if port is not None else {"starttls": 587, "ssl": 465}.get(security, 25)
        self.security = security
        self.username = username
        self.password: SecretStr | None = (
            password if isinstance(password, SecretStr) or password is None else SecretStr(password)
        )
        self.timeout = timeout
        self.tls_context = tls_context
        self.domain = domain
        self.settle_time = settle_time
        if name is not None:
            self.name = name
        if query is not None:
            self.tier = 2
            self._hook = query
            # an attribute, not a method: the gate sees a query (tier 2) only when one is given
            self.query = self._ask

    def __repr__(self) -> str:
        login = f", username={self.username!r}, password=SecretStr('**********')"
        return (
            f"SmtpEmail({self.host!r}, {self.port}, security={self.security!r}"
            f"{login if self.username is not None else ''}, tier={self.tier})"
        )

    async def _ask(self, effect_id: str, args: Any) -> Found | None:
        """The query hook, awaited if async, else run in a thread (it likely does I/O)."""
        if inspect.iscoroutinefunction(self._hook):
            found = await self._hook(effect_id, args)
        else:
            found = await asyncio.to_thread(self._hook, effect_id, args)
            if inspect.isawaitable(found):
                found = await found
        if found is None or isinstance(found, Found):
            return found
        return Found.model_validate(found)

    # -- what the gate asks ----------------------------------------------------------------------

    def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        """An email relies on no fact the server can report; extend it (a subclass) with the
        facts yours relies on (the user still subscribed, say)."""
        return {}

    def classify(self, error: BaseException) -> Classification:
        """What a failed send means. ``send``'s own errors carry it, judged by how far the SMTP
        dialogue got: refused before the message went, or a 5xx to it: ``rejected``; a 4xx, or
        any failure before the server asked for the message (connection refused, the greeting,
        TLS, login, a dropped connection): ``not_sent``; a timeout or a dropped connection once
        the message went: ``in_doubt``. A bare ``smtplib`` error (a body that calls ``smtplib``
        itself) is judged without knowing the stage: a disconnect or a timeout is in doubt."""
        if isinstance(error, EmailSendError):
            return error.outcome
        if isinstance(error, EmailInvalid):
            return "not_sent"
        if isinstance(error, smtplib.SMTPConnectError | ConnectionRefusedError):
            return "not_sent"
        if isinstance(error, smtplib.SMTPRecipientsRefused):
            return _failure(error, "rcpt").outcome
        if isinstance(error, smtplib.SMTPSenderRefused):
            return _by_code(error.smtp_code, "mail")
        if isinstance(error, smtplib.SMTPDataError):
            # a 4xx/5xx is the server's own answer; anything else, without the stage: unknown
            return _by_code(error.smtp_code, "message")
        return "in_doubt"

    def confirmation(self, result: Any) -> str | None:
        message_id = getattr(result, "message_id", None)
        if message_id is None and isinstance(result, Mapping):
            message_id = result.get("message_id")
        return message_id if isinstance(message_id, str) else None

    # -- the send ----------------------------------------------------------------------------

    def message_id(self, effect_id: str, sender: str | None = None) -> str:
        """The Message-ID an effect's message carries: ``<effect_id@domain>``."""
        domain = self.domain or (parseaddr(sender or "")[1].rpartition("@")[2])
        if not domain:
            raise EmailInvalid("the sender has no domain for the Message-ID: give domain=")
        return f"<{effect_id}@{domain}>"

    def prepare(
        self, message: Email | EmailMessage | Mapping[str, Any], effect_id: str
    ) -> tuple[EmailMessage, str, list[str]]:
        """The message as it will be sent (a copy: the caller's is not changed), its envelope
        sender and recipients. Raises ``EmailInvalid`` naming what is missing."""
        if not _TOKEN.fullmatch(effect_id or ""):
            raise EmailInvalid("effect_id must be a non-empty token (letters, digits, . _ -)")
        if isinstance(message, EmailMessage):
            msg = copy.deepcopy(message)
            bcc = msg.get_all("Bcc", [])
            del msg["Bcc"]
        else:
            fields = message if isinstance(message, Email) else Email.model_validate(message)
            msg, bcc = _build(fields), list(fields.bcc)
        sender = parseaddr(str(msg.get("Sender") or msg.get("From") or ""))[1]
        if not sender:
            raise EmailInvalid("the message has no sender (From)")
        recipients = [
            address
            for _, address in getaddresses([*msg.get_all("To", []), *msg.get_all("Cc", []), *bcc])
            if address
        ]
        if not recipients:
            raise EmailInvalid("the message has no recipient (To, Cc or Bcc)")
        wanted = self.message_id(effect_id, sender)
        if msg.get("Message-ID") not in (None, wanted):
            raise EmailInvalid(
                "the message carries a Message-ID of its own: leave it out, the effect's "
                "is set on it"
            )
        del msg["Message-ID"], msg[EFFECT_HEADER]
        msg["Message-ID"] = wanted
        msg[EFFECT_HEADER] = effect_id
        msg.policy = _keeping_the_id_whole(msg.policy)
        return msg, sender, recipients

    async def send(
        self, message: Email | EmailMessage | Mapping[str, Any], *, effect_id: str
    ) -> EmailSent:
        """Send the effect's message (``current_effect().effect_id`` in a gated body): an
        ``Email``, its fields as a dict, or an ``EmailMessage`` (not changed: a copy is sent).
        Runs ``smtplib`` in a thread, so the event loop, and the gate's heartbeats, go on.
        Raises ``EmailInvalid`` before anything is sent, else ``EmailSendError``."""
        return await asyncio.to_thread(self.send_blocking, message, effect_id=effect_id)

    def send_blocking(
        self, message: Email | EmailMessage | Mapping[str, Any], *, effect_id: str
    ) -> EmailSent:
        """``send`` for a plain ``def`` activity (it blocks its thread)."""
        msg, sender, recipients = self.prepare(message, effect_id)
        smtp: _Smtp | None = None
        try:
            smtp = self._open()
            self._start(smtp)
            refused = smtp.send_message(msg, sender, recipients)
            smtp.stage = "sent"
        except Exception as err:
            stage: Stage = smtp.stage if smtp is not None else "connect"
            if smtp is not None:
                smtp.close()
            raise _failure(err, stage) from err
        try:
            smtp.quit()  # the message is accepted: whatever QUIT meets changes nothing
        except Exception:
            smtp.close()
        refusals = [
            RefusedRecipient(address=a, code=c, message=_text(m)) for a, (c, m) in refused.items()
        ]
        return EmailSent(
            message_id=str(msg["Message-ID"]),
            accepted=[r for r in recipients if r not in refused],
            refused=refusals,
        )

    def _context(self) -> ssl.SSLContext:
        return self.tls_context or ssl.create_default_context()

    def _open(self) -> _Smtp:
        """Connected (TLS from the start with ``security="ssl"``), greeted."""
        if self.security == "ssl":
            return _SmtpSsl(self.host, self.port, timeout=self.timeout, context=self._context())
        return _Smtp(self.host, self.port, timeout=self.timeout)

    def _start(self, smtp: _Smtp) -> None:
        """EHLO, STARTTLS, login: nothing of the message goes before this is done."""
        smtp.ehlo()
        if self.security == "starttls":
            smtp.starttls(context=self._context())
            smtp.ehlo()
        if self.username is not None and self.password is not None:
            smtp.login(self.username, self.password.get_secret_value())


def _build(fields: Email) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = fields.sender
    if fields.to:
        msg["To"] = ", ".join(fields.to)
    if fields.cc:
        msg["Cc"] = ", ".join(fields.cc)
    if fields.reply_to:
        msg["Reply-To"] = fields.reply_to
    msg["Subject"] = fields.subject
    for header, value in fields.headers.items():
        if header.lower() in ("message-id", "from", "to", "cc", "bcc", "subject"):
            raise EmailInvalid(f"headers[{header!r}]: set it through its field, not headers")
        msg[header] = value
    msg.set_content(fields.text)
    if fields.html is not None:
        msg.add_alternative(fields.html, subtype="html")
    return msg
