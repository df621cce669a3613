"""Request and response bodies of the HTTP API (pydantic, through django-ninja)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import Field


class WorkflowOut(Schema):
    slug: str
    name: str
    team: str = Field(description="The slug of the team whose workflow it is.")
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


class ContinueOut(Schema):
    step_id: str
    index: int
    allowed: bool
    reason: str = Field(description="Why a new run may not start here ('' when it may).")


class RunAgainIn(Schema):
    inputs: dict[str, InputValue] | None = Field(
        None, description="One value per parameter; left out: the original run's inputs."
    )
    version: Literal["same", "latest"] = Field(
        "same",
        description="The original run's version, or the workflow's latest published one "
        "(not when continuing: the steps are the original's).",
    )
    start_step: str = Field(
        "",
        description="Continue a failed run from this step (its id; see the run's "
        "continue_from): the new run starts there with the original's outputs so far.",
        max_length=100,
    )
    priority: str = Field(
        "", description="low, normal or high; left out: the original's.", max_length=10
    )


class ReconcileIn(Schema):
    happened: bool = Field(
        description="Whether the approved action reached the portal, as the portal shows it."
    )
    note: str = Field(description="What you checked, for the audit trail.", max_length=2000)


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
    rerun_of: int | None = Field(description="The run this one repeats or continues, if any.")
    start_step: str | None = Field(
        description="The step a continuing run started at (the steps before it were not run)."
    )
    continue_from: list[ContinueOut] = Field(
        description="For a failed run: each step a new run may continue from "
        "(POST …/again with start_step), or why not."
    )
    steps: list[StepOut]
    approvals: list[ApprovalSummary]
    questions: list[QuestionOut]
    artifacts: list[ArtifactOut]


class RunPage(Schema):
    items: list[RunSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page.")


class ApprovalCommentOut(Schema):
    id: int
    author: str
    body: str
    created_at: datetime


class ApprovalOut(ApprovalSummary):
    run: int
    workflow: str
    launched_by: str
    reason: str
    decided_at: datetime | None
    evidence: dict[str, Any]
    decisions: list[dict[str, Any]]
    screenshot: str | None
    reviewer_group: str = Field(
        description="The group whose members decide it: its workflow's, or the one it was "
        "handed to."
    )
    escalated_to: str | None = Field(
        description="The group that may also decide it since it was escalated; null until then."
    )
    assignee: str | None = Field(
        description="The person it was handed to, who is told of it (they decide only if the "
        "policy lets them)."
    )
    comments: list[ApprovalCommentOut] = Field(description="Oldest first; never verdicts.")


class DecisionIn(Schema):
    verdict: Literal["approve", "reject"]
    evidence_sha256: str = Field(
        min_length=64, max_length=64, description="The evidence hash you were shown."
    )
    reason: str = Field(default="", max_length=2000)


class CommentIn(Schema):
    body: str = Field(
        description="A remark for everyone who reviews the request, at most 4000 characters; "
        "never a verdict."
    )


class HandOverIn(Schema):
    """One person or one group: the request's new reviewers, who are told."""

    username: str = Field(
        "", description="A person of the run's team who may decide the request.", max_length=150
    )
    group: str = Field(
        "", description="A group whose members decide approvals (its name).", max_length=150
    )
    note: str = Field(
        "", description="Why, for the new reviewers and the audit trail.", max_length=2000
    )


class AuditEventOut(Schema):
    sequence: int = Field(description="Its place in the chain: pass the last one as ?after=.")
    occurred_at: datetime
    actor: str = Field(description="The person's username, or runner / system.")
    actor_kind: str
    action: str
    object_type: str
    object_id: str
    team: str | None = Field(description="The team whose trail it is in (its slug), if any.")
    run_id: int | None
    approval_id: int | None
    before: Any
    after: Any
    extra: dict[str, Any] = Field(description="Context, e.g. the API token it came through (via).")
    prev_hash: str
    hash: str


class AuditEventPage(Schema):
    items: list[AuditEventOut]
    next_after: int = Field(
        description="Pass as ?after= next time: the last event's sequence (the one asked after "
        "when there is none yet)."
    )
    more: bool = Field(description="Whether more events wait now (else: ask again later).")


class VerifyOut(Schema):
    ok: bool
    count: int
    last_sequence: int | None
    last_hash: str | None
    problem: str | None
    # The team whose chain was verified alone (its head is last_hash); null for the whole chain.
    team: str | None = None


class CallbackOut(Schema):
    url: str
    secret: str = Field(
        description="The Standard Webhooks secret (whsec_…) that signs the callbacks of this run."
    )


class RunLaunchedOut(RunOut):
    callback: CallbackOut | None = Field(
        None, description="Where the run's callbacks go and their signing secret."
    )


# Managing workflows (workflow_api.py) -----------------------------------------------------------


class DocumentProblemOut(Schema):
    field: str = Field(
        description="Dotted path to the value at fault in the workflow document (list indexes "
        "from 0: steps.1.target), or 'file' for the file as a whole."
    )
    where: str = Field(description="The same place in people's words (step 2 'pay', field …).")
    message: str
    line: int | None = Field(description="The line of the imported file, when there is a file.")


class DraftOut(Schema):
    workflow: str
    created_at: datetime
    updated_at: datetime
    document: dict[str, Any] = Field(
        description="The workflow file this draft would publish as (settings included)."
    )
    problems: list[DocumentProblemOut] = Field(description="Publishing is refused until fixed.")
    warnings: list[DocumentProblemOut] = Field(
        description="Publishing needs accept_warnings: true while there are any."
    )
    links: dict[str, str]


class WorkflowDetailOut(WorkflowOut):
    reviewer_group: str
    settings: dict[str, Any] = Field(
        description="The settings the next published version carries (the file's settings "
        "block); runs use those of the latest published version."
    )
    offer_as_tool: bool
    has_draft: bool


class WorkflowSettingsIn(Schema):
    """Only the fields sent change; the others keep their values."""

    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = None
    reviewer_group: str | None = Field(None, description="A group's name.", max_length=150)
    allowed_hosts: list[str] | None = None
    step_budget: int | None = None
    run_ttl_minutes: int | None = None
    max_concurrent_runs: int | None = None
    approval_quorum: int | None = None
    approval_expiry_minutes: int | None = None
    author_may_approve: bool | None = None
    approval_remind_before_minutes: int | None = None
    approval_escalate_after_minutes: int | None = None
    approval_escalation_group: str | None = Field(
        None, description="A group's name; empty for none.", max_length=150
    )
    approval_reach: dict[str, Any] | None = Field(
        None,
        description="slack_channel, passkey, passkey_above_amount, facts: as in the file's "
        "settings.approval; the options sent replace those options.",
    )
    recording: dict[str, Any] | None = Field(
        None, description="filmstrip options as in the file's settings; those sent replace."
    )
    credentials: list[str] | None = Field(None, description="Credential names.")
    offer_as_tool: bool | None = Field(None, description="An administrator's token only.")


class PublishIn(Schema):
    message: str = Field(description="What changed in this version.", max_length=500)
    accept_warnings: bool = Field(
        False,
        description="Publish although the draft has warnings (a click that reads like 'pay' "
        "but is not marked irreversible): the dashboard's “publish anyway”.",
    )


class VersionSummary(Schema):
    number: int
    published_at: datetime | None
    author: str | None
    message: str
    content_hash: str
    links: dict[str, str]


class FieldChangeOut(Schema):
    path: str
    old: Any
    new: Any


class DiffEntryOut(Schema):
    section: str
    kind: str
    label: str
    changes: list[FieldChangeOut]
    note: str


class DiffOut(Schema):
    workflow: str
    old: str
    new: str
    entries: list[DiffEntryOut]


class SessionTemplateOut(Schema):
    workflow: str
    version: int = Field(description="The latest published version, whose template runs fork.")
    backend: str
    status: Literal["never baked", "baking", "ready", "stale", "failed"]
    template: int | None
    requested_by: str | None
    baked_at: datetime | None
    rebake_due_at: datetime | None
    rebake_every_hours: int
    failure_reason: str
    stale_reason: str
    links: dict[str, str]
