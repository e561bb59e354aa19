"""A real HTTP payments API on loopback, and a real proxy in front of it, for the HTTP target's
tests (stdlib ``http.server``, each in a thread of its own).

The API keeps its own state: the payments it created (each with the ``Idempotency-Key`` it
came with) and every POST it received. ``dedupe`` makes it honour the key (a resend with the
same key answers the first payment, ``Idempotent-Replayed: true``); without it, every POST
creates a payment, as an API with no idempotency would. It answers lookups two ways:
``GET /payments?key=K`` (a list, empty when absent) and ``GET /payments/by-key/K`` (a JSON 404
when absent), both with an ``X-Api`` header only it sets. ``canned`` answers are given to the
next POSTs without processing them (a 429 with ``Retry-After``, a 503...).

The proxy forwards everything, but it can drop the answer to the next POSTs (forward the
request, let the API process it, then close the client's connection without a word), and it
can answer every request with an HTML error page of its own (a gateway's 404 or 502).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout test) is expected


@dataclass
class Api:
    dedupe: bool = True
    #: (status, headers, body) answered to the next POSTs, unprocessed
    canned: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    #: seconds a POST waits, after it created the payment, before it answers
    post_delay: float = 0.0
    #: seconds a lookup waits before it answers
    lookup_delay: float = 0.0
    #: (status, body) answered to the next lookups instead of looking (a 503 of the API's own)
    lookup_canned: list[tuple[int, Any]] = field(default_factory=list)
    payments: list[dict[str, Any]] = field(default_factory=list)
    #: (monotonic time, Idempotency-Key) of every POST received
    posts: list[tuple[float, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def post(self, key: str | None, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        with self.lock:
            self.posts.append((time.monotonic(), key))
            if self.canned:
                status, headers, raw = self.canned.pop(0)
                return status, headers, raw
            if not isinstance(body.get("currency"), str):
                return 400, {}, {"error": {"message": "currency is required"}}
            amount = body.get("amount_cents")
            if not isinstance(amount, int) or amount <= 0:
                return 422, {}, {"error": {"message": "amount_cents must be a positive integer"}}
            if self.dedupe and key is not None:
                for payment in self.payments:
                    if payment["key"] == key:
                        return 200, {"Idempotent-Replayed": "true"}, payment
            payment = {
                "id": f"pay_{len(self.payments) + 1}",
                "key": key,
                "amount_cents": amount,
                "currency": body["currency"],
            }
            self.payments.append(payment)
        return 201, {}, payment

    def by_key(self, key: str) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.payments if p["key"] == key]


def _handler(api: Api) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, headers: dict[str, str], body: Any) -> None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("X-Api", "payments")
            if not isinstance(body, bytes):
                self.send_header("Content-Type", "application/json")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            status, headers, answer = api.post(self.headers.get("Idempotency-Key"), body)
            if api.post_delay:
                time.sleep(api.post_delay)
            self._answer(status, headers, answer)

        def do_GET(self) -> None:
            if api.lookup_delay:
                time.sleep(api.lookup_delay)
            url = urlsplit(self.path)
            if api.lookup_canned:
                status, body = api.lookup_canned.pop(0)
                self._answer(status, {}, body)
            elif url.path == "/payments":
                key = parse_qs(url.query).get("key", [""])[0]
                self._answer(200, {}, {"data": api.by_key(key)})
            elif url.path.startswith("/payments/by-key/"):
                found = api.by_key(url.path.rsplit("/", 1)[1])
                if found:
                    self._answer(200, {}, found[0])
                else:
                    self._answer(404, {}, {"error": {"message": "no payment with this key"}})
            else:
                self._answer(404, {}, {"error": {"message": "no such route"}})

    return Handler


HTML_PAGE = b"<html><body><h1>%d</h1><p>nginx</p></body></html>"
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "server", "date"}


@dataclass
class Proxy:
    upstream: tuple[str, int]
    #: drop the answer to this many POSTs (after the API processed them)
    drop_posts: int = 0
    #: answer every request with an HTML page of this status, forwarding nothing
    page: int | None = None
    dropped: int = 0
    url: str = ""

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()


def _proxy_handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _relay(self) -> None:
            if proxy.page is not None:
                page = HTML_PAGE % proxy.page
                self.send_response(proxy.page)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            status, answer_headers, answer = proxy.forward(self.command, self.path, headers, body)
            if self.command == "POST" and proxy.drop_posts > 0:
                proxy.drop_posts -= 1
                proxy.dropped += 1
                # the API processed it; its sender never hears
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.send_response(status)
            for name, value in answer_headers:
                if name.lower() not in _HOP:
                    self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = _relay

    return Handler


@dataclass
class Served:
    api: Api
    proxy: Proxy
    servers: list[ThreadingHTTPServer]

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = _Quiet(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    host, port = server.server_address[:2]
    return server, f"http://{host!s}:{port}"


def serve(api: Api | None = None) -> Served:
    """The API and the proxy in front of it, each serving from a thread."""
    api = api or Api()
    api_server, api.url = _serve(_handler(api))
    host, port = api_server.server_address[:2]
    proxy = Proxy((str(host), int(port)))
    proxy_server, proxy.url = _serve(_proxy_handler(proxy))
    return Served(api, proxy, [api_server, proxy_server])
