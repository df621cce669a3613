"""The audit trail over the API: its events in chain order (what a SIEM collects), signed
exports and chain verification, as Compliance has them on the audit page.
"""

from __future__ import annotations

from datetime import date

from django.http import FileResponse, HttpRequest
from ninja import Query, Router

from pandaweb.api.access import token_with_scope
from pandaweb.api.documents import serve_file
from pandaweb.api.paging import MAX_PAGE
from pandaweb.api.problems import Problem
from pandaweb.api.schemas import AuditEventOut, AuditEventPage, VerifyOut
from pandaweb.api.scopes import Scope
from pandaweb.audit import selectors as audit_selectors
from pandaweb.audit.export import ExportError
from pandaweb.audit.exports import AuditExportError, audit_export_to_file, export_team
from pandaweb.audit.services import audit_verify_database, audit_verify_team
from pandaweb.core.models import Team
from pandaweb.core.permissions import teams_where
from pandaweb.core.roles import Capability

router = Router(tags=["audit"])


@router.get("/events", response=AuditEventPage, url_name="audit_events")
def audit_events(
    request: HttpRequest,
    after: int = Query(0, ge=0, description="Events after this sequence (0: from the first)."),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
    date_from: date | None = None,
    date_to: date | None = None,
    actor: str = "",
    action: str = "",
    workflow: str = "",
    run_id: int | None = None,
    team: str = "",
) -> AuditEventPage:
    """The events the filters select, oldest first in the order of the hash chain, a page at a
    time: ask again with ``next_after`` (at once while ``more``, later otherwise), so a
    collector never misses or repeats one. The events of the teams where the owner reads the
    trail; the installation's own (people, tokens, the system) for a global role only, as on
    the audit page. ``action`` is a prefix (``run.``); dates are whole days."""
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
    teams = teams_where(context.user, Capability.VIEW_AUDIT)
    found = list(
        audit_selectors.audit_events(filters, teams=teams)
        .filter(sequence__gt=after)
        .order_by("sequence")[: limit + 1]
    )
    page = found[:limit]
    slugs = dict(
        Team.objects.filter(pk__in={e.team_id for e in page if e.team_id}).values_list("pk", "slug")
    )
    return AuditEventPage(
        items=[
            AuditEventOut(
                sequence=e.sequence,
                occurred_at=e.occurred_at,
                actor=e.actor.get_username() if e.actor else e.actor_label,
                actor_kind=e.actor_kind,
                action=e.action,
                object_type=e.object_type,
                object_id=e.object_id,
                team=slugs.get(e.team_id) if e.team_id else None,
                run_id=e.run_id,
                approval_id=e.approval_id,
                before=e.before,
                after=e.after,
                extra=e.extra,
                prev_hash=e.prev_hash,
                hash=e.hash,
            )
            for e in page
        ],
        next_after=page[-1].sequence if page else after,
        more=len(found) > limit,
    )


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
