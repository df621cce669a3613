"""Credentials over the API: list them, store one, replace its value. The credentials page's form
checks each request and its services store it, so the rules, the messages and the audit events
are the page's. Values are write-only: no answer and no audit event carries one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django import forms
from django.contrib.auth.models import User
from django.http import HttpRequest
from django.urls import reverse
from ninja import Router, Schema, Status
from pydantic import Field

from pandaweb.api.access import token_with_scope
from pandaweb.api.problems import Problem, field_errors
from pandaweb.api.scopes import Scope
from workflows import selectors, services
from workflows.forms import CredentialForm, CredentialValueForm
from workflows.models import Credential

router = Router(tags=["credentials"])

INVALID = "the request is not valid"
SECRET_FIELDS = frozenset(CredentialForm.SECRET_FIELDS)

Kind = Literal["username_password", "totp", "api_token"]

VALUES_DESCRIPTION = (
    "The secret, write-only: username and password for username_password, seed for totp, token "
    "for api_token. Never answered back."
)


class CredentialOut(Schema):
    name: str
    team: str = Field(description="The slug of the team whose workflows alone may use it.")
    kind: str
    description: str
    used_by: list[str] = Field(description="The slugs of the workflows that use it.")
    created_by: str
    created_at: datetime
    value_changed_at: datetime = Field(description="When its value was last set.")
    links: dict[str, str]


class CredentialIn(Schema):
    name: str = Field(description="Letters, digits, - and _; how workflow files name it.")
    kind: Kind
    description: str = ""
    team: str | None = Field(
        None,
        description="The slug of the team whose workflows may use it; needed only by someone "
        "who writes workflows in several teams.",
    )
    values: dict[str, str] = Field(description=VALUES_DESCRIPTION)


class CredentialValueIn(Schema):
    values: dict[str, str] = Field(description=VALUES_DESCRIPTION)


def _out(credential: Credential) -> CredentialOut:
    return CredentialOut(
        name=credential.name,
        team=credential.team.slug,
        kind=credential.kind,
        description=credential.description,
        used_by=[w.slug for w in credential.workflows.all()],
        created_by=credential.created_by.get_username(),
        created_at=credential.created_at,
        value_changed_at=credential.value_changed_at,
        links={"value": reverse("api:credential_value", kwargs={"name": credential.name})},
    )


def _path(name: str) -> str:
    """A field of the form as the request names it: the secret fields are under ``values``."""
    if name == "__all__":
        return ""
    return f"values.{name}" if name in SECRET_FIELDS else name


def _refused(errors: dict[str, list[str]]) -> Problem:
    """Messages never quote a value (the form's and the service's say what is wrong only)."""
    return Problem(422, INVALID, errors=field_errors({_path(n): m for n, m in errors.items()}))


def _checked(form: forms.Form, values: dict[str, str], kind: str) -> None:
    """The page's form checks the fields; a value the kind does not take is refused rather than
    dropped, so nobody believes a seed was stored with a password."""
    takes = CredentialValueForm.KIND_FIELDS[Credential.Kind(kind)]
    errors: dict[str, list[str]] = {
        name: [f"a {kind} credential takes {' and '.join(takes)}, not {name}"]
        for name in sorted(values)
        if name not in takes
    }
    if not form.is_valid():
        for name, messages in form.errors.get_json_data().items():
            errors.setdefault(name, []).extend(m["message"] for m in messages)
    if errors:
        raise _refused(errors)


def _credential(name: str, user: User) -> Credential:
    """The credential, 404 also when it is another team's."""
    return selectors.credential_get(user=user, name=name)


@router.get(
    "/", response=list[CredentialOut], url_name="credential_list", summary="List credentials"
)
def credential_list(request: HttpRequest) -> list[CredentialOut]:
    """Every credential by name, with its kind, the workflows that use it and when its value
    was set: what the credentials page shows, for the teams where the token's owner sees
    workflows. Never a value. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    return [_out(c) for c in selectors.credential_list(user=context.user)]


@router.post(
    "/", response={201: CredentialOut}, url_name="credential_create", summary="Store a credential"
)
def credential_create(request: HttpRequest, payload: CredentialIn) -> Status[CredentialOut]:
    """Store a new secret encrypted, as the credentials page's form does (audited as
    ``credential.created``, by name). A name in use is a 422 on ``name``; a missing or
    malformed value a 422 on ``values.<field>``; without ``team``, from someone who writes
    workflows in several teams, a 422 on ``team``. Scope: ``credentials:write``."""
    context = token_with_scope(request, Scope.CREDENTIALS_WRITE)
    data: dict[str, Any] = {
        "name": payload.name,
        "kind": payload.kind,
        "description": payload.description,
        **{k: v for k, v in payload.values.items() if k in SECRET_FIELDS},
    }
    form = CredentialForm(data)
    _checked(form, payload.values, payload.kind)
    try:
        credential = services.credential_create(
            user=context.user,
            team=payload.team,
            name=form.cleaned_data["name"],
            kind=form.cleaned_data["kind"],
            description=form.cleaned_data["description"],
            values=form.secret_values(),
        )
    except services.WorkflowError as exc:
        raise _refused(exc.field_errors) from None
    return Status(201, _out(_credential(credential.name, context.user)))


@router.post(
    "/{name}/value",
    response=CredentialOut,
    url_name="credential_value",
    summary="Replace a credential's value",
)
def credential_replace_value(
    request: HttpRequest, name: str, payload: CredentialValueIn
) -> CredentialOut:
    """Replace the secret (the portal's password changed); its name, kind and the workflows
    using it stay. Runs from now on type the new value. Audited as
    ``credential.value_replaced``, by name. Scope: ``credentials:write``."""
    context = token_with_scope(request, Scope.CREDENTIALS_WRITE)
    credential = _credential(name, context.user)
    form = CredentialValueForm(payload.values, kind=credential.kind)
    _checked(form, payload.values, credential.kind)
    try:
        services.credential_replace_value(
            credential_id=credential.pk, user=context.user, values=form.secret_values()
        )
    except services.WorkflowError as exc:
        if not exc.field_errors:
            raise Problem(403, str(exc), type="credential-refused") from None
        raise _refused(exc.field_errors) from None
    return _out(_credential(name, context.user))
