"""The client: one object per server and token, plain methods over ``/api/v1/``.

Every call raises :class:`ApiError` with the server's problem document (RFC 9457) when the server
says no, so a caller sees the same words and field paths the dashboard shows.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

# A run in one of these will not change again; in one of these it waits for a person.
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "expired", "interrupted"})
WAITING_STATUSES = frozenset({"awaiting_approval", "awaiting_answer", "needs_reconciliation"})
# Launching again after a dropped connection is safe (the same Idempotency-Key and body return
# the same run), so a launch is tried this many times before the error reaches the caller.
LAUNCH_ATTEMPTS = 3


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


@dataclass(frozen=True)
class Approval:
    id: int
    run: int
    status: str
    action: str
    evidence_sha256: str
    # What a reviewer decides on (amount, payee, reference), as the gate read them.
    facts: list[dict[str, Any]]
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
            raw=data,
        )


@dataclass(frozen=True)
class Event:
    """One event of the stream: its id (resume after it), its type and its data."""

    id: str
    type: str
    data: dict[str, Any]


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
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        for attempt in range(1, LAUNCH_ATTEMPTS + 1):
            try:
                return Run.of(self._json("POST", "/runs/", json=body, headers=headers))
            except httpx2.TransportError:
                if attempt == LAUNCH_ATTEMPTS:
                    raise
                time.sleep(0.5 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

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
        deadline = time.monotonic() + timeout
        pause = 0.25
        while True:
            run = self.run(run_id)
            if run.status in wanted:
                return run
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run #{run_id} is still {run.status} after {timeout:.0f} s")
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 5.0)

    def answer(self, run_id: int, answer: str) -> dict[str, Any]:
        """Answer the question the run waits at (an ``ask`` step)."""
        return self._json("POST", f"/runs/{run_id}/answer", json={"answer": answer})

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

    # Events ---------------------------------------------------------------------------------

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
