"""Sandboxes: one isolated browser per run, reached over CDP (no Django imports).

``get_backend("local").create(SandboxSpec(...))`` returns a ``Sandbox`` record; ``to_dict()`` /
``from_dict()`` carry it to the process that later continues, extends or destroys it. The local
backend and its ``reap_orphans`` live in ``sessions.engine.sandbox.local``; ``get_backend`` (in
``sessions.engine.sandbox.backends``) imports every backend, so it is resolved on first use too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessions.engine.sandbox.backends import get_backend, register_backend
    from sessions.engine.sandbox.base import (
        RESERVED_FLAGS,
        Sandbox,
        SandboxBackend,
        SandboxError,
        SandboxSpec,
        default_root,
    )

__all__ = [
    "RESERVED_FLAGS",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxSpec",
    "default_root",
    "get_backend",
    "register_backend",
]


def __getattr__(name: str) -> Any:
    # Resolved on first use: the watchdog runs as ``python -m sessions.engine.sandbox.watchdog``,
    # which imports this package first, and it is started next to a browser that is competing for
    # the same CPUs; it should not pay for dataclasses, sockets and URL parsing it never uses.
    if name in {"get_backend", "register_backend"}:
        from sessions.engine.sandbox import backends

        return getattr(backends, name)
    if name in __all__:
        from sessions.engine.sandbox import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
