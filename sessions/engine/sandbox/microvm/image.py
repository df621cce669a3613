"""Build and find the microVM guest image (standard library only, no Django).

A guest image is three files a QEMU ``microvm`` boots directly:

- ``vmlinux``: Debian's cloud kernel as an uncompressed ELF, booted through its PVH entry so the
  emulated CPU never spends time decompressing a bzImage;
- ``initrd.img``: a gzip'd newc cpio with a static busybox, the virtio, squashfs and overlay
  modules (in load order) and ``guest/init``;
- ``rootfs.squashfs``: a read-only Debian bookworm root (minbase + Chromium) carrying the guest's
  main script and control script from ``guest/``.

Everything comes from Debian packages, fetched through a debootstrap'd chroot's own apt, so the
result does not depend on what the building host has installed beyond a few tools (the steps
are ``image_build``'s, what they install ``recipe``'s). Images are cached under
``<root>/<key[:16]>/`` (the root is ``EngineConfig.microvm_image_dir``) where the key hashes
every input of the recipe (``recipe.current_key``); a build happens once per recipe change (or
on ``force``, e.g. to pick up security updates, which do not change the key).

Builds are crash-safe: work happens in ``<key[:16]>.partial-<pid>/``, the manifest is written
last, and the directory is renamed into place only when complete, so ``find_image`` never sees a
half-built image. A lock file serialises builders; leftovers of builders that died are removed by
the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sessions.engine.sandbox.microvm.image_build import assemble, remove_tree
from sessions.engine.sandbox.microvm.recipe import (
    BUILDER_VERSION,
    HOST_TOOLS,
    INITRD_FILE,
    KERNEL_FILE,
    KEYRING,
    LOG_FILE,
    ROOTFS_FILE,
    ImageBuildError,
    current_key,
    inputs_key,
    read_guest,
    recipe_inputs,
)

__all__ = ["GuestImage", "build_image", "find_image"]

MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".build.lock"
_ARTIFACTS = {"kernel": KERNEL_FILE, "initrd": INITRD_FILE, "rootfs": ROOTFS_FILE}
_KEY_DIR_CHARS = 16
_LEFTOVER = re.compile(r"[0-9a-f]{16}\.(?:partial|old)-[0-9]+")


@dataclass(frozen=True)
class GuestImage:
    """A complete, verified guest image on disk."""

    key: str
    directory: Path
    kernel: Path
    initrd: Path
    rootfs: Path
    manifest: dict[str, Any] = field(hash=False)


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
    guest = read_guest()
    inputs = recipe_inputs(guest)
    key = inputs_key(inputs)
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
            info = assemble(workdir, guest=guest, progress=progress, keep_fds=(lock_fd,))
            seconds = time.monotonic() - started
            _write_manifest(workdir, key=key, inputs=inputs, info=info, seconds=seconds)
            _publish(workdir, root / name)
        except BaseException as exc:
            failed_log = _keep_failed_log(workdir, root / f"{name}.failed.log")
            remove_tree(workdir)
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
            remove_tree(entry)


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
        remove_tree(old)
