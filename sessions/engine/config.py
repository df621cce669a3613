"""The engine's settings: one typed, frozen object handed in (no Django imports).

The engine never reads the environment for its configuration. ``pandaweb/settings.py`` builds an
``EngineConfig`` from the operator's ``PANDAWEB_*`` variables once, and the run core hands it to
whatever it asks of the engine (``get_backend(name, config)``); a test or a benchmark builds its
own. The defaults below are the product's defaults: settings start from them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ACCELERATORS",
    "BEGIN_FRAME_MODES",
    "MICROVM_MIN_MEMORY_MIB",
    "NAMESPACE_MODES",
    "EngineConfig",
]

_PROJECT_ROOT = Path(__file__).resolve().parents[2]

NAMESPACE_MODES = ("auto", "on", "off")
BEGIN_FRAME_MODES = ("auto", "off")
ACCELERATORS = ("auto", "kvm", "tcg")
MICROVM_MIN_MEMORY_MIB = 256


def _default_sandbox_dir() -> Path:
    # Fixed, so that a reaper in another process finds the sandboxes of this one.
    return Path(tempfile.gettempdir()) / "pandaweb-sandboxes"


@dataclass(frozen=True)
class EngineConfig:
    """How this host runs sandboxes; each field names the variable settings read it from."""

    # PANDAWEB_SANDBOX_DIR: per-run working directories, watchdog state, egress supervisors.
    sandbox_dir: Path = field(default_factory=_default_sandbox_dir)
    # PANDAWEB_CHROMIUM: the Chromium executable; "" looks for the system one on PATH.
    chromium: str = ""
    # PANDAWEB_LOCAL_NAMESPACES: the local backend's namespaces, one of NAMESPACE_MODES.
    local_namespaces: str = "auto"
    # PANDAWEB_BEGIN_FRAME: "auto" has a browser that can (chromium-headless-shell) draw its
    # pages only when asked, so a step's picture is the frame drawn for that step's state;
    # "off" lets every browser draw on its own clock.
    begin_frame: str = "auto"
    # PANDAWEB_MICROVM_IMAGE_DIR: guest images and saved base VMs (absolute: the worker, the web
    # process and a shell each have their own working directory).
    microvm_image_dir: Path = _PROJECT_ROOT / "var" / "microvm"
    # PANDAWEB_MICROVM_ACCEL: one of ACCELERATORS.
    microvm_accelerator: str = "auto"
    # PANDAWEB_MICROVM_MEMORY_MIB: guest memory of each microVM.
    microvm_memory_mib: int = 1024
    # PANDAWEB_MICROVM_POOL: microVMs restored ahead of time per worker process.
    microvm_pool: int = 0
    # PANDAWEB_PANDASTACK_TEMPLATE: the PandaStack template a sandbox boots.
    pandastack_template: str = "browser"
    # PANDASTACK_API and PANDASTACK_API_KEY; "" leaves the SDK to its own defaults (its config
    # file, then https://api.pandastack.ai).
    pandastack_api: str = ""
    pandastack_api_key: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.local_namespaces not in NAMESPACE_MODES:
            raise ValueError(
                f"local_namespaces must be one of {', '.join(NAMESPACE_MODES)}, "
                f"not {self.local_namespaces!r}"
            )
        if self.begin_frame not in BEGIN_FRAME_MODES:
            raise ValueError(
                f"begin_frame must be one of {', '.join(BEGIN_FRAME_MODES)}, "
                f"not {self.begin_frame!r}"
            )
        if self.microvm_accelerator not in ACCELERATORS:
            raise ValueError(
                f"microvm_accelerator must be one of {', '.join(ACCELERATORS)}, "
                f"not {self.microvm_accelerator!r}"
            )
        if self.microvm_memory_mib < MICROVM_MIN_MEMORY_MIB:
            raise ValueError(
                f"microvm_memory_mib={self.microvm_memory_mib} is below the minimum of "
                f"{MICROVM_MIN_MEMORY_MIB}"
            )
        if self.microvm_pool < 0:
            raise ValueError(f"microvm_pool={self.microvm_pool} is negative")
        if not self.microvm_image_dir.is_absolute():
            raise ValueError(
                f"microvm_image_dir must be an absolute path, not {str(self.microvm_image_dir)!r}"
            )
