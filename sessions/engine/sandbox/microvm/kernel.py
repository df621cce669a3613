"""The guest's kernel, its modules and its initramfs: pure functions over bytes and files
(standard library only, no Django), unit-tested without a build.

``vmlinux_from_bzimage`` unpacks Debian's LZ4 bzImage into the ELF the microVM boots directly;
``resolve_modules`` orders the modules the initramfs loads, dependencies first, from each
module's own ``.modinfo``; ``initramfs_entries`` and ``cpio_newc`` lay out and pack the
initramfs reproducibly.
"""

from __future__ import annotations

import gzip
import lzma
import re
import stat
import struct
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sessions.engine.sandbox.microvm.recipe import COMMAND_TIMEOUT, ImageBuildError

_LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"
_ELF_MAGIC = b"\x7fELF"


def vmlinux_from_bzimage(bzimage: bytes, *, lz4: str = "lz4") -> bytes:
    """The ELF ``vmlinux`` inside an LZ4-compressed x86 bzImage.

    The boot protocol header (2.08+) says where the compressed payload is; its last four bytes
    are the uncompressed size, which the result must match. Without a usable header, fall back
    to the first LZ4 legacy frame magic.
    """
    expected: int | None = None
    payload = b""
    if bzimage[0x202:0x206] == b"HdrS" and struct.unpack_from("<H", bzimage, 0x206)[0] >= 0x208:
        setup_sects = bzimage[0x1F1] or 4
        offset, length = struct.unpack_from("<II", bzimage, 0x248)
        start = (setup_sects + 1) * 512 + offset
        candidate = bzimage[start : start + length]
        if candidate.startswith(_LZ4_LEGACY_MAGIC) and length > 8:
            payload, expected = candidate[:-4], struct.unpack("<I", candidate[-4:])[0]
    if not payload:
        index = bzimage.find(_LZ4_LEGACY_MAGIC)
        if index < 0:
            raise ImageBuildError(
                "no LZ4 payload in the kernel image (did Debian change its kernel compression?)"
            )
        payload = bzimage[index:]
    completed = subprocess.run(
        [lz4, "-dc"], input=payload, capture_output=True, timeout=COMMAND_TIMEOUT, check=False
    )
    vmlinux = completed.stdout
    error = completed.stderr.decode(errors="replace")
    if not vmlinux.startswith(_ELF_MAGIC):
        raise ImageBuildError(
            "the kernel's LZ4 payload did not decompress to an ELF file",
            command=[lz4, "-dc"],
            output=error,
        )
    # With the exact payload lz4 must succeed; after a magic search, trailing bytes make it
    # complain at the end of an otherwise complete stream.
    if expected is not None and (completed.returncode != 0 or len(vmlinux) != expected):
        raise ImageBuildError(
            f"vmlinux is {len(vmlinux)} bytes, the bzImage says {expected}",
            command=[lz4, "-dc"],
            output=error,
        )
    return vmlinux


@dataclass(frozen=True)
class KernelModule:
    name: str
    file_name: str
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class ModulePlan:
    loaded: list[KernelModule]
    builtin: list[str]


def _module_name(file_name: str) -> str:
    return file_name.split(".ko", 1)[0].replace("-", "_")


def _module_bytes(path: Path) -> bytes:
    # busybox insmod takes plain .ko files only.
    raw = path.read_bytes()
    if path.name.endswith(".ko"):
        return raw
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(raw)
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(raw)
    if path.name.endswith(".ko.zst"):
        completed = subprocess.run(
            ["zstd", "-dc"], input=raw, capture_output=True, timeout=COMMAND_TIMEOUT, check=False
        )
        if completed.returncode != 0:
            raise ImageBuildError(
                f"cannot decompress {path.name} (is zstd installed?)",
                command=["zstd", "-dc"],
                output=completed.stderr.decode(errors="replace"),
            )
        return completed.stdout
    raise ImageBuildError(f"unknown kernel module format: {path.name}")


def modinfo(module: bytes) -> dict[str, str]:
    """The ``.modinfo`` section of a 64-bit little-endian kernel module (first value per key)."""
    if module[:4] != _ELF_MAGIC or module[4] != 2 or module[5] != 1:
        raise ImageBuildError("not a 64-bit little-endian ELF kernel module")
    section_offset = struct.unpack_from("<Q", module, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", module, 0x3A)

    def section(index: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", module, section_offset + index * entry_size
        )
        return name, offset, size

    _name, names_offset, _size = section(names_index)
    for index in range(count):
        name, offset, size = section(index)
        start = names_offset + name
        if module[start : module.index(b"\0", start)] != b".modinfo":
            continue
        fields: dict[str, str] = {}
        for item in module[offset : offset + size].split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep:
                fields.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
        return fields
    return {}


def resolve_modules(module_dir: Path, wanted: Iterable[str]) -> ModulePlan:
    """Load order for ``wanted`` (each module's dependencies first) from one kernel's tree.

    Debian's packages ship no ``modules.dep`` (depmod writes it at install time), so
    dependencies come from each module's own ``.modinfo``. Built-in modules are skipped.
    """
    available = {
        _module_name(path.name): path
        for path in sorted((module_dir / "kernel").rglob("*.ko*"))
        if re.search(r"\.ko(\.xz|\.gz|\.zst)?$", path.name)
    }
    builtin_list = module_dir / "modules.builtin"
    builtin_names = (
        {_module_name(Path(line.strip()).name) for line in builtin_list.read_text().splitlines()}
        if builtin_list.is_file()
        else set()
    )
    loaded: list[KernelModule] = []
    builtin: list[str] = []
    done: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        name = _module_name(name)
        if name in done:
            return
        if name in chain:
            raise ImageBuildError(f"kernel modules depend on each other in a cycle: {chain}")
        if name in builtin_names:
            done.add(name)
            builtin.append(name)
            return
        path = available.get(name)
        if path is None:
            raise ImageBuildError(f"kernel module {name} is neither built in nor in {module_dir}")
        data = _module_bytes(path)
        for dependency in filter(None, modinfo(data).get("depends", "").split(",")):
            visit(dependency, (*chain, name))
        done.add(name)
        loaded.append(KernelModule(name=name, file_name=f"{_module_name(path.name)}.ko", data=data))

    for name in wanted:
        visit(name, ())
    return ModulePlan(loaded=loaded, builtin=builtin)


@dataclass(frozen=True)
class CpioEntry:
    name: str
    mode: int
    data: bytes = field(default=b"", repr=False)
    rdev: tuple[int, int] = (0, 0)


def initramfs_entries(
    *, busybox: bytes, init: bytes, modules: Sequence[tuple[str, bytes]]
) -> list[CpioEntry]:
    """The initramfs tree: busybox (applet links are made by init), modules, load order, init."""
    directory = stat.S_IFDIR | 0o755
    entries = [CpioEntry(name, directory) for name in ("bin", "dev", "proc", "sys", "lib")]
    entries.append(CpioEntry("lib/modules", directory))
    # The kernel opens /dev/console for init's stdio before anything mounts devtmpfs.
    entries.append(CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries.append(CpioEntry("bin/busybox", stat.S_IFREG | 0o755, busybox))
    for file_name, data in modules:
        entries.append(CpioEntry(f"lib/modules/{file_name}", stat.S_IFREG | 0o644, data))
    order = "".join(f"{file_name}\n" for file_name, _data in modules).encode()
    entries.append(CpioEntry("lib/modules/load-order", stat.S_IFREG | 0o644, order))
    entries.append(CpioEntry("init", stat.S_IFREG | 0o755, init))
    return entries


def cpio_newc(entries: Iterable[CpioEntry]) -> bytes:
    """A newc ("070701") cpio archive as the kernel unpacks it: owned by root, mtime 0, so the
    same inputs give the same bytes."""
    out = bytearray()

    def pad() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    def add(inode: int, entry: CpioEntry) -> None:
        name = entry.name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        fields = (
            inode, entry.mode, 0, 0, nlink, 0, len(entry.data), 0, 0, *entry.rdev, len(name), 0,
        )  # fmt: skip
        out.extend(b"070701" + b"".join(b"%08X" % value for value in fields))
        out.extend(name)
        pad()
        out.extend(entry.data)
        pad()

    inode = 0
    for inode, entry in enumerate(entries, start=1):
        add(inode, entry)
    add(inode + 1, CpioEntry("TRAILER!!!", 0))
    return bytes(out)
