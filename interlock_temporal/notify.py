"""Telling people that a decision waits: notifiers for ``InterlockPlugin(notify=[...])``.

A review that opens (an AMBIGUOUS effect, an approval, an open circuit), nears its deadline
(``reminder``), expires (an approval: the call is refused), escalates (an AMBIGUOUS review at
its deadline: it stays open, because nobody may guess) or is resolved is sent to each notifier
from an activity the ``EffectReview`` workflow runs: retried by Temporal with backoff, never
in the way of the gate or of the review. A failed attempt is recorded in the journal's
``notification_failures`` table and shown by ``interlock report``.

Built in: ``Webhook`` (a signed JSON body, the versioned ``Notification`` schema), ``Slack``
(an incoming-webhook message) and ``Email`` (SMTP, through ``targets.email.SmtpEmail``'s
client). Each has its own ``secret`` (never the journal's signing key or the authority key),
in the Standard Webhooks form ``whsec_<base64 of 24 to 64 random bytes>`` (``new_secret()``
makes one). The body is signed as Standard Webhooks sign it, so a receiver checks it with any
Standard Webhooks library (in Python, the ``standardwebhooks`` package:
``Webhook(secret).verify(body, headers)``): ``webhook-id`` (the same on every retry of one
notification: a receiver dedupes by it), ``webhook-timestamp`` (unix seconds of this attempt)
and ``webhook-signature`` (``v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>``, the key
being the bytes the secret encodes). The ``Interlock-Signature`` header of earlier releases
(``t=<unix ts>,v1=<hex HMAC-SHA256(secret, "<ts>.<body>")>``) is still sent beside them, and is
deprecated: removed in 0.3.0. A notification carries no argument values unless the notifier
says ``include_values=True``, and never a secret argument.

Where the journal has an operator roster, the ``opened`` and ``reminder`` events also send each
operator their one-time codes (``core.vote_codes``), to the operator's own channels on the
roster that a notifier can reach (``Notifier.to_operator``: an ``Email`` reaches ``mailto:``
addresses, a ``Webhook`` ``https://`` URLs): a ``Notification`` with ``codes`` and
``for_operator``. The team's notification never carries a code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from abc import ABC, abstractmethod
from datetime import timedelta
from enum import Enum
from typing import Any, Final, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator

from .core.deprecated import REMOVED_IN

__all__ = [
    "DEFAULT",
    "DEFAULT_REMINDER_EVERY",
    "DEFAULT_REVIEW_DEADLINE",
    "SCHEMA",
    "SECRET_PREFIX",
    "SIGNATURE_HEADER",
    "WEBHOOK_ID_HEADER",
    "WEBHOOK_SIGNATURE_HEADER",
    "WEBHOOK_TIMESTAMP_HEADER",
    "DefaultType",
    "Email",
    "Event",
    "Notification",
    "Notifier",
    "NotifyError",
    "Slack",
    "Webhook",
    "new_secret",
    "secret_key",
    "sign",
    "standard_headers",
]

#: the payload's schema, versioned: a field is only ever added under the same version
SCHEMA: Final = "interlock.notification/v1"
#: the signature header of earlier releases, still sent beside the Standard Webhooks headers
#: (deprecated: removed in 0.3.0)
SIGNATURE_HEADER: Final = "Interlock-Signature"
#: the Standard Webhooks headers: the message's id (the same on every retry), the attempt's
#: time (unix seconds) and the signature (``v1,<base64 HMAC-SHA256>``)
WEBHOOK_ID_HEADER: Final = "webhook-id"
WEBHOOK_TIMESTAMP_HEADER: Final = "webhook-timestamp"
WEBHOOK_SIGNATURE_HEADER: Final = "webhook-signature"
#: how a Standard Webhooks secret begins (the base64 of the key's bytes follows)
SECRET_PREFIX: Final = "whsec_"
#: the key lengths Standard Webhooks allow, in bytes
_KEY_BYTES = (24, 64)
#: how long a review waits for a person by default: an approval then expires (the call is
#: refused); an AMBIGUOUS review escalates and stays open
DEFAULT_REVIEW_DEADLINE: Final = timedelta(hours=24)
#: how often an open review is sent again as a ``reminder`` by default
DEFAULT_REMINDER_EVERY: Final = timedelta(hours=4)

Event = Literal["opened", "reminder", "expired", "escalated", "resolved"]


class DefaultType(Enum):
    """The type of ``DEFAULT``, its one value (for annotations: ``timedelta | DefaultType |
    None``)."""

    DEFAULT = "DEFAULT"

    def __repr__(self) -> str:
        return "DEFAULT"


#: the default of ``review_deadline`` and ``reminder_every`` (``None`` turns either off, as an
#: explicit choice)
DEFAULT: Final = DefaultType.DEFAULT


class NotifyError(Exception):
    """A delivery that failed: the message names the notifier and what went wrong, never its
    URL (a Slack webhook's URL is its credential), secret or password."""


class Notification(BaseModel):
    """The webhook's JSON body (schema ``SCHEMA``), and what every notifier renders."""

    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(default=SCHEMA, alias="schema")
    event: Event
    review_id: str
    kind: Literal["ambiguous", "approval", "circuit"]
    effect_id: str
    #: the review's state after the event: open, escalated, expired, resolved, closed
    state: str
    activity: str = ""
    principal: str | None = None
    #: what is known, in a sentence, without argument values
    summary: str
    #: the decisions a person may send
    decisions: list[str] = Field(default_factory=list)
    #: the decision and who made it (``resolved``)
    decision: str | None = None
    operators: list[str] = Field(default_factory=list)
    #: when the review opened, its deadline (unix seconds; None: no deadline)
    opened_at: float
    deadline_at: float | None = None
    #: when the event happened (the same on every retry of its delivery)
    at: float
    ui_url: str
    resolve_command: str
    #: the arguments as recorded (secret arguments masked): only with ``include_values=True``
    values: Any = None
    #: the operator this copy is for, alone (None: the team's notification)
    for_operator: str | None = None
    #: that operator's one-time codes, by decision (only in their own copy)
    codes: dict[str, str] | None = None

    def signals(self) -> list[str]:
        """The JSON, one per decision, the operator pastes into the Web UI's signal form."""
        return [
            json.dumps({"decision": decision, "operator": self.for_operator, "code": code})
            for decision, code in (self.codes or {}).items()
        ]

    def body(self) -> bytes:
        return json.dumps(
            self.model_dump(mode="json", by_alias=True, exclude_none=False),
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    def message_id(self, notifier: str) -> str:
        """The ``webhook-id`` of this notification as ``notifier`` sends it: the same on every
        retry of its delivery (it is made of the review, the event and the event's time, which
        the workflow fixed), another for another event, notifier or operator's copy. A receiver
        that has seen an id already has that notification."""
        named = json.dumps(
            [notifier, self.review_id, self.event, round(self.at * 1000), self.for_operator]
        )
        return "msg_" + hashlib.sha256(named.encode()).hexdigest()[:32]

    def title(self) -> str:
        what = {"ambiguous": "Effect in doubt", "approval": "Approval needed"}.get(
            self.kind, "Circuit open"
        )
        title = f"{what} ({self.event}): {self.activity} {self.effect_id[:12]}"
        return f"Your one-time codes ({self.for_operator}): {title}" if self.codes else title

    def text(self) -> str:
        lines = [self.title(), "", self.summary, ""]
        if self.decision:
            lines.append(f"Decided: {self.decision} by {', '.join(self.operators)}")
        if self.deadline_at is not None and self.state in ("open", "escalated"):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.deadline_at))
            lines.append(f"Deadline: {stamp}")
        if self.codes:
            return "\n".join([*lines, "", *self._codes_text()])
        lines += [f"Open it: {self.ui_url}", f"Or resolve it: {self.resolve_command}"]
        return "\n".join(lines)

    def _codes_text(self) -> list[str]:
        return [
            f"Your one-time codes for this review, {self.for_operator}: yours alone (do not "
            "share or forward them), each works once, for this review only.",
            "",
            *(f"  {decision}: {code}" for decision, code in (self.codes or {}).items()),
            "",
            f"To decide in the Temporal Web UI: open {self.ui_url}",
            "then More Actions > Send a Signal, choose the signal `resolve`, and paste as its "
            "data exactly one of these lines (the decision you made):",
            "",
            *(f"  {line}" for line in self.signals()),
        ]


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The ``Interlock-Signature`` header of ``body``: ``t=<ts>,v1=<hex HMAC-SHA256>``, keyed
    with the secret's text as it is (deprecated, with the header: removed in 0.3.0; a receiver
    checks ``standard_headers`` instead)."""
    ts = int(time.time()) if timestamp is None else timestamp
    key = secret.encode() if isinstance(secret, str) else secret
    mac = hmac.new(key, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def new_secret() -> str:
    """A new notifier secret in the Standard Webhooks form: ``whsec_`` and the base64 of 32
    random bytes. Give the same text to the notifier and to its receiver."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a notifier's secret: the bytes a ``whsec_<base64>`` secret encodes; for
    a secret in another form (deprecated: refused from 0.3.0), its UTF-8 bytes, which a
    receiver passes to its library as bytes (``standardwebhooks.Webhook(secret.encode())``).
    Raises ``ValueError`` for a ``whsec_`` secret whose rest is not base64 of 24 to 64 bytes."""
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode()
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            f"the secret starts with {SECRET_PREFIX} but what follows is not base64: a Standard "
            f"Webhooks secret is {SECRET_PREFIX} and the base64 of 24 to 64 random bytes "
            "(interlock_temporal.notify.new_secret() makes one)"
        ) from None
    low, high = _KEY_BYTES
    if not low <= len(key) <= high:
        raise ValueError(
            f"the secret's key is {len(key)} bytes: a Standard Webhooks secret encodes 24 to 64 "
            "(interlock_temporal.notify.new_secret() makes one of 32)"
        )
    return key


def standard_headers(
    secret: str, message_id: str, body: bytes, timestamp: int | None = None
) -> dict[str, str]:
    """The Standard Webhooks headers of ``body``: ``webhook-id``, ``webhook-timestamp`` (now,
    unless given) and ``webhook-signature``, ``v1,<base64 HMAC-SHA256(key, "<id>.<ts>.<body>")>``
    with the key of ``secret`` (``secret_key``)."""
    ts = int(time.time()) if timestamp is None else timestamp
    signed = f"{message_id}.{ts}.".encode() + body
    mac = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return {
        WEBHOOK_ID_HEADER: message_id,
        WEBHOOK_TIMESTAMP_HEADER: str(ts),
        WEBHOOK_SIGNATURE_HEADER: f"v1,{base64.b64encode(mac).decode()}",
    }


def _signed(secret: SecretStr, message_id: str, body: bytes) -> dict[str, str]:
    """The headers that sign ``body``: the Standard Webhooks three, and the deprecated
    ``Interlock-Signature`` (one release more)."""
    text = secret.get_secret_value()
    return {**standard_headers(text, message_id, body), SIGNATURE_HEADER: sign(text, body)}


def _checked_secret(secret: SecretStr | None, notifier: str) -> SecretStr | None:
    """A notifier's secret, refused (``ValueError``) when it starts with ``whsec_`` and is not a
    Standard Webhooks secret; one in another form is accepted with a ``DeprecationWarning``."""
    if secret is None:
        return None
    text = secret.get_secret_value()
    if not text:
        raise ValueError(f"{notifier}: secret is empty (interlock_temporal.notify.new_secret())")
    try:
        secret_key(text)
    except ValueError as err:
        raise ValueError(f"{notifier}: {err}") from None
    if not text.startswith(SECRET_PREFIX):
        warnings.warn(
            f"{notifier}: a secret not in the Standard Webhooks form {SECRET_PREFIX}<base64> is "
            "deprecated: its UTF-8 bytes are the key (a receiver's library takes them as bytes, "
            "standardwebhooks.Webhook(secret.encode())); give one from "
            f"interlock_temporal.notify.new_secret() to the notifier and its receiver; refused "
            f"from {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=4,
        )
    return secret


class Notifier(BaseModel, ABC):
    """A way to tell people. ``name`` tells notifiers apart (in the failures table and the
    report: each must be unique on a plugin); ``ui_url`` is the Temporal Web UI's base URL the
    message links to; ``namespace`` is the reviews' namespace; ``include_values``: put the
    recorded arguments in the message (secret arguments stay masked)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    ui_url: str = "http://localhost:8233"
    namespace: str = "default"
    include_values: bool = False
    #: seconds for each attempt's connection and reply
    timeout: float = Field(default=10.0, gt=0)

    @abstractmethod
    def deliver(self, notification: Notification) -> None:
        """Send it (blocking: runs in a thread). Raises ``NotifyError`` when it did not go."""

    def to_operator(self, channel: str) -> Notifier | None:
        """This notifier aimed at one operator's own ``channel`` on the roster (``mailto:...``,
        ``https://...``), for their one-time codes; None when it cannot reach such a channel
        (the default)."""
        return None


def _post(notifier: str, url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
    except urllib.error.HTTPError as err:
        raise NotifyError(f"notifier {notifier!r}: the receiver answered HTTP {err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise NotifyError(
            f"notifier {notifier!r}: could not reach the receiver ({type(reason).__name__}: "
            f"{getattr(reason, 'strerror', None) or 'no answer'})"
        ) from None


class Webhook(Notifier):
    """POST the ``Notification`` as JSON, signed with ``secret`` (``whsec_<base64>``, from
    ``new_secret()``) as Standard Webhooks sign it: a receiver checks it with a Standard
    Webhooks library (``standardwebhooks.Webhook(secret).verify(body, headers)``) and dedupes
    by ``webhook-id``."""

    name: str = "webhook"
    url: str
    secret: SecretStr

    @field_validator("secret")
    @classmethod
    def _secret(cls, secret: SecretStr) -> SecretStr:
        _checked_secret(secret, "Webhook")
        return secret

    def deliver(self, notification: Notification) -> None:
        body = notification.body()
        headers = {
            "Content-Type": "application/json",
            **_signed(self.secret, notification.message_id(self.name), body),
        }
        _post(self.name, self.url, body, headers, self.timeout)

    def to_operator(self, channel: str) -> Webhook | None:
        """An ``https://`` channel (or ``http://`` on loopback, for tests), signed with this
        webhook's ``secret``."""
        parts = urllib.parse.urlsplit(channel.strip())
        loopback = parts.scheme == "http" and parts.hostname in _LOOPBACK
        if not parts.netloc or not (parts.scheme == "https" or loopback):
            return None
        return self.model_copy(update={"url": channel.strip()})


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: an address a ``mailto:`` channel may name: one mailbox, nothing that would split a header
_MAILBOX = re.compile(r"[^@\s,;<>\"]+@[^@\s,;<>\"]+")


class Slack(Notifier):
    """A Slack incoming-webhook message (``{"text": ..., "blocks": [...]}``); the URL Slack
    gives is the credential. With ``secret``, the body is signed as a webhook's is, for a
    relay that checks it."""

    name: str = "slack"
    url: SecretStr
    secret: SecretStr | None = None

    @field_validator("secret")
    @classmethod
    def _secret(cls, secret: SecretStr | None) -> SecretStr | None:
        return _checked_secret(secret, "Slack")

    def message(self, n: Notification) -> dict[str, Any]:
        summary = f"*{n.title()}*\n{n.summary}"
        if n.decision:
            summary += f"\nDecided: `{n.decision}` by {', '.join(n.operators)}"
        return {
            "text": f"{n.title()}: {n.summary}",
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": summary}},
                {
                    "type": "section",
                    "text": {
                        "type": "mrkdwn",
                        "text": f"<{n.ui_url}|Open the review> or resolve it:\n"
                        f"```{n.resolve_command}```",
                    },
                },
            ],
        }

    def deliver(self, notification: Notification) -> None:
        body = json.dumps(self.message(notification)).encode()
        headers = {"Content-Type": "application/json"}
        if self.secret is not None:
            message_id = notification.message_id(self.name)
            headers.update(_signed(self.secret, message_id, body))
        _post(self.name, self.url.get_secret_value(), body, headers, self.timeout)


class Email(Notifier):
    """A plain-text email over SMTP (the client of ``targets.email.SmtpEmail``). ``secret``
    (optional) signs the text body (its lines ended with ``\n``) in the Standard Webhooks
    headers, as a webhook's body is signed."""

    name: str = "email"
    host: str
    port: int | None = None
    #: the From address (``from`` in a configuration file)
    sender: str = Field(validation_alias=AliasChoices("sender", "from"))
    to: list[str] = Field(min_length=1)
    security: Literal["starttls", "ssl", "none"] = "starttls"
    username: str | None = None
    password: SecretStr | None = None
    secret: SecretStr | None = None

    @field_validator("secret")
    @classmethod
    def _secret(cls, secret: SecretStr | None) -> SecretStr | None:
        return _checked_secret(secret, "Email")

    def deliver(self, notification: Notification) -> None:
        # imported here: workflow code that imports the package never loads smtplib (which
        # Temporal's sandbox restricts)
        from .targets.email import Email as _Message
        from .targets.email import SmtpEmail

        smtp = SmtpEmail(
            self.host,
            self.port,
            security=self.security,
            username=self.username,
            password=self.password,
            timeout=self.timeout,
            name=f"notify-{self.name}",
        )
        text = notification.text() + "\n"
        headers = {}
        if self.secret is not None:
            signed = _signed(self.secret, notification.message_id(self.name), text.encode())
            # ", " between the parts: a header this long is folded there, not encoded
            signed[SIGNATURE_HEADER] = signed[SIGNATURE_HEADER].replace(",", ", ")
            headers.update(signed)
        message = _Message(
            sender=self.sender,
            to=self.to,
            subject=f"[interlock] {notification.title()}",
            text=text,
            headers=headers,
        )
        token = f"{notification.review_id}.{notification.event}.{int(notification.at * 1000)}"
        if notification.for_operator is not None:  # the operator's own message, its own id
            name = notification.for_operator.encode()
            token += f".op-{hashlib.sha256(name).hexdigest()[:16]}"
        try:
            smtp.send_blocking(message, effect_id=token)
        except Exception as err:
            raise NotifyError(f"notifier {self.name!r}: {err}") from None

    def to_operator(self, channel: str) -> Email | None:
        """A ``mailto:ADDRESS`` channel: this email notifier sending to ``ADDRESS`` alone."""
        if not channel.lower().startswith("mailto:"):
            return None
        address = urllib.parse.unquote(channel[len("mailto:") :].split("?", 1)[0]).strip()
        if not _MAILBOX.fullmatch(address):
            return None
        return self.model_copy(update={"to": [address]})
