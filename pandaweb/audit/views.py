"""The audit pages: the trail with filters, a run's timeline, chain verification and the run's
evidence bundle. Reading needs VIEW_AUDIT; verifying and exporting need EXPORT_AUDIT (Compliance
and Admins hold both). Held in some teams only, they reach those teams' events (their runs, their
chains); the installation's own events (no team) are for a global role."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.http import FileResponse, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from pandaweb.audit import exports, selectors, signing
from pandaweb.audit.bundles import run_bundle_to_file
from pandaweb.audit.chain import VerifyResult
from pandaweb.audit.checkpoints import audit_verify_checkpoints, checkpoint_dir
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_verify_database, audit_verify_teams
from pandaweb.core.http import AuthenticatedRequest
from pandaweb.core.permissions import capability_required, teams_where, user_can
from pandaweb.core.roles import Capability
from sessions.models import Run

_DATE = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")


# Filter days are turned into times with a day added (the end is exclusive): the last days of
# year 9999 would overflow, and no event is older than the first day.
_FIRST_DAY, _LAST_DAY = date(1970, 1, 1), date(9998, 12, 31)
# Identifiers and cursors are 64-bit integers in the database.
_LARGEST_ID = 2**63 - 1


def _within_days(day: date | None) -> None:
    if day is not None and not _FIRST_DAY <= day <= _LAST_DAY:
        raise forms.ValidationError(
            f"Pick a day between {_FIRST_DAY.isoformat()} and {_LAST_DAY.isoformat()}."
        )


class EventFilterForm(forms.Form):
    """The filters of the audit page, from the query string (every field optional)."""

    date_from = forms.DateField(
        required=False, label="From", widget=_DATE, validators=[_within_days]
    )
    date_to = forms.DateField(required=False, label="To", widget=_DATE, validators=[_within_days])
    actor = forms.CharField(required=False, max_length=150, label="Actor")
    action = forms.CharField(required=False, max_length=100, label="Action")
    workflow = forms.ChoiceField(required=False, label="Workflow")
    team = forms.ChoiceField(required=False, label="Team")
    run = forms.IntegerField(required=False, min_value=1, max_value=_LARGEST_ID, label="Run")
    before = forms.IntegerField(
        required=False, min_value=1, max_value=_LARGEST_ID, widget=forms.HiddenInput
    )
    after = forms.IntegerField(
        required=False, min_value=0, max_value=_LARGEST_ID, widget=forms.HiddenInput
    )

    def __init__(self, *args: Any, teams: frozenset[int] | None = None, **kwargs: Any) -> None:
        """``teams``: whose workflows and teams the reader may pick (None: all)."""
        super().__init__(*args, **kwargs)
        self.workflows = list(selectors.workflow_choices(teams))
        self.fields["workflow"].choices = [("", "All workflows")] + [  # type: ignore[attr-defined]
            (w.slug, w.name) for w in self.workflows
        ]
        self.fields["team"].choices = [("", "All teams")] + [  # type: ignore[attr-defined]
            (t.slug, t.name) for t in selectors.team_choices(teams)
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("date_from"), data.get("date_to")
        if start and end and start > end:
            self.add_error("date_to", "The end date is before the start date.")
        return data

    def filters(self) -> selectors.EventFilters:
        """The valid filters (a field with an error does not filter)."""
        data = self.cleaned_data if self.is_bound else {}
        return selectors.EventFilters(
            date_from=data.get("date_from"),
            date_to=data.get("date_to"),
            actor=(data.get("actor") or "").strip(),
            action=(data.get("action") or "").strip(),
            workflow=data.get("workflow") or "",
            run_id=data.get("run"),
            team=data.get("team") or "",
        )

    def applied(self) -> list[tuple[str, str]]:
        """The filters that select the listed events, as (field name, value) in query form: a
        field with an error is not among them, as it does not filter the list either."""
        data = self.cleaned_data if self.is_bound else {}
        return [
            (name, data[name].isoformat() if hasattr(data[name], "isoformat") else str(data[name]))
            for name in ("date_from", "date_to", "actor", "action", "workflow", "run", "team")
            if data.get(name) not in (None, "")
        ]

    def query(self, **cursor: int) -> str:
        """The query string of these filters, with a page cursor."""
        pairs: list[tuple[str, Any]] = [*self.applied(), *cursor.items()]
        return "?" + urlencode(pairs) if pairs else "?"


@dataclass(frozen=True)
class EventRow:
    """One event of the table, with its JSON made readable."""

    event: AuditEvent
    before: str
    after: str
    extra: str

    @property
    def has_details(self) -> bool:
        return bool(self.before or self.after or self.extra or self.event.request_id)


def _pretty(value: Any) -> str:
    if value in (None, {}, []):
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _row(event: AuditEvent) -> EventRow:
    return EventRow(
        event=event,
        before=_pretty(event.before),
        after=_pretty(event.after),
        extra=_pretty(event.extra),
    )


@require_GET
@capability_required(Capability.VIEW_AUDIT)
def audit_index(request: AuthenticatedRequest) -> HttpResponse:
    # A history restore (back button, cache miss) needs the whole page.
    partial = request.htmx and not request.htmx.history_restore_request
    template = "audit/index.html#table" if partial else "audit/index.html"
    context = _index_context(request)
    # The export form sits outside the swapped table: it is swapped along with it (out of band)
    # so that "Export the matching events" always exports the events on screen.
    context["export_oob"] = bool(partial and context["can_export"])
    return render(request, template, context)


def _index_context(request: AuthenticatedRequest) -> dict[str, Any]:
    teams = teams_where(request.user, Capability.VIEW_AUDIT)
    form = EventFilterForm(request.GET or None, teams=teams)
    if form.is_bound:
        form.is_valid()
    filters = form.filters()
    data = form.cleaned_data if form.is_bound else {}
    matching = selectors.audit_events(filters, teams=teams)
    page = selectors.audit_page(matching, before=data.get("before"), after=data.get("after"))
    labels = {name: str(field.label) for name, field in form.fields.items()}
    return {
        "form": form,
        "filters": filters,
        "export_filters": [(name, labels[name], value) for name, value in form.applied()],
        "rows": [_row(event) for event in page.events],
        "total": matching.count(),
        "page": page,
        "newer_query": form.query(after=page.newer_than) if page.newer_than else "",
        "older_query": form.query(before=page.older_than) if page.older_than else "",
        "newest_query": form.query() if (data.get("before") or data.get("after")) else "",
        "actions": selectors.known_actions(teams),
        "usernames": selectors.known_actors(teams),
        # The whole chain's head is the installation's: a team's reader verifies their teams'.
        "head": selectors.chain_head() if teams is None else None,
        "teams_only": teams is not None,
        "can_export": user_can(request.user, Capability.EXPORT_AUDIT),
        "public_key": signing.public_key_b64(),
        "public_key_fingerprint": signing.public_key_fingerprint(),
    }


@require_POST
@capability_required(Capability.EXPORT_AUDIT)
def audit_verify(request: AuthenticatedRequest) -> HttpResponse:
    """Verify the whole chain now, and against the signed checkpoints when there are any: the
    result panel for htmx, the page with it otherwise."""
    teams = teams_where(request.user, Capability.EXPORT_AUDIT)
    if teams is None:
        result: VerifyResult = audit_verify_database()
        directory = checkpoint_dir()
        if any(directory.glob("checkpoint-*.json")):
            # The signed heads kept outside the database also catch a cut tail or a rewritten
            # chain.
            result, _ = audit_verify_checkpoints(result, directory)
    else:
        result = audit_verify_teams(teams)
    if request.htmx:
        context = {"verify": result, "can_export": True, "teams_only": teams is not None}
        return render(request, "audit/index.html#chain", context)
    context = {**_index_context(request), "verify": result}
    return render(request, "audit/index.html", context)


@require_GET
@capability_required(Capability.VIEW_AUDIT)
def audit_run(request: AuthenticatedRequest, run_id: int) -> HttpResponse:
    run = selectors.run_get(run_id, teams=teams_where(request.user, Capability.VIEW_AUDIT))
    timeline = selectors.run_timeline(run)
    hashes_bad = sum(1 for e in timeline.audit_events if not selectors.audit_event_hash_ok(e))
    context = {
        "run": run,
        "timeline": timeline,
        "items": [_item(entry) for entry in timeline.entries],
        "decisions_count": sum(len(a.decisions.all()) for a in timeline.approvals),
        "hashes_bad": hashes_bad,
        "can_export": user_can(request.user, Capability.EXPORT_AUDIT),
        "can_see_runs": user_can(request.user, Capability.VIEW_RUNS),
        "can_see_approvals": user_can(request.user, Capability.VIEW_APPROVALS),
    }
    return render(request, "audit/run.html", context)


@dataclass(frozen=True)
class TimelineItem:
    entry: selectors.TimelineEntry
    audit: EventRow | None
    hash_ok: bool | None
    status_from: str = ""
    status_to: str = ""


_RUN_STATUS = dict(Run.Status.choices)


def _item(entry: selectors.TimelineEntry) -> TimelineItem:
    status_from = status_to = ""
    if entry.kind == "status" and entry.run_event is not None:
        payload = entry.run_event.payload
        status_from = _RUN_STATUS.get(payload.get("from") or "", "")
        status_to = _RUN_STATUS.get(payload.get("to") or "", str(payload.get("to") or ""))
    return TimelineItem(
        entry=entry,
        audit=_row(entry.audit) if entry.audit is not None else None,
        hash_ok=entry.audit_hash_ok,
        status_from=status_from,
        status_to=status_to,
    )


@require_POST
@capability_required(Capability.EXPORT_AUDIT)
def audit_export(request: AuthenticatedRequest) -> HttpResponseBase:
    """The events matching the page's filters as a signed zip (CSV, JSON Lines, manifest)."""
    form = EventFilterForm(request.POST, teams=teams_where(request.user, Capability.EXPORT_AUDIT))
    if not form.is_valid():
        messages.error(request, "Nothing was exported: correct the filters first.")
        return redirect("audit:index")
    try:
        path = exports.audit_export_to_file(user=request.user, filters=form.filters())
    except exports.AuditExportError as exc:
        messages.error(request, f"Nothing was exported: {exc}")
        return redirect("audit:index")
    team = form.filters().team
    whose = f"-{team}" if team else ""
    return _download(path, f"pandaweb-audit{whose}-{timezone.now():%Y%m%dT%H%M%SZ}.zip")


@require_POST
@capability_required(Capability.EXPORT_AUDIT)
def audit_run_bundle(request: AuthenticatedRequest, run_id: int) -> FileResponse:
    """The run's evidence bundle as a download; a POST, because every export is recorded in the
    trail (a link followed by a prefetcher or another site must not add events)."""
    path = run_bundle_to_file(run_id=run_id, user=request.user)
    return _download(path, f"run-{run_id}-evidence.zip")


def _download(path: Path, filename: str) -> FileResponse:
    handle = path.open("rb")
    # The open handle keeps the content readable; the name is gone at once (POSIX), so no copy of
    # the evidence is left behind in the temporary directory, even if the download is abandoned.
    path.unlink()
    response = FileResponse(
        handle, as_attachment=True, filename=filename, content_type="application/zip"
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    return response
