"""The audit trail over the API: signed exports and chain verification, as Compliance has them
on the audit page.
"""

from __future__ import annotations

from datetime import date

from django.http import FileResponse, HttpRequest
from ninja import Router

from pandaweb.api.access import token_with_scope
from pandaweb.api.documents import serve_file
from pandaweb.api.problems import Problem
from pandaweb.api.schemas import VerifyOut
from pandaweb.api.scopes import Scope
from pandaweb.audit import selectors as audit_selectors
from pandaweb.audit.export import ExportError
from pandaweb.audit.exports import AuditExportError, audit_export_to_file, export_team
from pandaweb.audit.services import audit_verify_database, audit_verify_team

# Audit -------------------------------------------------------------------------------------------

router = Router(tags=["audit"])


@router.get("/export", url_name="audit_export")
def audit_export(
    request: HttpRequest,
    date_from: date | None = None,
    date_to: date | None = None,
    actor: str = "",
    action: str = "",
    workflow: str = "",
    run_id: int | None = None,
    team: str = "",
) -> FileResponse:
    """A signed export (zip) of the events the filters select; dates are whole days. With
    ``team`` (a slug), that team's trail, verifiable on its own; a token whose owner has
    Compliance in some teams only exports one of those (their only one by default)."""
    context = token_with_scope(request, Scope.AUDIT_READ)
    filters = audit_selectors.EventFilters(
        date_from=date_from,
        date_to=date_to,
        actor=actor,
        action=action,
        workflow=workflow,
        run_id=run_id,
        team=team,
    )
    try:
        path = audit_export_to_file(user=context.user, filters=filters)
    except AuditExportError as exc:
        raise Problem(422, str(exc), errors=[{"field": exc.field, "message": str(exc)}]) from None
    except ExportError as exc:
        raise Problem(409, f"the trail does not verify: {exc}", type="chain-broken") from None
    return serve_file(path, filename="pandaweb-audit-export.zip", delete=True)


@router.get("/verify", response=VerifyOut, url_name="audit_verify")
def audit_verify(request: HttpRequest, team: str = "") -> VerifyOut:
    """Verify the whole hash chain in the database, or with ``team`` (a slug) that team's chain
    alone; a token whose owner has Compliance in some teams only verifies one of those."""
    context = token_with_scope(request, Scope.AUDIT_READ)
    try:
        chosen = export_team(context.user, audit_selectors.EventFilters(team=team))
    except AuditExportError as exc:
        raise Problem(422, str(exc), errors=[{"field": exc.field, "message": str(exc)}]) from None
    result = audit_verify_database() if chosen is None else audit_verify_team(team_id=chosen.pk)
    return VerifyOut(
        ok=result.ok,
        count=result.count,
        last_sequence=result.last_sequence,
        last_hash=result.last_hash,
        problem=result.reason or None,
        team=chosen.slug if chosen is not None else None,
    )
