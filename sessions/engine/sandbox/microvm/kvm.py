"""Whether this host can run microVMs with KVM, or only under QEMU's TCG emulator.

No Django imports. ``/dev/kvm`` answering is not enough: on PVM hosts (module ``kvm_pvm``, no
``vmx``/``svm`` CPU flag) a stock guest kernel fails, so only hardware virtualization counts.
Run as ``python -m sessions.engine.sandbox.microvm.kvm`` for a one-line report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KvmStatus:
    usable: bool
    reason: str


def detect(
    *,
    device: Path = Path("/dev/kvm"),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    modules: Path = Path("/proc/modules"),
    sys_module: Path = Path("/sys/module"),
) -> KvmStatus:
    if not device.exists():
        return KvmStatus(False, f"{device} does not exist")
    flags: set[str] = set()
    for line in _read(cpuinfo).splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    loaded = {line.split()[0] for line in _read(modules).splitlines() if line.strip()}
    # Sandboxed hosts may hide /proc/modules but still list loaded modules in /sys/module.
    if sys_module.is_dir():
        loaded.update(entry.name for entry in sys_module.iterdir())
    hardware = sorted(flags & {"vmx", "svm"})
    if "kvm_pvm" in loaded and not hardware:
        return KvmStatus(False, f"{device} is PVM (kvm_pvm) without vmx/svm: microVMs use TCG")
    if not hardware:
        return KvmStatus(False, "the CPU shows no vmx/svm flag: microVMs use TCG")
    try:
        os.close(os.open(device, os.O_RDWR))
    except OSError as exc:
        return KvmStatus(False, f"{device} cannot be opened ({exc.strerror}): microVMs use TCG")
    return KvmStatus(True, f"hardware virtualization ({', '.join(hardware)}) via {device}")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


if __name__ == "__main__":
    status = detect()
    print(f"kvm: {'usable' if status.usable else 'NOT usable'} — {status.reason}")
