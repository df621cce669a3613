"""Build and find the microVM guest image (standard library only, no Django).

A guest image is three files a QEMU ``microvm`` boots directly:

- ``vmlinux``: Debian's cloud kernel as an uncompressed ELF, booted through its PVH entry so the
  emulated CPU never spends time decompressing a bzImage;
- ``initrd.img``: a gzip'd newc cpio with a static busybox, the virtio, squashfs and overlay
  modules (in load order) and ``guest/init``;
- ``rootfs.squashfs``: a read-only Debian bookworm root (minbase + Chromium) carrying the guest's
  main script and control script from ``guest/``.

Everything comes from Debian packages, fetched through a debootstrap'd chroot's own apt, so the
result does not depend on what the building host has installed beyond a few tools. Images are
cached under ``<root>/<key[:16]>/`` (the root is ``EngineConfig.microvm_image_dir``) where the
key hashes every input of the recipe; a build happens once per recipe change (or on ``force``,
e.g. to pick up security updates, which do not change the key).

Builds are crash-safe: work happens in ``<key[:16]>.partial-<pid>/``, the manifest is written
last, and the directory is renamed into place only when complete, so ``find_image`` never sees a
half-built image. A lock file serialises builders; leftovers of builders that died are removed by
the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import lzma
import os
import platform
import re
import shlex
import shutil
import stat
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

from sessions.engine.chromium import MANAGED_POLICY_NAME, managed_policy_json

__all__ = [
    "BUILDER_VERSION",
    "GuestImage",
    "ImageBuildError",
    "build_image",
    "current_key",
    "find_image",
]

# Bump when the build steps change in a way the other inputs do not capture (strip list,
# squashfs options, initramfs layout...): it is part of the key, so old images stop matching.
BUILDER_VERSION = 1

SUITE = "bookworm"
VARIANT = "minbase"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# Installed with apt inside the chroot: debootstrap --include=chromium cannot resolve
# dconf-service's alternative dependency, apt can.
PACKAGES: tuple[str, ...] = ("chromium", "fonts-dejavu-core", "socat", "busybox")
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
# Where Debian's Chromium reads its managed policy, inside the root fs.
CHROMIUM_POLICY_DIR = "etc/chromium/policies/managed"
# guest/init goes into the initramfs; every other file under guest/ into /usr/local/sbin.
INIT_SCRIPT = "init"
GUEST_BIN_DIR = "usr/local/sbin"

KERNEL_FILE = "vmlinux"
INITRD_FILE = "initrd.img"
ROOTFS_FILE = "rootfs.squashfs"
MANIFEST_FILE = "manifest.json"
LOG_FILE = "build.log"
LOCK_FILE = ".build.lock"
_ARTIFACTS = {"kernel": KERNEL_FILE, "initrd": INITRD_FILE, "rootfs": ROOTFS_FILE}

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
_KEY_DIR_CHARS = 16
_LEFTOVER = re.compile(r"[0-9a-f]{16}\.(?:partial|old)-[0-9]+")
_LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"
_ELF_MAGIC = b"\x7fELF"

# Runs as root inside a private mount namespace, so the chroot's /proc, /sys and /dev vanish
# with the namespace however the build ends (even SIGKILL); a `finally: umount` would not run
# then, and a later rmtree of the leftover would descend into the host's /dev.
_CHROOT_WRAPPER = """
root=$1
shift
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
exec chroot "$root" /bin/sh -ec "$1"
"""


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
class GuestImage:
    """A complete, verified guest image on disk."""

    key: str
    directory: Path
    kernel: Path
    initrd: Path
    rootfs: Path
    manifest: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class _GuestFile:
    data: bytes = field(repr=False)
    executable: bool


def _read_guest() -> dict[str, _GuestFile]:
    """Every file under guest/, read once: what is hashed into the key is what gets baked in,
    even if someone edits guest/ while a build runs."""
    files = {}
    for path in sorted(GUEST_DIR.rglob("*")):
        relative = path.relative_to(GUEST_DIR)
        if path.is_file() and "__pycache__" not in relative.parts:
            executable = bool(path.stat().st_mode & stat.S_IXUSR)
            files[relative.as_posix()] = _GuestFile(path.read_bytes(), executable)
    return files


def _inputs(guest: dict[str, _GuestFile]) -> dict[str, Any]:
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
        "managed_policy": hashlib.sha256(managed_policy_json()).hexdigest(),
    }


def _key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def current_key() -> str:
    """Hex sha256 of every input of the recipe (not of the package versions it resolves to)."""
    return _key(_inputs(_read_guest()))


def _load_image(directory: Path, key: str) -> GuestImage | None:
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return None
    sizes = manifest.get("sizes")
    if not isinstance(sizes, dict):
        return None
    paths = {role: directory / name for role, name in _ARTIFACTS.items()}
    for role, path in paths.items():
        # A size mismatch means something truncated or replaced the file after the build.
        try:
            if not path.is_file() or path.stat().st_size != sizes.get(role):
                return None
        except OSError:
            return None
    return GuestImage(
        key=key,
        directory=directory,
        kernel=paths["kernel"],
        initrd=paths["initrd"],
        rootfs=paths["rootfs"],
        manifest=manifest,
    )


def find_image(root: Path) -> GuestImage | None:
    """The complete image for ``current_key()`` under ``root``, or None. Cheap (a few stats);
    takes no lock: a directory under the final name is complete because it only ever arrives by
    rename."""
    key = current_key()
    return _load_image(root / key[:_KEY_DIR_CHARS], key)


def build_image(
    root: Path,
    *,
    progress: Callable[[str], None] = print,
    force: bool = False,
) -> GuestImage:
    """Return the image for ``current_key()``, building it first unless it is cached.

    Idempotent: without ``force`` a cached image is returned untouched, and a builder that
    waited on another's lock returns that builder's result. Needs root, the tools in
    ``HOST_TOOLS`` and the Debian mirror; takes about a minute and ~1 GB of scratch space.
    """
    if not callable(progress):
        raise TypeError("progress must be a callable taking one line of text")
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ImageBuildError(f"image root {root} exists and is not a directory")
    if not force:
        cached = find_image(root)
        if cached is not None:
            progress(f"image {cached.key[:_KEY_DIR_CHARS]} is up to date: {cached.directory}")
            return cached
    _check_host()
    root.mkdir(parents=True, exist_ok=True)
    guest = _read_guest()
    inputs = _inputs(guest)
    key = _key(inputs)
    name = key[:_KEY_DIR_CHARS]
    with _build_lock(root, progress) as lock_fd:
        if not force:
            cached = find_image(root)
            if cached is not None:
                progress(f"image {name} was built meanwhile: {cached.directory}")
                return cached
        _remove_leftovers(root, progress)
        workdir = root / f"{name}.partial-{os.getpid()}"
        workdir.mkdir()
        workdir.chmod(0o755)
        started = time.monotonic()
        try:
            info = _assemble(workdir, guest=guest, progress=progress, keep_fds=(lock_fd,))
            seconds = time.monotonic() - started
            _write_manifest(workdir, key=key, inputs=inputs, info=info, seconds=seconds)
            _publish(workdir, root / name)
        except BaseException as exc:
            failed_log = _keep_failed_log(workdir, root / f"{name}.failed.log")
            _remove_tree(workdir)
            if isinstance(exc, ImageBuildError):
                exc.log_path = failed_log
                raise
            if isinstance(exc, OSError):
                error = ImageBuildError(f"the build failed: {exc}")
                error.log_path = failed_log
                raise error from exc
            raise
        with contextlib.suppress(FileNotFoundError):
            (root / f"{name}.failed.log").unlink()
    # The key of what was built, not current_key() again: guest/ may have been edited meanwhile.
    image = _load_image(root / name, key)
    if image is None:
        raise ImageBuildError(f"the image built in {root / name} does not verify")
    progress(f"image {name} ready in {time.monotonic() - started:.1f} s: {image.directory}")
    return image


def _check_host() -> None:
    if platform.machine() != "x86_64":
        raise ImageBuildError(
            f"the guest image is amd64 and is built on x86_64 hosts, not {platform.machine()}"
        )
    if os.geteuid() != 0:
        raise ImageBuildError(
            "building the guest image needs root (debootstrap, chroot and mounts do): "
            "run `manage.py microvm_image` as root"
        )
    missing = [
        f"{tool} (package {pkg})" for tool, pkg in HOST_TOOLS.items() if not shutil.which(tool)
    ]
    if not KEYRING.is_file():
        missing.append(f"{KEYRING} (package debian-archive-keyring)")
    if missing:
        raise ImageBuildError("missing on this host: " + ", ".join(missing))


@contextlib.contextmanager
def _build_lock(root: Path, progress: Callable[[str], None]) -> Iterator[int]:
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("another guest image build is running; waiting for it …")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _remove_leftovers(root: Path, progress: Callable[[str], None]) -> None:
    # Only called with the lock held. Every builder holds it for as long as it (or any child it
    # started, which inherit the lock's descriptor) is alive, so these belong to dead builders.
    for entry in sorted(root.iterdir()):
        if _LEFTOVER.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            progress(f"removing {entry.name} (left by a builder that did not finish)")
            _remove_tree(entry)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            # Field 5 is the mount point, with spaces and the like escaped as octal.
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if point.startswith(prefix):
                found.append(point)
    return found


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    # rmtree descends into mount points: a /dev bind mount left under a chroot would cost the
    # host its device nodes. The chroot mounts live in private namespaces; this is the backstop.
    mounts = _mounts_under(path)
    if mounts:
        raise ImageBuildError(f"refusing to delete {path}: still mounted below it: {mounts}")
    shutil.rmtree(path)


def _keep_failed_log(workdir: Path, target: Path) -> Path | None:
    try:
        shutil.copyfile(workdir / LOG_FILE, target)
    except OSError:
        return None
    return target


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(
    workdir: Path, *, key: str, inputs: dict[str, Any], info: dict[str, Any], seconds: float
) -> None:
    sizes: dict[str, int] = {}
    sha256: dict[str, str] = {}
    for role, name in _ARTIFACTS.items():
        path = workdir / name
        if not path.is_file():
            raise ImageBuildError(f"the build left no {name} in {workdir}")
        path.chmod(0o644)
        _fsync(path)
        sizes[role] = path.stat().st_size
        sha256[role] = _file_sha256(path)
    manifest = {
        "format": 1,
        "key": key,
        "builder_version": BUILDER_VERSION,
        "inputs": inputs,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_seconds": round(seconds, 1),
        "files": dict(_ARTIFACTS),
        "sizes": sizes,
        "sha256": sha256,
        **info,
    }
    # Written last: a directory holding a manifest that names this key holds everything else.
    path = workdir / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    path.chmod(0o644)
    _fsync(path)


def _publish(workdir: Path, final: Path) -> None:
    old = None
    if final.exists():
        # A forced rebuild, or a damaged image under the same key. VMs already running keep
        # their open files; the old directory goes once the new one is in place.
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.rename(final, old)
    os.rename(workdir, final)
    _fsync(final.parent)
    if old is not None:
        _remove_tree(old)


# --- the build itself -----------------------------------------------------------------------


class _Build:
    """Runs the commands of one build, logging everything to ``build.log`` in the work dir."""

    def __init__(
        self,
        workdir: Path,
        log: IO[str],
        progress: Callable[[str], None],
        keep_fds: tuple[int, ...],
    ) -> None:
        self.workdir = workdir
        self.rootfs = workdir / "rootfs"
        self.log = log
        self.progress = progress
        self.keep_fds = keep_fds
        self.started = time.monotonic()
        self.step_seconds: dict[str, float] = {}
        self.env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LC_ALL": "C",
            "DEBIAN_FRONTEND": "noninteractive",
        }
        # A host that reaches the mirror only through a proxy passes it on to debootstrap and apt.
        for name in ("http_proxy", "https_proxy", "no_proxy"):
            if name in os.environ:
                self.env[name] = os.environ[name]

    @contextlib.contextmanager
    def step(self, number: int, title: str) -> Iterator[None]:
        self.progress(f"[{number}/{STEPS}] {title} …")
        self.log.write(f"\n===== [{number}/{STEPS}] {title}\n")
        started = time.monotonic()
        yield
        seconds = time.monotonic() - started
        self.step_seconds[title] = round(seconds, 1)
        total = time.monotonic() - self.started
        self.progress(f"[{number}/{STEPS}] done in {seconds:.1f} s ({total:.1f} s elapsed)")

    def run(
        self,
        command: Sequence[str],
        *,
        input_bytes: bytes | None = None,
        merge_stderr: bool = True,
    ) -> str:
        self.log.write(f"$ {shlex.join(command)}\n")
        self.log.flush()
        try:
            completed = subprocess.run(
                list(command),
                input=input_bytes,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                env=self.env,
                pass_fds=self.keep_fds,
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b"").decode(errors="replace")
            self.log.write(output)
            raise ImageBuildError(
                f"{command[0]} did not finish within {COMMAND_TIMEOUT} s",
                command=command,
                output=output,
            ) from exc
        output = completed.stdout.decode(errors="replace")
        errors = (completed.stderr or b"").decode(errors="replace")
        self.log.write(output + errors)
        self.log.flush()
        if completed.returncode != 0:
            raise ImageBuildError(
                f"{Path(command[0]).name} failed with exit status {completed.returncode}",
                command=command,
                output=output + errors,
            )
        return output

    def chroot(self, script: str, *, merge_stderr: bool = True) -> str:
        return self.run(
            [
                "unshare",
                "--mount",
                "--",
                "sh",
                "-ec",
                _CHROOT_WRAPPER,
                "chroot",
                str(self.rootfs),
                script,
            ],
            merge_stderr=merge_stderr,
        )


def _assemble(
    workdir: Path,
    *,
    guest: dict[str, _GuestFile],
    progress: Callable[[str], None],
    keep_fds: tuple[int, ...],
) -> dict[str, Any]:
    """Build kernel, initramfs and root fs into ``workdir``; return facts for the manifest."""
    with (workdir / LOG_FILE).open("w", encoding="utf-8") as log:
        build = _Build(workdir, log, progress, keep_fds)
        rootfs = build.rootfs

        with build.step(1, f"debootstrap {SUITE} ({VARIANT})"):
            build.run(
                [
                    "unshare",
                    "--mount",
                    "--",
                    "debootstrap",
                    f"--variant={VARIANT}",
                    f"--keyring={KEYRING}",
                    SUITE,
                    str(rootfs),
                    MIRROR,
                ]
            )

        with build.step(2, f"apt-get install {' '.join(PACKAGES)}"):
            _configure_apt(rootfs)
            build.chroot(
                "apt-get update\n"
                "apt-get -y upgrade\n"
                f"apt-get -y install --no-install-recommends {shlex.join(PACKAGES)}\n"
            )
            chromium_version = build.chroot("chromium --version", merge_stderr=False).strip()
            packages = _parse_packages(
                build.chroot("dpkg-query -W -f='${Package}\\t${Version}\\n'", merge_stderr=False)
            )

        with build.step(3, f"kernel ({KERNEL_PACKAGE}) and {BUSYBOX_STATIC_PACKAGE}"):
            kernel_package = _resolve_kernel_package(
                build.chroot(f"apt-cache depends --important {KERNEL_PACKAGE}", merge_stderr=False)
            )
            download = _download_debs(build, [kernel_package, BUSYBOX_STATIC_PACKAGE])
            kernel_tree = download / "x" / kernel_package
            vmlinuz = sorted((kernel_tree / "boot").glob("vmlinuz-*"))
            if len(vmlinuz) != 1:
                raise ImageBuildError(f"expected one vmlinuz in {kernel_package}, found {vmlinuz}")
            kernel_release = vmlinuz[0].name.removeprefix("vmlinuz-")
            vmlinux = vmlinux_from_bzimage(vmlinuz[0].read_bytes())
            (workdir / KERNEL_FILE).write_bytes(vmlinux)
            modules = resolve_modules(kernel_tree / "lib" / "modules" / kernel_release, MODULES)
            busybox = (download / "x" / BUSYBOX_STATIC_PACKAGE / "bin" / "busybox").read_bytes()
            debs = _deb_versions(download)

        with build.step(4, "guest scripts, strip docs, locales and apt caches"):
            _install_guest_files(rootfs, guest)
            _prune(rootfs)
            tree_bytes = _tree_bytes(rootfs)

        with build.step(5, "initramfs (busybox, modules, init)"):
            entries = initramfs_entries(
                busybox=busybox,
                init=guest[INIT_SCRIPT].data,
                modules=[(module.file_name, module.data) for module in modules.loaded],
            )
            (workdir / INITRD_FILE).write_bytes(
                gzip.compress(cpio_newc(entries), compresslevel=9, mtime=0)
            )

        with build.step(6, "mksquashfs (zstd)"):
            build.run(
                [
                    "mksquashfs",
                    str(rootfs),
                    str(workdir / ROOTFS_FILE),
                    "-comp",
                    "zstd",
                    # Level 9 packs in ~6 s what the default 15 takes a minute for on two
                    # CPUs, for a 6% larger file; reading it back costs the guest the same.
                    "-Xcompression-level",
                    "9",
                    "-noappend",
                    "-no-progress",
                ]
            )
            _remove_tree(rootfs)
            _remove_tree(download)

        return {
            "kernel_version": kernel_release,
            "kernel_package": f"{kernel_package}={debs.get(kernel_package, '?')}",
            "chromium_version": chromium_version,
            "chromium_package": packages.get("chromium", "?"),
            "busybox_static_package": debs.get(BUSYBOX_STATIC_PACKAGE, "?"),
            "modules_loaded": [module.name for module in modules.loaded],
            "modules_builtin": modules.builtin,
            "packages": packages,
            "rootfs_tree_bytes": tree_bytes,
            "step_seconds": build.step_seconds,
        }


def _write_in_root(rootfs: Path, relative: str, data: bytes, mode: int = 0o644) -> None:
    path = rootfs / relative
    # Never follow a link out of the chroot: the build runs as root on the host.
    if not path.parent.resolve().is_relative_to(rootfs.resolve()):
        raise ImageBuildError(f"{relative} leads outside the root fs")
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_bytes(data)
    path.chmod(mode)


def _configure_apt(rootfs: Path) -> None:
    sources = (
        f"deb {MIRROR} {SUITE} main\n"
        f"deb {MIRROR} {SUITE}-updates main\n"
        f"deb {SECURITY_MIRROR} {SUITE}-security main\n"
    )
    _write_in_root(rootfs, "etc/apt/sources.list", sources.encode())
    _write_in_root(
        rootfs,
        "etc/apt/apt.conf.d/90pandaweb",
        b'APT::Install-Recommends "false";\n'
        b'APT::Install-Suggests "false";\n'
        b'Acquire::Languages "none";\n'
        b'Dpkg::Use-Pty "false";\n',
    )
    # Never unpacked, rather than unpacked and deleted: apt is faster and the tree smaller.
    _write_in_root(
        rootfs,
        "etc/dpkg/dpkg.cfg.d/90pandaweb-nodoc",
        b"path-exclude=/usr/share/doc/*\n"
        b"path-include=/usr/share/doc/*/copyright\n"
        b"path-exclude=/usr/share/man/*\n"
        b"path-exclude=/usr/share/info/*\n"
        b"path-exclude=/usr/share/locale/*\n"
        b"path-include=/usr/share/locale/locale.alias\n"
        b"path-exclude=/usr/share/lintian/*\n",
    )
    # Package scripts must not start daemons in the build chroot.
    _write_in_root(rootfs, "usr/sbin/policy-rc.d", b"#!/bin/sh\nexit 101\n", 0o755)
    # apt in the chroot resolves the mirror like the host does (replaced before packing).
    with contextlib.suppress(OSError):
        _write_in_root(rootfs, "etc/resolv.conf", Path("/etc/resolv.conf").read_bytes())


def _parse_packages(output: str) -> dict[str, str]:
    packages = {}
    for line in output.splitlines():
        name, _, version = line.partition("\t")
        if name and version:
            packages[name] = version
    return packages


def _resolve_kernel_package(output: str) -> str:
    match = re.search(r"Depends:\s*(linux-image-\d\S*)", output)
    if not match:
        raise ImageBuildError(
            f"cannot tell which kernel {KERNEL_PACKAGE} depends on", output=output
        )
    return match[1]


def _download_debs(build: _Build, packages: Sequence[str]) -> Path:
    # Downloaded and unpacked by the chroot's own apt and dpkg-deb: the host's apt sources
    # (or lack of them) do not matter, and the .debs are verified against the same Release
    # files as everything else.
    inner = "/var/tmp/pandaweb-download"  # noqa: S108 (inside the chroot, which is ours alone)
    script = [f"mkdir -p {inner}/x", f"cd {inner}", f"chown _apt {inner} || true"]
    script.append(f"apt-get download {shlex.join(packages)}")
    for package in packages:
        script.append(f"dpkg-deb -x {shlex.quote(package)}_*.deb x/{shlex.quote(package)}")
    build.chroot("\n".join(script) + "\n")
    outside = build.workdir / "download"
    os.rename(build.rootfs / inner.lstrip("/"), outside)
    return outside


def _deb_versions(directory: Path) -> dict[str, str]:
    versions = {}
    for deb in directory.glob("*.deb"):
        # apt-get download names files <package>_<version, ':' as %3a>_<arch>.deb.
        package, version, _arch = deb.name.removesuffix(".deb").split("_")
        versions[package] = unquote(version)
    return versions


def _install_guest_files(rootfs: Path, guest: dict[str, _GuestFile]) -> None:
    for name, file in guest.items():
        if name == INIT_SCRIPT:
            continue
        if "/" in name:
            raise ImageBuildError(f"guest/{name}: guest/ holds plain files only, no directories")
        mode = 0o755 if file.executable else 0o644
        _write_in_root(rootfs, f"{GUEST_BIN_DIR}/{name}", file.data, mode)
    # Chromium's own background traffic off (sessions.engine.chromium.MANAGED_POLICY); in the image,
    # so it is there before Chromium first starts and no run can change it.
    (rootfs / CHROMIUM_POLICY_DIR).mkdir(parents=True, exist_ok=True)
    _write_in_root(rootfs, f"{CHROMIUM_POLICY_DIR}/{MANAGED_POLICY_NAME}", managed_policy_json())
    _write_in_root(rootfs, "etc/hostname", b"pandaweb-guest\n")
    _write_in_root(
        rootfs, "etc/hosts", b"127.0.0.1\tlocalhost\n127.0.1.1\tpandaweb-guest\n::1\tlocalhost\n"
    )
    # No resolver: the guest's only way out is the proxy, which resolves names on the host.
    _write_in_root(rootfs, "etc/resolv.conf", b"# none: pandaweb guests reach the web by proxy\n")
    (rootfs / "usr/sbin/policy-rc.d").unlink(missing_ok=True)


def _empty(rootfs: Path, relative: str, keep: Callable[[Path], bool] = lambda _path: False) -> None:
    directory = rootfs / relative
    if directory.is_symlink() or not directory.is_dir():
        return
    if not directory.resolve().is_relative_to(rootfs.resolve()):
        raise ImageBuildError(f"{relative} leads outside the root fs")
    for entry in directory.iterdir():
        if keep(entry):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _prune(rootfs: Path) -> None:
    for relative in (
        "usr/share/man",
        "usr/share/info",
        "usr/share/lintian",
        "var/lib/apt/lists",
        "var/cache/apt",
        "var/cache/debconf",
        "var/log",
        "var/tmp",
        "tmp",
    ):
        _empty(rootfs, relative)
    _empty(rootfs, "usr/share/locale", keep=lambda path: path.name == "locale.alias")
    doc = rootfs / "usr/share/doc"
    if doc.is_dir() and not doc.is_symlink():
        # debootstrap unpacked its packages before the dpkg path-excludes existed.
        for package in doc.iterdir():
            if package.is_dir() and not package.is_symlink():
                _empty(
                    rootfs, f"usr/share/doc/{package.name}", keep=lambda p: p.name == "copyright"
                )


def _tree_bytes(root: Path) -> int:
    total = 0
    seen: set[int] = set()
    for directory, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(directory, name))
                # Hard links count once, as they take space once.
                if info.st_ino not in seen:
                    seen.add(info.st_ino)
                    total += info.st_size
    return total


# --- kernel, modules, initramfs (pure functions, unit-tested) -------------------------------


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
