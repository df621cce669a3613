"""Opening a run's or a bake's credentials: each use audited, never the value."""

from __future__ import annotations

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from workflows.models import Credential
from workflows.services import vault


class CredentialRefused(Exception):
    """A credential of another team than the workflow's: nothing was decrypted."""


def credentials_open(
    names: list[str],
    *,
    team_id: int | None,
    run_id: int | None,
    template_id: int | None = None,
    scratch_id: int | None = None,
) -> dict[str, dict[str, str]]:
    """Decrypt credentials for a run, a bake or a scratch session of a workflow of the team
    ``team_id``; each use is audited, never the value. Raises CredentialRefused, before
    decrypting any, when one is another team's (publishing refuses that; this holds even for a
    version published before, or a credential moved since)."""
    credentials = list(
        Credential.objects.filter(name__in=names).select_related("team").order_by("name")
    )
    foreign = [c for c in credentials if c.team_id != team_id]
    if foreign:
        raise CredentialRefused(
            "; ".join(
                f"the credential '{c.name}' belongs to {c.team}, not to this workflow's team"
                for c in foreign
            )
        )
    box = vault()
    values = {}
    for credential in credentials:
        values[credential.name] = box.open(credential.ciphertext)
        audit_record(
            action="credential.used",
            object_type="credential",
            object_id=credential.pk,
            team_id=credential.team_id,
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
