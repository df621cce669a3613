"""Kernel namespaces around the local backend's browser (no Django imports).

The browser runs in network, mount, PID and IPC namespaces (a worker that is not root makes them
inside a user namespace, where it is root), and holds no capability at all:

- Its network namespace has nothing but a loopback interface. The only way out is a relay that
  listens on the namespace's ``127.0.0.1:3128`` and forwards to ``proxy.sock`` in the workdir,
  where a relay on the host connects to the run's real proxy: path-named Unix sockets cross
  network namespaces, nothing else does. CDP comes in the other way, through the run's CDP gate
  (``sessions.engine.sandbox.cdp_gate``: a host loopback port that forwards only requests carrying
  the run's secret) and ``cdp.sock`` to the browser's ``127.0.0.1:9222``.
- Its mount namespace has fresh, empty tmpfs on ``/tmp``, ``/run`` and ``/dev/shm`` (the host's
  service sockets and shared memory live there), on the sandbox root (hiding every other run's
  directory and sockets) with only its own workdir bound back in, and on ``profile/``; and a
  read-only copy of ``/etc/chromium`` holding pandaweb's managed policy (Chromium's own
  background traffic off) over the host's.
- Its PID namespace holds only the sandbox: the browser sees no host process, and when the
  namespace's PID 1 dies the kernel kills everything inside.

The process tree is one process group whose leader's pid is its id; every member names the
workdir on its command line, so the watchdog and ``stop_browser`` find them all::

    sh <workdir> ...                    host side: a SIGTERM kills the whole group at once; when
      socat (proxy.sock → the proxy)    unshare ends (the browser exited) it stops the relays
      cdp_gate (127.0.0.1:N → cdp.sock) and exits with the browser's status
      unshare ... sh <workdir> ...      PID 1 inside: mounts, lo up, the inner relays, waits
        socat (127.0.0.1:3128 → proxy.sock)
        socat (cdp.sock → 127.0.0.1:9222)
        chromium ...                    (through setpriv, which drops every capability)

Needs ``unshare``, ``mount`` and ``setpriv`` (util-linux), ``ip`` (iproute2) and ``socat``.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sessions.engine.chromium import MANAGED_POLICY_NAME, managed_policy_json
from sessions.engine.sandbox import cdp_gate

__all__ = [
    "INNER_CDP_PORT",
    "INNER_PROXY_PORT",
    "Support",
    "browser_proxy_url",
    "command",
    "path_problem",
    "place_policy",
    "prepare",
    "probe",
    "relay_port",
]

INNER_CDP_PORT = 9222
INNER_PROXY_PORT = 3128
_CDP_GATE_LOG = "cdp-gate.log"
# The pid of unshare, which itself lives in the new network namespace.
_UNSHARE_PID = "unshare.pid"

# ``ip`` lives in sbin, which a worker's PATH often lacks.
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TOOLS = ("unshare", "mount", "ip", "socat", "setpriv")

# socat reads commas, colons and quotes in an address as syntax, and an fstab splits its fields
# at blanks: the workdir's path goes into both.
_SAFE_PATH = re.compile(r"/[A-Za-z0-9_./-]+")

# The browser's CDP socket in /proc/net/tcp: 127.0.0.1:9222, any remote, state LISTEN.
_CDP_LISTENING = f"0100007F:{INNER_CDP_PORT:04X} 00000000:0000 0A"

# The mounts, in order, as an fstab for one ``mount --all`` (one program started instead of six
# while the browser waits). The sources are named "sandbox" because mount skips an entry whose
# source, type and target are all mounted already (the host's /dev/shm is "tmpfs" too). By the
# bind mount the workdir's own path is hidden, under the new /tmp or the sandbox root's tmpfs,
# but mount's working directory still holds it: the kernel resolves /proc/self/cwd to that
# directory, where mount(8), had it been let canonicalize the path, would find the hidden name.
_FSTAB_FILE = "ns.fstab"
_FSTAB = """\
sandbox /tmp tmpfs mode=1777,nosuid,nodev 0 0
sandbox /run tmpfs mode=755,nosuid,nodev 0 0
sandbox /dev/shm tmpfs mode=1777,nosuid,nodev 0 0
sandbox {root} tmpfs mode=700,X-mount.mkdir 0 0
/proc/self/cwd {workdir} none bind,X-mount.mkdir 0 0
sandbox {workdir}/profile tmpfs mode=700 0 0
"""

# Debian's Chromium reads its managed policy from CHROMIUM_ETC/policies/managed, a path no
# switch changes. The sandbox sees its own copy of the directory, read-only, with pandaweb's
# policy in it (see ``place_policy``).
CHROMIUM_ETC = Path("/etc/chromium")
_POLICY_DIR = "chromium-etc"
_POLICY_MOUNT = "{source} {target} none bind,ro 0 0\n"

# Runs as PID 1 of the new namespaces, in the workdir ($1). Every step must succeed: a sandbox
# half set up (say, with the host's /tmp still visible) must not start a browser.
_PRELUDE = """\
set -e
{ip} link set lo up
{mount} --all --no-canonicalize --fstab "$1/{fstab}"
cd "$1"
"""

# The browser gives up every capability, for good: with CAP_SYS_ADMIN it could unmount the
# tmpfs above and see the host's /tmp and the other sandboxes' sockets again, and as real root
# (a root worker without a user namespace) it could leave its namespaces altogether.
_DROP_CAPABILITIES = "{setpriv} --no-new-privs --bounding-set=-all --inh-caps=-all"

_INNER_MAIN = """\
{socat} -lf "$1/ns-proxy.log" TCP-LISTEN:{proxy_port},bind=127.0.0.1,fork,reuseaddr \
"UNIX-CONNECT:$1/proxy.sock" &
{socat} -lf "$1/ns-cdp.log" "UNIX-LISTEN:$1/cdp.sock,fork" TCP:127.0.0.1:{cdp_port} &
shift
{drop} "$@" &
wait $!
"""

# The leader, on the host, in the workdir ($1); $2 is the real proxy's host:port. Nothing in the
# sandbox is worth a graceful stop (the profile is a tmpfs that dies with it), and unshare
# ignores SIGTERM: on stop_browser's polite signal the whole group goes at once. When the
# namespace ends by itself (the browser exited) the host relays and their connections go, and
# the leader exits with the browser's status, for the error message.
_HOST = """\
trap 'kill -KILL 0' TERM
w=$1
{socat} -lf "$w/proxy-relay.log" "UNIX-LISTEN:$w/proxy.sock,fork,mode=600" "TCP:$2" &
{gate} "$w" "unix:$w/cdp.sock" 2>"$w/{gate_log}" &
shift 2
"$@" &
echo $! > "$w/{unshare_pid}"
wait $!
status=$?
trap '' TERM
kill -TERM 0
exit $status
"""


@dataclass(frozen=True)
class Support:
    """What this host allows, found once per process by ``probe()``."""

    usable: bool
    # Whether the namespaces are made inside a user namespace (for a worker that is not root).
    user: bool = False
    reason: str = ""
    tools: tuple[tuple[str, str], ...] = ()

    @property
    def isolation(self) -> str:
        kinds = "user, network, mount, PID and IPC" if self.user else "network, mount, PID and IPC"
        return f"{kinds} namespaces"

    def tool(self, name: str) -> str:
        return dict(self.tools)[name]


def _unshare_args(unshare: str, *, user: bool) -> list[str]:
    return [
        unshare,
        *(["--user", "--map-root-user"] if user else []),
        "--net",
        "--mount",
        "--pid",
        "--ipc",
        "--fork",
        # PID 1 inside dies with unshare, and the kernel then kills the rest of the namespace.
        "--kill-child",
        "--mount-proc",
    ]


def _prelude(tools: dict[str, str]) -> str:
    return _PRELUDE.format(
        ip=shlex.quote(tools["ip"]), mount=shlex.quote(tools["mount"]), fstab=_FSTAB_FILE
    )


def _drop(tools: dict[str, str]) -> str:
    return _DROP_CAPABILITIES.format(setpriv=shlex.quote(tools["setpriv"]))


def prepare(workdir: Path) -> None:
    """Lay out what the namespaces need in a fresh workdir: the profile's mount point, the
    browser's policy directory and the fstab of the mounts."""
    (workdir / "profile").mkdir(mode=0o700)
    fstab = _FSTAB.format(root=workdir.parent, workdir=workdir)
    if place_policy(workdir):
        fstab += _POLICY_MOUNT.format(source=workdir / _POLICY_DIR, target=CHROMIUM_ETC)
    (workdir / _FSTAB_FILE).write_text(fstab)


def place_policy(workdir: Path) -> bool:
    """Copy the host's Chromium configuration directory into the workdir with pandaweb's
    managed policy added; False when the host has no such directory to mount it over.

    Only the sandbox's mount namespace sees the copy: the host's /etc stays as it is, and two
    sandboxes never share one policy file."""
    if not CHROMIUM_ETC.is_dir():
        return False
    copy = workdir / _POLICY_DIR
    shutil.copytree(CHROMIUM_ETC, copy, symlinks=True)
    managed = copy / "policies" / "managed"
    managed.mkdir(parents=True, exist_ok=True)
    (managed / MANAGED_POLICY_NAME).write_bytes(managed_policy_json())
    return True


def _try(tools: dict[str, str], *, user: bool) -> str:
    """Run the real set-up in a scratch workdir; return why it failed ("" if it did not)."""
    script = f"{_prelude(tools)}{_drop(tools)} true\n"
    with tempfile.TemporaryDirectory(prefix="pandaweb-ns-probe-") as scratch:
        workdir = Path(scratch) / "w"
        workdir.mkdir()
        prepare(workdir)
        try:
            done = subprocess.run(
                [
                    *_unshare_args(tools["unshare"], user=user),
                    "sh",
                    "-c",
                    script,
                    "probe",
                    str(workdir),
                ],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                env={"PATH": _SEARCH_PATH},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
    if done.returncode == 0:
        return ""
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"unshare exited with status {done.returncode}"


@functools.cache
def probe() -> Support:
    """Whether this host can run browsers in namespaces, and how; cached for the process.

    Root goes without a user namespace where it can: the browser drops its capabilities either
    way, and in a user namespace Chromium took some 50 ms longer to start."""
    tools = {}
    for name in _TOOLS:
        found = shutil.which(name, path=_SEARCH_PATH)
        if found is None:
            return Support(usable=False, reason=f"{name} is not installed")
        tools[name] = found
    root = os.geteuid() == 0
    failures = []
    for user in (False, True) if root else (True,):
        failure = _try(tools, user=user)
        if not failure:
            return Support(usable=True, user=user, tools=tuple(tools.items()))
        failures.append(failure)
    if root:
        return Support(usable=False, reason=f"namespaces cannot be made ({'; '.join(failures)})")
    return Support(
        usable=False, reason=f"not root and user namespaces are unavailable ({failures[0]})"
    )


def path_problem(workdir: Path) -> str:
    """Why ``workdir`` cannot be used with namespaces, or ""."""
    if not _SAFE_PATH.fullmatch(str(workdir)):
        return (
            f"the sandbox directory {workdir.parent} has characters other than letters, digits "
            "and ._-/ in its path, which the relays cannot take"
        )
    return ""


def browser_proxy_url(proxy_url: str) -> str:
    """The proxy as the browser sees it: the inner relay, same scheme."""
    return urlunsplit(urlsplit(proxy_url)._replace(netloc=f"127.0.0.1:{INNER_PROXY_PORT}"))


def command(support: Support, *, workdir: Path, proxy_url: str, browser: list[str]) -> list[str]:
    """The leader's command line: ``browser`` (which must listen for CDP on
    ``INNER_CDP_PORT`` and use ``browser_proxy_url``) in its namespaces, with the relays, in a
    workdir laid out by ``prepare``."""
    parts = urlsplit(proxy_url)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    socat = shlex.quote(support.tool("socat"))
    tools = dict(support.tools)
    inner = _prelude(tools) + _INNER_MAIN.format(
        socat=socat, proxy_port=INNER_PROXY_PORT, cdp_port=INNER_CDP_PORT, drop=_drop(tools)
    )
    return [
        "sh",
        "-c",
        _HOST.format(
            socat=socat, gate=_gate_command(), gate_log=_CDP_GATE_LOG, unshare_pid=_UNSHARE_PID
        ),
        "pandaweb-sandbox",
        str(workdir),
        f"{host}:{parts.port}",
        *_unshare_args(support.tool("unshare"), user=support.user),
        "sh",
        "-c",
        inner,
        "pandaweb-sandbox-init",
        str(workdir),
        *browser,
    ]


def _gate_command() -> str:
    # By path with -S: standard library only, so it starts fast and needs the project on no path.
    return " ".join(shlex.quote(part) for part in (sys.executable, "-S", cdp_gate.__file__))


def relay_port(workdir: Path) -> int | None:
    """The host loopback port of the CDP gate once the browser listens behind it and the proxy
    relay listens too (a browser handed out before that would fail its first request).

    Whether the browser listens is read from the namespace's own socket table, through unshare
    (which lives in the namespace): polling through the relays instead would have them fork for
    every refused attempt while the browser starts on the same CPUs."""
    try:
        unshare = int((workdir / _UNSHARE_PID).read_text())
        if _CDP_LISTENING not in Path(f"/proc/{unshare}/net/tcp").read_text():
            return None
        if not (workdir / "proxy.sock").exists():
            return None
        return int((workdir / cdp_gate.PORT_FILE).read_text())
    except (OSError, ValueError):
        return None
