"""The per-run egress proxy: default deny, allowlisted hosts only (no Django imports).

A run's browser sends every request through one ``EgressProxy``. The proxy asks an
``EgressPolicy`` (``sessions.engine.egress_policy``) about each destination before it opens any
connection, connects to exactly the address the policy vetted (so a second DNS answer cannot swap
it), and reports every refusal through ``on_denied`` so the run page can show what the page tried
to reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from sessions.engine.egress_policy import EgressDenied, EgressPolicy, hostport
from workflows.hosts import host_allowed, normalize_host, parse_host_pattern

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024

# Chromium's own calls home are switched off at the source (sessions.engine.chromium's flags and
# managed policy); what a backend without the policy still sends (sign-in probes, say) is
# expected noise: audited, but counted on the run page instead of listed.
DEFAULT_QUIET_HOSTS: tuple[str, ...] = (
    "google.com",
    "*.google.com",
    "*.googleapis.com",
    "*.gvt1.com",
    "*.gvt2.com",
    "*.gstatic.com",
    "*.googleusercontent.com",
    "*.chromium.org",
)

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    }
)


# ---------------------------------------------------------------------------------------------
# Proxy


@dataclass(frozen=True)
class DeniedAttempt:
    host: str
    port: int
    method: str
    reason: str
    at: datetime
    quiet: bool


class _BadRequest(Exception):
    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


# Set on every answer the proxy writes itself (a 502 for an origin that closed without answering,
# say) and stripped from every origin's answer: the runner reads it to tell "the portal did not
# answer" from the portal's own words, which an irreversible action's outcome depends on.
PROXY_ANSWER_HEADER = "Pandaweb-Egress-Answer"

_STATUS_TEXT = {
    400: "Bad Request",
    408: "Request Timeout",
    411: "Length Required",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    504: "Gateway Timeout",
}


class EgressProxy:
    """An HTTP forward proxy (absolute-form requests and CONNECT) that enforces an EgressPolicy.

    It runs its own event loop in a daemon thread so that the runner, which drives Playwright
    synchronously, needs no loop of its own. Each client connection carries one request: the
    connection to the origin is opened for the vetted destination only, so reusing it for another
    host is never possible.

    A refused request gets no answer: its connection is reset, so the page sees a network error.
    ``on_denied`` runs on the proxy's thread for every refusal, before the reset: keep it
    quick (hand the attempt to a queue); what it raises is logged and otherwise ignored.
    An origin that cannot be reached, or closes or times out without answering, gets a 502 or 504
    written by the proxy itself and marked with ``PROXY_ANSWER_HEADER``.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        on_denied: Callable[[DeniedAttempt], None],
        host: str = "127.0.0.1",
        port: int = 0,
        quiet_hosts: Sequence[str] = DEFAULT_QUIET_HOSTS,
        header_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        idle_timeout: float = 300.0,
    ) -> None:
        self.policy = policy
        self.host = host
        self._requested_port = port
        self._on_denied = on_denied
        self._quiet = [parse_host_pattern(raw) for raw in quiet_hosts]
        self.header_timeout = header_timeout
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout

        self.allowed_count = 0
        self.denied_count = 0
        self.quiet_denied_count = 0
        # "out" is what the browser sent towards origins, "in" what came back.
        self.bytes_out = 0
        self.bytes_in = 0

        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._startup_error: BaseException | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not running")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Start listening; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("the proxy is already started")
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pandaweb-egress-dns")
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="pandaweb-egress-proxy", daemon=True
        )
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the egress proxy did not start within 10 s")
        if self._startup_error is not None:
            self._thread.join(1)
            self._thread = None
            raise self._startup_error

    def stop(self) -> None:
        """Close the listener and every open connection; returns within about a second."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if not loop.is_closed() and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            with contextlib.suppress(Exception):
                future.result(timeout=1)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        thread.join(1)
        self._thread = None
        if self._executor is not None:
            # A lookup still running finishes on its own; nobody waits for its answer.
            self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(
                    self._handle, self.host, self._requested_port, limit=MAX_HEADER_BYTES
                )
            )
            self._port = int(self._server.sockets[0].getsockname()[1])
        except BaseException as exc:
            self._startup_error = exc
            loop.close()
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=0.5)

    # -- one client connection ----------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        upstreams: list[asyncio.StreamWriter] = []
        try:
            await self._serve(reader, writer, upstreams)
        except _BadRequest as exc:
            await _send_error(writer, exc.status, str(exc))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:
            logger.exception("egress proxy: unexpected error")
        finally:
            for w in (writer, *upstreams):
                await _close(w)
                self._writers.discard(w)
            if task is not None:
                self._tasks.discard(task)

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstreams: list[asyncio.StreamWriter],
    ) -> None:
        head = await self._read_head(reader)
        method, target, headers = _parse_request(head)
        request_head, body_length = b"", 0
        if method == "CONNECT":
            host, port = _parse_authority(target, default_port=None)
        else:
            host, port, path = _parse_absolute_url(target)
            request_head, body_length = _origin_request(method, host, port, path, headers)

        loop = asyncio.get_running_loop()
        try:
            # The resolver blocks; keep it off the loop so one slow lookup stalls one request.
            address = await loop.run_in_executor(
                self._executor, self.policy.resolve_for_connect, host, port
            )
        except EgressDenied as denied:
            self._report_denied(host, port, method, denied.decision.reason)
            # No answer at all, only a reset: any HTTP answer (a 403 included) is a success to a
            # no-cors fetch, an <img> or a beacon, so a page would believe its data went out.
            # A reset makes every kind of request fail as a network error; the refusal and its
            # reason live in the run's records, not in a response the page could read.
            _reset(writer)
            return

        try:
            async with asyncio.timeout(self.connect_timeout):
                up_reader, up_writer = await asyncio.open_connection(
                    address, port, limit=MAX_HEADER_BYTES
                )
        except (OSError, TimeoutError) as exc:
            detail = "timed out" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            await _send_error(writer, 502, f"could not connect to {hostport(host, port)}: {detail}")
            return
        upstreams.append(up_writer)
        self._writers.add(up_writer)
        self.allowed_count += 1
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await self._tunnel(reader, writer, up_reader, up_writer)
        else:
            await self._forward(request_head, body_length, reader, writer, up_reader, up_writer)

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            async with asyncio.timeout(self.header_timeout):
                return await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise _BadRequest("request headers are larger than 64 KiB", 431) from exc
        except TimeoutError as exc:
            raise _BadRequest("no complete request headers within the time limit", 408) from exc

    async def _forward(
        self,
        request_head: bytes,
        body_length: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        up_writer.write(request_head)
        self.bytes_out += len(request_head)
        remaining = body_length
        while remaining > 0:
            async with asyncio.timeout(self.idle_timeout):
                chunk = await reader.read(min(remaining, 65536))
            if not chunk:
                return
            up_writer.write(chunk)
            self.bytes_out += len(chunk)
            remaining -= len(chunk)
            await up_writer.drain()
        await up_writer.drain()

        try:
            async with asyncio.timeout(self.idle_timeout):
                response_head = await up_reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise _BadRequest("the origin's response headers are larger than 64 KiB", 502) from exc
        except TimeoutError as exc:
            raise _BadRequest("the origin sent no response in time", 504) from exc
        except asyncio.IncompleteReadError as exc:
            raise _BadRequest("the origin closed the connection without a response", 502) from exc
        writer.write(_rewrite_response_head(response_head))
        self.bytes_in += len(response_head)
        await writer.drain()
        # Only the origin's bytes flow from here: anything else the client sends on this
        # connection is not relayed, because it could be addressed to another host.
        await self._pipe(up_reader, writer, inbound=True)

    async def _tunnel(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer, inbound=False)),
            asyncio.ensure_future(self._pipe(up_reader, writer, inbound=True)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, inbound: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, TimeoutError):
            while True:
                async with asyncio.timeout(self.idle_timeout):
                    chunk = await source.read(65536)
                if not chunk:
                    return
                sink.write(chunk)
                if inbound:
                    self.bytes_in += len(chunk)
                else:
                    self.bytes_out += len(chunk)
                await sink.drain()

    def _report_denied(self, host: str, port: int, method: str, reason: str) -> None:
        quiet = host_allowed(host, port, self._quiet)
        self.denied_count += 1
        if quiet:
            self.quiet_denied_count += 1
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "egress refused: %s %s: %s",
            method,
            hostport(normalize_host(host), port),
            reason,
        )
        attempt = DeniedAttempt(
            host=normalize_host(host),
            port=port,
            method=method,
            reason=reason,
            at=datetime.now(UTC),
            quiet=quiet,
        )
        try:
            self._on_denied(attempt)
        except Exception:
            # A broken listener must not turn into an open (or dead) proxy.
            logger.exception("egress proxy: on_denied raised")


# ---------------------------------------------------------------------------------------------
# HTTP parsing (deliberately strict: anything ambiguous is a 400, never a guess)


def _parse_request(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError as exc:
        raise _BadRequest("the request head is not ASCII") from exc
    request_line, *header_lines = text[:-4].split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise _BadRequest("malformed request line")
    method, target, version = parts
    if not _TOKEN.match(method) or version not in ("HTTP/1.1", "HTTP/1.0") or not target:
        raise _BadRequest("malformed request line")
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in target):
        raise _BadRequest("malformed request target")
    headers: list[tuple[str, str]] = []
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise _BadRequest("malformed header line")
        value = value.strip(" \t")
        if any(ord(ch) < 0x20 and ch != "\t" for ch in value):
            raise _BadRequest("malformed header value")
        headers.append((name, value))
    return method, target, headers


def _parse_authority(authority: str, *, default_port: int | None) -> tuple[str, int]:
    if not authority or "@" in authority or "\\" in authority:
        # userinfo (allowed.com@evil.com) is the classic way to make two parsers disagree.
        raise _BadRequest("malformed host in the request")
    port_text: str | None
    if authority.startswith("["):
        host, sep, rest = authority[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise _BadRequest("malformed IPv6 host in the request")
        port_text = rest[1:] if rest else None
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    elif ":" in authority:
        raise _BadRequest("IPv6 hosts must be written in brackets")
    else:
        host, port_text = authority, None
    if not host:
        raise _BadRequest("the request names no host")
    if port_text is None:
        if default_port is None:
            raise _BadRequest("CONNECT needs host:port")
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _BadRequest("malformed port in the request")
    return host, int(port_text)


def _parse_absolute_url(target: str) -> tuple[str, int, str]:
    if target[:7].lower() != "http://":
        raise _BadRequest("a proxy request needs an absolute http:// URL (use CONNECT for https)")
    rest = target[7:]
    cut = len(rest)
    for sep in "/?#":
        index = rest.find(sep)
        if index != -1:
            cut = min(cut, index)
    authority, path = rest[:cut], rest[cut:]
    host, port = _parse_authority(authority, default_port=80)
    path = path.partition("#")[0]
    if not path.startswith("/"):
        path = "/" + path
    return host, port, path


def _origin_request(
    method: str, host: str, port: int, path: str, headers: list[tuple[str, str]]
) -> tuple[bytes, int]:
    """The request head to send to the origin (origin-form, no hop-by-hop headers), body length."""
    connection_tokens = _connection_tokens(headers)
    body_length = 0
    # The origin sees the host that was vetted, whatever Host header the client sent.
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {_bracket(host) if port == 80 else hostport(host, port)}",
    ]
    for name, value in headers:
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower in connection_tokens or lower.startswith("proxy-"):
            continue
        if lower == "host":
            continue
        if lower == "transfer-encoding":
            # Browsers do not stream request bodies over HTTP/1.1; refusing is simpler than
            # parsing chunks just to find where one request ends.
            raise _BadRequest("chunked request bodies are not supported", 411)
        if lower == "content-length":
            if not value.isdigit() or (body_length and int(value) != body_length):
                raise _BadRequest("malformed Content-Length")
            body_length = int(value)
        lines.append(f"{name}: {value}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), body_length


def _connection_tokens(headers: list[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for name, value in headers:
        if name.lower() in ("connection", "proxy-connection"):
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


_PROXY_ANSWER_NAME = PROXY_ANSWER_HEADER.lower().encode("ascii")


def _rewrite_response_head(head: bytes) -> bytes:
    lines = head[:-4].split(b"\r\n")
    status_line, header_lines = lines[0], lines[1:]
    if status_line[9:10] == b"1":
        # An interim 1xx head is followed by the real one, which is relayed as the origin sent it.
        return head
    parsed = [(line.partition(b":")[0].strip().lower(), line) for line in header_lines]
    tokens: set[bytes] = set()
    for name, line in parsed:
        if name == b"connection":
            value = line.partition(b":")[2]
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    kept = [
        line
        for name, line in parsed
        if name.decode("latin-1") not in _HOP_BY_HOP
        and name not in tokens
        and name != _PROXY_ANSWER_NAME
    ]
    # One request per client connection (see EgressProxy): tell the client not to reuse it.
    return b"\r\n".join([status_line, *kept, b"Connection: close"]) + b"\r\n\r\n"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _close(writer: asyncio.StreamWriter) -> None:
    # close() lets buffered bytes (the tail of a response) reach the peer first; abort() is the
    # fallback for a peer that stops reading.
    writer.close()
    try:
        async with asyncio.timeout(2):
            await writer.wait_closed()
    except (TimeoutError, ConnectionError, OSError, asyncio.CancelledError):
        writer.transport.abort()


def _reset(writer: asyncio.StreamWriter) -> None:
    # SO_LINGER with a zero timeout turns the close into a TCP reset instead of an orderly end.
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _send_error(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = (message + "\n").encode("utf-8")
    head = [
        f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        f"{PROXY_ANSWER_HEADER}: proxy",
        "Connection: close",
    ]
    with contextlib.suppress(ConnectionError, RuntimeError):
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body)
        async with asyncio.timeout(5):
            await writer.drain()
