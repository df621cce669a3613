"""The sandbox interface every backend implements (no Django imports).

A sandbox is one isolated browser for one run: the runner reaches it only through CDP on a
loopback URL, and the browser reaches the world only through the run's egress proxy. Backends
differ in the isolation boundary (a process group today, a microVM later) but not in this shape.
"""

from __future__ import annotations

import re
import socket
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

__all__ = [
    "RESERVED_FLAGS",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxSpec",
]

# A run key becomes a directory name and appears in process command lines, so it is kept to a
# small alphabet: no path separators, no leading dot, nothing a shell or a glob would reinterpret.
_RUN_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

# Flags that decide where traffic goes, where the profile lives and how CDP is exposed belong to
# the backend. Chromium lets a later duplicate win, so a caller's extra flag could otherwise
# quietly route traffic around the run's proxy or open the debugging port to the network.
RESERVED_FLAGS: frozenset[str] = frozenset(
    {
        "--proxy-server",
        "--proxy-bypass-list",
        "--no-proxy-server",
        "--proxy-auto-detect",
        "--proxy-pac-url",
        "--winhttp-proxy-resolver",
        "--remote-debugging-port",
        "--remote-debugging-address",
        "--remote-debugging-pipe",
        "--user-data-dir",
        "--headless",
    }
)

_PROXY_SCHEMES = frozenset({"http", "https", "socks4", "socks5"})

# How a sandbox's browser draws its pages (``details["frames"]``, shown on the run page): on
# request, by the client's frame pump (``sessions.engine.frames``), or by itself.
BEGIN_FRAME = "on request (begin-frame control)"
FREE_RUNNING = "on the browser's own clock"


class SandboxError(Exception):
    """A sandbox could not be created, found or destroyed; the message says why in plain words."""


@dataclass(frozen=True)
class SandboxSpec:
    """What a run asks for. Backends must honour every field or refuse."""

    run_key: str
    proxy_url: str
    ttl_seconds: float
    extra_args: tuple[str, ...] = ()
    window_size: tuple[int, int] = (1280, 900)
    # A saved browser to wake up in instead of a fresh one (a session template's snapshot), for
    # backends that can restore one; the others refuse a spec that sets it.
    restore_from: str = ""

    def __post_init__(self) -> None:
        if not _RUN_KEY.fullmatch(self.run_key):
            raise ValueError(
                f"run_key {self.run_key!r} is not filesystem-safe: use 1-128 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit"
            )
        parts = urlsplit(self.proxy_url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in _PROXY_SCHEMES or not parts.hostname or port is None:
            raise ValueError(
                f"proxy_url {self.proxy_url!r} must look like http://127.0.0.1:PORT "
                f"(scheme one of {sorted(_PROXY_SCHEMES)}, with host and port)"
            )
        if not self.ttl_seconds > 0:
            raise ValueError(f"ttl_seconds must be positive, not {self.ttl_seconds!r}")
        width, height = self.window_size
        if width <= 0 or height <= 0:
            raise ValueError(f"window_size must be positive, not {self.window_size!r}")
        for arg in self.extra_args:
            if not arg.startswith("--"):
                # A bare argument would be opened as a URL, outside the runner's control.
                raise ValueError(f"extra argument {arg!r} is not a --flag")
            if arg.split("=", 1)[0] in RESERVED_FLAGS and arg not in self.fixed_flags:
                raise ValueError(
                    f"extra argument {arg!r} would override a flag the sandbox sets itself "
                    "(proxy, profile or debugging port); pass proxy_url instead"
                )

    @property
    def fixed_flags(self) -> tuple[str, ...]:
        """The routing flags every backend gives Chromium: all traffic, loopback included,
        goes through the run's proxy (Chromium bypasses proxies for loopback by default)."""
        return (f"--proxy-server={self.proxy_url}", "--proxy-bypass-list=<-loopback>")


@dataclass
class Sandbox:
    """A live sandbox, as a record another process can load to find and destroy it."""

    backend: str
    run_key: str
    cdp_url: str
    pid: int
    pgid: int
    workdir: str
    started_at: float
    deadline: float
    ready_seconds: float
    host: str = field(default_factory=socket.gethostname)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sandbox:
        """Build from ``to_dict()`` output. Unknown keys are ignored so that a record written by
        a newer version still loads; missing ones raise ``SandboxError``."""
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names if n not in data and n not in {"host", "details"})
        if missing:
            raise SandboxError(f"sandbox record lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})

    def check_host(self) -> None:
        """Process ids and paths only mean something on the machine that holds the sandbox."""
        here = socket.gethostname()
        if self.host != here:
            raise SandboxError(
                f"sandbox {self.run_key} lives on host {self.host!r}, not on this one ({here!r})"
            )


@runtime_checkable
class SandboxBackend(Protocol):
    """One way of isolating a browser. Every method may be called from any process on the
    sandbox's host, not only the one that created it."""

    name: str

    def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a browser and return once CDP answers ``/json/version``. On failure, raise
        ``SandboxError`` having removed everything the attempt created."""
        ...

    def destroy(self, sandbox: Sandbox) -> None:
        """Stop the browser and remove its files. Idempotent."""
        ...

    def alive(self, sandbox: Sandbox) -> bool:
        """Whether the browser still runs."""
        ...

    def extend(self, sandbox: Sandbox, deadline: float) -> None:
        """Move the dead-man's deadline (epoch seconds); raise ``SandboxError`` if it is gone."""
        ...
