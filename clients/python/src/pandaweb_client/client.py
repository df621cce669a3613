"""The client: one object per server and token, plain methods over ``/api/v1/``.

Every call raises :class:`ApiError` with the server's problem document (RFC 9457) when the server
says no, so a caller sees the same words and field paths the dashboard shows.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx2

Found = TypeVar("Found")
# A run in one of these will not change again; in one of these it waits for a person.
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "expired", "interrupted"})
WAITING_STATUSES = frozenset({"awaiting_approval", "awaiting_answer", "needs_reconciliation"})
# Sending again after a dropped connection is safe (the same Idempotency-Key and body return
# the same run, version or batch), so a launch, a publish or a batch is tried this many times
# before the error reaches the caller.
LAUNCH_ATTEMPTS = 3
# A session template in one of these changes only when someone bakes it again.
SETTLED_TEMPLATE_STATUSES = frozenset({"ready", "failed", "stale", "never baked"})


class ApiError(Exception):
    """The server refused: ``status`` and its problem document (``title``, ``detail``, and the
    fields at fault in ``errors``, each ``{"field": "inputs.amount", "message": "…"}``)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.title = str(problem.get("title") or "")
        self.detail = str(problem.get("detail") or "")
        self.errors: list[dict[str, Any]] = list(problem.get("errors") or [])
        words = self.detail or self.title or f"HTTP {status}"
        for error in self.errors:
            words += f"\n  {error.get('field')}: {error.get('message')}"
        super().__init__(words)


@dataclass(frozen=True)
class Run:
    id: int
    workflow: str
    status: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    failure_reason: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Run:
        return cls(
            id=int(data["id"]),
            workflow=str(data["workflow"]),
            status=str(data["status"]),
            inputs=dict(data.get("inputs") or {}),
            outputs=dict(data.get("outputs") or {}),
            failure_reason=str(data.get("failure_reason") or ""),
            raw=data,
        )

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def pending_approvals(self) -> list[dict[str, Any]]:
        return [a for a in self.raw.get("approvals") or [] if a.get("status") == "pending"]

    @property
    def continue_from(self) -> list[dict[str, Any]]:
        """A failed run's later steps, each ``{"step_id", "allowed", "reason"}``: where
        :meth:`Client.again` may continue it (``start_step``), or why not."""
        return list(self.raw.get("continue_from") or [])

    @property
    def pending_question(self) -> dict[str, Any] | None:
        return next(
            (q for q in self.raw.get("questions") or [] if q.get("status") == "pending"), None
        )

    @property
    def callback(self) -> dict[str, Any] | None:
        """``{"url": …, "secret": "whsec_…"}`` of a launch with ``callback_url``: verify each
        delivery with the secret (any Standard Webhooks library)."""
        callback = self.raw.get("callback")
        return dict(callback) if callback else None


@dataclass(frozen=True)
class Comment:
    """A remark on an approval request, for everyone who reviews it; never a verdict."""

    id: int
    author: str
    body: str
    created_at: datetime
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Comment:
        return cls(
            id=int(data["id"]),
            author=str(data.get("author") or ""),
            body=str(data.get("body") or ""),
            created_at=datetime.fromisoformat(str(data["created_at"])),
            raw=data,
        )


@dataclass(frozen=True)
class Approval:
    id: int
    run: int
    status: str
    action: str
    evidence_sha256: str
    # What a reviewer decides on (amount, payee, reference), as the gate read them.
    facts: list[dict[str, Any]]
    # Who decides it: the group, and the person it was handed to (None when it was not); with
    # its comments, oldest first. A single request's answer has them, a list's does not.
    reviewer_group: str
    assignee: str | None
    comments: list[Comment]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Approval:
        return cls(
            id=int(data["id"]),
            run=int(data.get("run") or 0),
            status=str(data["status"]),
            action=str(data.get("action") or ""),
            evidence_sha256=str(data.get("evidence_sha256") or ""),
            facts=list((data.get("evidence") or {}).get("facts") or []),
            reviewer_group=str(data.get("reviewer_group") or ""),
            assignee=data.get("assignee"),
            comments=[Comment.of(c) for c in data.get("comments") or []],
            raw=data,
        )


@dataclass(frozen=True)
class Event:
    """One event of the stream: its id (resume after it), its type and its data."""

    id: str
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Workflow:
    slug: str
    name: str
    latest_version: int | None
    archived: bool
    # The settings the next published version carries (the file's settings block); present on
    # a single workflow's answer, empty in a list.
    settings: dict[str, Any]
    has_draft: bool
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Workflow:
        return cls(
            slug=str(data["slug"]),
            name=str(data.get("name") or ""),
            latest_version=data.get("latest_version"),
            archived=bool(data.get("archived")),
            settings=dict(data.get("settings") or {}),
            has_draft=bool(data.get("has_draft")),
            raw=data,
        )


@dataclass(frozen=True)
class Healing:
    """A failed step's healing proposal: ``candidates`` (each ``{"number", "role", "name",
    "target", "reasons", "matches", "picture"}``), best first; ``confirm`` is the step's id when
    it is irreversible (send it back to change the step); ``model_call`` while or once a model
    was asked."""

    run: int
    step_index: int
    step_id: str
    target_field: str
    looked_for: str
    candidates: list[dict[str, Any]]
    confirm: str | None
    model_call: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Healing:
        return cls(
            run=int(data["run"]),
            step_index=int(data["step_index"]),
            step_id=str(data["step_id"]),
            target_field=str(data["field"]),
            looked_for=str(data["looked_for"]),
            candidates=list(data.get("candidates") or []),
            confirm=data.get("confirm"),
            model_call=data.get("model_call"),
            raw=data,
        )


@dataclass(frozen=True)
class Draft:
    """The draft as it would publish: ``problems`` block publishing, ``warnings`` need
    accepting; each ``{"field": "steps.1.target", "where": "step 2 …", "message": …}``."""

    workflow: str
    document: dict[str, Any]
    problems: list[dict[str, Any]]
    warnings: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Draft:
        return cls(
            workflow=str(data["workflow"]),
            document=dict(data.get("document") or {}),
            problems=list(data.get("problems") or []),
            warnings=list(data.get("warnings") or []),
            raw=data,
        )


@dataclass(frozen=True)
class Version:
    number: int
    author: str | None
    message: str
    content_hash: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Version:
        return cls(
            number=int(data["number"]),
            author=data.get("author"),
            message=str(data.get("message") or ""),
            content_hash=str(data.get("content_hash") or ""),
            raw=data,
        )


@dataclass(frozen=True)
class SessionTemplate:
    """The session runs of ``workflow``'s latest version fork: ``status`` is ``ready``,
    ``baking``, ``never baked``, ``stale`` (``stale_reason``) or ``failed``
    (``failure_reason``)."""

    workflow: str
    version: int
    status: str
    failure_reason: str
    stale_reason: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> SessionTemplate:
        return cls(
            workflow=str(data["workflow"]),
            version=int(data["version"]),
            status=str(data["status"]),
            failure_reason=str(data.get("failure_reason") or ""),
            stale_reason=str(data.get("stale_reason") or ""),
            raw=data,
        )


@dataclass(frozen=True)
class Credential:
    """A stored secret's facts; its value never comes back."""

    name: str
    kind: str
    description: str
    used_by: list[str]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Credential:
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            description=str(data.get("description") or ""),
            used_by=list(data.get("used_by") or []),
            raw=data,
        )


@dataclass(frozen=True)
class Schedule:
    id: int
    workflow: str
    name: str
    cron: str
    timezone: str
    in_words: str
    inputs: dict[str, Any]
    paused: bool
    owner: str
    # The next five launch times, aware; none while paused.
    next_times: list[datetime]
    last_run: int | None
    last_outcome: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Schedule:
        return cls(
            id=int(data["id"]),
            workflow=str(data["workflow"]),
            name=str(data.get("name") or ""),
            cron=str(data["cron"]),
            timezone=str(data.get("timezone") or ""),
            in_words=str(data.get("in_words") or ""),
            inputs=dict(data.get("inputs") or {}),
            paused=bool(data.get("paused")),
            owner=str(data.get("owner") or ""),
            next_times=[datetime.fromisoformat(t) for t in data.get("next_times") or []],
            last_run=data.get("last_run"),
            last_outcome=str(data.get("last_outcome") or ""),
            raw=data,
        )


@dataclass(frozen=True)
class Batch:
    """One run per row: ``rows`` each with its ``row``, ``inputs``, ``status``, ``run`` and
    ``approval``; ``invalid`` the problems of rows kept back (``row``, ``field``, ``message``)."""

    id: int
    workflow: str
    total: int
    settled: int
    done: bool
    counts: dict[str, int]
    rows: list[dict[str, Any]]
    invalid: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Batch:
        return cls(
            id=int(data["id"]),
            workflow=str(data["workflow"]),
            total=int(data.get("total") or 0),
            settled=int(data.get("settled") or 0),
            done=bool(data.get("done")),
            counts=dict(data.get("counts") or {}),
            rows=list(data.get("rows") or []),
            invalid=list(data.get("invalid") or []),
            raw=data,
        )


@dataclass(frozen=True)
class Webhook:
    """A webhook subscription; ``secret`` (``whsec_…``) only in the answer that made it."""

    id: int
    name: str
    url: str
    events: list[str]
    workflow: str | None
    active: bool
    secret: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Webhook:
        return cls(
            id=int(data["id"]),
            name=str(data.get("name") or ""),
            url=str(data["url"]),
            events=list(data.get("events") or []),
            workflow=data.get("workflow"),
            active=bool(data.get("active")),
            secret=str(data.get("secret") or ""),
            raw=data,
        )


@dataclass(frozen=True)
class Team:
    """A team and the token owner's roles there (``Operators``, ``Reviewers``, ``Compliance``).
    ``people``, ``workflows`` and ``members`` (each ``{"username": …, "roles": […]}``) are an
    admin's to read: None for anyone else, and ``members`` None in a list too."""

    slug: str
    name: str
    my_roles: list[str]
    people: int | None
    workflows: int | None
    members: list[dict[str, Any]] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Team:
        members = data.get("members")
        return cls(
            slug=str(data["slug"]),
            name=str(data.get("name") or ""),
            my_roles=list(data.get("my_roles") or []),
            people=data.get("people"),
            workflows=data.get("workflows"),
            members=list(members) if members is not None else None,
            raw=data,
        )


class Client:
    """``Client("https://pandaweb.example", token="pw_…")``; usable as a context manager."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx2.Client(
            base_url=f"{self.base_url}/api/v1",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # Runs -----------------------------------------------------------------------------------

    def launch(
        self,
        workflow: str,
        inputs: dict[str, Any] | None = None,
        *,
        priority: str | None = None,
        idempotency_key: str | None = None,
        callback_url: str | None = None,
    ) -> Run:
        """Queue a run of ``workflow``'s latest published version. Retried on a dropped
        connection with the same Idempotency-Key, so it never launches twice."""
        body: dict[str, Any] = {"workflow": workflow, "inputs": inputs or {}}
        if priority is not None:
            body["priority"] = priority
        if callback_url is not None:
            body["callback_url"] = callback_url
        return Run.of(self._post_once("/runs/", idempotency_key, json=body))

    def run(self, run_id: int) -> Run:
        return Run.of(self._json("GET", f"/runs/{run_id}"))

    def runs(self, **filters: Any) -> Iterator[Run]:
        """Every run matching ``filters`` (``workflow=``, ``status=``), newest first, page by
        page."""
        params = {k: v for k, v in filters.items() if v is not None}
        while True:
            page = self._json("GET", "/runs/", params=params)
            yield from (Run.of(item) for item in page["items"])
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]

    def cancel(self, run_id: int) -> Run:
        return Run.of(self._json("POST", f"/runs/{run_id}/cancel"))

    def wait(
        self,
        run_id: int,
        *,
        until: Iterable[str] = FINAL_STATUSES | WAITING_STATUSES,
        timeout: float = 900.0,
    ) -> Run:
        """The run once its status is one of ``until`` (by default: finished, or waiting for a
        person); TimeoutError after ``timeout`` seconds."""
        wanted = frozenset(until)
        return self._poll(
            lambda: self.run(run_id),
            lambda run: run.status in wanted,
            timeout=timeout,
            what=f"run #{run_id}",
        )

    def answer(self, run_id: int, answer: str) -> dict[str, Any]:
        """Answer the question the run waits at (an ``ask`` step); ``LookupError`` when it waits
        at none."""
        question = self.run(run_id).pending_question
        if question is None:
            raise LookupError(f"run #{run_id} waits for no answer")
        path = f"/runs/{run_id}/questions/{question['id']}/answer"
        return dict(self._json("POST", path, json={"answer": answer}))

    def again(
        self,
        run_id: int,
        inputs: dict[str, Any] | None = None,
        *,
        start_step: str = "",
        latest_version: bool = False,
        priority: str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """A new run linked to ``run_id``: its inputs (or ``inputs``), its version (or the
        latest published one). ``start_step`` continues a failed run from that step (see
        :attr:`Run.continue_from`). Retried on a dropped connection with one Idempotency-Key."""
        body: dict[str, Any] = {"version": "latest" if latest_version else "same"}
        if inputs is not None:
            body["inputs"] = inputs
        if start_step:
            body["start_step"] = start_step
        if priority is not None:
            body["priority"] = priority
        return Run.of(self._post_once(f"/runs/{run_id}/again", idempotency_key, json=body))

    def reconcile(self, run_id: int, *, happened: bool, note: str) -> Run:
        """Say, after looking at the portal, whether the approved action of a run that needs
        reconciliation happened; ``note`` says what was checked."""
        body = {"happened": happened, "note": note}
        return Run.of(self._json("POST", f"/runs/{run_id}/reconcile", json=body))

    # Healing --------------------------------------------------------------------------------

    def healing(
        self, run_id: int, step_index: int, *, field: str = "", call: int | None = None
    ) -> Healing:
        """What the failed step's page offers for its target; with ``call``, in the order (or
        with the choice) of that model question."""
        params: dict[str, Any] = {"field": field} if field else {}
        if call is not None:
            params["call"] = call
        path = f"/runs/{run_id}/steps/{step_index}/healing"
        return Healing.of(self._json("GET", path, params=params))

    def ask_model(
        self, run_id: int, step_index: int, *, field: str = "", description: str = ""
    ) -> Healing:
        """Have the configured model rank the candidates (or choose the element
        ``description`` means) and wait for its answer."""
        path = f"/runs/{run_id}/steps/{step_index}/healing/model"
        asked = Healing.of(
            self._json("POST", path, json={"field": field, "description": description})
        )
        call = int((asked.model_call or {})["id"])
        return self._poll(
            lambda: self.healing(run_id, step_index, call=call),
            lambda found: (found.model_call or {}).get("status") != "pending",
            timeout=120.0,
            what=f"model question {call}",
        )

    def heal(
        self,
        run_id: int,
        step_index: int,
        *,
        number: int | None = None,
        target: str = "",
        field: str = "",
        confirm: str = "",
    ) -> Draft:
        """Put element ``number`` of the step's page (or a ``target`` written in the editor's
        one-line form) into the workflow's draft; publish it for runs to use it."""
        body: dict[str, Any] = {"field": field, "target": target, "confirm": confirm}
        if number is not None:
            body["number"] = number
        path = f"/runs/{run_id}/steps/{step_index}/healing"
        return Draft.of(self._json("POST", path, json=body))

    def download_bundle(self, run_id: int, destination: str | Path) -> Path:
        """The run's evidence bundle (a signed zip), written to ``destination``."""
        target = Path(destination)
        with self._http.stream("GET", f"/runs/{run_id}/bundle") as response:
            self._raise_for(response, streamed=True)
            with target.open("wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)
        return target

    # Approvals ------------------------------------------------------------------------------

    def approvals(self) -> list[Approval]:
        """Pending requests the token may read, oldest first."""
        return [Approval.of(item) for item in self._json("GET", "/approvals/")]

    def approval(self, approval_id: int) -> Approval:
        return Approval.of(self._json("GET", f"/approvals/{approval_id}"))

    def decide(
        self, approval_id: int, *, approve: bool, evidence_sha256: str, reason: str = ""
    ) -> Approval:
        """Approve or reject, bound to the evidence the decider looked at: a verdict on other
        evidence (the page changed) is refused with a 409."""
        body = {
            "verdict": "approve" if approve else "reject",
            "evidence_sha256": evidence_sha256,
            "reason": reason,
        }
        return Approval.of(self._json("POST", f"/approvals/{approval_id}/decision", json=body))

    def comment(self, approval_id: int, body: str) -> Comment:
        """Add a remark to the request for everyone who reviews it (its page shows it in the
        history); never a verdict. Each call adds one."""
        return Comment.of(
            self._json("POST", f"/approvals/{approval_id}/comments", json={"body": body})
        )

    def hand_over(
        self,
        approval_id: int,
        username: str | None = None,
        group: str | None = None,
        note: str = "",
    ) -> Approval:
        """Hand a pending request to one person (``username``) or one group (``group``), who are
        told, with ``note``. Someone the policy does not let decide it is refused with a 409 in
        words; an unknown person is a 422 on ``username``."""
        body = {"username": username or "", "group": group or "", "note": note}
        return Approval.of(self._json("POST", f"/approvals/{approval_id}/assignee", json=body))

    # Workflows ------------------------------------------------------------------------------

    def workflows(self, *, archived: bool = False) -> list[Workflow]:
        """Workflows with a published version (``archived=True``: the archived ones)."""
        params = {"archived": "true"} if archived else {}
        return [Workflow.of(item) for item in self._json("GET", "/workflows/", params=params)]

    def workflow(self, slug: str) -> Workflow:
        return Workflow.of(self._json("GET", f"/workflows/{slug}"))

    def import_workflow(self, source: bytes | str | os.PathLike[str]) -> Workflow:
        """A workflow file (its content as bytes, or a path; YAML, or JSON for a ``.json``
        path) becomes the draft of the workflow with its slug, or a new workflow. A refused
        file raises ApiError with one entry per problem (``field``, ``where``, ``line``)."""
        if isinstance(source, bytes):
            content, kind = source, "application/yaml"
        else:
            path = Path(source)
            content = path.read_bytes()
            kind = "application/json" if path.suffix.lower() == ".json" else "application/yaml"
        return Workflow.of(
            self._json("POST", "/workflows/import", content=content, headers={"Content-Type": kind})
        )

    def archive(self, slug: str) -> Workflow:
        """Archive the workflow: nothing launches it, its draft and settings are frozen, until
        it is restored. Archiving an archived workflow changes nothing."""
        return Workflow.of(self._json("POST", f"/workflows/{slug}/archive"))

    def restore(self, slug: str) -> Workflow:
        """Bring an archived workflow back (a workflow that is not archived is left as it is)."""
        return Workflow.of(self._json("POST", f"/workflows/{slug}/restore"))

    def draft(self, slug: str) -> Draft:
        """The draft with its problems and warnings; ApiError 404 when there is none."""
        return Draft.of(self._json("GET", f"/workflows/{slug}/draft"))

    def start_draft(self, slug: str) -> Draft:
        """A draft from the latest published version, or the draft there is."""
        return Draft.of(self._json("POST", f"/workflows/{slug}/draft"))

    def change_settings(self, slug: str, **settings: Any) -> Workflow:
        """Change the settings named (``step_budget=30``, ``approval_quorum=2``,
        ``credentials=["bank-portal"]``, …); they go into the draft, started when there is
        none, and reach runs once it is published."""
        return Workflow.of(self._json("PATCH", f"/workflows/{slug}/settings", json=settings))

    def publish(
        self,
        slug: str,
        message: str,
        *,
        accept_warnings: bool = False,
        idempotency_key: str | None = None,
    ) -> Version:
        """The draft becomes the next version. Retried on a dropped connection with the same
        Idempotency-Key, so it never publishes twice. A draft with problems is a 422, one with
        warnings a 409 (``problem["warnings"]``) until ``accept_warnings``."""
        body = {"message": message, "accept_warnings": accept_warnings}
        return Version.of(self._post_once(f"/workflows/{slug}/publish", idempotency_key, json=body))

    def versions(self, slug: str) -> list[Version]:
        """The published versions, newest first."""
        return [Version.of(item) for item in self._json("GET", f"/workflows/{slug}/versions")]

    def session_template(self, slug: str) -> SessionTemplate:
        """The session template the latest version's runs fork; 404 when it logs in none."""
        return SessionTemplate.of(self._json("GET", f"/workflows/{slug}/session-template"))

    def bake_session_template(self, slug: str) -> SessionTemplate:
        """Log in again now (the workflow page's Re-bake): queued, ``status`` is ``baking``."""
        return SessionTemplate.of(self._json("POST", f"/workflows/{slug}/session-template/bake"))

    def wait_session_template(self, slug: str, *, timeout: float = 300.0) -> SessionTemplate:
        """The session template once it is no longer baking (``ready``, or ``failed`` with its
        reason); TimeoutError after ``timeout`` seconds."""
        return self._poll(
            lambda: self.session_template(slug),
            lambda template: template.status in SETTLED_TEMPLATE_STATUSES,
            timeout=timeout,
            what=f"the session template of {slug}",
        )

    # Credentials ----------------------------------------------------------------------------

    def credentials(self) -> list[Credential]:
        """Every credential by name, with the workflows that use it; never a value."""
        return [Credential.of(item) for item in self._json("GET", "/credentials/")]

    def store_credential(
        self, name: str, kind: str, values: dict[str, str], *, description: str = ""
    ) -> Credential:
        """Store a secret: ``kind`` ``username_password`` (``values``: username, password),
        ``totp`` (seed) or ``api_token`` (token). Nothing answers the value back."""
        body = {"name": name, "kind": kind, "description": description, "values": values}
        return Credential.of(self._json("POST", "/credentials/", json=body))

    def replace_credential_value(self, name: str, values: dict[str, str]) -> Credential:
        """The portal's password changed: runs from now on type the new value."""
        return Credential.of(
            self._json("POST", f"/credentials/{name}/value", json={"values": values})
        )

    # Schedules ------------------------------------------------------------------------------

    def schedules(self, *, workflow: str | None = None) -> list[Schedule]:
        params = {"workflow": workflow} if workflow else {}
        return [Schedule.of(item) for item in self._json("GET", "/schedules/", params=params)]

    def schedule(self, schedule_id: int) -> Schedule:
        return Schedule.of(self._json("GET", f"/schedules/{schedule_id}"))

    def create_schedule(
        self,
        workflow: str,
        name: str,
        cron: str,
        *,
        timezone: str = "UTC",
        inputs: dict[str, Any] | None = None,
        overlap: str | None = None,
        missed: str | None = None,
        paused: bool = False,
    ) -> Schedule:
        """Launch ``workflow``'s latest version on ``cron`` (five fields) in ``timezone``, with
        fixed ``inputs``, as the token's owner. ``overlap``: ``skip`` or ``queue_one``;
        ``missed``: ``run_once`` or ``skip``."""
        body: dict[str, Any] = {
            "workflow": workflow,
            "name": name,
            "cron": cron,
            "timezone": timezone,
            "inputs": inputs or {},
            "paused": paused,
        }
        if overlap is not None:
            body["overlap"] = overlap
        if missed is not None:
            body["missed"] = missed
        return Schedule.of(self._json("POST", "/schedules/", json=body))

    def change_schedule(self, schedule_id: int, **changes: Any) -> Schedule:
        """Change the fields named (``cron=``, ``inputs=`` replacing all of them,
        ``paused=True`` to pause, ``False`` to resume); whoever changes it becomes its owner."""
        return Schedule.of(self._json("PATCH", f"/schedules/{schedule_id}", json=changes))

    def delete_schedule(self, schedule_id: int) -> None:
        """It launches nothing more; the runs it launched stay."""
        self._raise_for(self._http.request("DELETE", f"/schedules/{schedule_id}"))

    # Batches --------------------------------------------------------------------------------

    def launch_batch(
        self,
        workflow: str,
        rows: Iterable[dict[str, Any]],
        *,
        launch_valid_rows: bool = False,
        idempotency_key: str | None = None,
    ) -> Batch:
        """One run per row. Any invalid row refuses the whole batch (ApiError 422, ``errors``
        naming each ``row`` and ``field``) unless ``launch_valid_rows``. Retried like a
        launch."""
        body = {"workflow": workflow, "rows": list(rows), "launch_valid_rows": launch_valid_rows}
        return Batch.of(self._post_once("/batches/", idempotency_key, json=body))

    def launch_batch_csv(
        self,
        workflow: str,
        source: bytes | str | os.PathLike[str],
        *,
        launch_valid_rows: bool = False,
        idempotency_key: str | None = None,
    ) -> Batch:
        """The batch page's CSV file (its content as bytes, or a path): a header line naming
        the parameters, one run per line."""
        content = source if isinstance(source, bytes) else Path(source).read_bytes()
        params = {"workflow": workflow, "launch_valid_rows": str(launch_valid_rows).lower()}
        return Batch.of(
            self._post_once(
                "/batches/csv",
                idempotency_key,
                params=params,
                content=content,
                headers={"Content-Type": "text/csv"},
            )
        )

    def batch(self, batch_id: int) -> Batch:
        return Batch.of(self._json("GET", f"/batches/{batch_id}"))

    # Webhooks -------------------------------------------------------------------------------

    def webhooks(self) -> list[Webhook]:
        return [Webhook.of(item) for item in self._json("GET", "/webhooks/")]

    def create_webhook(
        self, name: str, url: str, events: Iterable[str], *, workflow: str | None = None
    ) -> Webhook:
        """A subscription (an administrator's token); the answer carries its ``secret`` once."""
        body = {"name": name, "url": url, "events": list(events), "workflow": workflow}
        return Webhook.of(self._json("POST", "/webhooks/", json=body))

    def delete_webhook(self, subscription_id: int) -> None:
        self._raise_for(self._http.request("DELETE", f"/webhooks/{subscription_id}"))

    # Teams ----------------------------------------------------------------------------------

    def teams(self) -> list[Team]:
        """The teams the token's owner belongs to (every team for an admin), by name."""
        return [Team.of(item) for item in self._json("GET", "/teams/")]

    def team(self, slug: str) -> Team:
        """One of them (another team is a 404, as a missing one); an admin reads its members."""
        return Team.of(self._json("GET", f"/teams/{quote(slug, safe='')}"))

    def team_create(self, name: str, *, slug: str = "") -> Team:
        """A new team, with nobody in it yet (an admin's token); the slug is made from the
        name when none is given. A slug another team has is a 409."""
        return Team.of(self._json("POST", "/teams/", json={"name": name, "slug": slug}))

    def team_member_add(self, slug: str, username: str, role: str) -> Team:
        """Give ``username`` ``role`` (``Operators``, ``Reviewers`` or ``Compliance``) in the
        team (an admin's token); holding it already changes nothing. An unknown person or role
        is a 422 on ``username`` or ``role``."""
        body = {"username": username, "role": role}
        return Team.of(self._json("POST", f"/teams/{quote(slug, safe='')}/members", json=body))

    def team_member_remove(self, slug: str, username: str, role: str) -> Team:
        """Take ``role`` in the team from ``username`` (an admin's token); not holding it
        changes nothing."""
        path = "/".join(quote(part, safe="") for part in (slug, "members", username, role))
        return Team.of(self._json("DELETE", f"/teams/{path}"))

    # Events ---------------------------------------------------------------------------------

    def audit_events(self, *, after: int = 0, **filters: Any) -> Iterator[dict[str, Any]]:
        """The audit trail's events after sequence ``after``, oldest first, page by page, until
        the newest (``action="run."``, ``team=``, ``workflow=``… narrow it); each with its
        ``sequence``: pass the last one seen as ``after`` next time."""
        params = {k: v for k, v in filters.items() if v is not None}
        while True:
            page = self._json("GET", "/audit/events", params={**params, "after": after})
            yield from page["items"]
            after = int(page["next_after"])
            if not page["more"]:
                return

    def events(
        self,
        *,
        runs: Iterable[int] = (),
        workflows: Iterable[str] = (),
        last_event_id: str | None = None,
        reconnect: bool = True,
    ) -> Iterator[Event]:
        """Events as they happen (Server-Sent Events), from after ``last_event_id``; a dropped
        stream is resumed after the last event received, so none is lost or repeated."""
        params: list[tuple[str, str | int | float | bool | None]] = [("run", r) for r in runs]
        params += [("workflow", w) for w in workflows]
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            try:
                with self._http.stream(
                    "GET", "/events", params=params, headers=headers, timeout=None
                ) as response:
                    self._raise_for(response, streamed=True)
                    for event in parse_sse(response.iter_lines()):
                        last_event_id = event.id or last_event_id
                        yield event
            except (httpx2.TransportError, httpx2.StreamError):
                if not reconnect:
                    raise
            if not reconnect:
                return
            time.sleep(1.0)

    # The wire -------------------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        self._raise_for(response)
        return response.json()

    def _post_once(self, path: str, idempotency_key: str | None, **kwargs: Any) -> Any:
        """POST with an Idempotency-Key (made up when none is given), sent again with the same
        key after a dropped connection: the server answers the first one's result."""
        headers = {
            **kwargs.pop("headers", {}),
            "Idempotency-Key": idempotency_key or uuid.uuid4().hex,
        }
        for attempt in range(1, LAUNCH_ATTEMPTS + 1):
            try:
                return self._json("POST", path, headers=headers, **kwargs)
            except httpx2.TransportError:
                if attempt == LAUNCH_ATTEMPTS:
                    raise
                time.sleep(0.5 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _poll(
        read: Callable[[], Found], done: Callable[[Found], bool], *, timeout: float, what: str
    ) -> Found:
        """``read()`` until ``done`` says so, pausing longer each time (up to 5 s)."""
        deadline = time.monotonic() + timeout
        pause = 0.25
        while True:
            found = read()
            if done(found):
                return found
            if time.monotonic() >= deadline:
                status = getattr(found, "status", "unchanged")
                raise TimeoutError(f"{what} is still {status} after {timeout:.0f} s")
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 5.0)

    @staticmethod
    def _raise_for(response: httpx2.Response, *, streamed: bool = False) -> None:
        if response.status_code < 400:
            return
        if streamed:
            response.read()
        try:
            problem = response.json()
        except ValueError:
            problem = {"title": response.text[:500]}
        raise ApiError(response.status_code, problem if isinstance(problem, dict) else {})


def parse_sse(lines: Iterable[str]) -> Iterator[Event]:
    """Server-Sent Events from the stream's lines (the WHATWG format: ``id:``, ``event:``,
    ``data:`` lines, a blank line ends an event, ``:`` lines are comments)."""
    event_id, kind = "", "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = {"text": text}
                yield Event(id=event_id, type=kind, data=payload)
            kind, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            event_id = value
        elif name == "event":
            kind = value
        elif name == "data":
            data.append(value)
