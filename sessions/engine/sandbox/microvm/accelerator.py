"""KVM or TCG for the microVMs, and what each means for a run (no Django imports).

``choose_accelerator`` takes the setting (``EngineConfig.microvm_accelerator``) and what
``kvm.detect`` found: KVM only where hardware virtualization really works, QEMU's software
emulator otherwise, with the warning and the time scale the run page and the runner use.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions.engine.sandbox.base import SandboxError
from sessions.engine.sandbox.microvm.kvm import detect

__all__ = ["Accelerator", "choose_accelerator"]


@dataclass(frozen=True)
class Accelerator:
    name: str  # "kvm" or "tcg"
    reason: str

    @property
    def qemu_args(self) -> list[str]:
        if self.name == "kvm":
            # -cpu host alone trips a QEMU 7.2 assertion setting MSR 0x10a.
            return ["-accel", "kvm", "-cpu", "host,-arch-capabilities"]
        # QEMU's default translation cache is 1 GiB per VM; a browser's working set fits in
        # far less, and the rest would be resident memory for nothing.
        return ["-accel", "tcg,tb-size=256", "-cpu", "max"]

    @property
    def label(self) -> str:
        return "KVM (hardware virtualization)" if self.name == "kvm" else "TCG (software emulation)"

    @property
    def warning(self) -> str:
        if self.name == "kvm":
            return ""
        return (
            f"No hardware virtualization on this host ({self.reason}). The microVM runs under "
            "QEMU's software emulator: same isolation, but pages take tens of seconds to load."
        )

    @property
    def time_scale(self) -> float:
        """How much longer a browser action takes in the guest than on the host (a page load
        and click measured ~60 times as long under TCG); step timeouts are stretched by it."""
        return 1.5 if self.name == "kvm" else 40.0


def choose_accelerator(setting: str) -> Accelerator:
    """``auto``: KVM where hardware virtualization really works, otherwise TCG. ``kvm`` insists."""
    if setting not in {"auto", "kvm", "tcg"}:
        raise SandboxError(f"microVM accelerator {setting!r} is not one of auto, kvm, tcg")
    if setting == "tcg":
        return Accelerator("tcg", "chosen by PANDAWEB_MICROVM_ACCEL=tcg")
    status = detect()
    if status.usable:
        return Accelerator("kvm", status.reason)
    if setting == "kvm":
        raise SandboxError(
            f"PANDAWEB_MICROVM_ACCEL=kvm, but KVM is not usable here: {status.reason}"
        )
    return Accelerator("tcg", status.reason)
