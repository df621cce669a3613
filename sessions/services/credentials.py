"""Opening a run's or a bake's credentials: each use audited, never the value."""

from __future__ import annotations

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from workflows.models import Credential
from workflows.services import vault


def credentials_open(
    names: list[str],
    *,
    run_id: int | None,
    template_id: int | None = None,
    scratch_id: int | None = None,
) -> dict[str, dict[str, str]]:
    """Decrypt credentials for a run, a bake or a scratch session; each use is audited, never
    the value."""
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
            extra={
                **({"session_template": template_id} if template_id else {}),
                **({"scratch_session": scratch_id} if scratch_id else {}),
            }
            or None,
        )
    return values
