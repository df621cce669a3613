"""The ``pandastack`` backend: the run's Chromium inside a remote PandaStack Firecracker microVM.

Built on the ``pandastack`` Python SDK (0.10.x), configured by the ``EngineConfig`` handed in
(``pandastack_api``, default ``https://api.pandastack.ai``, and ``pandastack_api_key``, which
settings read from ``PANDASTACK_API`` and ``PANDASTACK_API_KEY``). The SDK can create, exec
into, write files into, snapshot and kill a sandbox; it offers no egress rules, no tunnel and no
way to reach a guest port privately. Three pieces fill the gap:

``gate`` (a standard-library Python program written into the guest, ``pandastack_gate``)
    starts Chromium with its DevTools port on the guest's loopback, and listens on
    ``gate_port``, which the platform's *authenticated* port proxy
    (``{api}/v1/sandboxes/{id}/proxy/{port}/...``, the ``proxy_url`` that ``GET /ports``
    reports) reaches. Every request must carry a per-sandbox secret, so the platform's public
    preview URLs (``https://{port}-{id}.{suffix}``, no authentication) get a 403. It also takes
    the worker's egress tunnels (below) and kills Chromium at the deadline.
relay (in the worker, on 127.0.0.1; ``pandastack_link``)
    what ``cdp_url`` points at. It adds the API key and the gate secret to each CDP request and
    rewrites the WebSocket URLs Chromium reports (they name the guest's own address) to itself,
    so ``connect_over_cdp(cdp_url)`` works unchanged. The API key never enters the guest: the
    platform's proxy strips ``Authorization`` before forwarding.
tunnels (in the worker; ``pandastack_link``)
    the run's egress proxy listens on the worker's loopback, which a remote guest cannot reach.
    The worker keeps a few WebSocket-upgraded connections open *into* the gate; when Chromium
    opens a proxy connection to the gate's loopback port, the gate hands it to one of them and
    the worker connects it to ``spec.proxy_url``. Chromium is given the same routing flags as in
    the other backends (``sessions.engine.chromium.chromium_proxy_args``), aimed at the gate, so
    every request is still judged and recorded by the run's ``EgressProxy``.

What this backend cannot do, and says so in ``details["isolation_warning"]``: the microVM has
its own network, and the PandaStack API has no control over it. Chromium is held to the proxy by
its flags, as in a local sandbox without namespaces, not by the VM's network; a browser context
opened over CDP with a proxy setting of its own (``direct://``) would reach the internet from
PandaStack's network. Downloads do not work: Chromium writes them inside the guest, where
Playwright on the worker cannot read them (no ``details["artifacts_dir"]`` is offered).

Lifetime: ``ttl_seconds`` on PandaStack is an *idle* TTL (the agent's reaper deletes a sandbox
that has had no API request for that long), kept server side, so the remote sandbox dies by
itself even if the worker dies. The run's deadline itself is enforced inside the guest by the
gate, which kills Chromium when it passes (``extend`` moves it). The gate counts time on the
guest's monotonic clock from the remaining seconds the worker writes, so a VM clock that is off
(a restored snapshot's often is) does not move the deadline.

The relay and the tunnels live in the process that called ``create``, like the run's egress
proxy itself: if that process dies, the browser loses its only way out and CDP goes with it.
``destroy``, ``alive``, ``extend`` and ``snapshot`` only need the API and work from any process
with the same ``PANDASTACK_*`` settings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shlex
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sessions.engine.chromium import HEADLESS_ARGS, chromium_proxy_args
from sessions.engine.config import EngineConfig
from sessions.engine.sandbox.base import Sandbox, SandboxError, SandboxSpec
from sessions.engine.sandbox.pandastack_gate import GATE_SOURCE
from sessions.engine.sandbox.pandastack_link import (
    TUNNEL_PATH,
    Link,
    Upstream,
    drop_link,
    keep_link,
)
from sessions.engine.sandbox.workdirs import json_version

__all__ = ["PandaStackBackend"]

logger = logging.getLogger(__name__)

GATE_PORT = 8765
GUEST_PROXY_PORT = 3128
GUEST_DIR = "/var/tmp/pandaweb"  # noqa: S108 - a path in the guest, created 0700 by us
GUEST_CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

_ISOLATION_WARNING = (
    "PandaStack gives no control over the microVM's network: the VM can reach the internet "
    "directly. The browser's traffic reaches the run's egress proxy (through a tunnel to this "
    "worker) because of its proxy flags only, as in a local sandbox without namespaces; a "
    "browser context opened with a proxy setting of its own would bypass it."
)


def _deadline_text(remaining: float) -> str:
    # The nonce makes every write a change the gate notices, even with the same remaining time.
    return json.dumps({"remaining": remaining, "nonce": secrets.token_hex(4)})


class PandaStackBackend:
    """Chromium in a PandaStack microVM, reached through the platform's authenticated port
    proxy; see the module docstring for the gate, the relay and the tunnels."""

    name = "pandastack"

    def __init__(
        self,
        config: EngineConfig,
        *,
        client: Any = None,
        ttl_margin: float = 120.0,
        ready_timeout: float = 90.0,
        guest_dir: str = GUEST_DIR,
        gate_host: str = "0.0.0.0",  # noqa: S104 - the guest's own interface, behind the gate secret
        gate_port: int = GATE_PORT,
        guest_proxy_port: int = GUEST_PROXY_PORT,
        guest_chromium: Sequence[str] = GUEST_CHROMIUM,
        tunnels: int = 8,
        create_retry_seconds: float = 30.0,
    ) -> None:
        self._client_instance = client
        self.template = config.pandastack_template
        self.api_url = config.pandastack_api
        self.api_key = config.pandastack_api_key
        self.ttl_margin = ttl_margin
        self.ready_timeout = ready_timeout
        self.guest_dir = guest_dir.rstrip("/")
        self.gate_host = gate_host
        self.gate_port = gate_port
        self.guest_proxy_port = guest_proxy_port
        self.guest_chromium = tuple(guest_chromium)
        self.tunnels = tunnels
        self.create_retry_seconds = create_retry_seconds

    # -- the SDK ---------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._client_instance is None:
            try:
                import pandastack
            except ImportError as exc:
                raise SandboxError(
                    "the pandastack backend needs the pandastack SDK: pip install "
                    "'pandastack>=0.10,<0.11'"
                ) from exc
            # Unset, the SDK falls back to its own defaults (its config file, its public API).
            client = pandastack.Client(
                api_url=self.api_url or None,
                api_key=self.api_key or None,
                max_create_retry_seconds=self.create_retry_seconds,
            )
            if not client.api_key:
                raise SandboxError(
                    "PANDASTACK_API_KEY is not set: the pandastack backend cannot reach the API"
                )
            self._client_instance = client
        return self._client_instance

    def _box(self, client: Any, sandbox_id: str) -> Any:
        from pandastack import Sandbox as RemoteSandbox

        return RemoteSandbox.from_dict({"id": sandbox_id, "status": "running"}, client=client)

    def _remote_id(self, client: Any, sandbox: Sandbox) -> str:
        sandbox_id = str(sandbox.details.get("sandbox_id", ""))
        if not sandbox_id:
            raise SandboxError(f"sandbox record of {sandbox.run_key} names no PandaStack sandbox")
        recorded = str(sandbox.details.get("api_url", ""))
        if recorded and recorded.rstrip("/") != str(client.api_url).rstrip("/"):
            # Deleting through another API would answer 404 and look like success.
            raise SandboxError(
                f"sandbox {sandbox.run_key} lives on {recorded}, but this worker's "
                f"PANDASTACK_API is {client.api_url}"
            )
        return sandbox_id

    # -- create ----------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> Sandbox:
        from pandastack import AuthError, BadRequestError, PandastackError

        started = time.time()
        t0 = time.monotonic()
        client = self._client()
        restore = self._restore_point(spec, client)
        remote_ttl = math.ceil(spec.ttl_seconds + self.ttl_margin)
        try:
            box = client.sandboxes.create(
                template=self.template,
                ttl_seconds=remote_ttl,
                # Tags the sandbox so that one whose create response was lost can be found.
                metadata={"pandaweb_run_key": spec.run_key, "pandaweb_host": socket.gethostname()},
                from_snapshot=restore.get("snapshot_id") if restore else None,
            )
        except PandastackError as exc:
            if not isinstance(exc, AuthError | BadRequestError):
                # A 5xx, a timeout or a dropped connection may follow a create that went through.
                self._reap_tagged(client, spec.run_key)
            raise SandboxError(f"PandaStack did not create a sandbox: {exc}") from exc
        link: Link | None = None
        try:
            upstream = Upstream(client, box.id, self.gate_port)
            self._start_gate(box, spec, upstream.secret, adopt=restore is not None)
            link = Link(upstream, spec.proxy_url, self.tunnels)
            link.start()
            version = self._wait_ready(box, link, t0)
            sandbox = Sandbox(
                backend=self.name,
                run_key=spec.run_key,
                cdp_url=link.relay.url,
                # Nothing runs on this host but the relay thread: no process to signal.
                pid=0,
                pgid=0,
                workdir="",
                started_at=started,
                deadline=started + spec.ttl_seconds,
                ready_seconds=time.monotonic() - t0,
                host=socket.gethostname(),
                details={
                    "isolation": "firecracker microVM (PandaStack, remote)",
                    "sandbox_id": box.id,
                    "api_url": client.api_url,
                    "template": self.template,
                    "remote_ttl_seconds": remote_ttl,
                    "restored_from": restore.get("snapshot_id", "") if restore else "",
                    "browser": version.get("Browser", ""),
                    "proxy_url": spec.proxy_url,
                    "window_size": list(spec.window_size),
                    "extra_args": list(spec.extra_args),
                    "guest_dir": self.guest_dir,
                    "gate_port": self.gate_port,
                    "isolation_warning": _ISOLATION_WARNING,
                },
            )
        except BaseException as exc:
            # BaseException: a Ctrl-C or a Celery soft timeout must not leave a VM running.
            if link is not None:
                link.stop()
            note = self._kill_quietly(client, box.id, remote_ttl)
            if isinstance(exc, SandboxError):
                raise SandboxError(f"{exc}{note}") from exc
            if isinstance(exc, PandastackError | OSError):
                raise SandboxError(f"the PandaStack sandbox did not start: {exc}{note}") from exc
            raise
        keep_link(spec.run_key, link)
        return sandbox

    def _restore_point(self, spec: SandboxSpec, client: Any) -> dict[str, Any] | None:
        source = str(getattr(spec, "restore_from", "") or "")
        if not source:
            return None
        try:
            point = json.loads(Path(source).read_text())
        except (OSError, ValueError):
            raise SandboxError(f"the saved browser {source} is missing or unreadable") from None
        if not isinstance(point, dict) or point.get("backend") != self.name:
            raise SandboxError(f"{source} is not a PandaStack snapshot reference")
        if str(point.get("api_url", "")).rstrip("/") != str(client.api_url).rstrip("/"):
            raise SandboxError(f"{source} was saved on {point.get('api_url')}, not here")
        # The restored Chromium keeps running with the flags it was started with.
        if point.get("window_size") != list(spec.window_size) or point.get("extra_args") != list(
            spec.extra_args
        ):
            raise SandboxError(
                f"{source} holds a browser started with another window size or other flags"
            )
        return point

    def _guest_args(self, spec: SandboxSpec) -> list[str]:
        scheme = urlsplit(spec.proxy_url).scheme
        width, height = spec.window_size
        # The run's proxy URL names the worker's loopback; in the guest the same flags point at
        # the gate, whose tunnels end at that proxy. A caller's copy of the worker-side flags
        # would route to nothing in the guest, so it is dropped.
        extra = [arg for arg in spec.extra_args if arg not in spec.fixed_flags]
        return [
            "--headless=new",
            "--remote-debugging-port=0",
            f"--user-data-dir={self.guest_dir}/profile",
            *HEADLESS_ARGS,
            *chromium_proxy_args(f"{scheme}://127.0.0.1:{self.guest_proxy_port}"),
            f"--window-size={width},{height}",
            *extra,
            "about:blank",
        ]

    def _start_gate(self, box: Any, spec: SandboxSpec, secret: str, *, adopt: bool) -> None:
        from pandastack import CommandFailed

        d = self.guest_dir
        config = {
            "dir": d,
            "secret": secret,
            "profile": f"{d}/profile",
            "gate_host": self.gate_host,
            "gate_port": self.gate_port,
            "proxy_port": self.guest_proxy_port,
            "tunnel_path": TUNNEL_PATH,
            "chromium": list(self.guest_chromium),
            "args": self._guest_args(spec),
            "adopt": adopt,
        }
        qd = shlex.quote(d)
        try:
            box.exec(f"mkdir -p {qd} && chmod 700 {qd}", check=True)
        except CommandFailed as exc:
            raise SandboxError(f"could not prepare {d} in the sandbox: {exc.stderr}") from exc
        # The directory is 0700 before the secret is written into it.
        box.filesystem.write(f"{d}/gate.json", json.dumps(config))
        box.filesystem.write(f"{d}/gate.py", GATE_SOURCE)
        box.filesystem.write(f"{d}/deadline", _deadline_text(spec.ttl_seconds))
        result = box.exec(
            f"cd {qd} && chmod 600 gate.json && "
            "if ! command -v python3 >/dev/null 2>&1; then "
            "echo 'python3 is not installed in this template' >&2; exit 127; fi && "
            f"(setsid nohup python3 {qd}/gate.py {qd}/gate.json >>{qd}/gate.log 2>&1 </dev/null &)"
        )
        if result.exit_code != 0:
            raise SandboxError(
                f"could not start pandaweb's gate in the sandbox: "
                f"{(result.stderr or result.stdout).strip()}"
            )

    def _wait_ready(self, box: Any, link: Link, t0: float) -> dict[str, Any]:
        """Wait until CDP answers through the relay (the path the runner will take) and the
        first egress tunnel is open."""
        while True:
            version = json_version(link.relay.url, timeout=5.0)
            relayed = str((version or {}).get("webSocketDebuggerUrl", ""))
            if relayed.startswith(f"ws://127.0.0.1:{link.relay.port}/") and (
                link.tunnels.connected.is_set()
            ):
                assert version is not None
                return version
            if link.tunnels.gone.is_set():
                raise SandboxError("the PandaStack sandbox disappeared while starting")
            if time.monotonic() - t0 > self.ready_timeout:
                tail = self._guest_log_tail(box)
                what = (
                    "its debugging port did not answer"
                    if version is None
                    else ("no egress tunnel could be opened")
                )
                raise SandboxError(
                    f"the browser in the PandaStack sandbox was not ready within "
                    f"{self.ready_timeout:g} s: {what}"
                    + (f"; last lines of the guest's logs:\n{tail}" if tail else "")
                )
            time.sleep(0.25)

    def _guest_log_tail(self, box: Any, lines: int = 8) -> str:
        kept: list[str] = []
        for name in ("gate.log", "chromium.log"):
            with contextlib.suppress(Exception):
                text = box.filesystem.read(f"{self.guest_dir}/{name}").decode(errors="replace")
                kept += [
                    f"{name}: {line}"
                    for line in text.splitlines()
                    if line.strip() and "dbus" not in line.lower()
                ][-lines:]
        return "\n".join(kept)

    def _kill_quietly(self, client: Any, sandbox_id: str, remote_ttl: int) -> str:
        """Kill a sandbox whose start failed; what to add to the error if that failed too."""
        from pandastack import NotFoundError

        try:
            client.sandboxes.delete(sandbox_id)
        except NotFoundError:
            pass
        except Exception as exc:
            logger.warning("could not kill PandaStack sandbox %s: %s", sandbox_id, exc)
            return (
                f" (and the sandbox {sandbox_id} could not be killed: {exc}; PandaStack deletes "
                f"it after {remote_ttl} s without requests)"
            )
        return ""

    def _reap_tagged(self, client: Any, run_key: str) -> None:
        from pandastack import NotFoundError

        try:
            boxes = client.sandboxes.list()
        except Exception:
            logger.warning("could not list PandaStack sandboxes to find one for %s", run_key)
            return
        for box in boxes:
            if box.metadata.get("pandaweb_run_key") != run_key:
                continue
            try:
                client.sandboxes.delete(box.id)
            except NotFoundError:
                pass
            except Exception:
                logger.warning("could not kill PandaStack sandbox %s", box.id)

    # -- the rest --------------------------------------------------------------------------

    def destroy(self, sandbox: Sandbox) -> None:
        from pandastack import NotFoundError, PandastackError

        drop_link(sandbox.run_key)
        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        try:
            client.sandboxes.delete(sandbox_id)
        except NotFoundError:
            return
        except PandastackError as exc:
            ttl = sandbox.details.get("remote_ttl_seconds", "its TTL")
            raise SandboxError(
                f"could not kill PandaStack sandbox {sandbox_id}: {exc}; PandaStack deletes it "
                f"after {ttl} s without requests"
            ) from exc

    def alive(self, sandbox: Sandbox) -> bool:
        """Whether Chromium answers through the gate. Note: like every request naming the
        sandbox, this counts as activity for PandaStack's idle TTL."""
        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        upstream = Upstream(client, sandbox_id, int(sandbox.details.get("gate_port", GATE_PORT)))
        try:
            response = upstream.request("GET", "/json/version", None, timeout=10)
            return response.status_code == 200 and isinstance(response.json(), dict)
        except Exception:
            return False

    def extend(self, sandbox: Sandbox, deadline: float) -> None:
        from pandastack import NotFoundError, PandastackError

        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        gone = SandboxError(f"sandbox {sandbox.run_key} is gone; its deadline cannot move")
        if not self.alive(sandbox):
            raise gone
        remaining = deadline - time.time()
        box = self._box(client, sandbox_id)
        guest_dir = str(sandbox.details.get("guest_dir", self.guest_dir))
        try:
            box.set_ttl(math.ceil(max(remaining, 0.0) + self.ttl_margin))
            box.filesystem.write(f"{guest_dir}/deadline", _deadline_text(remaining))
        except NotFoundError:
            raise gone from None
        except PandastackError as exc:
            raise SandboxError(f"could not move the deadline of {sandbox.run_key}: {exc}") from exc
        # The gate may have read the old deadline just before the write and be killing it.
        if not self.alive(sandbox):
            raise gone
        sandbox.deadline = deadline

    def snapshot(self, sandbox: Sandbox, destination: Path) -> None:
        """Save the VM (memory and disk) on PandaStack, write a reference to it at
        ``destination`` for ``SandboxSpec.restore_from``, and destroy the sandbox.

        The gate is stopped first, so a restored copy does not wake up with this run's secret and
        deadline; Chromium keeps running into the snapshot and the new sandbox's gate adopts it.
        """
        from pandastack import PandastackError

        client = self._client()
        sandbox_id = self._remote_id(client, sandbox)
        box = self._box(client, sandbox_id)
        guest_dir = shlex.quote(str(sandbox.details.get("guest_dir", self.guest_dir)))
        try:
            drop_link(sandbox.run_key)
            box.exec(f'kill -KILL "$(cat {guest_dir}/gate.pid)" 2>/dev/null; true')
            snapshot_id = box.snapshot()
            if not snapshot_id:
                raise SandboxError("PandaStack answered the snapshot without an id")
            point = {
                "backend": self.name,
                "snapshot_id": snapshot_id,
                "api_url": client.api_url,
                "template": sandbox.details.get("template", self.template),
                "window_size": sandbox.details.get("window_size"),
                "extra_args": sandbox.details.get("extra_args", []),
                "saved_at": time.time(),
            }
            partial = destination.with_name(f".{destination.name}.{os.getpid()}")
            partial.write_text(json.dumps(point, indent=2))
            partial.replace(destination)
        except PandastackError as exc:
            raise SandboxError(f"could not snapshot the PandaStack sandbox: {exc}") from exc
        finally:
            self.destroy(sandbox)
