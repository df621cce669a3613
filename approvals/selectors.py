from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.db.models import QuerySet
from django.http import Http404

from approvals.models import ApprovalDecision, ApprovalRequest
from sessions.models import Run, StepResult
from workflows.models import Workflow

QUEUE_LIMIT = 200


def approval_pending_count() -> int:
    return ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING).count()


def approval_queue(
    *, workflow_slug: str = "", pending_only: bool = True
) -> QuerySet[ApprovalRequest]:
    """The queue: pending requests oldest first (the next to decide on top); with every status,
    the latest first."""
    requests = ApprovalRequest.objects.select_related(
        "run__workflow", "run__version", "run__launched_by"
    )
    if workflow_slug:
        requests = requests.filter(run__workflow__slug=workflow_slug)
    if pending_only:
        return requests.filter(status=ApprovalRequest.Status.PENDING).order_by("created_at", "pk")
    return requests.order_by("-created_at", "-pk")[:QUEUE_LIMIT]


def approval_queue_workflows() -> QuerySet[Workflow]:
    """Workflows that ever asked for an approval: the queue's filter choices."""
    return (
        Workflow.objects.filter(runs__approvals__isnull=False)
        .distinct()
        .only("name", "slug")
        .order_by("name")
    )


def approval_get(approval_id: int) -> ApprovalRequest:
    """The request (with its run, workflow and people) or 404."""
    try:
        return ApprovalRequest.objects.select_related(
            "run__workflow", "run__version__author", "run__launched_by", "previous"
        ).get(pk=approval_id)
    except ApprovalRequest.DoesNotExist:
        raise Http404("no such approval request") from None


def approval_decisions(approval: ApprovalRequest) -> QuerySet[ApprovalDecision]:
    return approval.decisions.select_related("reviewer").order_by("created_at", "pk")


def approval_successor(approval: ApprovalRequest) -> ApprovalRequest | None:
    """The request that replaced this one because the page changed since approval."""
    return ApprovalRequest.objects.filter(previous=approval).first()


def approval_timeline(run: Run) -> QuerySet[StepResult]:
    """The run's steps so far (the gated step has not run yet)."""
    return run.step_results.order_by("index")


# What the reviewer compares --------------------------------------------------------------------


@dataclass(frozen=True)
class SourceValue:
    """One value the run started from (an input) or read from the portal (an output)."""

    kind: str  # "input" or "output"
    name: str
    label: str
    value: str
    unit: str = ""
    used: bool = False


@dataclass(frozen=True)
class FilledValue:
    """One value the run typed into the portal, with where it came from."""

    field: str
    value: str
    secret: bool
    step_id: str
    on_page: str | None  # what the field holds now (None: not on this page, or secret)
    on_this_page: bool
    sources: list[SourceValue]

    @property
    def page_differs(self) -> bool:
        return self.on_this_page and self.on_page is not None and self.on_page != self.value


@dataclass(frozen=True)
class EvidenceValues:
    filled: list[FilledValue]
    inputs: list[SourceValue]
    outputs: list[SourceValue]


def _same(left: str, right: str) -> bool:
    """Equal once spacing and letter case are ignored ("DE97 2004" is "de972004")."""
    a, b = "".join(left.split()).casefold(), "".join(right.split()).casefold()
    return bool(a) and a == b


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def approval_values(approval: ApprovalRequest) -> EvidenceValues:
    """The typed values next to the run's inputs and extracted outputs, as frozen in the
    evidence, each typed value linked to the inputs and outputs that hold the same value."""
    evidence = approval.evidence or {}
    run = approval.run
    parameters = {
        p.get("name"): p
        for p in ((run.version.document or {}) if run else {}).get("parameters", [])
    }
    inputs = [
        SourceValue(
            kind="input",
            name=name,
            label=_text(parameters.get(name, {}).get("label")) or name,
            value=_text(value),
            unit=_text(parameters.get(name, {}).get("currency")),
        )
        for name, value in (evidence.get("inputs") or {}).items()
    ]
    outputs = [
        SourceValue(kind="output", name=name, label=name, value=_text(value))
        for name, value in (evidence.get("outputs") or {}).items()
    ]
    filled = []
    for entry in evidence.get("filled") or []:
        value = _text(entry.get("value"))
        secret = bool(entry.get("secret"))
        sources = [] if secret else [s for s in inputs + outputs if _same(s.value, value)]
        filled.append(
            FilledValue(
                field=_text(entry.get("field")),
                value=value,
                secret=secret,
                step_id=_text(entry.get("step_id")),
                on_page=None if entry.get("on_page") is None else _text(entry["on_page"]),
                on_this_page="on_page" in entry,
                sources=sources,
            )
        )
    used = {(s.kind, s.name) for f in filled for s in f.sources}
    return EvidenceValues(
        filled=filled,
        inputs=[replace(s, used=(s.kind, s.name) in used) for s in inputs],
        outputs=[replace(s, used=(s.kind, s.name) in used) for s in outputs],
    )
