from __future__ import annotations

from pathlib import Path

from sessions.engine.sandbox.microvm.kvm import detect

PVM_MODULES = "kvm_pvm 188416 0 - Live 0x0\nkvm 1142784 1 kvm_pvm, Live 0x0\n"
INTEL_MODULES = "kvm_intel 409600 0 - Live 0x0\nkvm 1142784 1 kvm_intel, Live 0x0\n"


def host(tmp_path: Path, *, flags: str, modules: str, device: bool = True) -> dict[str, Path]:
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n")
    (tmp_path / "modules").write_text(modules)
    kvm = tmp_path / "kvm"
    if device:
        kvm.write_text("")
    return {
        "device": kvm,
        "cpuinfo": tmp_path / "cpuinfo",
        "modules": tmp_path / "modules",
        "sys_module": tmp_path / "no-sys-module",
    }


def test_a_pvm_host_is_not_kvm_even_though_the_device_opens(tmp_path: Path) -> None:
    status = detect(**host(tmp_path, flags="lm", modules=PVM_MODULES))

    assert not status.usable
    assert "PVM" in status.reason


def test_hardware_virtualization_with_an_openable_device_is_usable(tmp_path: Path) -> None:
    status = detect(**host(tmp_path, flags="vmx lm", modules=INTEL_MODULES))

    assert status.usable
    assert "vmx" in status.reason


def test_a_missing_device_is_reported(tmp_path: Path) -> None:
    status = detect(**host(tmp_path, flags="vmx", modules=INTEL_MODULES, device=False))

    assert not status.usable
    assert "does not exist" in status.reason


def test_modules_listed_only_in_sys_module_count(tmp_path: Path) -> None:
    paths = host(tmp_path, flags="lm", modules="")
    (tmp_path / "sys-module" / "kvm_pvm").mkdir(parents=True)
    paths["sys_module"] = tmp_path / "sys-module"

    status = detect(**paths)

    assert not status.usable
    assert "PVM" in status.reason
