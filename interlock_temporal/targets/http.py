"""A ready-made target for any HTTP API that honours an idempotency key, on ``httpx`` (async).

The tier follows from what is configured, and is declared so ``@gated`` can check it:

- ``dedupe_window`` (the API dedupes a resend that carries the same idempotency key inside
  that window): tier 1. With a ``lookup`` too, recovery asks it once the window can no longer
  be relied on.
- ``lookup`` only (the API can be asked whether the effect happened): tier 2.
- neither: tier 3 (an effect in doubt after a crash goes to a person).

The gated activity's body sends with ``await target.send("POST", url, json=...,
effect_id=current_effect().effect_id)``: the effect id travels in the idempotency header
(``Idempotency-Key`` by default), and the answer comes back as an ``HttpResult``. A failed send
raises what ``classify`` reads:

- the request never left (connection refused, connect timeout, no pooled connection in time):
  the ``httpx`` error, ``"not_sent"``;
- it may have been written (a read or write timeout, a reset, a connection closed without an
  answer): the ``httpx`` error, ``"in_doubt"``;
- the API answered 408, 409 (a request with this key still in progress), 425, 429, 5xx, or a
  redirect (never followed): ``HttpInDoubt``, ``"in_doubt"``, whose ``next_retry_delay`` is the
  answer's ``Retry-After`` (the activity's next attempt waits that long), bounded by
  ``clamp_retry_after``: never past what is left of the activity's schedule-to-close timeout,
  and at most an hour when it has none (or outside an activity). A value that is not a number
  or an HTTP date, NaN or infinite, leaves the retry policy's own interval; one that does not
  fit (``1e15``) is bounded like any other, so the answer is in doubt and never a crash;
- any other 4xx: ``HttpRejected``, ``"rejected"`` (nothing happened), naming the status and
  the API's own message.

``lookup`` answers "absent" only on the API's own not-found answer: a 404 with a JSON body
(and the configured header, if any), or a 2xx whose list of matches is empty. A proxy's HTML
error page, any other status, a timeout or a body that is not JSON raises ``LookupFailed`` (or
the ``httpx`` error): the gate then treats the effect as not known yet.

Never import this module from workflow code (the workflow sandbox rejects ``httpx``).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from ..core.extras import needs_extra
from ..core.models import Found
from ..core.targets import BaseTarget, Classification

with needs_extra("http", "interlock_temporal.targets.http"):
    import httpx

#: statuses (besides every 5xx) after which the request may have been, or may yet be, applied
IN_DOUBT_STATUSES = frozenset({408, 409, 425, 429})
#: the response headers an ``HttpResult`` keeps by default (lower case)
RESULT_HEADERS = ("location", "etag", "idempotent-replayed", "request-id", "x-request-id")
#: how much of a response body that is not JSON an error message quotes
_QUOTED = 200
#: the longest a ``Retry-After`` holds the next attempt back when nothing else bounds it (a
#: send outside an activity, or an activity with no schedule-to-close timeout)
RETRY_AFTER_CAP = timedelta(hours=1)

#: the request never left this process: a resend cannot be a duplicate
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
#: the request may have been written, whole or in part: nobody knows
_IN_DOUBT = (
    httpx.ReadTimeout,
    httpx.ReadError,
    httpx.WriteTimeout,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)

Capture = Callable[[Any, str], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
LookupFn = Callable[[str, Any], Awaitable[Found | None]]


class HttpResult(BaseModel):
    """What a send returns (and recovery hands back when ``lookup`` found the effect): the
    status, the body parsed as JSON (``None`` if it is not JSON: then ``text``), and the
    response headers of interest (lower-case names)."""

    model_config = ConfigDict(frozen=True)

    status: int
    body: Any = None
    text: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)


class HttpStatusError(ApplicationError):
    """The API answered a send with a status that is not 2xx (``status``; ``api_message`` is
    the API's own message, if it gave one). ``retry_after``: seconds, already bounded
    (``status_error`` bounds the answer's with ``clamp_retry_after``)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        api_message: str,
        non_retryable: bool,
        retry_after: float | None = None,
    ) -> None:
        delay = None if retry_after is None else timedelta(seconds=retry_after)
        super().__init__(
            message,
            {"status": status, "retry_after_s": retry_after},
            type=type(self).__name__,
            non_retryable=non_retryable,
            next_retry_delay=delay,
        )
        self.status = status
        self.api_message = api_message
        #: recorded in the refusal's reason (the status; the API's message may echo a value)
        self.refusal_detail = f"HTTP {status}"
        self.retry_after = retry_after


class HttpRejected(HttpStatusError):
    """A 4xx the API answered before doing anything (not 408, 409, 425 or 429): nothing
    happened. Not retryable; the gate records the effect REFUSED (``target_rejected``)."""


class HttpInDoubt(HttpStatusError):
    """408, 409, 425, 429 or 5xx: the request may have been applied, or may still be. Retryable;
    ``next_retry_delay`` is the answer's ``Retry-After`` (seconds, or an HTTP date) bounded by
    ``clamp_retry_after``, so Temporal's next attempt, which recovers the effect, waits that
    long, and never past the activity's own deadline."""


class LookupFailed(RuntimeError):
    """The lookup got no answer that says whether the effect happened (a proxy's error page,
    an unexpected status, a body that is not the API's): nobody knows yet."""


@dataclass(frozen=True)
class Lookup:
    """How to ask the API whether an effect happened, by its effect id.

    ``url``: a template with ``{effect_id}`` (``"https://api.example.com/payments?key=
    {effect_id}"``). A 2xx answer's JSON is a list of matches, or an object: with ``items``,
    the object's field that holds the list (``"data"``); without, the object is the match.
    An empty list is the API's "absent"; so is a 404, but only with a JSON body and, when
    ``api_header`` is set, that header (one only the API sets, so a gateway's 404 is never
    taken for it). Anything else raises."""

    url: str
    items: str | None = None
    api_header: str | None = None
    timeout: float = 10.0

    def __post_init__(self) -> None:
        # a lookup that does not ask by the effect id would find some other effect's answer
        if not isinstance(self.url, str) or "{effect_id}" not in self.url:
            raise ValueError("Lookup: url must be a template that contains {effect_id}")
        if isinstance(self.timeout, bool) or not (
            isinstance(self.timeout, int | float) and self.timeout > 0
        ):
            raise ValueError("Lookup: timeout must be a positive number of seconds")


def retry_after(response: httpx.Response, now: datetime | None = None) -> float | None:
    """The answer's ``Retry-After`` in seconds (a number of seconds or an HTTP date; never
    negative, never NaN or infinite), or None when it has none that parses. Not bounded above:
    ``clamp_retry_after`` does that."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def clamp_retry_after(seconds: float | None, now: datetime | None = None) -> float | None:
    """``seconds`` (an answer's ``Retry-After``) bounded by what is left of the running
    activity's schedule-to-close timeout, or by ``RETRY_AFTER_CAP`` (one hour) outside an
    activity or when it has none; never negative; None for None, NaN or infinity (the retry
    policy's own interval applies).

    The problem: an API's answer is not to be trusted. ``Retry-After: 86400000000`` would hold
    the next attempt a million days, the effect ``DISPATCHED`` all the while and its owner
    alive, and ``1e15`` does not fit a ``timedelta`` (``OverflowError``, not ``HttpInDoubt``).
    Bounded, the answer stays in doubt like any other 429 or 5xx: the next attempt, which
    recovers the effect, comes within the hour, or, where the delay reaches the activity's
    deadline, Temporal makes no further attempt and the effect is left in doubt for recovery
    (the reconciler, once its workflow has ended). Cost: one read of ``activity.info()``."""
    if seconds is None or not math.isfinite(seconds):
        return None
    limit = RETRY_AFTER_CAP.total_seconds()
    if activity.in_activity():
        info = activity.info()
        if info.schedule_to_close_timeout:
            deadline = info.scheduled_time + info.schedule_to_close_timeout
            limit = (deadline - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, min(seconds, limit))


def _json(response: httpx.Response) -> tuple[bool, Any]:
    """(whether the body is JSON, the parsed body)."""
    if not response.content:
        return False, None
    try:
        return True, json.loads(response.content)
    except ValueError:
        return False, None


def api_message(response: httpx.Response) -> str:
    """The API's own message in an error answer: the usual JSON shapes (``{"error":
    {"message"}}``, ``{"error"}``, ``{"message"}``, ``{"detail"}``, ``{"title"}``), else the
    start of the body."""
    parsed, body = _json(response)
    if parsed and isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for field in ("error", "message", "detail", "title"):
            if isinstance(body.get(field), str):
                return str(body[field])
    text = response.text.strip()
    return text[:_QUOTED] + ("..." if len(text) > _QUOTED else "")


class HttpTarget(BaseTarget):
    """An HTTP API that honours an idempotency key.

    - ``name``: recorded with every effect.
    - ``idempotency_header``: the header that carries the effect id (``Idempotency-Key``).
    - ``dedupe_window``: how long the API dedupes a resend with the same key (tier 1).
    - ``lookup``: a ``Lookup`` (or just its URL template), or an ``async`` callable
      ``(effect_id, args) -> Found | None``: whether the effect happened (tier 2 without a
      window; asked after the window at tier 1).
    - ``settle_time``: how long a request may still be applied after its sender gave up (the
      API's own processing, a queue behind it): "not found" is believed only after it.
    - ``capture``: the facts the effect relies on (``(args, effect_id) -> Mapping``, may be
      ``async``); default none.
    - ``client``: an ``httpx.AsyncClient`` to send with (its ``base_url`` applies); default a
      new client per request, with ``timeout`` seconds.
    - ``result_headers``: the response headers an ``HttpResult`` keeps.
    - ``confirmation_field``: the field of a JSON body that names what the send made (cited
      by the receipt): ``"id"``.
    """

    #: set only when a lookup is configured (a tier-3 target must have no ``query``)
    query: LookupFn

    def __init__(
        self,
        name: str,
        *,
        idempotency_header: str = "Idempotency-Key",
        dedupe_window: timedelta | None = None,
        lookup: Lookup | str | LookupFn | None = None,
        settle_time: timedelta = timedelta(seconds=30),
        capture: Capture | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
        result_headers: Sequence[str] = RESULT_HEADERS,
        confirmation_field: str | None = "id",
    ) -> None:
        if not isinstance(idempotency_header, str) or not idempotency_header.strip():
            raise ValueError("HttpTarget: idempotency_header must be a header name")
        if lookup is not None and not (isinstance(lookup, Lookup | str) or callable(lookup)):
            raise TypeError(
                "HttpTarget: lookup must be a Lookup, its URL template, or an async callable "
                "(effect_id, args) -> Found | None"
            )
        self.name = name
        self.idempotency_header = idempotency_header
        self.dedupe_window = dedupe_window
        self.settle_time = settle_time
        self.client = client
        self.timeout = timeout
        self.result_headers = tuple(h.lower() for h in result_headers)
        self.confirmation_field = confirmation_field
        self._capture = capture
        self.lookup: Lookup | LookupFn | None = (
            Lookup(lookup) if isinstance(lookup, str) else lookup
        )
        if self.lookup is not None:
            self.query = self._query
        self.tier = 1 if dedupe_window is not None else 2 if self.lookup is not None else 3

    # -- the facts ---------------------------------------------------------------------------

    async def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        if self._capture is None:
            return {}
        facts = self._capture(args, effect_id)
        return await facts if inspect.isawaitable(facts) else facts

    # -- the send ------------------------------------------------------------------------------

    async def send(
        self,
        method: str,
        url: str,
        *,
        effect_id: str,
        json: Any = None,
        content: bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """Send one request carrying ``effect_id`` in the idempotency header; a 2xx comes back
        as an ``HttpResult``, anything else raises (see the module's docstring)."""
        if not isinstance(effect_id, str) or not effect_id:
            raise ValueError("send: effect_id must be the effect's id (current_effect().effect_id)")
        key = self.idempotency_header
        sent_headers = {k: v for k, v in (headers or {}).items() if k.lower() != key.lower()}
        sent_headers[key] = effect_id
        request = {"json": json, "content": content, "params": params, "headers": sent_headers}
        response = await self._request(method, url, request)
        if 200 <= response.status_code < 300:
            return self.result_of(response)
        raise self.status_error(response)

    async def _request(self, method: str, url: str, request: dict[str, Any]) -> httpx.Response:
        given = {k: v for k, v in request.items() if v is not None}
        if self.client is not None:
            return await self.client.request(method, url, **given)
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            return await client.request(method, url, **given)

    def result_of(self, response: httpx.Response, body: Any = None) -> HttpResult:
        parsed, data = (True, body) if body is not None else _json(response)
        kept = {h: response.headers[h] for h in self.result_headers if h in response.headers}
        return HttpResult(
            status=response.status_code,
            body=data if parsed else None,
            text=None if parsed or not response.content else response.text,
            headers=kept,
        )

    def status_error(self, response: httpx.Response) -> HttpStatusError:
        """The error a send raises for an answer that is not 2xx."""
        status = response.status_code
        message = api_message(response)
        said = f": {message}" if message else ""
        what = f"{self.name}: {response.request.method} answered {status}"
        if status in IN_DOUBT_STATUSES or status >= 500 or status < 200 or 300 <= status < 400:
            asked = retry_after(response)
            delay = clamp_retry_after(asked)
            wait = "" if delay is None else f" (Retry-After {delay:g} s)"
            if asked is not None and delay is not None and delay < asked:
                wait = f" (Retry-After {asked:g} s, held to {delay:g} s)"
            return HttpInDoubt(
                f"{what}, the request may have been applied{wait}{said}",
                status=status,
                api_message=message,
                non_retryable=False,
                retry_after=delay,
            )
        return HttpRejected(
            f"{what}, rejected{said}", status=status, api_message=message, non_retryable=True
        )

    def classify(self, error: BaseException) -> Classification:
        """Connect errors before anything was written: ``not_sent``; a 4xx the API refused:
        ``rejected``; everything else (timeouts and resets after the request may have been
        written, 408/409/425/429/5xx, a redirect, which is not followed, anything unknown):
        ``in_doubt``."""
        if isinstance(error, HttpRejected):
            return "rejected"
        if isinstance(error, _NOT_SENT) and not isinstance(error, _IN_DOUBT):
            return "not_sent"
        return "in_doubt"

    def confirmation(self, result: Any) -> str | None:
        body = result.body if isinstance(result, HttpResult) else None
        if body is None and isinstance(result, Mapping):
            body = result.get("body")
        if self.confirmation_field is None or not isinstance(body, Mapping):
            return None
        value = body.get(self.confirmation_field)
        return str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None

    # -- finding an effect again -----------------------------------------------------------------

    async def _query(self, effect_id: str, args: Any) -> Found | None:
        lookup = self.lookup
        if lookup is None:  # pragma: no cover - _query is bound only with a lookup
            return None
        if not isinstance(lookup, Lookup):
            return await lookup(effect_id, args)
        url = lookup.url.format(effect_id=effect_id)
        if self.client is not None:
            response = await self.client.get(url, timeout=lookup.timeout)
        else:
            async with httpx.AsyncClient(timeout=lookup.timeout) as client:
                response = await client.get(url)
        return self.found_in(response, lookup)

    def found_in(self, response: httpx.Response, lookup: Lookup) -> Found | None:
        """What a lookup's answer says: the effect found, None (the API's own "absent"), or
        ``LookupFailed``."""
        status = response.status_code
        parsed, body = _json(response)
        from_api = parsed and (lookup.api_header is None or lookup.api_header in response.headers)
        if status == 404 and from_api:
            return None
        if not from_api:
            what = "JSON" if parsed else "not JSON"
            raise LookupFailed(
                f"{self.name}: the lookup's answer ({status}, {what}) is not the API's own (a "
                "proxy's or a gateway's page?): whether the effect happened is not known"
            )
        if not 200 <= status < 300:
            raise LookupFailed(
                f"{self.name}: the lookup got {status} from the API: whether the effect "
                "happened is not known"
            )
        match = body
        if lookup.items is not None:
            match = body.get(lookup.items) if isinstance(body, dict) else None
            if not isinstance(match, list):
                raise LookupFailed(
                    f"{self.name}: the lookup's answer has no list {lookup.items!r}: whether "
                    "the effect happened is not known"
                )
        if isinstance(match, list):
            if not match:
                return None
            match = match[0]
        result = self.found_result(response, match)
        return Found(result=result, confirmation=self.confirmation(result))

    def found_result(self, response: httpx.Response, match: Any) -> Any:
        """An effect the lookup found, in the shape the gated activity returns (recovery
        hands it back as that activity's result): an ``HttpResult`` of the lookup's status and
        the match, by default. Override it when your activity returns something else."""
        return self.result_of(response, match).model_dump(mode="json")
