from __future__ import annotations

import dataclasses
import fcntl
import gzip
import json
import lzma
import os
import shutil
import stat
import struct
import subprocess
import threading
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from sessions.engine.chromium import HEADLESS_ARGS
from sessions.engine.sandbox.microvm import image, image_build, kernel, recipe

ARTIFACTS = (recipe.KERNEL_FILE, recipe.INITRD_FILE, recipe.ROOTFS_FILE)


def make_image(root: Path, key: str | None = None, payload: bytes = b"artifact") -> Path:
    """A complete image as build_image leaves it (tiny fake artifacts)."""
    key = key or recipe.current_key()
    directory = root / key[:16]
    directory.mkdir(parents=True)
    sizes = {}
    for role, name in zip(("kernel", "initrd", "rootfs"), ARTIFACTS, strict=True):
        (directory / name).write_bytes(payload)
        sizes[role] = len(payload)
    manifest = {"key": key, "sizes": sizes, "chromium_version": "Chromium 1.2.3"}
    (directory / image.MANIFEST_FILE).write_text(json.dumps(manifest))
    return directory


def fake_assemble(
    workdir: Path, *, guest: Any, progress: Any, keep_fds: tuple[int, ...]
) -> dict[str, Any]:
    progress(f"[1/{recipe.STEPS}] pretend to build …")
    for name in ARTIFACTS:
        (workdir / name).write_bytes(name.encode() * 10)
    (workdir / recipe.LOG_FILE).write_text("pretend log\n")
    return {"chromium_version": "Chromium 1.2.3", "kernel_version": "6.1.0-test-cloud-amd64"}


def must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("no build was expected")


@pytest.fixture
def guest_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "guest"
    shutil.copytree(recipe.GUEST_DIR, copy)
    monkeypatch.setattr(recipe, "GUEST_DIR", copy)
    return copy


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "images"


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "_check_host", lambda: None)
    monkeypatch.setattr(image, "assemble", fake_assemble)


# --- the key ----------------------------------------------------------------------------------


def test_the_key_is_a_stable_sha256() -> None:
    key = recipe.current_key()
    assert key == recipe.current_key()
    assert len(key) == 64
    int(key, 16)


def test_the_key_changes_when_a_guest_file_changes(guest_copy: Path) -> None:
    before = recipe.current_key()
    script = guest_copy / "pandaweb-control"
    script.write_text(script.read_text() + "\n# edited\n")
    assert recipe.current_key() != before


def test_the_key_changes_when_a_guest_file_loses_its_exec_bit(guest_copy: Path) -> None:
    before = recipe.current_key()
    (guest_copy / "init").chmod(0o644)
    assert recipe.current_key() != before


def test_the_key_changes_when_a_guest_file_is_added(guest_copy: Path) -> None:
    before = recipe.current_key()
    (guest_copy / "pandaweb-extra").write_text("#!/bin/sh\n")
    assert recipe.current_key() != before


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SUITE", "trixie"),
        ("MIRROR", "http://mirror.example/debian"),
        ("SECURITY_MIRROR", "http://mirror.example/debian-security"),
        ("PACKAGES", (*recipe.PACKAGES, "curl")),
        ("KERNEL_PACKAGE", "linux-image-amd64"),
        ("MODULES", recipe.MODULES[:-1]),
        ("BUILDER_VERSION", recipe.BUILDER_VERSION + 1),
    ],
)
def test_the_key_changes_with_the_recipe(
    monkeypatch: pytest.MonkeyPatch, name: str, value: object
) -> None:
    before = recipe.current_key()
    monkeypatch.setattr(recipe, name, value)
    assert recipe.current_key() != before


# --- finding an image -------------------------------------------------------------------------


def test_it_finds_a_complete_image(root: Path) -> None:
    directory = make_image(root)
    found = image.find_image(root)
    assert found is not None
    assert found.key == recipe.current_key()
    assert found.directory == directory
    assert found.kernel == directory / recipe.KERNEL_FILE
    assert found.initrd == directory / recipe.INITRD_FILE
    assert found.rootfs == directory / recipe.ROOTFS_FILE
    assert found.manifest["chromium_version"] == "Chromium 1.2.3"


def test_it_finds_nothing_in_an_empty_root(root: Path) -> None:
    assert image.find_image(root) is None


def test_a_partial_build_never_counts_as_an_image(root: Path) -> None:
    directory = make_image(root)
    directory.rename(root / f"{directory.name}.partial-4242")
    assert image.find_image(root) is None


def test_an_image_without_its_manifest_does_not_count(root: Path) -> None:
    directory = make_image(root)
    (directory / image.MANIFEST_FILE).unlink()
    assert image.find_image(root) is None


def test_an_image_of_other_inputs_does_not_count(root: Path) -> None:
    make_image(root, key=recipe.current_key()[:16] + "0" * 48)
    assert image.find_image(root) is None


def test_a_truncated_artifact_does_not_count(root: Path) -> None:
    directory = make_image(root)
    (directory / recipe.ROOTFS_FILE).write_bytes(b"")
    assert image.find_image(root) is None


def test_a_missing_artifact_does_not_count(root: Path) -> None:
    directory = make_image(root)
    (directory / recipe.KERNEL_FILE).unlink()
    assert image.find_image(root) is None


# --- building ---------------------------------------------------------------------------------


def test_a_cached_image_is_returned_without_building(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image, "_check_host", must_not_run)
    monkeypatch.setattr(image, "assemble", must_not_run)
    directory = make_image(root)
    lines: list[str] = []
    built = image.build_image(root, progress=lines.append)
    assert built.directory == directory
    assert lines == [f"image {directory.name} is up to date: {directory}"]


@pytest.mark.usefixtures("fake_build")
def test_a_build_publishes_a_complete_image_with_its_manifest(root: Path) -> None:
    lines: list[str] = []
    built = image.build_image(root, progress=lines.append)

    key = recipe.current_key()
    assert built.key == key
    assert built.directory == root / key[:16]
    assert sorted(path.name for path in root.iterdir()) == [image.LOCK_FILE, key[:16]]
    manifest = json.loads((built.directory / image.MANIFEST_FILE).read_text())
    assert manifest == built.manifest
    assert manifest["key"] == key
    assert manifest["inputs"]["packages"] == list(recipe.PACKAGES)
    assert manifest["chromium_version"] == "Chromium 1.2.3"
    assert manifest["kernel_version"] == "6.1.0-test-cloud-amd64"
    assert manifest["sizes"] == {
        "kernel": built.kernel.stat().st_size,
        "initrd": built.initrd.stat().st_size,
        "rootfs": built.rootfs.stat().st_size,
    }
    assert set(manifest["sha256"]) == {"kernel", "initrd", "rootfs"}
    assert isinstance(manifest["build_seconds"], float)
    assert stat.S_IMODE(built.rootfs.stat().st_mode) == 0o644
    assert lines[0] == f"[1/{recipe.STEPS}] pretend to build …"
    assert lines[-1].startswith(f"image {key[:16]} ready in ")
    assert image.find_image(root) == built


@pytest.mark.usefixtures("fake_build")
def test_a_forced_build_replaces_the_image(root: Path) -> None:
    directory = make_image(root, payload=b"old")
    built = image.build_image(root, progress=lambda line: None, force=True)
    assert built.directory == directory
    assert built.kernel.read_bytes() != b"old"
    assert sorted(path.name for path in root.iterdir()) == [image.LOCK_FILE, directory.name]


@pytest.mark.usefixtures("fake_build")
def test_a_damaged_image_is_rebuilt(root: Path) -> None:
    directory = make_image(root)
    (directory / recipe.INITRD_FILE).write_bytes(b"")
    built = image.build_image(root, progress=lambda line: None)
    assert built.initrd.stat().st_size > 0
    assert image.find_image(root) == built


@pytest.mark.usefixtures("fake_build")
def test_leftovers_of_dead_builders_are_removed(root: Path) -> None:
    root.mkdir()
    partial = root / "0123456789abcdef.partial-999999"
    old = root / "0123456789abcdef.old-999998"
    unrelated = root / "notes"
    for directory in (partial, old, unrelated):
        directory.mkdir()
        (directory / "file").write_text("x")
    lines: list[str] = []

    image.build_image(root, progress=lines.append)

    assert not partial.exists()
    assert not old.exists()
    assert (unrelated / "file").exists()
    assert f"removing {partial.name} (left by a builder that did not finish)" in lines


def test_a_failed_build_leaves_no_image_and_keeps_its_log(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_assemble(workdir: Path, **kwargs: Any) -> dict[str, Any]:
        (workdir / recipe.KERNEL_FILE).write_bytes(b"half")
        (workdir / recipe.LOG_FILE).write_text("debootstrap said no\n")
        raise recipe.ImageBuildError("debootstrap failed", command=["debootstrap"], output="E: no")

    monkeypatch.setattr(image, "_check_host", lambda: None)
    monkeypatch.setattr(image, "assemble", failing_assemble)

    with pytest.raises(recipe.ImageBuildError) as caught:
        image.build_image(root, progress=lambda line: None)

    name = recipe.current_key()[:16]
    assert sorted(path.name for path in root.iterdir()) == [
        image.LOCK_FILE,
        f"{name}.failed.log",
    ]
    assert caught.value.log_path == root / f"{name}.failed.log"
    assert caught.value.log_path.read_text() == "debootstrap said no\n"
    assert f"full log: {root / name}.failed.log" in str(caught.value)
    assert image.find_image(root) is None


def test_an_interrupted_build_leaves_no_partial_directory(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(workdir: Path, **kwargs: Any) -> dict[str, Any]:
        (workdir / recipe.KERNEL_FILE).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(image, "_check_host", lambda: None)
    monkeypatch.setattr(image, "assemble", interrupted)
    with pytest.raises(KeyboardInterrupt):
        image.build_image(root, progress=lambda line: None)
    assert [path.name for path in root.iterdir()] == [image.LOCK_FILE]


def test_an_os_error_during_a_build_becomes_a_build_error(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(workdir: Path, **kwargs: Any) -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(image, "_check_host", lambda: None)
    monkeypatch.setattr(image, "assemble", disk_full)
    with pytest.raises(recipe.ImageBuildError, match="No space left on device"):
        image.build_image(root, progress=lambda line: None)
    assert not list(root.glob("*.partial-*"))


def test_a_build_missing_an_artifact_is_not_published(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forgetful(workdir: Path, **kwargs: Any) -> dict[str, Any]:
        info = fake_assemble(workdir, **kwargs)
        (workdir / recipe.ROOTFS_FILE).unlink()
        return info

    monkeypatch.setattr(image, "_check_host", lambda: None)
    monkeypatch.setattr(image, "assemble", forgetful)
    with pytest.raises(recipe.ImageBuildError, match=r"left no rootfs\.squashfs"):
        image.build_image(root, progress=lambda line: None)
    assert image.find_image(root) is None
    assert not list(root.glob("*.partial-*"))


def test_a_builder_that_waited_returns_the_other_builders_image(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image, "_check_host", lambda: None)
    monkeypatch.setattr(image, "assemble", must_not_run)
    root.mkdir()
    other = os.open(root / image.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)
    lines: list[str] = []

    def other_builder() -> None:
        deadline = time.monotonic() + 10
        while not any("waiting" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
        make_image(root)
        os.close(other)

    thread = threading.Thread(target=other_builder)
    thread.start()
    built = image.build_image(root, progress=lines.append)
    thread.join()

    assert built.directory == root / recipe.current_key()[:16]
    assert lines[0] == "another guest image build is running; waiting for it …"
    assert lines[1].startswith(f"image {built.directory.name} was built meanwhile")


def test_it_refuses_a_progress_that_is_not_callable(root: Path) -> None:
    with pytest.raises(TypeError, match="progress"):
        image.build_image(root, progress="loud")  # type: ignore[arg-type]


def test_it_refuses_a_root_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(recipe.ImageBuildError, match="not a directory"):
        image.build_image(file, progress=lambda line: None)


def test_it_refuses_to_build_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(image.os, "geteuid", lambda: 1000)
    with pytest.raises(recipe.ImageBuildError, match="needs root"):
        image._check_host()


def test_it_names_the_packages_of_missing_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(image.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        image.shutil, "which", lambda tool: None if tool in {"lz4", "mksquashfs"} else tool
    )
    with pytest.raises(recipe.ImageBuildError) as caught:
        image._check_host()
    assert "lz4 (package lz4)" in str(caught.value)
    assert "mksquashfs (package squashfs-tools)" in str(caught.value)


def test_a_failing_command_reports_itself_and_its_last_lines(tmp_path: Path) -> None:
    with (tmp_path / "log").open("w") as log:
        build = image_build._Build(tmp_path, log, progress=lambda line: None, keep_fds=())
        with pytest.raises(recipe.ImageBuildError) as caught:
            build.run(["sh", "-c", "for i in $(seq 1 40); do echo line $i; done; exit 3"])
    message = str(caught.value)
    assert message.startswith("sh failed with exit status 3\n")
    assert "command: sh -c 'for i in" in message
    assert "  line 40" in message
    assert "  line 15\n" not in message
    assert "line 1\n" in (tmp_path / "log").read_text()


def test_the_lock_is_held_by_the_builders_children(tmp_path: Path) -> None:
    """A builder killed mid-command must not let the next one delete its children's tree."""
    lock = os.open(tmp_path / image.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    with (tmp_path / "log").open("w") as log:
        build = image_build._Build(tmp_path, log, progress=lambda line: None, keep_fds=(lock,))
        out = build.run(["sh", "-c", f"test -e /proc/self/fd/{lock} && echo inherited"])
    os.close(lock)
    assert out.strip() == "inherited"


def test_the_tree_size_counts_hard_links_once(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 1000)
    os.link(tmp_path / "big", tmp_path / "alias")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "small").write_bytes(b"y" * 10)
    (tmp_path / "link").symlink_to("big")
    assert image_build._tree_bytes(tmp_path) == 1000 + 10 + len("big")


# --- initramfs, kernel, modules ---------------------------------------------------------------


def read_cpio(archive: bytes) -> list[tuple[str, int, bytes, tuple[int, int]]]:
    entries: list[tuple[str, int, bytes, tuple[int, int]]] = []
    offset = 0
    while True:
        assert archive[offset : offset + 6] == b"070701"
        fields = [int(archive[offset + 6 + 8 * i : offset + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rdev, namesize = fields[1], fields[6], (fields[9], fields[10]), fields[11]
        name_start = offset + 110
        name = archive[name_start : name_start + namesize - 1].decode()
        data_start = name_start + namesize + (-(110 + namesize) % 4)
        data = archive[data_start : data_start + size]
        offset = data_start + size + (-size % 4)
        if name == "TRAILER!!!":
            assert offset == len(archive)
            return entries
        entries.append((name, mode, data, rdev))


def test_the_initramfs_holds_busybox_modules_in_order_and_init() -> None:
    entries = kernel.initramfs_entries(
        busybox=b"BUSYBOX",
        init=b"#!/bin/busybox sh\n",
        modules=[("virtio_ring.ko", b"ring"), ("virtio.ko", b"virtio")],
    )
    archive = read_cpio(kernel.cpio_newc(entries))
    by_name = {name: (mode, data, rdev) for name, mode, data, rdev in archive}

    assert by_name["init"] == (stat.S_IFREG | 0o755, b"#!/bin/busybox sh\n", (0, 0))
    assert by_name["bin/busybox"] == (stat.S_IFREG | 0o755, b"BUSYBOX", (0, 0))
    assert by_name["dev/console"] == (stat.S_IFCHR | 0o600, b"", (5, 1))
    assert by_name["lib/modules/virtio.ko"][1] == b"virtio"
    assert by_name["lib/modules/load-order"][1] == b"virtio_ring.ko\nvirtio.ko\n"
    assert stat.S_ISDIR(by_name["proc"][0])
    # Parents come before what they hold, as the kernel's unpacker needs.
    names = [name for name, *_rest in archive]
    assert names.index("lib") < names.index("lib/modules") < names.index("lib/modules/virtio.ko")


def test_the_initramfs_is_reproducible() -> None:
    entries = kernel.initramfs_entries(busybox=b"b", init=b"i", modules=[("m.ko", b"m")])
    assert kernel.cpio_newc(entries) == kernel.cpio_newc(entries)


needs_lz4 = pytest.mark.skipif(shutil.which("lz4") is None, reason="needs the lz4 tool")


def lz4_legacy(data: bytes) -> bytes:
    return subprocess.run(["lz4", "-l", "-c"], input=data, capture_output=True, check=True).stdout


def fake_bzimage(vmlinux: bytes, *, claimed_size: int | None = None) -> bytes:
    """The parts of an x86 bzImage the extractor reads: setup header and LZ4 payload."""
    size = len(vmlinux) if claimed_size is None else claimed_size
    payload = lz4_legacy(vmlinux) + struct.pack("<I", size)
    setup_sects = 3
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, 0x020F)
    decompressor = b"\x90" * 64
    struct.pack_into("<II", setup, 0x248, len(decompressor), len(payload))
    return bytes(setup) + decompressor + payload + b"\0" * 32


FAKE_VMLINUX = b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 400


@needs_lz4
def test_it_extracts_vmlinux_from_a_bzimage() -> None:
    assert kernel.vmlinux_from_bzimage(fake_bzimage(FAKE_VMLINUX)) == FAKE_VMLINUX


@needs_lz4
def test_it_refuses_a_vmlinux_of_the_wrong_size() -> None:
    with pytest.raises(recipe.ImageBuildError, match="the bzImage says"):
        kernel.vmlinux_from_bzimage(fake_bzimage(FAKE_VMLINUX, claimed_size=12))


@needs_lz4
def test_it_finds_the_payload_without_a_setup_header() -> None:
    blob = b"no header here" + lz4_legacy(FAKE_VMLINUX)
    assert kernel.vmlinux_from_bzimage(blob).startswith(FAKE_VMLINUX)


def test_it_refuses_a_kernel_without_an_lz4_payload() -> None:
    with pytest.raises(recipe.ImageBuildError, match="no LZ4 payload"):
        kernel.vmlinux_from_bzimage(b"\0" * 4096)


@needs_lz4
def test_it_refuses_a_payload_that_is_not_elf() -> None:
    with pytest.raises(recipe.ImageBuildError, match="did not decompress to an ELF"):
        kernel.vmlinux_from_bzimage(fake_bzimage(b"MZ not an elf" * 100))


def fake_module(**fields: str) -> bytes:
    """A minimal ELF64 relocatable object with a .modinfo section."""
    info = b"".join(f"{key}={value}".encode() + b"\0" for key, value in fields.items())
    names = b"\0.modinfo\0.shstrtab\0"
    info_at = 64
    names_at = info_at + len(info)
    headers_at = names_at + len(names) + (-(names_at + len(names)) % 8)
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    header = struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 1, 62, 1, 0, 0, headers_at, 0, 64, 0, 0, 64, 3, 2
    )

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    body = header + info + names
    body += b"\0" * (headers_at - len(body))
    return (
        body
        + section(0, 0, 0, 0)
        + section(1, 1, info_at, len(info))
        + section(10, 3, names_at, len(names))
    )


def test_it_reads_a_modules_modinfo() -> None:
    module = fake_module(license="GPL", depends="virtio,virtio_ring", name="virtio_blk")
    assert kernel.modinfo(module) == {
        "license": "GPL",
        "depends": "virtio,virtio_ring",
        "name": "virtio_blk",
    }


def test_it_refuses_a_module_that_is_not_elf() -> None:
    with pytest.raises(recipe.ImageBuildError, match="ELF"):
        kernel.modinfo(b"MZ" + b"\0" * 100)


@pytest.fixture
def module_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "lib" / "modules" / "6.1.0-test"
    drivers = tree / "kernel" / "drivers"
    drivers.mkdir(parents=True)
    (drivers / "virtio_ring.ko").write_bytes(fake_module(depends=""))
    (drivers / "virtio.ko").write_bytes(fake_module(depends="virtio_ring"))
    (drivers / "virtio_blk.ko").write_bytes(fake_module(depends="virtio,virtio_ring"))
    (drivers / "virtio-rng.ko.xz").write_bytes(
        lzma.compress(fake_module(depends="virtio"), format=lzma.FORMAT_XZ)
    )
    (drivers / "unrelated.ko").write_bytes(fake_module(depends=""))
    (tree / "modules.builtin").write_text("kernel/fs/squashfs/squashfs.ko\n")
    return tree


def test_modules_load_after_their_dependencies_and_builtins_are_skipped(
    module_tree: Path,
) -> None:
    plan = kernel.resolve_modules(module_tree, ["virtio_blk", "squashfs", "virtio-rng"])
    assert [module.name for module in plan.loaded] == [
        "virtio_ring",
        "virtio",
        "virtio_blk",
        "virtio_rng",
    ]
    assert plan.builtin == ["squashfs"]
    rng = plan.loaded[-1]
    # Decompressed, since busybox insmod takes plain .ko files only.
    assert rng.file_name == "virtio_rng.ko"
    assert rng.data.startswith(b"\x7fELF")


def test_it_refuses_a_module_the_kernel_does_not_have(module_tree: Path) -> None:
    with pytest.raises(recipe.ImageBuildError, match="overlay is neither built in nor"):
        kernel.resolve_modules(module_tree, ["virtio", "overlay"])


# --- the guest's scripts ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["init", "pandaweb-guest", "pandaweb-control"])
def test_the_guest_scripts_parse(name: str) -> None:
    subprocess.run(["sh", "-n", str(recipe.GUEST_DIR / name)], check=True)


def test_the_guest_starts_chromium_behind_the_proxy_with_cdp_on_loopback() -> None:
    script = (recipe.GUEST_DIR / "pandaweb-guest").read_text()
    for expected in (
        "--proxy-server=http://10.0.2.100:3128",
        "'--proxy-bypass-list=<-loopback>'",
        "--remote-debugging-port=9222",
        "--user-data-dir=/tmp/profile",
        "TCP-LISTEN:9223,fork,reuseaddr TCP:127.0.0.1:9222",
        "TCP-LISTEN:9224,fork,reuseaddr EXEC:/usr/local/sbin/pandaweb-control",
        'say "chromium started"',
    ):
        assert expected in script


@pytest.fixture
def fake_date(tmp_path: Path) -> Path:
    """A `date` that records what it was asked to set and reports a fixed time."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "date").write_text(
        f'#!/bin/sh\n[ "$1" = -s ] && echo "$2" >>{tmp_path}/set\necho 1700000000.250000000\n'
    )
    (bin_dir / "date").chmod(0o755)
    return bin_dir


def control(request: bytes, bin_dir: Path) -> str:
    completed = subprocess.run(
        [str(recipe.GUEST_DIR / "pandaweb-control")],
        input=request,
        capture_output=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        timeout=10,
        check=True,
    )
    return completed.stdout.decode()


@pytest.mark.parametrize(
    ("request_line", "sets"),
    [
        (b"time 1700000000.25\n", "@1700000000.25"),
        (b"time 1700000000\n", "@1700000000"),
        (b"time 1700000000.123456789", "@1700000000.123456789"),
    ],
)
def test_the_control_port_sets_the_clock(fake_date: Path, request_line: bytes, sets: str) -> None:
    # "ready" first: the host sends its time only once the script listens, so it is fresh.
    assert control(request_line, fake_date) == "ready\nok 1700000000.250000000\n"
    assert (fake_date.parent / "set").read_text() == f"{sets}\n"


@pytest.mark.parametrize(
    ("request_line", "answer"),
    [
        (b"", "error empty request\n"),
        (b"hello\n", "error unknown request\n"),
        (b"time\n", "error unknown request\n"),
        (b"time \n", "error bad time\n"),
        (b"time -5\n", "error bad time\n"),
        (b"time 1.2.3\n", "error bad time\n"),
        (b"time .5\n", "error bad time\n"),
        (b"time 5.\n", "error bad time\n"),
        (b"time 17e8\n", "error bad time\n"),
        (b"time $(reboot)\n", "error bad time\n"),
        (b"time " + b"1" * 30 + b"\n", "error bad time\n"),
    ],
)
def test_the_control_port_refuses_anything_else(
    fake_date: Path, request_line: bytes, answer: str
) -> None:
    assert control(request_line, fake_date) == f"ready\n{answer}"
    assert not (fake_date.parent / "set").exists()


# --- the management command -------------------------------------------------------------------


def test_the_command_reports_a_missing_image(root: Path) -> None:
    with pytest.raises(CommandError, match="no guest image for key"):
        call_command("microvm_image", "--check", "--root", str(root), stdout=StringIO())


def test_the_command_describes_the_current_image(root: Path) -> None:
    directory = make_image(root)
    out = StringIO()
    call_command("microvm_image", "--check", "--root", str(root), stdout=out)
    text = out.getvalue()
    assert f"guest image {directory.name}: {directory}" in text
    assert "rootfs.squashfs" in text
    assert "Chromium 1.2.3" in text


def test_the_command_refuses_check_with_force(root: Path) -> None:
    with pytest.raises(CommandError, match="not allowed with argument"):
        call_command("microvm_image", "--check", "--force", "--root", str(root))


def test_the_command_refuses_a_root_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(CommandError, match="is not a directory"):
        call_command("microvm_image", "--root", str(file), stdout=StringIO())


def test_the_command_looks_in_the_configured_image_dir(root: Path, settings: Any) -> None:
    directory = make_image(root)
    settings.ENGINE_CONFIG = dataclasses.replace(settings.ENGINE_CONFIG, microvm_image_dir=root)
    out = StringIO()
    call_command("microvm_image", "--check", stdout=out)
    assert f"guest image {directory.name}: {directory}" in out.getvalue()


@pytest.mark.usefixtures("fake_build")
def test_the_command_builds_and_prints_progress(root: Path) -> None:
    out = StringIO()
    call_command("microvm_image", "--root", str(root), stdout=out)
    text = out.getvalue()
    name = recipe.current_key()[:16]
    assert f"[1/{recipe.STEPS}] pretend to build …" in text
    assert f"image {name} ready in " in text
    assert "6.1.0-test-cloud-amd64" in text
    assert image.find_image(root) is not None


def test_the_command_turns_a_build_failure_into_a_command_error(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> image.GuestImage:
        raise recipe.ImageBuildError("mksquashfs failed", command=["mksquashfs"], output="boom")

    monkeypatch.setattr(image, "build_image", fail)
    with pytest.raises(CommandError, match=r"(?s)mksquashfs failed.*boom"):
        call_command("microvm_image", "--root", str(root), stdout=StringIO())


# --- the real thing ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.microvm
@pytest.mark.timeout(1800)
def test_a_real_build_makes_a_bootable_looking_image(tmp_path: Path) -> None:
    missing = [tool for tool in recipe.HOST_TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.skip(f"needs root and {', '.join(recipe.HOST_TOOLS)} (missing: {missing})")

    built = image.build_image(tmp_path, progress=lambda line: None)

    assert built.kernel.read_bytes()[:4] == b"\x7fELF"
    with gzip.open(built.initrd) as initrd:
        entries = {name for name, *_rest in read_cpio(initrd.read())}
    assert {"init", "bin/busybox", "lib/modules/load-order", "lib/modules/virtio_net.ko"} <= entries
    with built.rootfs.open("rb") as rootfs:
        assert rootfs.read(4) == b"hsqs"
    assert built.manifest["chromium_version"].startswith("Chromium ")
    assert built.manifest["kernel_version"].endswith("-cloud-amd64")
    assert not list(tmp_path.glob("*.partial-*"))
    # Cached from now on.
    assert image.build_image(tmp_path, progress=lambda line: None) == built
    # A third of a gigabyte; pytest keeps its last few temp dirs around.
    shutil.rmtree(built.directory)


@pytest.fixture
def fake_network(tmp_path: Path) -> Path:
    """`socat` and `getent` that record what they were asked and fail, as in a sealed guest."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("socat", "getent"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "$@" >>{tmp_path}/{name}\nexit 1\n')
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_the_control_port_probes_a_direct_connection(fake_network: Path) -> None:
    assert control(b"probe 10.0.2.2 8001\n", fake_network) == "ready\nok closed\n"
    asked = (fake_network.parent / "socat").read_text()
    assert "TCP:10.0.2.2:8001,connect-timeout=3" in asked


def test_the_control_port_probes_name_resolution(fake_network: Path) -> None:
    assert control(b"resolve pandaweb-probe.invalid\n", fake_network) == "ready\nok unresolved\n"
    assert (fake_network.parent / "getent").read_text() == "hosts pandaweb-probe.invalid\n"


@pytest.mark.parametrize(
    "request_line",
    [b"probe 10.0.2.2\n", b"probe 10.0.2.2 80;reboot\n", b"probe host 80\n", b"resolve A$(x)\n"],
)
def test_the_control_port_refuses_odd_probes(fake_network: Path, request_line: bytes) -> None:
    assert control(request_line, fake_network).split("\n")[1].startswith("error")
    assert not (fake_network.parent / "socat").exists()
    assert not (fake_network.parent / "getent").exists()


def test_the_guest_starts_chromium_with_every_headless_flag() -> None:
    # The guest cannot import pandaweb; its script spells the flags out, and must not drift.
    script = (recipe.GUEST_DIR / "pandaweb-guest").read_text()
    assert [flag for flag in HEADLESS_ARGS if f"    {flag} \\\n" not in script] == []
