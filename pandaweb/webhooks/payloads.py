"""What a webhook says about a run or an approval: ids, status, outputs and links, never secrets.

Credentials never reach a run's inputs or outputs (they travel as ``{{ secrets.… }}`` references
resolved inside the sandbox), and the evidence of an approval is referred to by its hash and a
link: a receiver that wants to see it signs in like everyone else.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse

from approvals.models import ApprovalRequest
from sessions.models import Run


def _link(name: str, *args: Any) -> str:
    return settings.PANDAWEB_BASE_URL + reverse(name, args=args)


def run_data(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "status": run.status,
        "workflow": {"id": run.workflow_id, "slug": run.workflow.slug, "name": run.workflow.name},
        "version": run.version.number,
        "launched_by": run.launched_by.get_username(),
        "inputs": dict(run.inputs or {}),
        "outputs": dict(run.outputs or {}),
        "failure_reason": run.failure_reason,
        "failure_step": run.failure_step,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "links": {"run": _link("runs:detail", run.pk)},
    }


def approval_data(approval: ApprovalRequest, run: Run | None = None) -> dict[str, Any]:
    """``run`` is the approval's run as the caller holds it (locked, after its transition)."""
    run = run if run is not None else approval.run
    return {
        "id": approval.pk,
        "status": approval.status,
        "action": approval.action,
        "step_id": approval.step_id,
        "evidence_sha256": approval.evidence_sha256,
        "quorum": approval.quorum,
        "expires_at": approval.expires_at.isoformat(),
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
        "reason": approval.reason,
        "decisions": [
            {"reviewer": d.reviewer.get_username(), "verdict": d.verdict, "reason": d.reason}
            for d in approval.decisions.select_related("reviewer").order_by("pk")
        ],
        "run": {
            "id": run.pk,
            "status": run.status,
            "workflow": {"id": run.workflow_id, "slug": run.workflow.slug},
        },
        "links": {
            "approval": _link("approvals:detail", approval.pk),
            "run": _link("runs:detail", run.pk),
        },
    }
