"""The microVM guest image's recipe and its key (standard library only, no Django).

What goes into the image: the Debian suite, mirrors and packages, the kernel and the modules its
initramfs loads and the files under ``guest/``. The key hashes all of it (``current_key``), so
changing any input names a new image; ``image`` finds and builds images by it, and
``image_build`` runs the recipe. A build step that fails raises
``ImageBuildError``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.engine.chromium import HEADLESS_SHELL

# Bump when the build steps change in a way the other inputs do not capture (strip list,
# squashfs options, initramfs layout...): it is part of the key, so old images stop matching.
BUILDER_VERSION = 1

SUITE = "bookworm"
VARIANT = "minbase"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# Installed with apt inside the chroot: debootstrap --include=chromium cannot resolve
# dconf-service's alternative dependency, apt can.
# The guest's browser is the headless shell: lighter than the desktop Chromium, and it draws on
# request (sessions.engine.frames). It reads no managed policy; its switches
# (sessions.engine.chromium.HEADLESS_ARGS, spelled out in guest/pandaweb-guest) are what keeps
# its own traffic off.
GUEST_CHROMIUM = HEADLESS_SHELL
PACKAGES: tuple[str, ...] = (GUEST_CHROMIUM, "fonts-dejavu-core", "socat", "busybox")
KERNEL_PACKAGE = "linux-image-cloud-amd64"
BUSYBOX_STATIC_PACKAGE = "busybox-static"
# Load order for the initramfs. Dependencies the kernel declares are added before their users;
# modules built into the kernel are skipped.
MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "failover",
    "net_failover",
    "virtio_net",
    "squashfs",
    "overlay",
    "virtio-rng",
)

GUEST_DIR = Path(__file__).resolve().with_name("guest")
# guest/init goes into the initramfs; every other file under guest/ into /usr/local/sbin.
INIT_SCRIPT = "init"
GUEST_BIN_DIR = "usr/local/sbin"

KERNEL_FILE = "vmlinux"
INITRD_FILE = "initrd.img"
ROOTFS_FILE = "rootfs.squashfs"
LOG_FILE = "build.log"

KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# Host tool -> the Debian package that provides it (named in the error when one is missing).
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "mksquashfs": "squashfs-tools",
    "lz4": "lz4",
    "unshare": "util-linux",
    "chroot": "coreutils",
}

STEPS = 6
COMMAND_TIMEOUT = 30 * 60
_TAIL_LINES = 25


class ImageBuildError(Exception):
    """The guest image could not be built; says which command failed and how it ended."""

    def __init__(
        self, message: str, *, command: Sequence[str] | None = None, output: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.command: tuple[str, ...] | None = tuple(command) if command else None
        self.tail: list[str] = [line for line in output.splitlines() if line.strip()][-_TAIL_LINES:]
        self.log_path: Path | None = None

    def __str__(self) -> str:
        parts = [self.message]
        if self.command:
            parts.append(f"command: {shlex.join(self.command)}")
        if self.tail:
            parts.append("last output:")
            parts.extend(f"  {line}" for line in self.tail)
        if self.log_path:
            parts.append(f"full log: {self.log_path}")
        return "\n".join(parts)


@dataclass(frozen=True)
class GuestFile:
    data: bytes = field(repr=False)
    executable: bool


def read_guest() -> dict[str, GuestFile]:
    """Every file under guest/, read once: what is hashed into the key is what gets baked in,
    even if someone edits guest/ while a build runs."""
    files = {}
    for path in sorted(GUEST_DIR.rglob("*")):
        relative = path.relative_to(GUEST_DIR)
        if path.is_file() and "__pycache__" not in relative.parts:
            executable = bool(path.stat().st_mode & stat.S_IXUSR)
            files[relative.as_posix()] = GuestFile(path.read_bytes(), executable)
    return files


def recipe_inputs(guest: dict[str, GuestFile]) -> dict[str, Any]:
    hashed = {
        name: f"{'x' if file.executable else '-'}:{hashlib.sha256(file.data).hexdigest()}"
        for name, file in guest.items()
    }
    return {
        "builder_version": BUILDER_VERSION,
        "suite": SUITE,
        "variant": VARIANT,
        "mirror": MIRROR,
        "security_mirror": SECURITY_MIRROR,
        "packages": list(PACKAGES),
        "kernel_package": KERNEL_PACKAGE,
        "busybox_package": BUSYBOX_STATIC_PACKAGE,
        "modules": list(MODULES),
        "guest_files": hashed,
    }


def inputs_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def current_key() -> str:
    """Hex sha256 of every input of the recipe (not of the package versions it resolves to)."""
    return inputs_key(recipe_inputs(read_guest()))
