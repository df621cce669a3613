"""The ``microvm`` backend: one QEMU ``microvm`` per run, Chromium inside (no Django imports).

The isolation boundary is a guest kernel. The guest has no network of its own (``restrict=on``
user networking): the only ways in or out are two loopback forwards (CDP and a clock control
port) and one guest forward to ``10.0.2.100:3128``, which reaches the run's egress proxy
through a relay on a Unix socket in the sandbox's directory. Where the worker is root, QEMU runs
in a network namespace of its own, so its forwards are out of every other host process's reach,
and the run's CDP gate (``sessions.engine.sandbox.cdp_gate``, secret required) is the way in. Until
the proxy relay is started the guest cannot reach anything at all, which is what lets a warm
pool hold VMs before their run is known.

Runs start by restoring a saved VM (Chromium started, blank page) instead of booting: ~1 s instead
of ~19 s under TCG. The base state is made once per image and machine configuration; session
templates save their own after logging in (``snapshot()``).

The layout of ``<root>/<name>/`` follows the local backend (marker, ``deadline``, ``pgid``,
``sandbox.json``), so its watchdog and ``reap_orphans`` destroy VMs too, plus ``qmp.sock``,
``proxy.sock``, ``serial.log``, and with a namespace ``cdp.secret`` and ``cdp-gate.port``.

The QEMU process's own pieces (machine, namespace, gate, clock) are in ``vm``; the choice of
KVM or TCG in ``accelerator``; the warm pool and the saved states here.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sessions.engine.config import EngineConfig
from sessions.engine.sandbox._proc import (
    DEADLINE_FILE,
    MARKER,
    PGID_FILE,
    RECORD_FILE,
    atomic_write,
    remove_workdir,
    stop_browser,
)
from sessions.engine.sandbox.base import (
    BEGIN_FRAME,
    FREE_RUNNING,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from sessions.engine.sandbox.microvm import qmp
from sessions.engine.sandbox.microvm.accelerator import Accelerator, choose_accelerator
from sessions.engine.sandbox.microvm.image import GuestImage, find_image
from sessions.engine.sandbox.microvm.vm import (
    GUEST_CDP_PORT,
    GUEST_CONTROL_PORT,
    GUEST_PROXY,
    KERNEL_ARGS,
    MACHINE,
    QEMU,
    VM,
    free_port,
    gate_listens,
    host_tsc_khz,
    log_tail,
    network_namespace_tools,
    own_namespace,
    push_clock,
    qemu_version,
    spawn_gate,
)
from sessions.engine.sandbox.workdirs import (
    WorkdirSandboxes,
    adopt,
    ensure_root,
    json_version,
    spawn_watchdog,
)

__all__ = ["MicroVMBackend"]

logger = logging.getLogger(__name__)

# How long after start QEMU gets to answer, per accelerator (boot vs. restore), in seconds.
_READY_TIMEOUT = {
    ("kvm", False): 20.0,
    ("kvm", True): 10.0,
    ("tcg", False): 120.0,
    ("tcg", True): 30.0,
}
# Saving ~0.5 GiB of guest memory to a file.
_SAVE_TIMEOUT = 120.0
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class MicroVMBackend(WorkdirSandboxes):
    """QEMU ``-M microvm`` per run, restored from a saved state, watched by a dead-man's switch."""

    name = "microvm"

    def __init__(self, config: EngineConfig, *, restore: bool = True) -> None:
        self.root = config.sandbox_dir
        self.images = config.microvm_image_dir
        self.accelerator_setting = config.microvm_accelerator
        self.memory_mib = config.microvm_memory_mib
        # False boots every VM from scratch: only for measuring what restoring saves.
        self.restore = restore
        self.pool_size = config.microvm_pool
        # The guest's headless shell draws its pages on request unless told otherwise.
        self.frames = "request" if config.begin_frame == "auto" else "own"
        self._accelerator: Accelerator | None = None

    @property
    def accelerator(self) -> Accelerator:
        if self._accelerator is None:
            self._accelerator = choose_accelerator(self.accelerator_setting)
            if self._accelerator.warning:
                logger.warning("microVM sandboxes: %s", self._accelerator.warning)
        return self._accelerator

    # -- create ---------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> Sandbox:
        started = time.time()
        t0 = time.monotonic()
        image = self._image()
        state: Path | None
        if spec.restore_from:
            state = Path(spec.restore_from)
            self._check_compatible(state, image, spec.window_size)
            how = "session template fork"
        elif self.restore:
            state = self.ensure_base_state(image, spec.window_size)
            how = "snapshot restore"
        else:
            state = None
            how = "cold boot"
        t_launch = time.monotonic()
        pooled = self._pool(image, spec.window_size).take() if how == "snapshot restore" else None
        if pooled is not None:
            vm, how = pooled, "warm pool"
            atomic_write(vm.workdir / DEADLINE_FILE, repr(started + spec.ttl_seconds))
        else:
            vm = self._launch(spec.run_key, image, spec.window_size, state=state,
                              deadline=started + spec.ttl_seconds)  # fmt: skip
        try:
            vm.relay = self._spawn_relay(vm.workdir, spec.proxy_url)
            version = self._wait_ready(vm, restored=state is not None, t0=t_launch)
            accel = self.accelerator
            sandbox = Sandbox(
                backend=self.name,
                run_key=spec.run_key,
                cdp_url=vm.cdp_url,
                pid=vm.qemu.pid,
                pgid=vm.qemu.pid,
                workdir=str(vm.workdir),
                started_at=started,
                deadline=started + spec.ttl_seconds,
                ready_seconds=time.monotonic() - t0,
                host=socket.gethostname(),
                details={
                    "isolation": "microVM: a guest kernel of its own under QEMU",
                    "accelerator": accel.label,
                    "accelerator_warning": accel.warning,
                    "time_scale": accel.time_scale,
                    "start": how,
                    "launch_to_ready_seconds": round(time.monotonic() - t_launch, 3),
                    "image": image.key,
                    "memory_mib": self.memory_mib,
                    "browser": version.get("Browser", ""),
                    "frames": BEGIN_FRAME if self.frames == "request" else FREE_RUNNING,
                    "watchdog_pid": vm.watchdog.pid,
                    "control_port": vm.control_port,
                    "proxy_url": spec.proxy_url,
                    "window_size": list(spec.window_size),
                },
            )
            atomic_write(vm.workdir / RECORD_FILE, json.dumps(sandbox.to_dict(), indent=2))
        except BaseException:
            self._abandon(vm)
            raise
        for proc in vm.procs:
            adopt(spec.run_key, proc)
        return sandbox

    def _image(self) -> GuestImage:
        image = find_image(self.images)
        if image is None:
            raise SandboxError(
                "no microVM guest image is built for this version: run "
                "`python manage.py microvm_image` first (it takes a few minutes)"
            )
        return image

    def _launch(
        self,
        name: str,
        image: GuestImage,
        window: tuple[int, int],
        *,
        state: Path | None,
        deadline: float,
    ) -> VM:
        ensure_root(self.root)
        workdir = self.root / name
        try:
            workdir.mkdir(mode=0o700)
        except FileExistsError:
            raise SandboxError(f"a sandbox named {name} already exists in {workdir}") from None
        qemu: subprocess.Popen[bytes] | None = None
        try:
            (workdir / MARKER).touch(mode=0o600)
            atomic_write(workdir / DEADLINE_FILE, repr(deadline))
            cdp_port, control_port = free_port(), free_port()
            argv = self._qemu_argv(workdir, image, window, cdp_port, control_port, state)
            isolated = network_namespace_tools()
            if isolated is not None:
                unshare, ip = isolated
                # QEMU's forwards listen in a namespace of their own, which no other process
                # on the host can reach; the CDP gate (with the run's secret) is the way in.
                argv = [unshare, "--net", "--", "sh", "-c", f'{ip} link set lo up && exec "$@"',
                        "pandaweb-qemu", *argv]  # fmt: skip
            env = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
            env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
            with open(workdir / "qemu.log", "wb") as log:
                qemu = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=workdir,
                    start_new_session=True,
                    close_fds=True,
                )
            atomic_write(workdir / PGID_FILE, f"{qemu.pid} {qemu.pid}")
            # Started at once: a worker killed while the VM boots is covered too.
            watchdog = spawn_watchdog(workdir, qemu.pid)
            vm = VM(workdir, qemu, watchdog, cdp_port, control_port)
            if isolated is not None:
                vm.netns = own_namespace(qemu)
                vm.gate = spawn_gate(workdir, f"tcp:127.0.0.1:{cdp_port}", vm.netns)
        except BaseException as exc:
            if qemu is not None:
                qemu.kill()
                qemu.wait()
            stop_browser(str(workdir), None, None, grace=0.0)
            remove_workdir(workdir)
            if isinstance(exc, OSError):
                raise SandboxError(f"could not start QEMU ({QEMU}): {exc}") from exc
            raise
        return vm

    def _qemu_argv(
        self,
        workdir: Path,
        image: GuestImage,
        window: tuple[int, int],
        cdp_port: int,
        control_port: int,
        state: Path | None,
    ) -> list[str]:
        for path in (workdir, image.rootfs, *([state] if state else [])):
            # QEMU splits its option strings on commas.
            if "," in str(path) or "'" in str(path):
                raise SandboxError(f"path {path} contains a comma or quote, which QEMU cannot take")
        width, height = window
        # Each connection the guest opens to the proxy address runs one socat to the relay's
        # socket; -lf puts the workdir on its command line, so stop_browser finds stragglers.
        forward = f"cmd:socat -lf {workdir}/guestfwd.log - UNIX-CONNECT:{workdir}/proxy.sock"
        netdev = ",".join(
            (
                "user",
                "id=net0",
                "restrict=on",
                f"hostfwd=tcp:127.0.0.1:{cdp_port}-:{GUEST_CDP_PORT}",
                f"hostfwd=tcp:127.0.0.1:{control_port}-:{GUEST_CONTROL_PORT}",
                f"guestfwd=tcp:{GUEST_PROXY[0]}:{GUEST_PROXY[1]}-{forward}",
            )
        )
        argv = [
            QEMU,
            "-name", f"pandaweb-{workdir.name}",
            "-M", MACHINE,
            *self.accelerator.qemu_args,
            "-m", str(self.memory_mib),
            "-smp", "1",
            "-nodefaults", "-no-user-config", "-nographic",
            # QEMU gives up system calls it never needs. Not elevateprivileges=deny: the filter
            # is inherited by the guestfwd helpers, and socat fails under it.
            "-sandbox", "on,obsolete=deny,resourcecontrol=deny",
            "-kernel", str(image.kernel),
            "-initrd", str(image.initrd),
            "-append",
            f"{self._kernel_args()} pandaweb.window={width}x{height} pandaweb.frames={self.frames}",
            "-drive", f"id=root,file={image.rootfs},format=raw,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=root",
            "-netdev", netdev,
            "-device", "virtio-net-device,netdev=net0",
            "-device", "virtio-rng-device",
            # path= puts the workdir on QEMU's command line after '=', where mentions() sees it.
            "-chardev", f"file,id=serial0,path={workdir}/serial.log",
            "-serial", "chardev:serial0",
            "-qmp", f"unix:{workdir}/qmp.sock,server=on,wait=off",
        ]  # fmt: skip
        if state is not None:
            argv += ["-incoming", f"exec:cat '{state}'"]
        return argv

    def _kernel_args(self) -> str:
        if self.accelerator.name == "kvm":
            return KERNEL_ARGS
        # On a loaded host the kernel's TSC calibration against the emulated PIT fails and boot
        # hangs on a clock it marked unstable; under TCG the TSC ticks at the host's rate, so
        # that rate is given instead of measured.
        khz = host_tsc_khz()
        return f"{KERNEL_ARGS} tsc_early_khz={khz}" if khz else KERNEL_ARGS

    def _spawn_relay(self, workdir: Path, proxy_url: str) -> subprocess.Popen[bytes]:
        parts = urlsplit(proxy_url)
        if parts.hostname is None or parts.port is None:
            raise SandboxError(f"proxy_url {proxy_url!r} has no host and port")
        with open(workdir / "relay.log", "wb") as log:
            return subprocess.Popen(
                [
                    "socat",
                    "-lf",
                    f"{workdir}/relay.log",
                    f"UNIX-LISTEN:{workdir}/proxy.sock,fork,mode=600",
                    f"TCP:{parts.hostname}:{parts.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                # Not in QEMU's group (a group cannot span sessions): the workdir on its command
                # line is what makes stop_browser() and the watchdog's clean-up find it.
                start_new_session=True,
                close_fds=True,
            )

    def _wait_ready(self, vm: VM, *, restored: bool, t0: float) -> dict[str, Any]:
        timeout = _READY_TIMEOUT[(self.accelerator.name, restored)]
        clock_set = threading.Event()
        pusher: threading.Thread | None = None
        running = not restored
        version: dict[str, Any] | None = None
        while True:
            code = vm.qemu.poll()
            if code is not None:
                raise SandboxError(self._failure(vm, f"QEMU exited with status {code}"))
            if not running:
                running = self._resume(vm)
            elif pusher is None or (not pusher.is_alive() and not clock_set.is_set()):
                # The clock is set while CDP comes up: they cost the guest separate processes.
                pusher = threading.Thread(
                    target=push_clock,
                    args=(vm.control_port, 30.0, clock_set, vm.netns),
                    daemon=True,
                )
                pusher.start()
            if running and version is None and (vm.gate is None or gate_listens(vm)):
                version = json_version(vm.cdp_url, timeout=2.0)
            if version is not None and clock_set.wait(0.05):
                return version
            if time.monotonic() - t0 > timeout:
                raise SandboxError(
                    self._failure(vm, f"the microVM's browser did not answer within {timeout:g} s")
                )
            time.sleep(0.02)

    def _resume(self, vm: VM) -> bool:
        """Start a restored VM once its state is loaded; True when it runs."""
        if not (vm.workdir / "qmp.sock").exists():
            return False  # QEMU has not opened its monitor yet
        try:
            status = qmp.execute(vm.workdir / "qmp.sock", "query-status").get("status")
            if status == "inmigrate":
                return False
            if status != "running":
                qmp.execute(vm.workdir / "qmp.sock", "cont")
        except qmp.MonitorError:
            return False  # the monitor socket is not there yet
        return True

    def _failure(self, vm: VM, what: str) -> str:
        parts = [what]
        for name in ("qemu.log", "serial.log"):
            tail = log_tail(vm.workdir / name)
            if tail:
                parts.append(f"last lines of {name}:\n{tail}")
        return "; ".join(parts)

    def _abandon(self, vm: VM) -> None:
        with contextlib.suppress(FileNotFoundError):
            (vm.workdir / DEADLINE_FILE).unlink()
        for proc in vm.procs:
            with contextlib.suppress(OSError):
                proc.kill()
        stop_browser(str(vm.workdir), vm.qemu.pid, vm.qemu.pid, grace=0.0)
        for proc in vm.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        remove_workdir(vm.workdir)

    def _pool(self, image: GuestImage, window: tuple[int, int]) -> _WarmPool:
        key = f"{self.root}:{self.fingerprint(image, window)}"
        with _POOLS_LOCK:
            pool = _POOLS.get(key)
            if pool is None or pool.size != self.pool_size:
                if pool is not None:
                    pool.close()
                pool = _POOLS[key] = _WarmPool(self, image, window, self.pool_size)
            return pool

    # -- saved states ---------------------------------------------------------------------

    def fingerprint(self, image: GuestImage, window: tuple[int, int]) -> str:
        """What a saved state depends on: restoring it anywhere else fails or misbehaves."""
        parts = {
            "image": image.key,
            "accelerator": self.accelerator.name,
            "memory_mib": self.memory_mib,
            "machine": MACHINE,
            "kernel_args": KERNEL_ARGS,
            # --force rebuilds an image in place (same inputs, newer Debian updates).
            "files": image.manifest.get("sha256"),
            "window": list(window),
            "frames": self.frames,
            "qemu": qemu_version(),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]

    def ensure_base_state(self, image: GuestImage, window: tuple[int, int] = (1280, 900)) -> Path:
        """The saved VM every run restores: booted, Chromium started on a blank page. Made once
        per image and machine configuration (a cold boot, ~20 s under TCG), then reused."""
        fingerprint = self.fingerprint(image, window)
        directory = self.images / "states" / fingerprint
        state = directory / "state"
        if state.is_file():
            return state
        with _locked(self.images / "states" / f"{fingerprint}.lock"):
            if state.is_file():  # another process made it while we waited
                return state
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            name = f"base-{fingerprint[:12]}-{secrets.token_hex(3)}"
            t0 = time.monotonic()
            vm = self._launch(name, image, window, state=None, deadline=time.time() + 600)
            try:
                version = self._wait_ready(vm, restored=False, t0=t0)
                boot_seconds = time.monotonic() - t0
                partial = directory / f".state.{os.getpid()}"
                save_seconds = qmp.save_state(
                    vm.workdir / "qmp.sock", partial, timeout=_SAVE_TIMEOUT
                )
            finally:
                self._abandon(vm)
            meta = {
                "fingerprint": fingerprint,
                "boot_seconds": round(boot_seconds, 3),
                "save_seconds": round(save_seconds, 3),
                "browser": version.get("Browser", ""),
                "made_at": time.time(),
            }
            atomic_write(directory / "meta.json", json.dumps(meta, indent=2))
            os.replace(partial, state)
            logger.info(
                "microVM base state %s saved: boot %.1f s, save %.1f s", fingerprint,
                boot_seconds, save_seconds,
            )  # fmt: skip
        return state

    def snapshot(self, sandbox: Sandbox, destination: Path) -> None:
        """Save the whole VM to ``destination`` (plus ``<destination>.json``) and destroy it.

        For session templates: every run started from the file wakes up in this browser, logged
        in, each in a VM of its own. The VM itself does not go on, so no run ever shares it.
        """
        sandbox.check_host()
        workdir = Path(sandbox.workdir)
        partial = destination.with_name(f".{destination.name}.{os.getpid()}")
        image = self._image()
        window = tuple(sandbox.details.get("window_size", (1280, 900)))
        try:
            qmp.save_state(workdir / "qmp.sock", partial, timeout=_SAVE_TIMEOUT)
            meta = {"fingerprint": self.fingerprint(image, (int(window[0]), int(window[1])))}
            atomic_write(destination.with_name(destination.name + ".json"), json.dumps(meta))
            os.replace(partial, destination)
        except qmp.MonitorError as exc:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            raise SandboxError(f"could not save the microVM: {exc}") from exc
        finally:
            self.destroy(sandbox)

    def _check_compatible(self, state: Path, image: GuestImage, window: tuple[int, int]) -> None:
        try:
            meta = json.loads(state.with_name(state.name + ".json").read_text())
        except (OSError, ValueError):
            raise SandboxError(f"the saved VM {state} is missing or unreadable") from None
        if not state.is_file() or meta.get("fingerprint") != self.fingerprint(image, window):
            raise SandboxError(
                "the saved VM was made for another guest image or machine configuration: "
                "bake it again"
            )

    # -- the rest -------------------------------------------------------------------------

    def _check_workdir(self, sandbox: Sandbox, workdir: Path) -> None:
        # A VM from the warm pool keeps the workdir it was restored into.
        named = workdir.name == sandbox.run_key or workdir.name.startswith("pool-")
        if workdir.parent != self.root or not named:
            raise SandboxError(f"sandbox record of {sandbox.run_key} names workdir {workdir}")


class _WarmPool:
    """VMs restored ahead of time, each handed to exactly one run (never reused).

    They wait without any egress: the proxy relay is only started when a run claims one. Their
    deadline is kept a few minutes ahead while this process lives, so a pool left behind by a
    dead worker is destroyed by the watchdogs.
    """

    IDLE_DEADLINE = 300.0

    def __init__(
        self, backend: MicroVMBackend, image: GuestImage, window: tuple[int, int], size: int
    ) -> None:
        self.backend, self.image, self.window, self.size = backend, image, window, size
        self._idle: list[VM] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._wanted = threading.Event()
        if size > 0:
            threading.Thread(target=self._fill_forever, name="microvm-pool", daemon=True).start()
            atexit.register(self.close)

    def take(self) -> VM | None:
        with self._lock:
            while self._idle:
                vm = self._idle.pop(0)
                if vm.qemu.poll() is None:
                    self._wanted.set()
                    return vm
                self.backend._abandon(vm)
        self._wanted.set()
        return None

    def close(self) -> None:
        self._closed.set()
        self._wanted.set()
        with self._lock:
            idle, self._idle = self._idle, []
        for vm in idle:
            self.backend._abandon(vm)

    def _fill_forever(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                missing = self.size - len(self._idle)
                for vm in self._idle:
                    atomic_write(vm.workdir / DEADLINE_FILE, repr(time.time() + self.IDLE_DEADLINE))
            if missing > 0:
                try:
                    vm = self._restore_one()
                except SandboxError:
                    logger.exception("the microVM warm pool could not restore a VM")
                    self._closed.wait(30)
                    continue
                with self._lock:
                    if self._closed.is_set():
                        self.backend._abandon(vm)
                        return
                    self._idle.append(vm)
                continue
            self._wanted.wait(60)
            self._wanted.clear()

    def _restore_one(self) -> VM:
        state = self.backend.ensure_base_state(self.image, self.window)
        t0 = time.monotonic()
        vm = self.backend._launch(
            f"pool-{secrets.token_hex(6)}", self.image, self.window, state=state,
            deadline=time.time() + self.IDLE_DEADLINE,
        )  # fmt: skip
        try:
            self.backend._wait_ready(vm, restored=True, t0=t0)
        except BaseException:
            self.backend._abandon(vm)
            raise
        return vm


_POOLS: dict[str, _WarmPool] = {}
_POOLS_LOCK = threading.Lock()
