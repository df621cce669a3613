"""Request and response bodies of the HTTP API (pydantic, through django-ninja)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import Field


class WorkflowOut(Schema):
    slug: str
    name: str
    description: str
    latest_version: int | None
    archived: bool
    links: dict[str, str]


class WorkflowVersionOut(Schema):
    workflow: str
    number: int
    published_at: datetime | None
    content_hash: str
    message: str
    parameters: list[dict[str, Any]]
    inputs_schema: dict[str, Any]
    steps: int
    links: dict[str, str]


InputValue = str | int | float | bool | None


class RunLaunchIn(Schema):
    workflow: str = Field(description="The workflow's slug; its latest published version runs.")
    inputs: dict[str, InputValue] = Field(
        default_factory=dict, description="One value per parameter (see the version's schema)."
    )
    priority: str = Field(
        "normal",
        description="low, normal or high: the run's place in its workflow's queue when the "
        "workflow's concurrency limit is reached (higher first, then oldest first).",
        max_length=10,
    )
    callback_url: str = Field(
        "",
        description="Optional: pandaweb POSTs the run's end (run.finished, run.failed, "
        "run.needs_reconciliation) and its approval requests (approval.requested) here, signed "
        "like webhooks (Standard Webhooks) with the secret the launch answers with.",
        max_length=2000,
    )


class StepOut(Schema):
    index: int
    step_id: str
    type: str
    sentence: str
    status: str
    started_at: datetime
    duration_ms: int
    url: str
    error: str
    screenshot: str | None


class ArtifactOut(Schema):
    id: int
    name: str
    filename: str
    sha256: str
    size: int
    step_index: int
    download: str


class ApprovalSummary(Schema):
    id: int
    status: str
    step_id: str
    action: str
    created_at: datetime
    expires_at: datetime
    evidence_sha256: str
    approvals: int
    quorum: int
    links: dict[str, str]


class RunSummary(Schema):
    id: int
    workflow: str
    version: int | None
    status: str
    launched_by: str
    created_at: datetime
    finished_at: datetime | None
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    links: dict[str, str]


class QuestionOut(Schema):
    id: int
    status: str
    step_id: str
    question: str
    kind: str = Field(description="text, code (a one-time code) or choice")
    options: list[str]
    answered_by: str = Field(description="'launcher' or the group whose members may answer")
    created_at: datetime
    expires_at: datetime
    answerer: str | None
    answered_at: datetime | None
    answer: str | None = Field(
        description="The answer; a one-time code is never shown (••••), nor stored in clear."
    )
    links: dict[str, str]


class RunQuestionOut(QuestionOut):
    """A question with the run that asks it: what a token that answers (``questions:answer``)
    sees, without the run's steps, inputs or outputs, which need ``runs:read``."""

    run: int
    workflow: str
    run_status: str = Field(description="awaiting_answer while it waits; running once answered")
    launched_by: str


class AnswerIn(Schema):
    answer: str = Field(min_length=1, max_length=1000)


class RunOut(RunSummary):
    priority: str
    queued_ahead: int | None = Field(
        description="While the run waits for a free slot of its workflow's concurrency limit: "
        "how many runs of the workflow go before it. Null once it was handed to a worker."
    )
    started_at: datetime | None
    failure_reason: str
    failure_step: str
    steps_executed: int
    idempotency_key: str
    steps: list[StepOut]
    approvals: list[ApprovalSummary]
    questions: list[QuestionOut]
    artifacts: list[ArtifactOut]


class RunPage(Schema):
    items: list[RunSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page.")


class ApprovalOut(ApprovalSummary):
    run: int
    workflow: str
    launched_by: str
    reason: str
    decided_at: datetime | None
    evidence: dict[str, Any]
    decisions: list[dict[str, Any]]
    screenshot: str | None


class DecisionIn(Schema):
    verdict: Literal["approve", "reject"]
    evidence_sha256: str = Field(
        min_length=64, max_length=64, description="The evidence hash you were shown."
    )
    reason: str = Field(default="", max_length=2000)


class VerifyOut(Schema):
    ok: bool
    count: int
    last_sequence: int | None
    last_hash: str | None
    problem: str | None


class CallbackOut(Schema):
    url: str
    secret: str = Field(
        description="The Standard Webhooks secret (whsec_…) that signs the callbacks of this run."
    )


class RunLaunchedOut(RunOut):
    callback: CallbackOut | None = Field(
        None, description="Where the run's callbacks go and their signing secret."
    )
