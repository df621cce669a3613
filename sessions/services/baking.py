"""Baking session templates and forking them for a run: the part of session templates that runs
a browser (the worker's side; the records, requests and retirement are in ``templates``)."""

from __future__ import annotations

import json
import logging
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from sessions import selectors
from sessions.engine.egress_policy import EgressPolicy
from sessions.engine.plan import RunPlan, SessionCheck
from sessions.engine.proxy import EgressProxy
from sessions.engine.runner import Runner
from sessions.engine.sandbox.base import SandboxError, SandboxSpec
from sessions.engine.vocabulary import MASK, PUBLIC_CREDENTIAL_FIELDS, STALE_SESSION
from sessions.models import Run, SessionTemplate
from sessions.services.credentials import CredentialRefused, credentials_open
from sessions.services.records import event_append, lock_run
from sessions.services.sandboxes import sandbox_backend
from sessions.services.templates import (
    T,
    TemplateError,
    bake_failed,
    bake_finished,
    request_bake,
    snapshots_whole_vm,
    templates_dir,
)
from sessions.services.writer import Heartbeat, RunSink
from workflows.schema import credentials_used
from workflows.services import vault
from workflows.vault import VaultError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fork:
    """What a run takes from the template it forks: decrypted only in the worker that uses it."""

    template_id: int
    storage_state: dict[str, Any] | None
    restore_from: str


@dataclass(frozen=True)
class _Capture:
    state: str  # the sealed storage state, or ''
    state_path: str  # a saved VM, or ''
    host: str


class _BakeFailed(Exception):
    pass


def template_bake(*, template_id: int, run_id: int | None = None) -> SessionTemplate:
    """Bake a requested template (the body of the bake task; a run whose version never had a
    template calls it inline): in a fresh sandbox behind the workflow's egress proxy, run the
    session steps with the credentials, check the logged-in element, then save the whole VM
    (backends with ``snapshot``) or capture the storage state, encrypted.

    Not re-entrant: only the first call claims the template; a later one (a redelivered task)
    returns it as it is.
    """
    claimed = SessionTemplate.objects.filter(
        pk=template_id, status=T.BAKING, bake_started_at__isnull=True
    ).update(bake_started_at=timezone.now())
    template = SessionTemplate.objects.select_related("version__workflow").get(pk=template_id)
    if claimed != 1:
        return template
    try:
        capture = _bake(template, run_id=run_id)
    except _BakeFailed as exc:
        return bake_failed(template_id, str(exc), run_id=run_id)
    return bake_finished(
        template_id,
        state=capture.state,
        state_path=capture.state_path,
        host=capture.host,
        run_id=run_id,
    )


def _bake(template: SessionTemplate, *, run_id: int | None) -> _Capture:
    document = template.version.document or {}
    session = document["session"]
    run_settings = template.version.settings_model
    ttl = run_settings.run_ttl_minutes * 60
    names = sorted(set(run_settings.credentials) & credentials_used(session["steps"]))
    try:
        backend = sandbox_backend(template.backend)
    except SandboxError as exc:
        raise _BakeFailed(str(exc)) from None
    snapshot = getattr(backend, "snapshot", None)
    proxy = EgressProxy(
        EgressPolicy(run_settings.allowed_hosts),
        on_denied=lambda attempt: logger.debug(
            "session template %s: egress to %s refused", template.pk, attempt.host
        ),
    )
    proxy.start()
    sandbox = None
    typed: list[str] = []
    try:
        sandbox = backend.create(
            SandboxSpec(
                run_key=f"bake-{template.pk}-{secrets.token_hex(4)}",
                proxy_url=proxy.url,
                ttl_seconds=ttl + 30,
            )
        )
        with transaction.atomic():
            credentials = credentials_open(
                names,
                team_id=template.version.workflow.team_id,
                run_id=run_id,
                template_id=template.pk,
            )
        typed = [
            value
            for fields in credentials.values()
            for name, value in fields.items()
            if value and name not in PUBLIC_CREDENTIAL_FIELDS
        ]
        plan = RunPlan(
            steps=session["steps"],
            inputs={},
            secrets=credentials,
            step_budget=len(session["steps"]),
            deadline=time.time() + ttl,
            artifacts_dir=templates_dir() / f"{template.pk}-files",
            time_scale=float(sandbox.details.get("time_scale") or 1.0),
            session=SessionCheck(url=session["check_url"], logged_in=session["logged_in"]),
            baking=True,
            capture_state=snapshot is None,
        )
        outcome = Runner(plan, _BakeSink()).run(
            sandbox.cdp_url, artifacts_dir=sandbox.details.get("artifacts_dir")
        )
        if outcome.status != "succeeded":
            where = f"session step '{outcome.failed_step}': " if outcome.failed_step else ""
            raise _BakeFailed(where + outcome.reason)
        if snapshot is None:
            sealed = vault().seal({"storage_state": json.dumps(outcome.storage_state)})
            return _Capture(state=sealed, state_path="", host="")
        destination = templates_dir() / f"template-{template.pk}.vm"
        destination.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        saving, sandbox = sandbox, None  # saving the VM ends it
        snapshot(saving, destination)
        return _Capture(state="", state_path=str(destination), host=socket.gethostname())
    except _BakeFailed:
        raise
    except CredentialRefused as exc:
        raise _BakeFailed(str(exc)) from None
    except SandboxError as exc:
        raise _BakeFailed(f"the browser sandbox failed: {_masked(str(exc), typed)}") from None
    except Exception as exc:  # the browser died under us, or Playwright lost it
        logger.exception("baking session template %s crashed", template.pk)
        reason = _masked(str(exc)[:300], typed)
        raise _BakeFailed(f"the browser stopped unexpectedly: {reason}") from None
    finally:
        if sandbox is not None:
            try:
                backend.destroy(sandbox)
            except Exception:  # a sandbox that is already gone must not hide the outcome
                logger.exception("destroying bake sandbox %s failed", sandbox.run_key)
        proxy.stop()


def _masked(text: str, typed: list[str]) -> str:
    for value in sorted(typed, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


class _BakeSink:
    """A bake's steps are not a run's: nothing is kept of them but how they ended."""

    def step_finished(self, record: Any) -> None:
        pass

    def action_starting(self, index: int) -> None:
        raise RuntimeError("session templates have no irreversible steps")

    def action_finished(self, index: int, result: str = "") -> None:
        raise RuntimeError("session templates have no irreversible steps")

    def action_refused(self, index: int, reason: str) -> None:
        raise RuntimeError("session templates have no irreversible steps")

    def stop_reason(self) -> str | None:
        return None


def fork_for(run_id: int, sink: RunSink) -> Fork | str:
    """The template a starting run forks, or why it cannot start. The newest ready template is
    forked; one being baked is waited for; a stale or failed one fails the run (a person
    re-bakes it); a version that never had one is baked here, inline: the only time the login
    is on a run's path."""
    beat = Heartbeat(run_id, sink)  # the reaper must not take a long bake for a dead worker
    beat.start()
    try:
        return _pick_or_bake(run_id)
    finally:
        beat.stop()


def _pick_or_bake(run_id: int) -> Fork | str:
    here = socket.gethostname()
    run = Run.objects.select_related("version", "launched_by").get(pk=run_id)
    backend = run.sandbox_backend
    while True:
        state = Run.objects.filter(pk=run_id).values("status", "cancel_requested").get()
        if state["cancel_requested"] or state["status"] in Run.FINAL:
            return "the run was cancelled while its session template was baked"
        if run.deadline_at is not None and timezone.now() >= run.deadline_at:
            return "the run's time limit was reached while its session template was baked"
        template = selectors.session_template_pick(
            version_id=run.version_id, backend=backend, hosts=("", here)
        )
        if template is None:
            try:
                host = here if snapshots_whole_vm(backend) else ""
                with transaction.atomic():
                    fresh, created = request_bake(
                        version_id=run.version_id, user=run.launched_by, backend=backend,
                        host=host, run_id=run_id,
                    )  # fmt: skip
                    if created:
                        locked = lock_run(run_id)
                        event_append(
                            locked, "session_template", {"phase": "baking", "template": fresh.pk}
                        )
                        locked.save(update_fields=["last_event_seq"])
            except (TemplateError, SandboxError) as exc:
                return f"the session template cannot be baked: {exc}"
            if created:
                template_bake(template_id=fresh.pk, run_id=run_id)
            continue
        if template.status == T.BAKING:
            time.sleep(1.0)
            continue
        if template.status == T.STALE:
            return STALE_SESSION
        if template.status == T.FAILED:
            return f"the session template could not be baked ({template.failure_reason}) — re-bake"
        try:
            storage = (
                json.loads(vault().open(template.state)["storage_state"])
                if template.state
                else None
            )
        except (VaultError, KeyError, ValueError):
            return "the session template's state cannot be decrypted — re-bake"
        return Fork(
            template_id=template.pk, storage_state=storage, restore_from=template.state_path
        )
