"""The sandbox backends by name (no Django imports): what a run's ``sandbox_backend`` and a
recorded sandbox's ``backend`` field resolve to.

Kept apart from ``base`` so the interface imports no backend and every backend imports only the
interface: the dependency runs one way.
"""

from __future__ import annotations

from collections.abc import Callable

from sessions.engine.config import EngineConfig
from sessions.engine.sandbox.base import SandboxBackend, SandboxError
from sessions.engine.sandbox.local import LocalBackend
from sessions.engine.sandbox.microvm.backend import MicroVMBackend
from sessions.engine.sandbox.pandastack import PandaStackBackend

__all__ = ["get_backend", "register_backend"]

_FACTORIES: dict[str, Callable[[EngineConfig], SandboxBackend]] = {
    "local": LocalBackend,
    "microvm": MicroVMBackend,
    "pandastack": PandaStackBackend,
}


def register_backend(name: str, factory: Callable[[EngineConfig], SandboxBackend]) -> None:
    _FACTORIES[name] = factory


def get_backend(name: str, config: EngineConfig) -> SandboxBackend:
    """The backend ``name``, configured by ``config`` (the engine reads no settings itself)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        known = ", ".join(sorted(_FACTORIES))
        raise SandboxError(f"unknown sandbox backend {name!r} (known: {known})") from None
    return factory(config)
