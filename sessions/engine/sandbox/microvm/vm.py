"""One QEMU ``microvm`` process as the backend starts it (no Django imports): the machine it
emulates, the ports the guest listens on, the network namespace QEMU gets where the worker is
root, the CDP gate that is the host's only way into that namespace, and the guest's clock,
set from the host's after a restore.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sessions.engine.sandbox import cdp_gate
from sessions.engine.sandbox._proc import atomic_write
from sessions.engine.sandbox.base import SandboxError

QEMU = "qemu-system-x86_64"
GUEST_CDP_PORT = 9223
GUEST_CONTROL_PORT = 9224
GUEST_PROXY = ("10.0.2.100", 3128)
# Keep the PIT: with pit=off TCG hangs calibrating the TSC. ACPI stays on because this kernel
# finds virtio-mmio devices only through microvm's ACPI tables.
MACHINE = "microvm,x-option-roms=off,isa-serial=on,rtc=on,acpi=on"
KERNEL_ARGS = (
    "console=ttyS0 quiet loglevel=1 reboot=t panic=-1 i8042.noaux i8042.nomux i8042.nopnp "
    "i8042.dumbkbd 8250.nr_uarts=1 pci=off tsc=reliable no_timer_check cryptomgr.notests "
    "random.trust_cpu=on rcupdate.rcu_expedited=1"
)


def free_port() -> int:
    """A loopback port free at this moment, for one of QEMU's forwards."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def log_tail(path: Path, lines: int = 10) -> str:
    """The last non-blank lines of a log, for an error message ('' when there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.splitlines()[-lines:] if line.strip())


def push_clock(port: int, timeout: float, done: threading.Event, netns: str = "") -> None:
    """Set the guest's clock to the host's, and ``done`` once the guest confirms it.

    A restored guest wakes up at the time it was saved, and a clock hours behind breaks TLS
    certificate checks and cookie expiry. The guest says "ready" before it reads, so the time
    sent is fresh when it is applied, however slowly the guest started its side.
    """
    try:
        if netns:
            # This thread only: the forward listens in QEMU's namespace.
            cdp_gate.enter_network_namespace(netns)
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            answers = conn.makefile("rb")
            if answers.readline(100).strip() != b"ready":
                return
            conn.sendall(f"time {time.time():.3f}\n".encode())
            if answers.readline(200).startswith(b"ok "):
                done.set()
    except OSError:
        return


def network_namespace_tools() -> tuple[str, str] | None:
    """``unshare`` and ``ip`` when this worker may give QEMU a network namespace (root, so the
    gate may enter it too), else None."""
    if os.geteuid() != 0:
        return None
    search = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    unshare, ip = shutil.which("unshare", path=search), shutil.which("ip", path=search)
    return (unshare, ip) if unshare and ip else None


def own_namespace(qemu: subprocess.Popen[bytes], timeout: float = 10.0) -> str:
    """The path of QEMU's network namespace, once unshare has made it (the gate must not enter
    the host's by starting first)."""
    host = os.readlink("/proc/self/ns/net")
    path = f"/proc/{qemu.pid}/ns/net"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if qemu.poll() is not None:
            raise SandboxError("QEMU exited before its network namespace was made")
        with contextlib.suppress(OSError):
            if os.readlink(path) != host:
                return path
        time.sleep(0.005)
    raise SandboxError(f"QEMU's network namespace was not made within {timeout:g} s")


def spawn_gate(workdir: Path, upstream: str, netns: str) -> subprocess.Popen[bytes]:
    """Start the run's CDP gate, forwarding to ``upstream`` in QEMU's namespace ``netns``, with a
    fresh secret in the workdir."""
    atomic_write(workdir / cdp_gate.SECRET_FILE, secrets.token_urlsafe(32))
    with open(workdir / "cdp-gate.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-S", cdp_gate.__file__, str(workdir), upstream, netns],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            # Its own session, like the proxy relay: the workdir on its command line is what
            # stop_browser() and the watchdog find it by.
            start_new_session=True,
            close_fds=True,
        )


def gate_listens(vm: VM) -> bool:
    """Whether the gate has its port yet; raises ``SandboxError`` if it died first."""
    if vm.gate is not None and vm.gate.poll() is not None:
        raise SandboxError(
            f"the microVM's CDP gate exited: {log_tail(vm.workdir / 'cdp-gate.log')}"
        )
    return (vm.workdir / cdp_gate.PORT_FILE).exists()


def host_tsc_khz() -> int | None:
    """The host CPU's clock rate: under TCG the guest's TSC ticks at it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return round(float(line.split(":", 1)[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


@dataclass
class VM:
    """A QEMU process being started, with what is needed to finish or abandon it."""

    workdir: Path
    qemu: subprocess.Popen[bytes]
    watchdog: subprocess.Popen[bytes]
    cdp_port: int
    control_port: int
    # QEMU's own network namespace ("" when this host cannot make one), where its forwards
    # listen, and the CDP gate that is the host's only way to them.
    netns: str = ""
    gate: subprocess.Popen[bytes] | None = None
    relay: subprocess.Popen[bytes] | None = None

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in (self.qemu, self.watchdog, self.gate, self.relay) if p is not None]

    @property
    def cdp_url(self) -> str:
        """The browser's address for this host's processes: behind the gate with the VM's
        secret, or (without a namespace) QEMU's forward itself."""
        if self.gate is None:
            return f"http://127.0.0.1:{self.cdp_port}"
        port = (self.workdir / cdp_gate.PORT_FILE).read_text().strip()
        secret = (self.workdir / cdp_gate.SECRET_FILE).read_text().strip()
        return f"http://127.0.0.1:{port}/{secret}"


_QEMU_VERSION: str | None = None


def qemu_version() -> str:
    """QEMU's version line, asked once per process (a saved VM restores on the same QEMU only)."""
    global _QEMU_VERSION
    if _QEMU_VERSION is None:
        try:
            out = subprocess.run(
                [QEMU, "--version"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(
                f"{QEMU} is not usable here ({exc}): install Debian's qemu-system-x86"
            ) from exc
        _QEMU_VERSION = out.splitlines()[0] if out else "unknown"
    return _QEMU_VERSION
