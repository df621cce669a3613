"""Credentials: secrets sealed with the credential keys (``vault``), created, replaced and
re-encrypted under a new key. Audit events name a credential, never its value."""

from __future__ import annotations

import base64
import binascii

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from workflows.models import Credential
from workflows.services.errors import NotYourTeam, WorkflowError
from workflows.services.teams import team_for_new
from workflows.vault import Vault


def vault() -> Vault:
    return Vault(settings.CREDENTIAL_KEYS)


def _credential_payload(kind: str, values: dict[str, str]) -> dict[str, str]:
    """Check a credential's fields for its kind; messages never repeat the value."""
    errors: dict[str, list[str]] = {}

    def need(field: str, limit: int) -> str:
        value = values.get(field, "")
        if not value:
            errors.setdefault(field, []).append("this field is required")
        elif len(value) > limit:
            errors.setdefault(field, []).append(f"at most {limit} characters")
        return value

    if kind == Credential.Kind.USERNAME_PASSWORD:
        payload = {"username": need("username", 300), "password": need("password", 1000)}
    elif kind == Credential.Kind.TOTP:
        seed = need("seed", 200).replace(" ", "").upper()
        if seed:
            try:
                base64.b32decode(seed + "=" * (-len(seed) % 8))
            except (binascii.Error, ValueError):
                errors.setdefault("seed", []).append("not a base32 TOTP seed (letters A–Z, 2–7)")
        payload = {"seed": seed}
    elif kind == Credential.Kind.API_TOKEN:
        payload = {"token": need("token", 4000)}
    else:
        errors["kind"] = ["unknown kind"]
        payload = {}
    if errors:
        raise WorkflowError("invalid credential", errors)
    return payload


@transaction.atomic
def credential_create(
    *,
    user: User,
    name: str,
    kind: str,
    description: str,
    values: dict[str, str],
    team: str | None = None,
) -> Credential:
    """Store a new secret encrypted, for the workflows of the team ``team`` (a slug; see
    ``team_for_new`` when None) only. The audit event names it, never its value."""
    joins = team_for_new(user, team)
    payload = _credential_payload(kind, values)
    try:
        with transaction.atomic():
            credential = Credential.objects.create(
                name=name,
                team=joins,
                kind=kind,
                description=description,
                ciphertext=vault().seal(payload),
                created_by=user,
                value_changed_at=timezone.now(),
            )
    except IntegrityError:
        raise WorkflowError("taken", {"name": [f"a credential named '{name}' exists"]}) from None
    audit_record(
        action="credential.created",
        object_type="credential",
        object_id=credential.pk,
        actor=user,
        after={"name": name, "kind": kind, "description": description},
        team_id=joins.pk,
    )
    return credential


@transaction.atomic
def credential_replace_value(
    *, credential_id: int, user: User, values: dict[str, str]
) -> Credential:
    """Replace a secret's value (the portal password changed). Its name and scope stay. Only
    who authors workflows in its team replaces it."""
    credential = Credential.objects.select_for_update().get(pk=credential_id)
    if not user_can(user, Capability.AUTHOR_WORKFLOWS, team_id=credential.team_id):
        raise NotYourTeam(f"you may not change {credential.team}'s credentials")
    credential.ciphertext = vault().seal(_credential_payload(credential.kind, values))
    credential.value_changed_at = timezone.now()
    credential.save(update_fields=["ciphertext", "value_changed_at"])
    audit_record(
        action="credential.value_replaced",
        object_type="credential",
        object_id=credential.pk,
        team_id=credential.team_id,
        actor=user,
        after={"name": credential.name},
    )
    return credential


@transaction.atomic
def credentials_reencrypt(*, actor: User | None = None) -> int:
    """Re-encrypt every credential with the newest key, so older keys can be retired.

    Idempotent. Fails as a whole (nothing changes) if any credential cannot be decrypted.
    """
    box = vault()
    count = 0
    for credential in Credential.objects.select_for_update().order_by("pk"):
        credential.ciphertext = box.rotate(credential.ciphertext)
        credential.save(update_fields=["ciphertext"])
        count += 1
    audit_record(
        action="credential.keys_rotated",
        object_type="credential",
        object_id="*",
        actor=actor,
        after={"credentials": count, "keys_configured": len(settings.CREDENTIAL_KEYS)},
    )
    return count
