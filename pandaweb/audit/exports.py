"""Exporting a filtered range of the audit trail as a signed zip (the format is in ``export.py``).

The export narrows the trail with the audit page's own filters (``selectors.EventFilters``), so an
export holds exactly the events the page listed. It reads the table outside any transaction:
holding one for the whole stream would block every writer of the trail (on SQLite, every writer
of anything) for as long as a million events take. The range is fixed instead by the head at the
start, so events appended meanwhile, the export's own event among them, are never in it.

Teams: a person who may export every team's trail (a global role) exports the whole trail or,
naming a team, one team's; a person with Compliance in some teams only exports one of those
teams' trails (the one they have, or the one they name). A team's export holds the events on that
team's chain and is verified on it alone (``export.py``).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, replace
from datetime import date
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from pandaweb.audit import chain, selectors
from pandaweb.audit.checkpoints import audit_checkpoint_write
from pandaweb.audit.export import Manifest, TeamScope, fingerprint, write_export
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.audit.signing import signing_key
from pandaweb.core.models import Team
from pandaweb.core.permissions import in_teams, teams_where
from pandaweb.core.roles import Capability
from workflows.models import Workflow

EXPORTED_ACTION = "audit.exported"
# Rows per round trip: bounds the memory of the read side.
CHUNK_SIZE = 2000

# One definition of the filters for the page and the export: date_from / date_to (whole days in
# the site's time zone, both included), actor (username or label), action (prefix), workflow
# (slug: the workflow's own events and those of its runs), run_id, team (slug).
AuditFilter = selectors.EventFilters


class AuditExportError(Exception):
    """What was asked for is not there (or not the person's): ``field`` names the filter."""

    def __init__(self, message: str, *, field: str = "workflow") -> None:
        super().__init__(message)
        self.field = field


def audit_filtered(filters: AuditFilter) -> QuerySet[AuditEvent]:
    """The events ``filters`` select, in sequence order."""
    return selectors.audit_events(filters).order_by("sequence")


def export_team(user: User, filters: AuditFilter) -> Team | None:
    """The team whose trail ``user`` exports with ``filters``: the one named, or a team-scoped
    person's only team; None for the whole trail (a global role naming none).

    PermissionDenied without EXPORT_AUDIT anywhere; AuditExportError for a team that is not there
    or not theirs (the same words: a slug of another team leaks nothing), and for a person with
    several teams who named none.
    """
    teams = teams_where(user, Capability.EXPORT_AUDIT)
    if teams is not None and not teams:
        raise PermissionDenied("exporting the audit trail needs the capability 'export_audit'")
    if filters.team:
        team = Team.objects.filter(slug=filters.team).first()
        if team is None or (teams is not None and team.pk not in teams):
            raise AuditExportError(f"no team has the slug {filters.team!r}", field="team")
        return team
    if teams is None:
        return None
    if len(teams) == 1:
        return Team.objects.get(pk=next(iter(teams)))
    slugs = ", ".join(Team.objects.filter(pk__in=teams).values_list("slug", flat=True))
    raise AuditExportError(f"name the team whose trail to export (one of {slugs})", field="team")


def audit_export(*, user: User, filters: AuditFilter, out: IO[bytes]) -> Manifest:
    """Write the events ``filters`` select, up to the current head, as a signed export to ``out``.

    Needs the EXPORT_AUDIT capability (PermissionDenied); exports one team's trail when
    ``export_team`` says so (its rules and errors). Raises AuditExportError for an unknown
    workflow slug (another team's is unknown too), ``export.ExportError`` when a selected event
    does not verify and ImproperlyConfigured for a bad signing key; ``out`` then holds nothing
    usable. Once the zip is complete, records one ``audit.exported`` event in its own short
    transaction, then writes a signed checkpoint of the head (which includes that event). Not
    idempotent: every call is a new export with its own event.
    """
    team = export_team(user, filters)
    if team is not None:
        filters = replace(filters, team=team.slug)
    if (
        filters.workflow
        and not in_teams(
            Workflow.objects.filter(slug=filters.workflow), user, Capability.EXPORT_AUDIT
        ).exists()
    ):
        # An empty export of a mistyped slug would look like an answer.
        raise AuditExportError(f"no workflow has the slug {filters.workflow!r}")
    key = signing_key()  # a configuration error shows before the long part
    head = AuditEvent.objects.aggregate(head=Max("sequence"))["head"] or 0
    events = audit_filtered(filters).filter(sequence__lte=head)
    scope = None
    if team is not None:
        # The team's chain: its events written before team chains existed are on none, and in
        # the whole trail's export only.
        events = events.filter(team_prev_hash__isnull=False)
        # Narrowed by dates at most, the events are the team's chain without a gap (the chain's
        # times only rise, each taken under its lock, barring a clock set back): checked link by
        # link. Narrowed further, event by event.
        chained = not (filters.actor or filters.action or filters.workflow or filters.run_id)
        scope = TeamScope(id=team.pk, slug=team.slug, chained=chained)
    rows = events.values(*chain.STORED_FIELDS).iterator(chunk_size=CHUNK_SIZE)
    manifest = write_export(
        rows,
        out=out,
        filter=_described(filters, head),
        private_key=key,
        tmp_dir=exports_dir(),
        team=scope,
    )
    with transaction.atomic():
        audit_record(
            action=EXPORTED_ACTION,
            object_type="audit_export",
            object_id=manifest.sha256,
            actor=user,
            after={
                "filter": dict(manifest.filter),
                "count": manifest.count,
                "first_sequence": manifest.first_sequence,
                "last_sequence": manifest.last_sequence,
                "last_hash": manifest.last_hash,
                "manifest_sha256": manifest.sha256,
                "signed_by": fingerprint(manifest.public_key),
            },
            # A team's export is an event of that team's trail: its compliance sees who took it.
            team_id=team.pk if team is not None else None,
        )
    # The head as of this export, signed and kept outside the database: a later rewrite of
    # anything up to here shows against it (audit_verify --checkpoints).
    audit_checkpoint_write(reason="export")
    return manifest


def audit_export_to_file(*, user: User, filters: AuditFilter) -> Path:
    """``audit_export`` into a new file under DATA_DIR/exports; the caller serves and deletes it.

    On any failure the file is removed before the exception propagates.
    """
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below; the caller keeps the file)
        dir=exports_dir(), prefix="audit-export-", suffix=".zip", delete=False
    )
    path = Path(handle.name)
    try:
        with handle:
            audit_export(user=user, filters=filters, out=handle)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def exports_dir() -> Path:
    """Where exports and their CSV spool are written: on disk beside the data (the system's
    temporary directory may be memory), readable by this user only."""
    directory = Path(settings.DATA_DIR) / "exports"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def _described(filters: AuditFilter, head: int) -> dict[str, Any]:
    """The filter as the manifest records it: the fields that were set, the time zone the dates
    were read in, and the head the range was cut at."""
    described: dict[str, Any] = {
        name: value.isoformat() if isinstance(value, date) else value
        for name, value in asdict(filters).items()
        if value not in (None, "")
    }
    if filters.date_from or filters.date_to:
        described["time_zone"] = timezone.get_current_timezone_name()
    described["up_to_sequence"] = head
    return described
