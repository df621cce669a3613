"""Session templates: bake, fork, mark stale, retire, re-bake."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.core.dispatch import dispatch, task_named
from sessions.models import Run, SessionTemplate
from sessions.services.records import event_append, lock_run
from sessions.services.runstate import host_queue
from sessions.services.sandboxes import sandbox_backend
from sessions.services.writer import _Heartbeat, _Sink
from workflows.models import Credential, WorkflowVersion
from workflows.schema import credentials_used
from workflows.services import vault
from workflows.vault import VaultError

logger = logging.getLogger(__name__)

# Session templates ------------------------------------------------------------------------------
#
# A workflow's ``session`` block logs in once per bake; runs fork the result. A template is baked
# on request (a person, the schedule, or the first run of a version that never had one), goes
# ready, and is forked until a run finds it logged out (stale) or a newer bake retires it. A stale
# or failed template is never re-baked on its own: a person looks first (a changed password
# retried on every run locks the account).

T = SessionTemplate.Status
# A request nobody started within this long (its task was lost) gives way to a new one.
BAKE_START_PATIENCE = timedelta(hours=1)


class TemplateError(Exception):
    """A bake that cannot be requested; the message is for people."""


@dataclass(frozen=True)
class _Fork:
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


def lock_template(template_id: int) -> SessionTemplate:
    return SessionTemplate.objects.select_for_update().get(pk=template_id)


def templates_dir() -> Path:
    """Where saved VMs of session templates live (next to the runs' files)."""
    return Path(settings.RUN_FILES_DIR).parent / "session-templates"


def _template_audit(
    template: SessionTemplate,
    action: str,
    *,
    actor: User | None = None,
    actor_kind: AuditEvent.ActorKind | None = None,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    run_id: int | None = None,
) -> None:
    version = template.version
    audit_record(
        action=f"session_template.{action}",
        object_type="session_template",
        object_id=template.pk,
        actor=actor,
        actor_kind=actor_kind,
        before=before,
        after={"status": template.status, **(after or {})},
        run_id=run_id,
        extra={
            "workflow": version.workflow.slug,
            "version": version.number,
            "backend": template.backend,
        },
    )


def _snapshots_whole_vm(backend: str) -> bool:
    return callable(getattr(sandbox_backend(backend), "snapshot", None))


def template_request_bake(
    *, version_id: int, user: User | None, backend: str, host: str = ""
) -> SessionTemplate:
    """Queue a bake of a published version's session template for ``backend`` (``user`` None:
    the schedule; ``host`` names the machine that must bake a saved-VM template).

    Idempotent while one is baking: that template is returned and nothing more is queued.
    Raises TemplateError when the version has no session block or its workflow is archived.
    """
    with transaction.atomic():
        template, created = _request_bake(
            version_id=version_id, user=user, backend=backend, host=host
        )
        if created:
            dispatch(
                task_named("runs.bake_session_template"),
                template_id=template.pk,
                queue=host_queue(host) if host else None,
            )
    return template


def _request_bake(
    *, version_id: int, user: User | None, backend: str, host: str, run_id: int | None = None
) -> tuple[SessionTemplate, bool]:
    version = WorkflowVersion.objects.select_related("workflow").get(pk=version_id)
    if version.status != WorkflowVersion.Status.PUBLISHED or not (version.document or {}).get(
        "session"
    ):
        raise TemplateError(f"version {version.number or 'draft'} has no session template")
    if version.workflow.archived:
        raise TemplateError("this workflow is archived")
    baking = SessionTemplate.objects.filter(
        version=version, backend=backend, host=host, status=T.BAKING
    )
    existing = baking.first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            template = SessionTemplate.objects.create(
                version=version, backend=backend, host=host, requested_by=user
            )
    except IntegrityError:
        # Another request won the race (the one-bake-at-a-time constraint); its bake is ours.
        return baking.get(), False
    _template_audit(
        template,
        "bake_requested",
        actor=user,
        after={"host": host, "for_run": run_id} if run_id else {"host": host},
        run_id=run_id,
    )
    return template, True


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
        return _bake_failed(template_id, str(exc), run_id=run_id)
    return _bake_ready(template_id, capture, run_id=run_id)


def _bake(template: SessionTemplate, *, run_id: int | None) -> _Capture:
    from sessions.engine.egress_policy import EgressPolicy
    from sessions.engine.proxy import EgressProxy
    from sessions.engine.runner import PUBLIC_CREDENTIAL_FIELDS, Runner, RunPlan, SessionCheck
    from sessions.engine.sandbox.base import SandboxError, SandboxSpec

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
            credentials = _open_credentials(names, run_id=run_id, template_id=template.pk)
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
    from sessions.engine.runner import MASK

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


def _open_credentials(
    names: list[str], *, run_id: int | None, template_id: int | None = None
) -> dict[str, dict[str, str]]:
    """Decrypt credentials for a run or a bake; each use is audited, never the value."""
    box = vault()
    values = {}
    for credential in Credential.objects.filter(name__in=names).order_by("name"):
        values[credential.name] = box.open(credential.ciphertext)
        audit_record(
            action="credential.used",
            object_type="credential",
            object_id=credential.pk,
            actor_kind=AuditEvent.ActorKind.RUNNER,
            after={"name": credential.name},
            run_id=run_id,
            extra={"session_template": template_id} if template_id else None,
        )
    return values


def _bake_ready(template_id: int, capture: _Capture, *, run_id: int | None) -> SessionTemplate:
    key = SessionTemplate.objects.values("version_id", "backend").get(pk=template_id)
    with transaction.atomic():
        # One order for every lock: by primary key (the templates this bake replaces are older).
        rows = list(
            SessionTemplate.objects.select_for_update()
            .select_related("version__workflow")
            .filter(**key, pk__lte=template_id)
            .filter(
                Q(pk=template_id) | Q(status__in=(T.READY, T.STALE, T.FAILED), host=capture.host)
            )
            .order_by("pk")
        )
        *replaced, template = rows
        if template.status != T.BAKING:
            # Given up on while it baked (see _fail_abandoned_bakes): the capture is not used.
            _discard_state_file(capture.state_path, capture.host)
            return template
        template.status = T.READY
        template.state = capture.state
        template.state_path = capture.state_path
        template.host = capture.host
        template.baked_at = timezone.now()
        template.save()
        _template_audit(
            template,
            "baked",
            actor_kind=AuditEvent.ActorKind.RUNNER,
            before={"status": T.BAKING},
            after={
                "snapshot": "saved VM" if capture.state_path else "storage state (encrypted)",
                "host": capture.host,
            },
            run_id=run_id,
        )
        for old in replaced:
            _retire(old, reason=f"replaced by session template #{template.pk}")
    return template


def _bake_failed(template_id: int, reason: str, *, run_id: int | None) -> SessionTemplate:
    with transaction.atomic():
        template = lock_template(template_id)
        if template.status != T.BAKING:
            return template
        template.status = T.FAILED
        template.failure_reason = reason
        template.ended_at = timezone.now()
        template.save(update_fields=["status", "failure_reason", "ended_at"])
        _template_audit(
            template,
            "bake_failed",
            actor_kind=AuditEvent.ActorKind.RUNNER,
            before={"status": T.BAKING},
            after={"reason": reason},
            run_id=run_id,
        )
    return template


def template_mark_stale(
    *, template_id: int, reason: str, run_id: int | None = None
) -> SessionTemplate:
    """A fork woke up logged out: the template is stale until a person re-bakes it, and its
    state (useless now, still secret) is dropped. Idempotent: a template that is not ready is
    left as it is. Inside the caller's transaction when there is one (the run's failure)."""
    with transaction.atomic():
        template = lock_template(template_id)
        if template.status != T.READY:
            return template
        template.status = T.STALE
        template.stale_reason = reason
        template.ended_at = timezone.now()
        _drop_state(template)
        template.save()
        _template_audit(
            template,
            "stale",
            actor_kind=AuditEvent.ActorKind.RUNNER,
            before={"status": T.READY},
            after={"reason": reason},
            run_id=run_id,
        )
    return template


def template_retire(*, template_id: int, reason: str) -> SessionTemplate:
    """Stop using a template and drop its state. Idempotent."""
    with transaction.atomic():
        template = lock_template(template_id)
        if template.status not in (T.READY, T.STALE, T.FAILED):
            return template
        _retire(template, reason=reason)
    return template


def _retire(template: SessionTemplate, *, reason: str) -> None:
    """Retire a locked template (in the caller's transaction)."""
    before = template.status
    template.status = T.RETIRED
    template.ended_at = timezone.now()
    _drop_state(template)
    template.save()
    _template_audit(template, "retired", before={"status": before}, after={"reason": reason})


def _drop_state(template: SessionTemplate) -> None:
    """Forget a locked template's snapshot; a saved VM's file goes once the change commits."""
    path, host = template.state_path, template.host
    template.state = ""
    template.state_path = ""
    if path:
        transaction.on_commit(lambda: _discard_state_file(path, host))


def _discard_state_file(path: str, host: str) -> None:
    if not path:
        return
    if host and host != socket.gethostname():
        task_named("runs.discard_session_template_state").apply_async(
            kwargs={"path": path}, queue=host_queue(host)
        )
        return
    template_discard_state(path=path)


def template_discard_state(*, path: str) -> None:
    """Delete a saved VM (and its metadata file) of a session template. Idempotent; refuses any
    path outside the templates directory."""
    target = Path(path).resolve()
    if not target.is_relative_to(templates_dir().resolve()):
        logger.warning("not deleting %s: outside the session templates directory", path)
        return
    for file in (target, target.with_name(target.name + ".json")):
        with contextlib.suppress(FileNotFoundError):
            file.unlink()


@transaction.atomic
def template_states_reencrypt() -> int:
    """Re-encrypt the saved login of every ready session template with the newest vault key
    (key rotation, next to ``credentials_reencrypt``). Idempotent; all or nothing: a state that
    no configured key opens raises VaultError."""
    box = vault()
    count = 0
    ready = SessionTemplate.objects.select_for_update().filter(status=T.READY).exclude(state="")
    for template in ready.order_by("pk"):
        template.state = box.rotate(template.state)
        template.save(update_fields=["state"])
        count += 1
    if count:
        audit_record(
            action="session_template.keys_rotated",
            object_type="session_template",
            object_id="*",
            after={"templates": count, "keys_configured": len(settings.CREDENTIAL_KEYS)},
        )
    return count


def template_rebake_due() -> list[int]:
    """The schedule (Celery beat; the housekeeping thread in the embedded default): ready
    templates older than their version's ``rebake_every_hours`` get a new bake, templates of a
    version that is no longer its live workflow's latest are retired, and bakes whose worker
    went quiet fail. Idempotent. Returns the templates whose bake it queued."""
    now = timezone.now()
    _fail_abandoned_bakes(now)
    latest: dict[int, int | None] = {}
    queued = []
    ready = SessionTemplate.objects.filter(status=T.READY).select_related("version__workflow")
    for template in ready.order_by("pk"):
        version = template.version
        workflow = version.workflow
        if workflow.pk not in latest:
            latest[workflow.pk] = (
                workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
                .order_by("-number")
                .values_list("pk", flat=True)
                .first()
            )
        if workflow.archived or latest[workflow.pk] != version.pk:
            why = "the workflow is archived" if workflow.archived else "a newer version exists"
            template_retire(template_id=template.pk, reason=why)
            continue
        hours = int(((version.document or {}).get("session") or {}).get("rebake_every_hours", 12))
        if template.baked_at is None or template.baked_at + timedelta(hours=hours) > now:
            continue
        with transaction.atomic():
            fresh, created = _request_bake(
                version_id=version.pk, user=None, backend=template.backend, host=template.host
            )
            if created:
                dispatch(
                    task_named("runs.bake_session_template"),
                    template_id=fresh.pk,
                    queue=host_queue(template.host) if template.host else None,
                )
                queued.append(fresh.pk)
    return queued


def _fail_abandoned_bakes(now: Any) -> None:
    for template in SessionTemplate.objects.filter(status=T.BAKING).select_related("version"):
        ttl = template.version.settings_model.run_ttl_minutes
        if template.bake_started_at is not None:
            if template.bake_started_at + timedelta(minutes=ttl + 5) < now:
                _bake_failed(template.pk, "the worker baking it stopped answering", run_id=None)
        elif template.created_at + BAKE_START_PATIENCE < now:
            _bake_failed(template.pk, "no worker started the bake", run_id=None)


def _fork_for(run_id: int, sink: _Sink) -> _Fork | str:
    """The template a starting run forks, or why it cannot start. The newest ready template is
    forked; one being baked is waited for; a stale or failed one fails the run (a person
    re-bakes it); a version that never had one is baked here, inline: the only time the login
    is on a run's path."""
    beat = _Heartbeat(run_id, sink)  # the reaper must not take a long bake for a dead worker
    beat.start()
    try:
        return _pick_or_bake(run_id)
    finally:
        beat.stop()


def _pick_or_bake(run_id: int) -> _Fork | str:
    from sessions import selectors
    from sessions.engine.runner import STALE_SESSION
    from sessions.engine.sandbox.base import SandboxError

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
                host = here if _snapshots_whole_vm(backend) else ""
                with transaction.atomic():
                    fresh, created = _request_bake(
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
        return _Fork(
            template_id=template.pk, storage_state=storage, restore_from=template.state_path
        )
