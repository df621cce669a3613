"""The CDP gate of a sandbox: ``python -S cdp_gate.py <workdir> <upstream>``.

Chromium's DevTools endpoint has no authentication, and while a run waits for approval its
browser holds a logged-in portal session: whoever reaches that endpoint can press the
irreversible button without any approval. So the browser's own endpoint is never on host
loopback (it is a Unix socket in the sandbox's 0700 directory, or a port inside the sandbox's
namespace), and this gate is the only door: it listens on host loopback and forwards a
connection only when its request path starts with the run's secret, ``/<secret>/...``. The
secret is read from ``<workdir>/cdp.secret`` (0600), never from the command line, which every
local user can read in /proc. Anything else gets a 403 and is closed before a byte reaches the
browser.

Clients use ``http://127.0.0.1:<port>/<secret>`` as the browser's address: Playwright's
``connect_over_cdp`` and the dashboard's tap fetch ``<address>/json/version`` and open the
websocket it names, which the gate rewrites to carry the secret too.

``<upstream>`` is ``unix:<path>`` or ``tcp:<host>:<port>``; with a third argument, the path of a
network namespace (``/proc/<pid>/ns/net``), the gate listens on the host and connects upstream
inside that namespace, where a microVM's QEMU forwards its CDP port out of every other
process's reach. The gate writes the port it listens on to ``<workdir>/cdp-gate.port`` once it
accepts connections. Standard library only, run by path: it starts in a fraction of the
browser's start-up time and needs nothing installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hmac
import os
import re
import sys
from pathlib import Path

SECRET_FILE = "cdp.secret"  # noqa: S105 - the file's name, not its content
PORT_FILE = "cdp-gate.port"

_HEAD_LIMIT = 64 * 1024
# A client that connects and says nothing must not hold a connection open for long.
_HEAD_TIMEOUT_SECONDS = 10.0
FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 42\r\n"
    b"Connection: close\r\n\r\nThis browser answers only its run's workers"
)
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
# The websocket addresses Chromium names in /json answers: ``ws://host:port/devtools/...`` and
# the front-end link's ``ws=host:port/devtools/...``.
_ADVERTISED = re.compile(rb"(ws://[^/\"]+|ws=[^/\"&]+)/devtools/")


def strip_secret(target: bytes, secret: bytes) -> bytes | None:
    """The request target without the secret prefix, or None when it does not carry it."""
    prefix = b"/" + secret
    # compare_digest over the prefix-length slice: how long a guess matched never shows.
    if not hmac.compare_digest(target[: len(prefix)], prefix):
        return None
    rest = target[len(prefix) :]
    if rest and not rest.startswith((b"/", b"?")):
        return None
    return rest if rest.startswith(b"/") else b"/" + rest


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


def _without_header(lines: list[bytes], name: bytes) -> list[bytes]:
    return [line for line in lines if line.partition(b":")[0].strip().lower() != name]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(256 * 1024):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


class Gate:
    def __init__(self, secret: bytes, upstream: str) -> None:
        self.secret = secret
        self.upstream = upstream

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        kind, _, address = self.upstream.partition(":")
        if kind == "unix":
            return await asyncio.open_unix_connection(address, limit=_HEAD_LIMIT)
        host, _, port = address.rpartition(":")
        return await asyncio.open_connection(host, int(port), limit=_HEAD_LIMIT)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_HEAD_TIMEOUT_SECONDS):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            return
        lines = head[:-4].split(b"\r\n")
        request = lines[0].split(b" ")
        if len(request) != 3:
            writer.write(_BAD_REQUEST)
            return
        method, target, version = request
        inner_target = strip_secret(target, self.secret)
        if inner_target is None:
            writer.write(FORBIDDEN)
            await writer.drain()
            return
        upgrade = (_header(head, b"upgrade") or b"").lower() == b"websocket"
        try:
            up_reader, up_writer = await self._open_upstream()
        except (ConnectionError, OSError, ValueError):
            writer.write(_BAD_GATEWAY)
            return
        try:
            headers = lines[1:]
            if not upgrade:
                # One request per connection: the answer is rewritten, so it must end here.
                headers = [*_without_header(headers, b"connection"), b"Connection: close"]
            up_writer.write(b"\r\n".join([b" ".join((method, inner_target, version)), *headers]))
            up_writer.write(b"\r\n\r\n")
            await up_writer.drain()
            if upgrade:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            else:
                await self._answer(up_reader, writer)
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                up_writer.close()

    async def _answer(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pass the browser's HTTP answer on, with the websocket addresses it names behind the
        secret (a client that follows them must come back through this gate)."""
        head = await up_reader.readuntil(b"\r\n\r\n")
        length = _header(head, b"content-length")
        body = (
            await up_reader.readexactly(int(length))
            if length is not None and length.isdigit()
            else await up_reader.read()
        )
        gated = b"/" + self.secret + b"/devtools/"
        body = _ADVERTISED.sub(lambda found: found.group(1) + gated, body)
        lines = _without_header(head[:-4].split(b"\r\n"), b"content-length")
        lines = _without_header(lines, b"connection")
        lines += [b"Content-Length: %d" % len(body), b"Connection: close"]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()


_CLONE_NEWNET = 0x40000000


def enter_network_namespace(path: str) -> None:
    """Move the calling thread into the network namespace at ``path``: sockets it makes from
    now on live there (those it already has stay where they are). Needs CAP_SYS_ADMIN."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"cannot enter {path}: {os.strerror(error)}")
    finally:
        os.close(fd)


async def serve(workdir: Path, upstream: str, netns: str = "") -> None:
    secret = (workdir / SECRET_FILE).read_bytes().strip()
    if not secret:
        raise SystemExit(f"cdp gate: {workdir / SECRET_FILE} is empty")
    gate = Gate(secret, upstream)
    server = await asyncio.start_server(gate.handle, "127.0.0.1", 0, limit=_HEAD_LIMIT)
    if netns:
        # The listening socket stays on the host; upstream connections are made in there.
        enter_network_namespace(netns)
    port = server.sockets[0].getsockname()[1]
    partial = workdir / f".{PORT_FILE}.tmp"
    partial.write_text(str(port))
    os.replace(partial, workdir / PORT_FILE)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or not argv[1].startswith(("unix:", "tcp:")):
        print(
            "usage: cdp_gate.py <workdir> unix:<path>|tcp:<host>:<port> [<netns path>]",
            file=sys.stderr,
        )
        return 2
    asyncio.run(serve(Path(argv[0]), argv[1], *argv[2:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
