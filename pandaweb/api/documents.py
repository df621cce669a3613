"""What the API answers with for runs, their approvals and questions, and its files: one
rendering shared by the endpoints of runs, approvals and questions and by ``manage.py run_show``.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from django.db.models import Prefetch
from django.http import FileResponse, Http404
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalRequest, Question
from pandaweb.api.schemas import (
    ApprovalSummary,
    ArtifactOut,
    ContinueOut,
    QuestionOut,
    RunOut,
    RunQuestionOut,
    StepOut,
)
from sessions.console_services import run_continue_checks
from sessions.engine.vocabulary import MASK
from sessions.models import Artifact, Run, StepResult
from sessions.services import queue_position


def api_url(name: str, **kwargs: Any) -> str:
    return reverse(f"api:{name}", kwargs=kwargs)


def serve_file(path: Path, *, filename: str, delete: bool = False) -> FileResponse:
    content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    handle = path.open("rb")
    if delete:
        # The file is ours (a fresh export): gone from disk once opened, read to the end anyway.
        path.unlink(missing_ok=True)
    response = FileResponse(
        handle, content_type=content_type, as_attachment=True, filename=filename
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


def run_links(run: Run) -> dict[str, str]:
    return {
        "self": api_url("run_get", run_id=run.pk),
        "bundle": api_url("run_bundle", run_id=run.pk),
        "page": reverse("runs:detail", kwargs={"run_id": run.pk}),
    }


def run_summary(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "workflow": run.workflow.slug,
        "version": run.version.number,
        "status": run.status,
        "launched_by": run.launched_by.get_username(),
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "inputs": run.inputs,
        "outputs": run.outputs,
        "links": run_links(run),
    }


def approval_summary(approval: ApprovalRequest) -> ApprovalSummary:
    return ApprovalSummary(
        id=approval.pk,
        status=approval.status,
        step_id=approval.step_id,
        action=approval.action,
        created_at=approval.created_at,
        expires_at=approval.expires_at,
        evidence_sha256=approval.evidence_sha256,
        approvals=approval.approvals_count,
        quorum=approval.quorum,
        links={
            "self": api_url("approval_get", approval_id=approval.pk),
            "decide": api_url("approval_decide", approval_id=approval.pk),
        },
    )


def _question_fields(question: Question) -> dict[str, Any]:
    answer: str | None = None
    if question.status == Question.Status.ANSWERED or question.answered_at is not None:
        answer = MASK if question.kind == Question.Kind.CODE else question.answer
    return {
        "id": question.pk,
        "status": question.status,
        "step_id": question.step_id,
        "question": question.text,
        "kind": question.kind,
        "options": list(question.options),
        "answered_by": question.answered_by,
        "created_at": question.created_at,
        "expires_at": question.expires_at,
        "answerer": question.answerer.get_username() if question.answerer else None,
        "answered_at": question.answered_at,
        "answer": answer,
        "links": {
            "answer": api_url("question_answer", run_id=question.run_id, question_id=question.pk)
        },
    }


def question_out(question: Question) -> QuestionOut:
    return QuestionOut(**_question_fields(question))


def run_question_out(question: Question) -> RunQuestionOut:
    """``question`` with its run, workflow and launcher selected."""
    run = question.run
    return RunQuestionOut(
        **_question_fields(question),
        run=run.pk,
        workflow=run.workflow.slug,
        run_status=run.status,
        launched_by=run.launched_by.get_username(),
    )


def file_url(run_id: int, path: str) -> str | None:
    return api_url("run_file", run_id=run_id, path=path) if path else None


def _step_id(run: Run, index: int) -> str:
    steps = (run.version.document or {}).get("steps", [])
    return str(steps[index].get("id", "")) if 0 <= index < len(steps) else ""


def run_out(run: Run) -> RunOut:
    """The run with its steps, approvals, questions and artifacts: six queries whatever the
    run's size (run, steps, approvals, their decisions, questions with answerers, artifacts),
    two more for a failed run (the steps it may continue from)."""
    steps = (
        StepResult.objects.filter(run=run)
        .only(
            "index",
            "step_id",
            "step_type",
            "sentence",
            "status",
            "started_at",
            "duration_ms",
            "url",
            "error",
            "screenshot",
        )
        .order_by("index")
    )
    approvals = (
        ApprovalRequest.objects.filter(run=run)
        .order_by("created_at", "pk")
        .defer("evidence")
        .prefetch_related(
            Prefetch("decisions", queryset=ApprovalDecision.objects.only("verdict", "request_id"))
        )
    )
    questions = Question.objects.filter(run=run).select_related("answerer").order_by("pk")
    artifacts = Artifact.objects.filter(run=run).order_by("step_index", "pk")
    return RunOut(
        **run_summary(run),
        priority=run.get_priority_display().lower(),
        queued_ahead=queue_position(run),
        started_at=run.started_at,
        failure_reason=run.failure_reason,
        failure_step=run.failure_step,
        steps_executed=run.steps_executed,
        idempotency_key=run.idempotency_key,
        rerun_of=run.rerun_of_id,
        start_step=_step_id(run, run.start_index) if run.start_index else None,
        continue_from=[
            ContinueOut(
                step_id=_step_id(run, check.index),
                index=check.index,
                allowed=check.allowed,
                reason=check.reason,
            )
            for check in run_continue_checks(run)
        ],
        steps=[
            StepOut(
                index=s.index,
                step_id=s.step_id,
                type=s.step_type,
                sentence=s.sentence,
                status=s.status,
                started_at=s.started_at,
                duration_ms=s.duration_ms,
                url=s.url,
                error=s.error,
                screenshot=file_url(run.pk, s.screenshot),
            )
            for s in steps
        ],
        approvals=[approval_summary(a) for a in approvals],
        questions=[question_out(q) for q in questions],
        artifacts=[
            ArtifactOut(
                id=a.pk,
                name=a.name,
                filename=a.filename,
                sha256=a.sha256,
                size=a.size,
                step_index=a.step_index,
                download=api_url("run_artifact", run_id=run.pk, artifact_id=a.pk),
            )
            for a in artifacts
        ],
    )


def run_document(run_id: int) -> dict[str, Any]:
    """The run as ``GET /api/v1/runs/{id}`` answers it, for other adapters (the CLI: whoever
    runs manage.py on the server sees every team's runs, as the database does)."""
    run = Run.objects.select_related("workflow", "version", "launched_by").filter(pk=run_id).first()
    if run is None:
        raise Http404("no such run")
    return run_out(run).model_dump(mode="json")
