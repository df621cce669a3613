"""The guest image's build steps: debootstrap, apt, the kernel, the initramfs, the squashfs root
(standard library only, no Django).

``assemble`` runs the recipe (``recipe``) into a work directory, logging every command to
``build.log`` there; ``image.build_image`` decides when to build and publishes the result.
Everything runs as root: the chroot's mounts live in private mount namespaces, and
``remove_tree`` refuses to delete anything with a mount below it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

from sessions.engine.sandbox.microvm.kernel import (
    cpio_newc,
    initramfs_entries,
    resolve_modules,
    vmlinux_from_bzimage,
)
from sessions.engine.sandbox.microvm.recipe import (
    BUSYBOX_STATIC_PACKAGE,
    COMMAND_TIMEOUT,
    GUEST_BIN_DIR,
    GUEST_CHROMIUM,
    INIT_SCRIPT,
    INITRD_FILE,
    KERNEL_FILE,
    KERNEL_PACKAGE,
    KEYRING,
    LOG_FILE,
    MIRROR,
    MODULES,
    PACKAGES,
    ROOTFS_FILE,
    SECURITY_MIRROR,
    STEPS,
    SUITE,
    VARIANT,
    GuestFile,
    ImageBuildError,
)

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


def remove_tree(path: Path) -> None:
    """Delete ``path`` and everything below it, refusing while anything is mounted there."""
    if not path.exists():
        return
    # rmtree descends into mount points: a /dev bind mount left under a chroot would cost the
    # host its device nodes. The chroot mounts live in private namespaces; this is the backstop.
    mounts = _mounts_under(path)
    if mounts:
        raise ImageBuildError(f"refusing to delete {path}: still mounted below it: {mounts}")
    shutil.rmtree(path)


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


def assemble(
    workdir: Path,
    *,
    guest: dict[str, GuestFile],
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
            chromium_version = build.chroot(
                f"{GUEST_CHROMIUM} --version", merge_stderr=False
            ).strip()
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
            remove_tree(rootfs)
            remove_tree(download)

        return {
            "kernel_version": kernel_release,
            "kernel_package": f"{kernel_package}={debs.get(kernel_package, '?')}",
            "chromium_version": chromium_version,
            "chromium_package": packages.get(GUEST_CHROMIUM, "?"),
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


def _install_guest_files(rootfs: Path, guest: dict[str, GuestFile]) -> None:
    for name, file in guest.items():
        if name == INIT_SCRIPT:
            continue
        if "/" in name:
            raise ImageBuildError(f"guest/{name}: guest/ holds plain files only, no directories")
        mode = 0o755 if file.executable else 0o644
        _write_in_root(rootfs, f"{GUEST_BIN_DIR}/{name}", file.data, mode)
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
