"""Session templates: bake, fork, mark stale, retire, re-bake."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Mapping
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
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.models import SessionTemplate
from sessions.services.runstate import host_queue
from sessions.services.sandboxes import sandbox_backend
from workflows.models import WorkflowVersion
from workflows.services import vault

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
        team_id=version.workflow.team_id,
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


def snapshots_whole_vm(backend: str) -> bool:
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
        template, created = request_bake(
            version_id=version_id, user=user, backend=backend, host=host
        )
        if created:
            dispatch(
                task_named("runs.bake_session_template"),
                template_id=template.pk,
                queue=host_queue(host) if host else None,
            )
    return template


def request_bake(
    *, version_id: int, user: User | None, backend: str, host: str, run_id: int | None = None
) -> tuple[SessionTemplate, bool]:
    version = WorkflowVersion.objects.select_related("workflow").get(pk=version_id)
    if version.status != WorkflowVersion.Status.PUBLISHED or not (version.document or {}).get(
        "session"
    ):
        raise TemplateError(f"version {version.number or 'draft'} has no session template")
    if version.workflow.archived:
        raise TemplateError("this workflow is archived")
    # A person (not the schedule, nor a run's own re-bake) re-bakes their team's templates only.
    if user is not None and not user_can(
        user, Capability.LAUNCH_RUNS, team_id=version.workflow.team_id
    ):
        raise TemplateError("you may not re-bake another team's session templates")
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


def bake_finished(
    template_id: int, *, state: str, state_path: str, host: str, run_id: int | None
) -> SessionTemplate:
    """A bake captured its session: the template is ready and the ones it replaces retire."""
    key = SessionTemplate.objects.values("version_id", "backend").get(pk=template_id)
    with transaction.atomic():
        # One order for every lock: by primary key (the templates this bake replaces are older).
        rows = list(
            SessionTemplate.objects.select_for_update()
            .select_related("version__workflow")
            .filter(**key, pk__lte=template_id)
            .filter(Q(pk=template_id) | Q(status__in=(T.READY, T.STALE, T.FAILED), host=host))
            .order_by("pk")
        )
        *replaced, template = rows
        if template.status != T.BAKING:
            # Given up on while it baked (see _fail_abandoned_bakes): the capture is not used.
            _discard_state_file(state_path, host)
            return template
        template.status = T.READY
        template.state = state
        template.state_path = state_path
        template.host = host
        template.baked_at = timezone.now()
        template.save()
        _template_audit(
            template,
            "baked",
            actor_kind=AuditEvent.ActorKind.RUNNER,
            before={"status": T.BAKING},
            after={
                "snapshot": "saved VM" if state_path else "storage state (encrypted)",
                "host": host,
            },
            run_id=run_id,
        )
        for old in replaced:
            _retire(old, reason=f"replaced by session template #{template.pk}")
    return template


def bake_failed(template_id: int, reason: str, *, run_id: int | None) -> SessionTemplate:
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
            fresh, created = request_bake(
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
                bake_failed(template.pk, "the worker baking it stopped answering", run_id=None)
        elif template.created_at + BAKE_START_PATIENCE < now:
            bake_failed(template.pk, "no worker started the bake", run_id=None)
