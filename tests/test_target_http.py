"""The HTTP target (``interlock_temporal.targets.http``) against a real API on loopback and a
real proxy in front of it (``tests/http_api.py``): what each failure of a send means, what a
lookup may call "absent", and, on a real Temporal dev server, a send whose answer the proxy
lost recovered at tier 1 (resent under the same key) and tier 2 (found by the lookup), and a
worker SIGKILLed after the send. What happened is read from the API's own state, never from
the gate."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, open_journal, receipt
from interlock_temporal.core.models import Kind
from interlock_temporal.targets.http import (
    HttpInDoubt,
    HttpRejected,
    HttpResult,
    HttpTarget,
    Lookup,
    LookupFailed,
    clamp_retry_after,
    retry_after,
)
from interlock_temporal.testing import DevServer, free_port

from .doc_snippets import load, snippet
from .http_api import Served, serve
from .http_worker import ACTIVITY, SIGNING_KEY, worker
from .server_workflows import CallActivity

ROOT = Path(__file__).resolve().parent.parent
EID = "e" * 64


@pytest.fixture
def served() -> Iterator[Served]:
    running = serve()
    try:
        yield running
    finally:
        running.close()


def _target(**kwargs: Any) -> HttpTarget:
    kwargs.setdefault("timeout", 5.0)
    return HttpTarget("payments-api", **kwargs)


PAYMENT = {"amount_cents": 500, "currency": "eur"}


# -- a send, and what its failures mean ------------------------------------------------------------


async def test_a_send_carries_the_effect_id_as_its_idempotency_key(served: Served) -> None:
    target = _target(result_headers=("idempotent-replayed",))
    url = f"{served.proxy.url}/payments"
    first = await target.send("POST", url, json=PAYMENT, effect_id=EID)
    again = await target.send("POST", url, json=PAYMENT, effect_id=EID)
    (payment,) = served.api.payments
    assert payment["key"] == EID
    assert first == HttpResult(status=201, body=payment, headers={})
    assert again == HttpResult(status=200, body=payment, headers={"idempotent-replayed": "true"})
    assert target.confirmation(first) == payment["id"] == "pay_1"
    assert target.confirmation(first.model_dump()) == "pay_1"  # as recovery hands it back


async def test_a_refused_connection_was_never_sent() -> None:
    target = _target()
    with pytest.raises(httpx.ConnectError) as caught:
        await target.send("POST", f"http://127.0.0.1:{free_port()}/payments", effect_id=EID)
    assert target.classify(caught.value) == "not_sent"


async def test_no_pooled_connection_in_time_was_never_sent(served: Served) -> None:
    """One connection, held by a slow send: the second send times out waiting for it, and the
    API never sees it."""
    served.api.post_delay = 0.6
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(5, pool=0.1)) as client:
        target = _target(client=client)
        url = f"{served.api.url}/payments"
        slow = asyncio.ensure_future(target.send("POST", url, json=PAYMENT, effect_id=EID))
        await asyncio.sleep(0.2)
        with pytest.raises(httpx.PoolTimeout) as caught:
            await target.send("POST", url, json=PAYMENT, effect_id="f" * 64)
        await slow
    assert target.classify(caught.value) == "not_sent"
    assert [key for _, key in served.api.posts] == [EID]


async def test_an_answer_the_proxy_dropped_is_in_doubt_though_the_api_made_the_payment(
    served: Served,
) -> None:
    served.proxy.drop_posts = 1
    target = _target()
    with pytest.raises(httpx.RemoteProtocolError) as caught:
        await target.send("POST", f"{served.proxy.url}/payments", json=PAYMENT, effect_id=EID)
    assert target.classify(caught.value) == "in_doubt"
    assert [p["key"] for p in served.api.payments] == [EID]  # it happened


async def test_a_read_timeout_after_the_api_made_the_payment_is_in_doubt(served: Served) -> None:
    served.api.post_delay = 1.0
    target = _target(timeout=0.3)
    with pytest.raises(httpx.ReadTimeout) as caught:
        await target.send("POST", f"{served.api.url}/payments", json=PAYMENT, effect_id=EID)
    assert target.classify(caught.value) == "in_doubt"
    assert [p["key"] for p in served.api.payments] == [EID]


@pytest.mark.parametrize(
    ("error", "verdict"),
    [
        (httpx.ConnectError("refused"), "not_sent"),
        (httpx.ConnectTimeout("connect"), "not_sent"),
        (httpx.PoolTimeout("pool"), "not_sent"),
        (httpx.WriteTimeout("part may have been written"), "in_doubt"),
        (httpx.WriteError("part may have been written"), "in_doubt"),
        (httpx.ReadError("reset"), "in_doubt"),
        (httpx.ReadTimeout("read"), "in_doubt"),
        (httpx.RemoteProtocolError("closed"), "in_doubt"),
        (ValueError("anything else"), "in_doubt"),
    ],
)
def test_what_each_transport_error_means(error: Exception, verdict: str) -> None:
    assert _target().classify(error) == verdict


@pytest.mark.parametrize(
    ("status", "headers", "retry_s"),
    [
        (408, {}, None),
        (409, {"Retry-After": "2"}, 2.0),
        (425, {"Retry-After": "1.5"}, 1.5),
        (429, {"Retry-After": "7"}, 7.0),
        (500, {}, None),
        (502, {"Retry-After": "0"}, 0.0),
        (503, {"Retry-After": "30"}, 30.0),
    ],
)
async def test_an_answer_that_may_yet_be_applied_is_in_doubt_and_carries_its_retry_after(
    served: Served, status: int, headers: dict[str, str], retry_s: float | None
) -> None:
    body = b'{"error": {"message": "a request with this key is in progress"}}'
    served.api.canned.append((status, headers, body))
    target = _target()
    with pytest.raises(HttpInDoubt) as caught:
        await target.send("POST", f"{served.proxy.url}/payments", json=PAYMENT, effect_id=EID)
    error = caught.value
    assert target.classify(error) == "in_doubt"
    assert (error.status, error.retry_after, error.non_retryable) == (status, retry_s, False)
    assert error.next_retry_delay == (None if retry_s is None else timedelta(seconds=retry_s))
    wait = "" if retry_s is None else f" (Retry-After {retry_s:g} s)"
    assert error.message == (
        f"payments-api: POST answered {status}, the request may have been applied{wait}: "
        "a request with this key is in progress"
    )
    assert served.api.payments == []  # the API answered it unprocessed (so it says)


def test_retry_after_as_an_http_date_and_nonsense() -> None:
    from datetime import UTC, datetime

    request = httpx.Request("POST", "http://api")
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

    def answer(value: str) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": value}, request=request)

    assert retry_after(answer("Wed, 02 Dec 2026 12:00:42 GMT"), now) == 42.0
    assert retry_after(answer("Wed, 02 Dec 2026 11:00:00 GMT"), now) == 0.0  # past: now
    assert retry_after(answer("soon"), now) is None
    assert retry_after(answer("-5"), now) == 0.0
    assert retry_after(answer("nan"), now) is None
    assert retry_after(answer("1e400"), now) is None  # inf
    assert retry_after(answer("Wed, 02 Dec 99999 12:00:00 GMT"), now) is None  # no such year
    # parsed, not bounded: clamp_retry_after bounds it
    assert retry_after(answer("1e15"), now) == 1e15


#: a Retry-After, and what clamp_retry_after makes of it outside an activity (one hour at most)
NONSENSE = [
    ("86400000000", 3600.0),  # a million days
    ("1e15", 3600.0),  # does not fit a timedelta
    ("1e400", None),  # infinite: the retry policy's own interval
    ("-5", 0.0),
    ("-1e15", 0.0),
    ("nan", None),
    ("inf", None),
    ("-inf", None),
    ("soon", None),
    ("0x10", None),
    ("", None),
    ("Fri, 31 Dec 9999 23:59:59 -2359", 3600.0),  # far in the future
    ("Mon, 01 Jan 1900 00:00:00 GMT", 0.0),  # far in the past
    ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
    ("Wed, 02 Dec 99999 12:00:00 GMT", None),  # no such year
    ("Mon, 32 Jan 2000 00:00:00 GMT", None),  # no such day
    ("30", 30.0),
]


@pytest.mark.parametrize(("value", "held"), NONSENSE)
def test_a_retry_after_is_bounded_by_an_hour_outside_an_activity(
    value: str, held: float | None
) -> None:
    request = httpx.Request("POST", "http://api")
    response = httpx.Response(503, headers={"Retry-After": value}, request=request)
    assert clamp_retry_after(retry_after(response)) == held
    error = _target().status_error(response)  # never OverflowError
    assert isinstance(error, HttpInDoubt) and not error.non_retryable
    assert error.retry_after == held
    assert error.next_retry_delay == (None if held is None else timedelta(seconds=held))


def test_a_retry_after_is_bounded_by_what_is_left_of_the_schedule_to_close_timeout() -> None:
    """In an activity scheduled 50 s ago with 60 s to close, 10 s are left: a longer
    Retry-After is held to them; one with no schedule-to-close timeout gets an hour; one past
    its deadline gets 0 (Temporal makes no further attempt)."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from temporalio.testing import ActivityEnvironment

    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    env = ActivityEnvironment()

    def within(seconds: float, **info: Any) -> float | None:
        env.info = replace(env.default_info(), **info)
        return env.run(clamp_retry_after, seconds, now)

    scheduled = now - timedelta(seconds=50)
    timed = {"scheduled_time": scheduled, "schedule_to_close_timeout": timedelta(seconds=60)}
    assert within(1e15, **timed) == 10.0
    assert within(86400000000, **timed) == 10.0
    assert within(3, **timed) == 3.0
    assert within(-1, **timed) == 0.0
    assert within(1e15, scheduled_time=scheduled, schedule_to_close_timeout=None) == 3600.0
    hour_ago = now - timedelta(hours=1)
    a_day = {"scheduled_time": hour_ago, "schedule_to_close_timeout": timedelta(days=1)}
    assert within(1e15, **a_day) == 23 * 3600.0  # a longer timeout: no hour's cap
    past = {"scheduled_time": hour_ago, "schedule_to_close_timeout": timedelta(seconds=5)}
    assert within(30, **past) == 0.0


@pytest.mark.parametrize(
    ("payment", "status", "message"),
    [
        ({"amount_cents": 500}, 400, "currency is required"),
        ({"amount_cents": -5, "currency": "eur"}, 422, "amount_cents must be a positive integer"),
    ],
)
async def test_a_refused_request_is_rejected_naming_the_status_and_the_apis_message(
    served: Served, payment: dict[str, Any], status: int, message: str
) -> None:
    target = _target()
    with pytest.raises(HttpRejected) as caught:
        await target.send("POST", f"{served.proxy.url}/payments", json=payment, effect_id=EID)
    error = caught.value
    assert target.classify(error) == "rejected"
    assert (error.status, error.api_message, error.non_retryable) == (status, message, True)
    assert error.message == f"payments-api: POST answered {status}, rejected: {message}"
    assert served.api.payments == []


async def test_a_send_without_an_effect_id_is_refused_before_anything_is_sent(
    served: Served,
) -> None:
    with pytest.raises(ValueError, match=r"^send: effect_id must be the effect's id"):
        await _target().send("POST", f"{served.api.url}/payments", json=PAYMENT, effect_id="")
    assert served.api.posts == []


async def test_the_effect_id_wins_over_a_key_given_in_the_headers(served: Served) -> None:
    target = _target()
    await target.send(
        "POST",
        f"{served.api.url}/payments",
        json=PAYMENT,
        headers={"idempotency-key": "mine"},
        effect_id=EID,
    )
    assert [p["key"] for p in served.api.payments] == [EID]


def test_the_tier_follows_from_what_is_configured_and_a_lookup_must_ask_by_effect_id() -> None:
    url = "http://api/payments/{effect_id}"
    window = timedelta(hours=24)
    assert [
        (t.tier, callable(getattr(t, "query", None)))
        for t in (
            _target(),
            _target(lookup=url),
            _target(dedupe_window=window),
            _target(dedupe_window=window, lookup=Lookup(url)),
        )
    ] == [(3, False), (2, True), (1, False), (1, True)]
    with pytest.raises(ValueError) as caught:
        Lookup("http://api/payments/latest")
    assert str(caught.value) == "Lookup: url must be a template that contains {effect_id}"
    with pytest.raises(TypeError, match=r"^HttpTarget: lookup must be a Lookup"):
        _target(lookup=42)


# -- the lookup ------------------------------------------------------------------------------------


def _by_key(served: Served, **kwargs: Any) -> HttpTarget:
    return _target(lookup=Lookup(f"{served.proxy.url}/payments/by-key/{{effect_id}}", **kwargs))


def _listed(served: Served) -> HttpTarget:
    return _target(lookup=Lookup(f"{served.proxy.url}/payments?key={{effect_id}}", items="data"))


async def test_the_lookup_finds_a_payment_by_its_key(served: Served) -> None:
    made = await _target().send("POST", f"{served.api.url}/payments", json=PAYMENT, effect_id=EID)
    for target in (_by_key(served), _by_key(served, api_header="X-Api"), _listed(served)):
        found = await target.query(EID, None)
        assert found is not None
        assert found.result == {"status": 200, "body": made.body, "text": None, "headers": {}}
        assert found.confirmation == "pay_1"


async def test_the_lookup_says_absent_only_on_the_apis_own_answer(served: Served) -> None:
    assert await _by_key(served).query(EID, None) is None  # the API's JSON 404
    assert await _by_key(served, api_header="X-Api").query(EID, None) is None
    assert await _listed(served).query(EID, None) is None  # the API's empty list


@pytest.mark.parametrize("page", [404, 502])
async def test_a_proxys_html_page_is_not_absent(served: Served, page: int) -> None:
    served.proxy.page = page
    for target in (_by_key(served), _listed(served)):
        with pytest.raises(LookupFailed) as caught:
            await target.query(EID, None)
        assert str(caught.value) == (
            f"payments-api: the lookup's answer ({page}, not JSON) is not the API's own (a "
            "proxy's or a gateway's page?): whether the effect happened is not known"
        )


async def test_a_json_404_without_the_apis_header_is_not_absent(served: Served) -> None:
    """A gateway that answers JSON 404s of its own: only the API sets X-Api."""
    target = _by_key(served, api_header="X-Api-Version")
    with pytest.raises(LookupFailed) as caught:
        await target.query(EID, None)
    assert str(caught.value) == (
        "payments-api: the lookup's answer (404, JSON) is not the API's own (a proxy's or a "
        "gateway's page?): whether the effect happened is not known"
    )


async def test_an_api_error_on_the_lookup_is_not_absent(served: Served) -> None:
    served.api.lookup_canned.append((503, {"error": {"message": "try again"}}))
    with pytest.raises(LookupFailed) as caught:
        await _by_key(served, api_header="X-Api").query(EID, None)
    assert str(caught.value) == (
        "payments-api: the lookup got 503 from the API: whether the effect happened is not known"
    )


async def test_a_lookup_that_times_out_is_not_absent(served: Served) -> None:
    served.api.lookup_delay = 1.0
    target = _target(lookup=Lookup(f"{served.api.url}/payments/by-key/{{effect_id}}", timeout=0.3))
    with pytest.raises(httpx.ReadTimeout):
        await target.query(EID, None)


async def test_a_lookup_may_be_an_async_callable() -> None:
    from interlock_temporal.targets import Found

    async def ask(effect_id: str, args: Any) -> Found | None:
        return Found(result={"key": effect_id}) if args == "made" else None

    target = _target(lookup=ask)
    assert await target.query(EID, "made") == Found(result={"key": EID})
    assert await target.query(EID, "not made") is None


# -- end to end, on a real Temporal dev server ----------------------------------------------------


class Story:
    """A journal, a lease for ``http_pay``, a task queue, and the workflow that pays."""

    def __init__(self, dev_server: DevServer, tmp_path: Path) -> None:
        self.dev_server = dev_server
        self.url = f"sqlite:///{tmp_path / 'journal.db'}"
        self.journal = open_journal(self.url, signing_key=SIGNING_KEY)
        self.lease = self.journal.leases.issue("bot", activities=[ACTIVITY, "pay"])
        self.queue = f"http-{uuid.uuid4().hex[:8]}"
        self.order = f"o-{uuid.uuid4().hex[:8]}"

    async def client(self) -> Client:
        plugin = InterlockPlugin(self.url, signing_key=SIGNING_KEY)
        return await Client.connect(
            self.dev_server.target, data_converter=pydantic_data_converter, plugins=[plugin]
        )

    async def start(
        self,
        client: Client,
        activity: str = ACTIVITY,
        order_field: str = "order",
        **options: Any,
    ) -> WorkflowHandle[Any, Any]:
        spec = {
            "activity": activity,
            "arg": {order_field: self.order, **PAYMENT},
            "principal": "bot",
            "lease": self.lease,
            "heartbeat_s": 1,
            **options,
        }
        return await client.start_workflow(
            CallActivity.run, spec, id=f"pay-{self.order}", task_queue=self.queue
        )

    def effect(self) -> str:
        (row,) = self.journal.effects()
        return row.effect_id


@pytest.fixture
def story(dev_server: DevServer, tmp_path: Path) -> Iterator[Story]:
    made = Story(dev_server, tmp_path)
    try:
        yield made
    finally:
        made.journal.close()


async def _paid(story: Story, url: str, tier: int) -> dict[str, Any]:
    client = await story.client()
    async with worker(client, story.queue, url, tier):
        handle = await story.start(client)
        return await asyncio.wait_for(handle.result(), 30)  # type: ignore[no-any-return]


@pytest.mark.server
async def test_tier_1_an_answer_lost_by_the_proxy_is_resent_under_the_same_key(
    served: Served, story: Story
) -> None:
    """The proxy drops the answer to the first send after the API made the payment; the next
    attempt resends with the same key, and the API, which dedupes, answers the same payment."""
    served.proxy.drop_posts = 1
    result = await _paid(story, served.proxy.url, tier=1)
    eid = story.effect()
    (payment,) = served.api.payments
    assert [key for _, key in served.api.posts] == [eid, eid]  # sent twice, one key
    assert payment["key"] == eid and served.proxy.dropped == 1
    assert (result["status"], result["body"]) == (200, payment)  # the API's replay
    done = receipt(eid, journal=story.journal)
    assert (done.final, done.via, done.tier, done.dispatches) == (
        "COMMITTED",
        "retry-idempotent",
        1,
        2,
    )
    assert done.confirmation == payment["id"]


@pytest.mark.server
async def test_tier_1_a_429_s_retry_after_holds_the_next_attempt_back(
    served: Served, story: Story
) -> None:
    """The API answers the first send 429, Retry-After 1.5 s (the workflow's retry policy would
    try again within 1 s): the next attempt comes no sooner, and makes the one payment."""
    served.api.canned.append((429, {"Retry-After": "1.5"}, b'{"error": "slow down"}'))
    result = await _paid(story, served.proxy.url, tier=1)
    (payment,) = served.api.payments
    (first, _), (second, _) = served.api.posts
    assert second - first >= 1.5
    assert (result["status"], result["body"]) == (201, payment)
    assert receipt(story.effect(), journal=story.journal).via == "retry-idempotent"


#: Retry-After values an API must not be trusted with: a million days, and one past timedelta
UNTRUSTED = ["86400000000", "1e15"]


@pytest.mark.server
@pytest.mark.parametrize("value", UNTRUSTED)
async def test_an_untrusted_retry_after_holds_the_next_attempt_an_hour_at_most(
    served: Served, story: Story, value: str
) -> None:
    """No schedule-to-close timeout: the API's 503 says wait ``value`` seconds; Temporal
    schedules the next attempt an hour out (not a million days, and no ``OverflowError``), the
    effect in doubt meanwhile and no payment made."""
    served.api.canned.append((503, {"Retry-After": value}, b'{"error": "busy"}'))
    client = await story.client()
    async with worker(client, story.queue, served.proxy.url, 1):
        handle = await story.start(client)
        try:
            pending = None
            for _ in range(100):
                described = await handle.describe()
                found = list(described.raw_description.pending_activities)
                if found and found[0].HasField("last_failure"):
                    pending = found[0]
                    break
                await asyncio.sleep(0.1)
            assert pending is not None, "the first attempt never failed"
            failure = pending.last_failure
            assert failure.application_failure_info.type == "HttpInDoubt"
            assert f"(Retry-After {float(value):g} s, held to 3600 s)" in failure.message
            next_attempt = pending.next_attempt_schedule_time.ToDatetime(tzinfo=UTC)
            wait = next_attempt - pending.last_attempt_complete_time.ToDatetime(tzinfo=UTC)
            assert timedelta(minutes=59) < wait <= timedelta(hours=1, seconds=1)
        finally:
            await handle.terminate("the test saw what it came for")
    assert len(served.api.posts) == 1 and served.api.payments == []
    (row,) = story.journal.effects()
    assert row.status is Kind.DISPATCHED  # in doubt: the next attempt would recover it


@pytest.mark.server
@pytest.mark.parametrize("value", UNTRUSTED)
async def test_an_untrusted_retry_after_ends_at_the_schedule_to_close_deadline_in_doubt(
    served: Served, story: Story, value: str
) -> None:
    """A 4 s schedule-to-close timeout: the delay is held to what is left of it, so Temporal
    makes no further attempt and the workflow hears ``HttpInDoubt`` (not ``OverflowError``)
    well inside the deadline; the effect is left in doubt, and no payment was made."""
    served.api.canned.append((503, {"Retry-After": value}, b'{"error": "busy"}'))
    client = await story.client()
    async with worker(client, story.queue, served.proxy.url, 1):
        handle = await story.start(client, schedule_to_close_s=4)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 30)
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and cause.retry_state is RetryState.TIMEOUT
    api = cause.cause
    assert isinstance(api, ApplicationError) and api.type == "HttpInDoubt"
    (details,) = api.details
    assert details["status"] == 503 and 0 <= details["retry_after_s"] <= 4
    assert f"(Retry-After {float(value):g} s, held to " in api.message
    assert len(served.api.posts) == 1 and served.api.payments == []
    (row,) = story.journal.effects()
    assert row.status is Kind.DISPATCHED


@pytest.mark.server
async def test_a_422_is_refused_once_naming_the_status_and_the_workflow_hears_the_apis_message(
    served: Served, story: Story
) -> None:
    """A definite refusal: one POST, no payment, REFUSED (target_rejected) with the status in
    the record (not the API's message, which may echo a value) and no retry."""
    served.api.canned.append((422, {}, b'{"error": {"message": "amount_cents too large"}}'))
    client = await story.client()
    async with worker(client, story.queue, served.proxy.url, 2):
        handle = await story.start(client)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 30)
    assert len(served.api.posts) == 1 and served.api.payments == []
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    assert cause.cause.type == "EffectRefused"
    api = cause.cause.cause  # the target's own error, with the API's message
    assert isinstance(api, ApplicationError) and api.type == "HttpRejected"
    assert api.message == "payments-api: POST answered 422, rejected: amount_cents too large"
    done = receipt(story.effect(), journal=story.journal)
    assert (done.final, done.code, done.executed) == ("REFUSED", "target_rejected", False)
    assert done.reason == "the target rejected the request (HttpRejected: HTTP 422)"


@pytest.mark.server
async def test_tier_2_an_answer_lost_by_the_proxy_is_found_by_the_lookup(
    served: Served, story: Story
) -> None:
    """The API does not dedupe (a resend would be a second payment): the next attempt asks the
    lookup, finds the payment by its key, and sends nothing again."""
    served.api.dedupe = False
    served.proxy.drop_posts = 1
    result = await _paid(story, served.proxy.url, tier=2)
    eid = story.effect()
    (payment,) = served.api.payments
    assert [key for _, key in served.api.posts] == [eid]  # sent once
    assert (result["status"], result["body"]) == (200, payment)  # what the lookup answered
    done = receipt(eid, journal=story.journal)
    assert (done.final, done.via, done.tier, done.dispatches) == (
        "COMMITTED",
        "recovery-query",
        2,
        1,
    )
    assert done.confirmation == payment["id"]


@pytest.mark.server
async def test_tier_2_a_worker_killed_after_the_send_leaves_one_payment(
    served: Served, story: Story, tmp_path: Path
) -> None:
    """The worker SIGKILLs itself right after the API answered the send, before the gate
    recorded it; a fresh worker's attempt finds the payment by its key (the API does not
    dedupe, so a resend would show as a second payment)."""
    served.api.dedupe = False
    log = (tmp_path / "worker.log").open("w")
    argv = [story.dev_server.target, story.url, story.queue, served.proxy.url, "2"]
    doomed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.http_worker",
        *argv,
        "--kill-after-send",
        cwd=ROOT,
        stdout=log,
        stderr=log,
        env={k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))},
    )
    client = await story.client()
    handle = await story.start(client)
    try:
        code = await asyncio.wait_for(doomed.wait(), 60)
    except TimeoutError:
        doomed.kill()
        raise AssertionError((tmp_path / "worker.log").read_text()[-3000:]) from None
    assert code == -9, (tmp_path / "worker.log").read_text()[-3000:]
    eid = story.effect()
    (payment,) = served.api.payments  # the API made it; the journal only knows it was sent
    row = story.journal.row(eid)
    assert payment["key"] == eid and row is not None and row.status is Kind.DISPATCHED

    async with worker(client, story.queue, served.proxy.url, 2):
        result = await asyncio.wait_for(handle.result(), 30)
    assert served.api.payments == [payment]
    assert [key for _, key in served.api.posts] == [eid]
    assert result["body"] == payment
    done = receipt(eid, journal=story.journal)
    assert (done.final, done.via, done.dispatches) == ("COMMITTED", "recovery-query", 1)


@pytest.mark.server
async def test_the_pages_example_records_a_lost_answer_found_by_its_lookup(
    served: Served, story: Story, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/targets.md's HttpTarget example, as written, pointed at the API through the proxy
    (its one placeholder, the API's address, comes from the environment as the page says)."""
    monkeypatch.setenv("PAYMENTS_API", served.proxy.url)
    page = load(snippet("docs/targets.md#3539f575f45b"), tmp_path / "payments_api.py")
    assert page.payments.tier == 1 and callable(page.payments.query)
    served.proxy.drop_posts = 1
    client = await story.client()
    async with Worker(
        client, task_queue=story.queue, workflows=[CallActivity], activities=[page.pay]
    ):
        handle = await story.start(client, "pay", "order_id")
        result = await asyncio.wait_for(handle.result(), 30)
    eid = story.effect()
    (payment,) = served.api.payments
    assert [key for _, key in served.api.posts] == [eid]  # found, not sent again
    assert (result["status"], result["body"]) == (200, payment)
    done = receipt(eid, journal=story.journal)
    assert (done.final, done.via, done.tier, done.confirmation) == (
        "COMMITTED",
        "recovery-query",
        1,
        payment["id"],
    )
