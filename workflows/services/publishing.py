"""Publishing a draft: what stands between it and publishing (problems, warnings), and turning
it into the next numbered, immutable version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from pydantic import ValidationError

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from sessions.engine.steps.assertion import CHECK_KINDS
from sessions.engine.steps.base import Problem
from workflows.fileformat import LocatedProblem, canonical_data
from workflows.models import Workflow, WorkflowVersion
from workflows.schema import STEP_TYPES, WorkflowDocument, document_problems, irreversible_warnings
from workflows.services.drafts import (
    content_hash,
    credential_kinds,
    document_data,
    lock_workflow,
    refuse_archived,
)
from workflows.services.errors import WorkflowError


class PublishRefused(WorkflowError):
    def __init__(self, review: DraftReview) -> None:
        super().__init__("the draft cannot be published yet")
        self.review = review
        self.problems = review.problems
        self.warnings = review.warnings


@dataclass(frozen=True)
class DraftReview:
    """What stands between a draft and publishing it, each with the path of the document's
    value at fault (``located_*``) and as the sentence the editor shows."""

    located_problems: list[LocatedProblem]
    located_warnings: list[LocatedProblem]
    document: WorkflowDocument | None

    @property
    def problems(self) -> list[str]:
        return [str(p) for p in self.located_problems]

    @property
    def warnings(self) -> list[str]:
        return [str(w) for w in self.located_warnings]


def draft_review(workflow: Workflow, draft: WorkflowVersion) -> DraftReview:
    data = document_data(workflow, draft)
    try:
        document = WorkflowDocument.model_validate(data)
    except ValidationError as exc:
        found = []
        for error in exc.errors():
            problem = Problem(
                path=tuple(p for p in error["loc"] if p not in _TAGS),
                message=str(error["msg"]).removeprefix("Value error, "),
            )
            session_steps = (draft.session or {}).get("steps")
            found.append(_located(problem, draft.steps, session_steps))
        return DraftReview(located_problems=found, located_warnings=[], document=None)
    # The team's own credentials only: another team's is named as a missing one.
    problems = document_problems(document, credential_kinds=credential_kinds(workflow.team))
    if not document.steps:
        problems.append(Problem(path=("steps",), message="a workflow needs at least one step"))
    warnings = irreversible_warnings(
        list(document.steps), (workflow.page_facts or {}).get("opens_dialog")
    )
    steps = list(document.steps)
    session_steps = list(document.session.steps) if document.session else None
    return DraftReview(
        located_problems=[_located(p, steps, session_steps) for p in problems],
        located_warnings=[_located(w, steps, None) for w in warnings],
        document=document,
    )


def _located(problem: Problem, steps: list[Any], session_steps: list[Any] | None) -> LocatedProblem:
    """A draft has no file, hence no line: its problems are located by path alone."""
    return LocatedProblem(
        where=problem.where(steps, session_steps=session_steps),
        message=problem.message,
        line=None,
        path=problem.path,
    )


# The discriminator values pydantic puts in an error's location (not a key of the document).
_TAGS = frozenset((*STEP_TYPES, *CHECK_KINDS))


class PublishKeyReused(WorkflowError):
    """An idempotency key that published a version with another message."""


@transaction.atomic
def workflow_publish_once(
    *,
    workflow_id: int,
    user: User,
    message: str,
    accept_warnings: bool = False,
    idempotency_key: str = "",
) -> tuple[WorkflowVersion, bool]:
    """``workflow_publish``, safe to retry; returns the version and whether this call published it.

    With an ``idempotency_key``, the same (user, workflow, key) with the same message returns the
    version it published first, where a plain retry would be refused for want of a draft; with
    another message it raises PublishKeyReused. The key lives in the ``workflow.published``
    audit event, the record of that publish (versions are immutable, and need no column for it).
    """
    key = idempotency_key.strip()
    if key:
        # The retry waits for the publish it repeats, whose event it must find.
        lock_workflow(workflow_id, user=user)
        earlier = (
            AuditEvent.objects.filter(
                action="workflow.published",
                object_type="workflow",
                object_id=str(workflow_id),
                actor=user,
                extra__idempotency_key=key,
            )
            .order_by("-sequence")
            .first()
        )
        if earlier is not None:
            published = earlier.after or {}
            if published.get("message") != message.strip():
                raise PublishKeyReused(
                    f"this Idempotency-Key published version {published.get('version')} "
                    "with another message"
                )
            return WorkflowVersion.objects.get(pk=earlier.extra["version_id"]), False
    version = workflow_publish(
        workflow_id=workflow_id,
        user=user,
        message=message,
        accept_warnings=accept_warnings,
        idempotency_key=key,
    )
    return version, True


@transaction.atomic
def workflow_publish(
    *,
    workflow_id: int,
    user: User,
    message: str,
    accept_warnings: bool = False,
    idempotency_key: str = "",
) -> WorkflowVersion:
    """Turn the draft into the next numbered, immutable version.

    Refused while the draft has problems, and while it has warnings (a click that reads like
    "pay" but is not irreversible) unless ``accept_warnings``. Not idempotent: publishing twice
    needs a new draft in between (there is none right after publishing).
    """
    workflow = lock_workflow(workflow_id, user=user)
    refuse_archived(workflow)
    draft = workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).first()
    if draft is None:
        raise WorkflowError("there is no draft to publish; change something first")
    message = message.strip()
    if not message:
        raise WorkflowError("message", {"message": ["say what changed in this version"]})
    review = draft_review(workflow, draft)
    if review.problems or (review.warnings and not accept_warnings):
        raise PublishRefused(review)
    assert review.document is not None
    number = (workflow.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    draft.status = WorkflowVersion.Status.PUBLISHED
    draft.number = number
    draft.document = canonical_data(review.document)
    draft.content_hash = content_hash(review.document)
    draft.author = user
    draft.message = message
    draft.published_at = timezone.now()
    draft.save()
    audit_record(
        action="workflow.published",
        object_type="workflow",
        object_id=workflow.pk,
        team_id=workflow.team_id,
        actor=user,
        after={"version": number, "content_hash": draft.content_hash, "message": message},
        extra={
            "version_id": draft.pk,
            "accepted_warnings": review.warnings,
            **({"idempotency_key": idempotency_key} if idempotency_key else {}),
        },
    )
    return draft
