"""The evidence bundle of one run: everything an auditor needs, in one zip that opens offline.

Layout of the zip::

    index.html          a readable summary (inline CSS, relative links only, no network)
    timeline.json       run facts, steps, approvals with decisions, artifacts, the run's own
                        event log and its audit events with their chain hashes, in time order
    screenshots/        every step screenshot and overlay, approval screenshots and outlined
                        pictures, under their paths in the run's files directory
    observations/       what the robot read on each step (the JSON that observation_sha256 covers)
    artifacts/          the run's downloads
    control/            each take-over's inputs (inputs.jsonl) and its frame a second
    filmstrip/          the run's filmstrip frames and their index, when the workflow keeps one
    SHA256SUMS          the sha256 of every other file (``sha256sum -c SHA256SUMS``)

Files are copied from the run's files directory in chunks and hashed while they are written, so
memory stays bounded whatever the size of the run; the zip itself is written to a temporary file
that the caller serves and deletes. Each file's hash is also compared with the hash recorded when
the run made it (``matches_record`` in timeline.json, flagged in index.html): a picture edited on
disk after the fact shows up here.

Every export is itself recorded: one ``audit.run_bundle_exported`` event naming who exported the
bundle and the sha256 of its SHA256SUMS, which fixes the content of every file in it.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from approvals.services import evidence_hash
from pandaweb.audit import chain
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.selectors import RunTimeline, TimelineEntry, run_get, run_timeline
from pandaweb.audit.services import audit_record
from pandaweb.core.permissions import teams_where
from pandaweb.core.roles import Capability
from sessions.engine.filmstrip import filmstrip_frames
from sessions.models import Run
from sessions.services import run_files_dir

FORMAT = "pandaweb.run-bundle/1"
EXPORTED_ACTION = "audit.run_bundle_exported"
_CHUNK = 1024 * 1024
# Already compressed: stored as they are.
_STORED_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".gif", ".webp", ".zip", ".gz", ".pdf"})


def run_bundle_to_file(*, run_id: int, user: User) -> Path:
    """Write the evidence bundle of run ``run_id`` to a new temporary file and return its path.

    The caller owns the file (serve it, then delete it). Records one ``audit.run_bundle_exported``
    event (in its own transaction) once the zip's content is complete; should that fail, the file
    is removed and nothing was exported. Raises Http404 for an unknown run, and for a run of a
    team where ``user`` may not export the trail. Not idempotent: each call is a new export with
    its own audit event.
    """
    run = run_get(run_id, teams=teams_where(user, Capability.EXPORT_AUDIT))
    timeline = run_timeline(run)
    now = timezone.now()
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below; the caller keeps the file)
        prefix=f"pandaweb-run-{run.pk}-", suffix=".zip", delete=False
    )
    path = Path(handle.name)
    try:
        with handle, zipfile.ZipFile(handle, "w", allowZip64=True) as archive:
            writer = _Writer(archive, now)
            document = _collect(timeline, writer, user=user, now=now)
            writer.write_bytes("timeline.json", _json_bytes(document))
            html = render_to_string("audit/bundle/index.html", {**document, "files": writer.files})
            writer.write_bytes("index.html", html.encode("utf-8"))
            sums = "".join(f"{f.sha256}  {f.name}\n" for f in writer.files).encode("utf-8")
            writer.write_bytes("SHA256SUMS", sums, listed=False)
        # The zip is complete and closed: only now is it an export.
        with transaction.atomic():
            audit_record(
                action=EXPORTED_ACTION,
                object_type="run",
                object_id=run.pk,
                actor=user,
                run_id=run.pk,
                team_id=run.team_id,
                after={
                    "format": FORMAT,
                    "files": len(writer.files),
                    "bytes": writer.total_bytes,
                    "sha256sums_sha256": hashlib.sha256(sums).hexdigest(),
                    "audit_events": len(timeline.audit_events),
                    "missing_files": [f["path"] for f in writer.missing],
                },
            )
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


@dataclass
class BundledFile:
    name: str
    sha256: str
    size: int


@dataclass
class _Writer:
    archive: zipfile.ZipFile
    now: datetime
    files: list[BundledFile] = field(default_factory=list)
    by_name: dict[str, BundledFile] = field(default_factory=dict)
    missing: list[dict[str, str]] = field(default_factory=list)
    total_bytes: int = 0

    def _info(self, name: str) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=self.now.timetuple()[:6])
        stored = Path(name).suffix.lower() in _STORED_SUFFIXES
        info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
        info.external_attr = 0o644 << 16
        return info

    def write_bytes(self, name: str, content: bytes, *, listed: bool = True) -> BundledFile:
        self.archive.writestr(self._info(name), content)
        bundled = BundledFile(name, hashlib.sha256(content).hexdigest(), len(content))
        if listed:
            self._add(bundled)
        return bundled

    def _add(self, bundled: BundledFile) -> None:
        self.files.append(bundled)
        self.by_name[bundled.name] = bundled
        self.total_bytes += bundled.size

    def copy(self, run_id: int, relative: str, folder: str, *, why: str) -> BundledFile | None:
        """Copy one file of the run into ``folder`` of the zip, hashing it on the way; None when
        it is gone (or its recorded path points outside the run's directory)."""
        root = run_files_dir(run_id).resolve()
        source = (root / relative).resolve()
        if not source.is_relative_to(root) or not source.is_file():
            self.missing.append({"path": relative, "for": why})
            return None
        name = f"{folder}/{source.relative_to(root).as_posix()}"
        if name in self.by_name:  # the same file named twice
            return self.by_name[name]
        digest = hashlib.sha256()
        size = 0
        target = self.archive.open(self._info(name), "w", force_zip64=True)
        with source.open("rb") as src, target as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
        bundled = BundledFile(name, digest.hexdigest(), size)
        self._add(bundled)
        return bundled


def _file_fact(
    writer: _Writer, run: Run, relative: str, folder: str, recorded: str, *, why: str
) -> dict[str, Any] | None:
    if not relative:
        return None
    bundled = writer.copy(run.pk, relative, folder, why=why)
    fact: dict[str, Any] = {"path": relative, "recorded_sha256": recorded or None}
    if bundled is None:
        fact.update(file=None, sha256=None, missing=True, matches_record=None)
    else:
        fact.update(
            file=bundled.name,
            sha256=bundled.sha256,
            size=bundled.size,
            missing=False,
            matches_record=(bundled.sha256 == recorded) if recorded else None,
        )
    return fact


def _collect(
    timeline: RunTimeline, writer: _Writer, *, user: User, now: datetime
) -> dict[str, Any]:
    run = timeline.run
    steps = []
    for step in timeline.steps:
        observation = None
        if step.observation:
            content = json.dumps(step.observation, sort_keys=True).encode("utf-8")
            bundled = writer.write_bytes(
                f"observations/{step.index + 1:03d}-{_safe(step.step_id)}.json", content
            )
            observation = {
                "file": bundled.name,
                "sha256": bundled.sha256,
                "recorded_sha256": step.observation_sha256 or None,
                "matches_record": (bundled.sha256 == step.observation_sha256)
                if step.observation_sha256
                else None,
                "chars": step.observation_chars,
                "tokens": step.observation_tokens,
            }
        label = f"step {step.index + 1}"
        steps.append(
            {
                "index": step.index,
                "number": step.index + 1,
                "step_id": step.step_id,
                "type": step.step_type,
                "sentence": step.sentence,
                "status": step.status,
                "started_at": _iso(step.started_at),
                "duration_ms": step.duration_ms,
                "url": step.url,
                "title": step.title,
                "error": step.error,
                "screenshot": _file_fact(
                    writer, run, step.screenshot, "screenshots", step.screenshot_sha256, why=label
                ),
                "overlay": _file_fact(writer, run, step.overlay, "screenshots", "", why=label),
                "observation": observation,
            }
        )

    approvals = []
    for approval in timeline.approvals:
        evidence = approval.evidence or {}
        label = f"approval request {approval.pk}"
        shot_sha = str(evidence.get("screenshot_sha256") or "")
        outlined_sha = str(evidence.get("outlined_sha256") or "")
        approvals.append(
            {
                "id": approval.pk,
                "step_index": approval.step_index,
                "step_number": approval.step_index + 1,
                "step_id": approval.step_id,
                "action": approval.action,
                "status": approval.status,
                "created_at": _iso(approval.created_at),
                "expires_at": _iso(approval.expires_at),
                "decided_at": _iso(approval.decided_at),
                "reason": approval.reason,
                "quorum": approval.quorum,
                "reviewer_group": approval.reviewer_group,
                "author_may_approve": approval.author_may_approve,
                "supersedes": approval.previous_id,
                "evidence_sha256": approval.evidence_sha256,
                "evidence_sha256_matches": evidence_hash(evidence) == approval.evidence_sha256,
                "evidence": evidence,
                "screenshot": _file_fact(
                    writer, run, approval.screenshot, "screenshots", shot_sha, why=label
                ),
                "outlined": _file_fact(
                    writer, run, approval.outlined, "screenshots", outlined_sha, why=label
                ),
                "action_started_at": _iso(approval.intent_at),
                "action_completed_at": _iso(approval.completed_at),
                "action_refused_at": _iso(approval.refused_at),
                "action_result": approval.action_result,
                "decisions": [
                    {
                        "reviewer": decision.reviewer.get_username(),
                        "reviewer_id": decision.reviewer_id,
                        "reviewer_name": decision.reviewer.get_full_name(),
                        "verdict": decision.verdict,
                        "reason": decision.reason,
                        "evidence_sha256": decision.evidence_sha256,
                        "created_at": _iso(decision.created_at),
                    }
                    for decision in approval.decisions.all()
                ],
            }
        )

    artifacts = []
    for artifact in run.artifacts.order_by("step_index", "pk"):
        fact = _file_fact(
            writer, run, artifact.path, "artifacts", artifact.sha256, why=artifact.filename
        )
        artifacts.append(
            {
                "name": artifact.name,
                "filename": artifact.filename,
                "step_number": artifact.step_index + 1,
                "size": artifact.size,
                "created_at": _iso(artifact.created_at),
                **(fact or {}),
            }
        )

    controls = []
    for session in run.control_sessions.select_related("user"):
        label = f"control session {session.pk}"
        folder = run_files_dir(run.pk) / session.files_dir
        files = sorted(folder.iterdir()) if session.files_dir and folder.is_dir() else []
        controls.append(
            {
                "id": session.pk,
                "by": session.user.get_username(),
                "before_step_number": session.step_index + 1,
                "opened_at": _iso(session.opened_at),
                "closed_at": _iso(session.closed_at),
                "close_reason": session.close_reason,
                "navigated": session.navigated,
                "typed": session.typed,
                "urls": session.urls,
                "inputs": session.inputs,
                "files": [
                    _file_fact(
                        writer, run, f"{session.files_dir}/{path.name}", "control", "", why=label
                    )
                    for path in files
                ],
            }
        )
    film_root = run_files_dir(run.pk) / "filmstrip"
    filmstrip = []
    for frame in filmstrip_frames(run_files_dir(run.pk)):
        fact = _file_fact(
            writer, run, f"filmstrip/{frame['file']}", "filmstrip", frame["sha256"],
            why="filmstrip",
        )  # fmt: skip
        filmstrip.append({"at": frame["at"], "masks": frame.get("masks", 0), **(fact or {})})
    if (film_root / "index.jsonl").is_file():
        writer.copy(run.pk, "filmstrip/index.jsonl", "filmstrip", why="filmstrip")

    audit_events = [_audit_event(event) for event in timeline.audit_events]
    return {
        "format": FORMAT,
        "generated_at": _iso(now),
        "generated_by": user.get_username(),
        "run": {
            "id": run.pk,
            "workflow": {"slug": run.workflow.slug, "name": run.workflow.name},
            "version": {"number": run.version.number, "content_hash": run.version.content_hash},
            "status": run.status,
            "status_label": run.get_status_display(),
            "inputs": run.inputs,
            "outputs": run.outputs,
            "launched_by": run.launched_by.get_username(),
            "created_at": _iso(run.created_at),
            "started_at": _iso(run.started_at),
            "finished_at": _iso(run.finished_at),
            "steps_executed": run.steps_executed,
            "failure_reason": run.failure_reason,
            "failure_step": run.failure_step,
            "sandbox_backend": run.sandbox_backend,
        },
        "steps": steps,
        "approvals": approvals,
        "artifacts": artifacts,
        "control_sessions": controls,
        "filmstrip": filmstrip,
        "missing_files": writer.missing,
        "run_events": [
            {"seq": e.seq, "type": e.type, "payload": e.payload, "created_at": _iso(e.created_at)}
            for e in timeline.run_events
        ],
        "audit_events": audit_events,
        "audit_events_hashes_ok": all(e["hash_matches_content"] for e in audit_events),
        "timeline": list(_timeline_rows(timeline)),
    }


def _audit_event(event: AuditEvent) -> dict[str, Any]:
    """The event with every hashed field as stored (datetimes in the chain's text form), so that
    ``chain.event_hash(row, row["prev_hash"]) == row["hash"]`` can be checked offline; with its
    team link and ``team_hash`` when it is on a team's chain."""
    fields = event.chain_fields()
    team = (*chain.TEAM_FIELDS, "team_hash") if chain.on_team_chain(fields) else ()
    row = {name: fields[name] for name in (*chain.HASHED_FIELDS, *team)}
    row["occurred_at"] = chain.format_datetime(event.occurred_at)
    row["hash"] = event.hash
    try:
        row["hash_matches_content"] = chain.event_hash(fields, event.prev_hash) == event.hash
    except (TypeError, ValueError, KeyError):
        row["hash_matches_content"] = False
    return row


def _timeline_rows(timeline: RunTimeline) -> Iterator[dict[str, Any]]:
    for entry in timeline.entries:
        yield {
            "at": _iso(entry.at),
            "kind": entry.kind,
            "summary": timeline_summary(entry),
            "audit_sequence": entry.sequence,
            "audit_hash": entry.audit.hash if entry.audit is not None else None,
        }


def timeline_summary(entry: TimelineEntry) -> str:
    """One line for a timeline entry, in words."""
    if entry.kind == "step" and entry.step is not None:
        step = entry.step
        return f"Step {step.index + 1} {step.status}: {step.sentence}"
    if entry.kind == "approval" and entry.approval is not None:
        approval = entry.approval
        return (
            f"Approval request #{approval.pk} for step {approval.step_index + 1}: "
            f"{approval.action} (now {approval.status})"
        )
    if entry.kind == "decision" and entry.decision is not None:
        decision = entry.decision
        verb = "approved" if decision.verdict == "approve" else "rejected"
        text = f"{decision.reviewer.get_username()} {verb} request #{decision.request_id}"
        return f"{text}: {decision.reason}" if decision.reason else text
    if entry.kind == "status" and entry.run_event is not None:
        payload = entry.run_event.payload
        text = f"Run {payload.get('from') or 'created'} → {payload.get('to')}"
        return f"{text} ({payload['reason']})" if payload.get("reason") else text
    if entry.kind == "denial" and entry.run_event is not None:
        payload = entry.run_event.payload
        port = f":{payload['port']}" if payload.get("port") else ""
        return f"Blocked a connection to {payload.get('host')}{port}"
    if entry.audit is not None:
        audit = entry.audit
        return f"{audit.action} by {audit.actor_label} on {audit.object_type} {audit.object_id}"
    return entry.kind


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80] or "step"


def _iso(value: datetime | None) -> str | None:
    return chain.format_datetime(value) if value is not None else None


def _json_bytes(document: Any) -> bytes:
    return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False).encode("utf-8")
