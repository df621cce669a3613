"""The per-run egress proxy.

Network rule for this file: every packet goes to 127.0.0.0/8. Refusals of other addresses are
checked on the decision function only, and names under .test are refused before any lookup.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings
from playwright.sync_api import Playwright

from sessions.engine.chromium import HEADLESS_ARGS, chromium_proxy_args, find_chromium
from sessions.engine.egress_policy import EgressDenied, EgressPolicy, parse_ip_literal
from sessions.engine.proxy import PROXY_ANSWER_HEADER, DeniedAttempt, EgressProxy

SINK_HOST = "127.0.0.9"


class ResolverSpy:
    """A resolver with canned answers that records every lookup; unknown names fail the test."""

    def __init__(self, answers: dict[str, list[str]] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.answers:
            raise AssertionError(f"unexpected DNS lookup of {host!r}")
        return self.answers[host]


def refusing_resolver(host: str, port: int) -> list[str]:
    raise AssertionError(f"unexpected DNS lookup of {host!r}")


# ---------------------------------------------------------------------------------------------
# Decisions


@pytest.mark.parametrize(
    ("allowed", "host", "port"),
    [
        (["portal.example.com"], "portal.example.com", 443),
        (["portal.example.com"], "PORTAL.Example.com.", 80),
        (["portal.example.com:443"], "portal.example.com", 443),
        (["*.example.com"], "pay.example.com", 443),
        (["*.example.com:8443"], "a.b.example.com", 8443),
    ],
)
def test_it_allows_allowlisted_names_that_resolve_to_public_addresses(
    allowed: list[str], host: str, port: int
) -> None:
    resolver = ResolverSpy({host.lower().rstrip("."): ["93.184.215.14", "2606:2800:21f::1"]})
    policy = EgressPolicy(allowed, resolver=resolver)

    decision = policy.decide(host, port)

    assert decision.allowed, decision.reason
    assert policy.resolve_for_connect(host, port) == "93.184.215.14"


@pytest.mark.parametrize(
    ("allowed", "host", "port"),
    [
        (["portal.example.com"], "evil.example", 443),
        (["portal.example.com:443"], "portal.example.com", 8443),
        (["*.example.com"], "example.com", 443),
        (["*.example.com"], "example.com.evil.test", 443),
        (["portal.example.com"], "evil.example.test", 80),
    ],
)
def test_it_refuses_names_outside_the_allowlist_without_resolving_them(
    allowed: list[str], host: str, port: int
) -> None:
    resolver = ResolverSpy()
    policy = EgressPolicy(allowed, resolver=resolver)

    decision = policy.decide(host, port)

    assert not decision.allowed
    assert decision.reason == f"{host.lower()} is not in this workflow's allowed hosts"
    assert resolver.calls == []


def test_it_explains_a_refused_name_in_plain_words() -> None:
    policy = EgressPolicy(["portal.example.com"], resolver=refusing_resolver)

    decision = policy.decide("evil.example", 443)

    assert decision.reason == "evil.example is not in this workflow's allowed hosts"


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("127.0.0.9", "127.0.0.9"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("10.0.0.5", "10.0.0.5"),
        ("8.8.8.8", "8.8.8.8"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
    ],
)
def test_it_refuses_raw_ips_in_any_spelling(spelling: str, canonical: str) -> None:
    policy = EgressPolicy(["portal.example.com", "127.0.0.1:8001"], resolver=refusing_resolver)

    decision = policy.decide(spelling, 80)

    assert not decision.allowed
    assert decision.reason == f"raw IP address {canonical} is not in the allowed hosts"


def test_it_parses_odd_ipv4_spellings_as_addresses_not_names() -> None:
    assert str(parse_ip_literal("2130706433")) == "127.0.0.1"
    assert str(parse_ip_literal("0x7f.1")) == "127.0.0.1"
    assert parse_ip_literal("portal.example.com") is None
    assert parse_ip_literal("1.2.3.4.example") is None


def test_it_allows_an_explicitly_allowlisted_loopback_ip_on_its_port_only() -> None:
    policy = EgressPolicy(["127.0.0.1:8001"], resolver=refusing_resolver)

    assert policy.decide("127.0.0.1", 8001).allowed
    assert policy.decide("2130706433", 8001).allowed
    assert policy.resolve_for_connect("127.1", 8001) == "127.0.0.1"
    refused = policy.decide("127.0.0.1", 8002)
    assert not refused.allowed
    assert refused.reason == "raw IP address 127.0.0.1 is not in the allowed hosts"


def test_it_allows_an_allowlisted_ip_without_port_on_any_port() -> None:
    policy = EgressPolicy(["10.1.2.3", "[fd12::1]"], resolver=refusing_resolver)

    assert policy.decide("10.1.2.3", 1234).allowed
    assert policy.decide("[FD12::1]", 443).allowed


@pytest.mark.parametrize(
    "host",
    ["169.254.169.254", "169.254.170.2", "169.254.1.1", "fe80::1", "fd00:ec2::254",
     "::ffff:169.254.169.254", "2852039166"],
)  # fmt: skip
def test_it_refuses_the_metadata_and_link_local_addresses_even_when_allowlisted(host: str) -> None:
    bracketed = f"[{host}]" if ":" in host else host
    policy = EgressPolicy([bracketed], resolver=refusing_resolver)

    decision = policy.decide(host, 80)

    assert not decision.allowed
    assert "never reachable" in decision.reason


def test_it_names_the_metadata_address_in_the_reason() -> None:
    policy = EgressPolicy(["169.254.169.254"], resolver=refusing_resolver)

    decision = policy.decide("169.254.169.254", 80)

    assert decision.reason == (
        "169.254.169.254 is a link-local address (cloud metadata) and is never reachable"
    )


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("10.0.0.5", "private"),
        ("192.168.1.1", "private"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 — an answer under test, not a bind address
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "non-public"),
    ],
)
def test_it_refuses_an_allowlisted_name_that_resolves_to_an_internal_address(
    address: str, kind: str
) -> None:
    resolver = ResolverSpy({"portal.example.com": ["93.184.215.14", address]})
    policy = EgressPolicy(["portal.example.com"], resolver=resolver)

    decision = policy.decide("portal.example.com", 443)

    assert not decision.allowed
    assert f"resolves to {address}, a {kind} address" in decision.reason
    with pytest.raises(EgressDenied):
        policy.resolve_for_connect("portal.example.com", 443)


def test_it_refuses_a_name_rebound_to_the_metadata_address() -> None:
    resolver = ResolverSpy({"portal.example.com": ["169.254.169.254"]})
    policy = EgressPolicy(["portal.example.com"], resolver=resolver)

    decision = policy.decide("portal.example.com", 443)

    assert not decision.allowed
    assert "never reachable" in decision.reason


def test_it_refuses_a_name_that_does_not_resolve() -> None:
    def failing(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    policy = EgressPolicy(["portal.example.com"], resolver=failing)

    decision = policy.decide("portal.example.com", 443)

    assert not decision.allowed
    assert "could not be resolved" in decision.reason


def test_it_allows_localhost_only_when_named_explicitly() -> None:
    resolver = ResolverSpy({"localhost": ["127.0.0.1", "::1"]})

    assert EgressPolicy(["localhost:8001"], resolver=resolver).decide("localhost", 8001).allowed
    assert not EgressPolicy(["localhost:8001"], resolver=resolver).decide("localhost", 22).allowed
    # Only the name itself is trusted with loopback: a wildcard entry gets the rebinding check.
    resolver.answers["localhost.example.com"] = ["127.0.0.1"]
    wildcard = EgressPolicy(["*.example.com"], resolver=resolver)
    assert not wildcard.decide("localhost.example.com", 80).allowed


def test_it_refuses_localhost_resolving_off_the_machine() -> None:
    resolver = ResolverSpy({"localhost": ["10.0.0.5"]})

    decision = EgressPolicy(["localhost"], resolver=resolver).decide("localhost", 80)

    assert not decision.allowed


@pytest.mark.parametrize("host", ["", "bad host", "exa_mple..com", "a/b"])
def test_it_refuses_hosts_that_are_not_names(host: str) -> None:
    policy = EgressPolicy(["*.example.com"], resolver=refusing_resolver)

    assert not policy.decide(host, 80).allowed


# ---------------------------------------------------------------------------------------------
# Real traffic (loopback only)


class Portal:
    """A tiny origin on 127.0.0.1 standing in for the demo portal."""

    def __init__(self) -> None:
        self.page = b"<!doctype html><title>portal</title><p>hello</p>"
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/page.html":
                    body, kind = portal.page, "text/html"
                elif self.path == "/big":
                    body, kind = bytes(range(256)) * 4096, "application/octet-stream"
                elif self.path == "/headers":
                    body, kind = str(self.headers).encode(), "text/plain"
                else:
                    body, kind = f"hello from {self.path}".encode(), "text/plain"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Sink:
    """A listener on 127.0.0.9 that records every connection; the proxy must never reach it."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind((SINK_HOST, 0))
        self.listener.listen(16)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.connections: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections.append(peer)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(1)
        self.listener.close()


@pytest.fixture
def portal() -> Iterator[Portal]:
    server = Portal()
    yield server
    server.close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    server = Sink()
    yield server
    server.close()


@pytest.fixture
def denied() -> list[DeniedAttempt]:
    return []


@pytest.fixture
def proxy(portal: Portal, denied: list[DeniedAttempt]) -> Iterator[EgressProxy]:
    policy = EgressPolicy([f"127.0.0.1:{portal.port}"], resolver=refusing_resolver)
    with EgressProxy(policy, on_denied=denied.append) as running:
        yield running


@pytest.fixture
def opener(proxy: EgressProxy, monkeypatch: pytest.MonkeyPatch) -> urllib.request.OpenerDirector:
    # urllib skips the proxy for hosts in no_proxy; the tests need every request to go through it.
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy.url}))


def raw_exchange(proxy: EgressProxy, data: bytes, *, timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout) as conn:
        conn.sendall(data)
        return read_all(conn)


def read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(1)
        if not chunk:
            break
        data += chunk
    return data


def test_it_relays_a_request_to_the_allowlisted_portal(
    proxy: EgressProxy, portal: Portal, opener: urllib.request.OpenerDirector
) -> None:
    with opener.open(f"http://127.0.0.1:{portal.port}/hello?x=1", timeout=5) as response:
        assert response.status == 200
        assert response.read() == b"hello from /hello?x=1"
    assert proxy.allowed_count == 1
    assert proxy.bytes_in > 0
    assert proxy.bytes_out > 0


def test_it_relays_a_request_body(
    proxy: EgressProxy, portal: Portal, opener: urllib.request.OpenerDirector
) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{portal.port}/echo", data=b"amount=12.50", method="POST"
    )
    with opener.open(request, timeout=5) as response:
        assert response.read() == b"amount=12.50"


def test_it_relays_a_large_response_to_the_last_byte(
    proxy: EgressProxy, portal: Portal, opener: urllib.request.OpenerDirector
) -> None:
    with opener.open(f"http://127.0.0.1:{portal.port}/big", timeout=5) as response:
        body = response.read()

    assert body == bytes(range(256)) * 4096


def test_it_strips_proxy_and_hop_by_hop_headers_and_sends_the_vetted_host(
    proxy: EgressProxy, portal: Portal
) -> None:
    response = raw_exchange(
        proxy,
        (
            f"GET http://127.0.0.1:{portal.port}/headers HTTP/1.1\r\n"
            "Host: evil.example.test\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\n"
            "Proxy-Connection: keep-alive\r\n"
            "Connection: keep-alive, X-Secret\r\n"
            "X-Secret: 1\r\n"
            "Accept: text/plain\r\n\r\n"
        ).encode(),
    )

    head, _, body = response.partition(b"\r\n\r\n")
    received = body.decode().lower()
    assert f"host: 127.0.0.1:{portal.port}\n" in received
    assert "accept: text/plain\n" in received
    assert "connection: close\n" in received
    assert "proxy-" not in received
    assert "x-secret" not in received
    assert "evil" not in received
    assert b"\r\nConnection: close" in head


def test_it_refuses_a_raw_ip_without_touching_it(
    proxy: EgressProxy,
    sink: Sink,
    denied: list[DeniedAttempt],
    opener: urllib.request.OpenerDirector,
) -> None:
    with pytest.raises(ConnectionResetError):
        opener.open(f"http://{SINK_HOST}:{sink.port}/", timeout=5)

    [attempt] = denied
    assert (attempt.host, attempt.port, attempt.method) == (SINK_HOST, sink.port, "GET")
    assert attempt.reason == f"raw IP address {SINK_HOST} is not in the allowed hosts"
    assert not attempt.quiet
    assert attempt.at.tzinfo is not None
    time.sleep(0.2)
    assert sink.connections == []
    assert (proxy.allowed_count, proxy.denied_count) == (0, 1)


def test_it_answers_a_refused_request_with_a_reset_not_an_http_status(
    proxy: EgressProxy, sink: Sink, denied: list[DeniedAttempt]
) -> None:
    # Any HTTP answer, a 403 included, is a success to a no-cors fetch or an <img>; only a
    # failed connection tells the page its data did not go out.
    request = f"POST http://{SINK_HOST}:{sink.port}/collect HTTP/1.1\r\nContent-Length: 4\r\n\r\n"
    with pytest.raises(ConnectionResetError):
        raw_exchange(proxy, request.encode() + b"data")

    assert [(a.method, a.host) for a in denied] == [("POST", SINK_HOST)]


def test_it_refuses_an_unlisted_name_without_a_dns_lookup(
    proxy: EgressProxy, denied: list[DeniedAttempt], opener: urllib.request.OpenerDirector
) -> None:
    # The proxy's resolver fails the test if called; urllib does not resolve through a proxy.
    with pytest.raises(ConnectionResetError):
        opener.open("http://evil.example.test/steal", timeout=5)

    assert [a.reason for a in denied] == [
        "evil.example.test is not in this workflow's allowed hosts"
    ]


def test_it_tunnels_connect_to_the_portal(proxy: EgressProxy, portal: Portal) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as conn:
        conn.sendall(
            f"CONNECT 127.0.0.1:{portal.port} HTTP/1.1\r\nHost: 127.0.0.1:{portal.port}\r\n\r\n"
            .encode()
        )  # fmt: skip
        assert read_head(conn).startswith(b"HTTP/1.1 200 Connection established\r\n")
        conn.sendall(b"GET /tunnelled HTTP/1.0\r\n\r\n")
        response = read_all(conn)

    assert response.startswith(b"HTTP/1.0 200")
    assert response.endswith(b"hello from /tunnelled")
    assert proxy.allowed_count == 1


def test_it_refuses_connect_to_an_unlisted_address(
    proxy: EgressProxy, sink: Sink, denied: list[DeniedAttempt]
) -> None:
    with pytest.raises(ConnectionResetError):
        raw_exchange(proxy, f"CONNECT {SINK_HOST}:{sink.port} HTTP/1.1\r\n\r\n".encode())

    assert [(a.method, a.host) for a in denied] == [("CONNECT", SINK_HOST)]
    time.sleep(0.2)
    assert sink.connections == []


def test_it_marks_chromium_background_noise_as_quiet(
    proxy: EgressProxy, denied: list[DeniedAttempt]
) -> None:
    for host in ("accounts.google.com", "update.googleapis.com", "redirector.gvt1.com"):
        with pytest.raises(ConnectionResetError):
            raw_exchange(proxy, f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
    with pytest.raises(ConnectionResetError):
        raw_exchange(proxy, b"CONNECT tracker.evil.test:443 HTTP/1.1\r\n\r\n")

    assert [a.quiet for a in denied] == [True, True, True, False]
    assert (proxy.denied_count, proxy.quiet_denied_count) == (4, 3)


def test_it_keeps_working_when_the_denial_listener_raises(portal: Portal) -> None:
    def broken(attempt: DeniedAttempt) -> None:
        raise RuntimeError("listener bug")

    policy = EgressPolicy([f"127.0.0.1:{portal.port}"], resolver=refusing_resolver)
    with EgressProxy(policy, on_denied=broken) as proxy:
        with pytest.raises(ConnectionResetError):
            raw_exchange(proxy, b"GET http://127.0.0.9/ HTTP/1.1\r\n\r\n")
        allowed = raw_exchange(
            proxy, f"GET http://127.0.0.1:{portal.port}/ok HTTP/1.1\r\n\r\n".encode()
        )

    assert allowed.startswith(b"HTTP/1.0 200")
    assert b"\r\nConnection: close\r\n" in allowed


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET http://127.0.0.1@127.0.0.9/ HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1:99999/ HTTP/1.1\r\n\r\n",
        b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/2.0\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nbad header\r\n\r\n",
        b"GET http://\xff/ HTTP/1.1\r\n\r\n",
    ],
)
def test_it_answers_malformed_requests_with_400_quickly(
    proxy: EgressProxy, request_bytes: bytes, denied: list[DeniedAttempt]
) -> None:
    started = time.monotonic()

    response = raw_exchange(proxy, request_bytes, timeout=2)

    assert response.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert time.monotonic() - started < 1
    assert denied == []
    assert proxy.allowed_count == 0


def test_it_refuses_oversized_headers(proxy: EgressProxy) -> None:
    head = b"GET http://127.0.0.1/ HTTP/1.1\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n"

    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as conn:
        # The proxy may answer and close before the whole oversized head is sent.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            conn.sendall(head)
        response = read_head(conn)

    assert response.startswith(b"HTTP/1.1 431")


def test_it_drops_a_client_that_never_finishes_its_headers(portal: Portal) -> None:
    policy = EgressPolicy([], resolver=refusing_resolver)
    with EgressProxy(policy, on_denied=lambda a: None) as proxy:
        proxy.header_timeout = 0.2
        response = raw_exchange(proxy, b"GET http://127.0.0.1/ HTTP/1.1\r\n", timeout=3)

    assert response.startswith(b"HTTP/1.1 408")


def test_it_reports_an_unreachable_origin_as_502(denied: list[DeniedAttempt]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    policy = EgressPolicy([f"127.0.0.1:{closed_port}"], resolver=refusing_resolver)

    with EgressProxy(policy, on_denied=denied.append) as proxy:
        response = raw_exchange(
            proxy, f"GET http://127.0.0.1:{closed_port}/ HTTP/1.1\r\n\r\n".encode()
        )

    assert response.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert f"could not connect to 127.0.0.1:{closed_port}".encode() in response
    assert f"\r\n{PROXY_ANSWER_HEADER}: proxy\r\n".encode() in response
    assert denied == []


def one_answer_origin(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """An origin on loopback that reads one request, sends ``answer`` (maybe nothing) and closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            read_head(conn)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.parametrize(
    ("answer", "status", "marked"),
    [
        # The portal acted, perhaps, and closed without a word: the proxy answers for it.
        (b"", b"502 Bad Gateway", True),
        # The portal's own answer is relayed, and a marker it sets itself does not pass.
        (
            f"HTTP/1.1 409 Conflict\r\n{PROXY_ANSWER_HEADER}: proxy\r\nContent-Length: 2\r\n"
            "\r\nno".encode(),
            b"409 Conflict",
            False,
        ),
    ],
)
def test_it_marks_the_answers_it_writes_itself_and_only_those(
    answer: bytes, status: bytes, marked: bool
) -> None:
    listener, thread = one_answer_origin(answer)
    port = listener.getsockname()[1]
    policy = EgressPolicy([f"127.0.0.1:{port}"], resolver=refusing_resolver)

    with listener, EgressProxy(policy, on_denied=lambda a: None) as proxy:
        response = raw_exchange(
            proxy,
            f"POST http://127.0.0.1:{port}/pay HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode(),
        )
        thread.join(5)

    assert response.startswith(b"HTTP/1.1 " + status + b"\r\n")
    assert (PROXY_ANSWER_HEADER.lower().encode() in response.lower()) is marked


def test_it_closes_open_tunnels_when_stopped(portal: Portal) -> None:
    policy = EgressPolicy([f"127.0.0.1:{portal.port}"], resolver=refusing_resolver)
    proxy = EgressProxy(policy, on_denied=lambda a: None)
    proxy.start()
    conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    try:
        conn.sendall(f"CONNECT 127.0.0.1:{portal.port} HTTP/1.1\r\n\r\n".encode())
        assert read_head(conn).startswith(b"HTTP/1.1 200")

        started = time.monotonic()
        proxy.stop()
        stopped_in = time.monotonic() - started

        assert stopped_in < 1.0
        assert conn.recv(1) == b""
    finally:
        conn.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()


def test_it_names_every_chromium_flag() -> None:
    args = chromium_proxy_args("http://127.0.0.1:4321")

    assert args == [
        "--proxy-server=http://127.0.0.1:4321",
        "--proxy-bypass-list=<-loopback>",
        "--disable-quic",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--webrtc-ip-handling-policy=disable_non_proxied_udp",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    ]


# ---------------------------------------------------------------------------------------------
# Real Chromium


@pytest.fixture
def udp_sink() -> Iterator[list[tuple[str, int]]]:
    """Records UDP datagrams to 127.0.0.9 (where the page points its STUN server)."""
    received: list[tuple[str, int]] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((SINK_HOST, 0))
    sock.settimeout(0.05)
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                _, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            received.append(peer)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    sock_port = sock.getsockname()[1]
    received.append((SINK_HOST, sock_port))  # the first entry names the port; packets follow
    yield received
    stop.set()
    thread.join(1)
    sock.close()


@pytest.mark.browser
def test_chromium_sends_everything_through_the_proxy(
    playwright_instance: Playwright,
    portal: Portal,
    sink: Sink,
    udp_sink: list[tuple[str, int]],
) -> None:
    stun_port = udp_sink[0][1]
    portal.page = (
        "<!doctype html><title>portal</title><p>hello</p>"
        f'<img src="http://{SINK_HOST}:{sink.port}/pixel.png">'
        '<script src="http://tracker.evil.test/t.js"></script>'
        "<script>"
        f'const stun = "stun:{SINK_HOST}:{stun_port}";'
        "const pc = new RTCPeerConnection({iceServers: [{urls: stun}]});"
        "pc.onicegatheringstatechange = () => {"
        '  if (pc.iceGatheringState === "complete") window.iceDone = true; };'
        'pc.createDataChannel("x");'
        "pc.createOffer().then((offer) => pc.setLocalDescription(offer));"
        "</script>"
    ).encode()
    denied: list[DeniedAttempt] = []
    policy = EgressPolicy([f"127.0.0.1:{portal.port}"], resolver=refusing_resolver)

    with EgressProxy(policy, on_denied=denied.append) as proxy:
        browser = playwright_instance.chromium.launch(
            executable_path=find_chromium(settings.ENGINE_CONFIG.chromium),
            args=[*HEADLESS_ARGS, *chromium_proxy_args(proxy.url)],
            headless=True,
        )
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{portal.port}/page.html", timeout=10_000)
            assert page.title() == "portal"
            page.wait_for_function("window.iceDone === true", timeout=5_000)
        finally:
            browser.close()

    # Loopback was not bypassed: the page itself came through the proxy.
    assert proxy.allowed_count >= 1
    loud = {(a.host, a.port) for a in denied if not a.quiet}
    assert (SINK_HOST, sink.port) in loud
    assert ("tracker.evil.test", 80) in loud
    assert sink.connections == []
    assert udp_sink[1:] == []
