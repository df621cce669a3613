"""The client library (clients/python) and its ``pandaweb`` command against the live stack, as
an integrator's machine runs them: launch with idempotency and wait, read the request's facts,
decide with a reviewer's token (bound to the evidence), download the evidence bundle; refusals
come back in the server's words with their field paths. And a whole day of a new workflow from
the client alone: import, publish, bake, schedule, the event stream and a signed callback, the
approval, the evidence."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pandaweb_client import FINAL_STATUSES, ApiError, Client, Event
from standardwebhooks import Webhook

from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME, PortalState
from tests.e2e.conftest import ROOT, Stack

pytestmark = [pytest.mark.e2e]


def command(stack: Stack, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``pandaweb`` program, as a shell on another machine runs it."""
    program = Path(sys.executable).with_name("pandaweb")
    return subprocess.run(
        [str(program), "--url", stack.url, *args],
        env={**os.environ, "PANDAWEB_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_day_driven_from_the_client_library_and_its_command(stack: Stack, tmp_path: Path) -> None:
    stack.manage("demo_workflow")
    operator_token = stack.manage(
        "api_token", "erp-client", "--name", "erp-prod", "--service", "--by", "ada.admin",
        "--role", "Operators", "--role", "Compliance",
        "--scope", "runs:launch", "--scope", "runs:read", "--scope", "audit:read",
    ).strip()  # fmt: skip
    reviewer_token = stack.manage(
        "api_token", "rory.reviewer", "--name", "client-library",
        "--scope", "approvals:read", "--scope", "approvals:decide", "--scope", "approvals:comment",
    ).strip()  # fmt: skip
    invoice = [i for i in PortalState().invoices() if i.status == "open"][-1]
    amount = f"{invoice.amount_due:.2f}"

    refused = command(
        stack, operator_token, "launch", "acme-pay-invoice",
        f"invoice={invoice.number}", "amount=12,34,5",
    )  # fmt: skip
    assert refused.returncode == 1, refused
    assert "inputs.amount:" in refused.stderr

    key = f"erp-{invoice.number}"
    launched = command(
        stack, operator_token, "launch", "acme-pay-invoice", f"invoice={invoice.number}",
        f"amount={amount}", "--idempotency-key", key, "--wait", "--timeout", "300",
    )  # fmt: skip
    assert launched.returncode == 0, (launched, stack.log_tail())
    assert "awaiting_approval" in launched.stdout
    assert "waits for approval #" in launched.stdout

    with Client(stack.url, operator_token) as operator, Client(stack.url, reviewer_token) as rory:
        # The same key and body: the same run, not a second payment.
        again = operator.launch(
            "acme-pay-invoice", {"invoice": invoice.number, "amount": amount}, idempotency_key=key
        )
        assert f"run #{again.id} " in launched.stdout
        # Other tests share this installation: the request of this run.
        [request] = [
            rory.approval(a.id) for a in rory.approvals() if rory.approval(a.id).run == again.id
        ]
        facts = {fact["fact"]: fact for fact in request.facts}
        assert facts["amount"]["value"] == amount
        assert facts["payee"]["value"] == "DE97 2004 0060 0123 4567 89"
        assert facts["reference"]["value"] == invoice.number
        assert all(fact["on_page"] for fact in facts.values())

        with pytest.raises(ApiError) as stale:
            rory.decide(request.id, approve=True, evidence_sha256="0" * 64)
        assert stale.value.status == 409
        # Discussed and handed over before the verdict: the page's rules, in the server's words.
        said = rory.comment(request.id, "The payee matches the contract.")
        assert (said.author, said.body) == ("rory.reviewer", "The payee matches the contract.")
        refused_hand_over = command(
            stack, reviewer_token, "approvals", "hand-over", str(request.id),
            "--to", "olivia.operator",
        )  # fmt: skip
        assert refused_hand_over.returncode == 1, refused_hand_over
        assert "409: olivia.operator cannot decide this request" in refused_hand_over.stderr
        handed = command(
            stack, reviewer_token, "approvals", "hand-over", str(request.id),
            "--group", "Reviewers", "--note", "still ours",
        )  # fmt: skip
        assert handed.returncode == 0, handed
        assert f"approval #{request.id} handed to Reviewers" in handed.stdout
        remarked = command(
            stack, reviewer_token, "approvals", "comment", str(request.id), "Due", "today"
        )
        assert remarked.returncode == 0, remarked
        shown = command(stack, reviewer_token, "approval", str(request.id))
        assert f"Amount: {amount} EUR" in shown.stdout
        assert request.evidence_sha256 in shown.stdout
        assert "rory.reviewer commented: Due today" in shown.stdout
        assert [c.body for c in rory.approval(request.id).comments] == [
            "The payee matches the contract.",
            "Due today",
        ]
        decided = command(
            stack, reviewer_token, "decide", str(request.id), "--approve",
            "--evidence", request.evidence_sha256,
        )  # fmt: skip
        assert decided.returncode == 0, decided
        assert f"approval #{request.id}: approved" in decided.stdout

        run = operator.wait(again.id, until={"succeeded", "failed", "cancelled"}, timeout=300)
        assert run.status == "succeeded", (run.failure_reason, stack.log_tail())
        assert str(run.outputs["receipt"]).startswith("RCPT-")

        # The run's whole history from the event stream, from its first event, in order.
        seen: list[tuple[str, object]] = []
        for event in operator.events(runs=[run.id], last_event_id="0"):
            seen.append((event.type, event.data.get("status")))
            if event.type == "run.status" and event.data.get("status") == "succeeded":
                break
        kinds = [kind for kind, _ in seen]
        assert kinds.count("step") == len(run.raw["steps"]), seen
        assert ("run.status", "running") in seen

    bundle = tmp_path / "evidence.zip"
    fetched = command(stack, operator_token, "bundle", str(run.id), str(bundle))
    assert fetched.returncode == 0, fetched
    with zipfile.ZipFile(bundle) as archive:
        assert "SHA256SUMS" in archive.namelist()


DAY_SLUG = "day-pay-invoice"
EXAMPLE = ROOT / "workflows" / "examples" / "acme-pay-invoice.yaml"
Inbox = queue.Queue[tuple[bytes, dict[str, str]]]


def day_workflow(stack: Stack, credential: str) -> dict[str, Any]:
    """The demo pay-invoice workflow under a slug of its own, aimed at the stack's portal, its
    login moved into a session template (baked once, forked by every run) with ``credential``."""
    text = EXAMPLE.read_text().replace("127.0.0.1:8001", urlsplit(stack.portal_url).netloc)
    document: dict[str, Any] = yaml.safe_load(text)
    login, steps = document["steps"][:4], document["steps"][4:]
    assert [s["id"] for s in login] == ["open-login", "log-in", "wait-dashboard", "accept-cookies"]
    login[1]["credential"] = credential
    document["settings"]["credentials"] = [credential]
    return document | {
        "slug": DAY_SLUG,
        "name": "Pay an Acme invoice, logged in once",
        "steps": steps,
        "session": {
            "steps": login,
            "check_url": f"{stack.portal_url}/",
            "logged_in": {"role": "button", "name": "Log out"},
        },
    }


@pytest.fixture
def callbacks() -> Iterator[tuple[str, Inbox]]:
    """A callback receiver on loopback: each POST's raw body and headers, in arrival order."""
    inbox: Inbox = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            inbox.put((body, dict(self.headers.items())))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/pandaweb", inbox
    server.shutdown()
    server.server_close()


def signed_until(inbox: Inbox, secret: str, event_type: str) -> list[dict[str, Any]]:
    """The deliveries up to the first ``event_type``, each one's signature verified."""
    delivered: list[dict[str, Any]] = []
    while not delivered or delivered[-1]["type"] != event_type:
        body, headers = inbox.get(timeout=60)
        delivered.append(Webhook(secret).verify(body, headers))
    return delivered


def test_a_whole_day_of_a_new_workflow_driven_from_the_client(
    stack: Stack, tmp_path: Path, callbacks: tuple[str, Inbox]
) -> None:
    callback_url, inbox = callbacks
    erp_token = stack.manage(
        "api_token", "day-erp", "--name", "day", "--service", "--by", "ada.admin",
        "--role", "Operators", "--role", "Compliance",
        "--scope", "workflows:read", "--scope", "workflows:write", "--scope", "credentials:write",
        "--scope", "session-templates:bake", "--scope", "schedules:write",
        "--scope", "runs:launch", "--scope", "runs:read", "--scope", "approvals:read",
        "--scope", "audit:read",
    ).strip()  # fmt: skip
    reviewer_token = stack.manage(
        "api_token", "rory.reviewer", "--name", "day-review",
        "--scope", "approvals:read", "--scope", "approvals:decide",
    ).strip()  # fmt: skip
    open_invoices = [i for i in PortalState().invoices() if i.status == "open"]
    invoice, scheduled_invoice = open_invoices[0], open_invoices[1]
    amount = f"{invoice.amount_due:.2f}"

    with Client(stack.url, erp_token) as erp, Client(stack.url, reviewer_token) as rory:
        # The portal's login, stored write-only, then the workflow file that names it.
        stored = erp.store_credential(
            "day-portal", "username_password",
            {"username": DEMO_USERNAME, "password": DEMO_PASSWORD}, description="Acme login",
        )  # fmt: skip
        assert DEMO_PASSWORD not in json.dumps(stored.raw)
        workflow_file = tmp_path / f"{DAY_SLUG}.yaml"
        workflow_file.write_text(yaml.safe_dump(day_workflow(stack, "day-portal")))
        imported = command(stack, erp_token, "workflows", "import", str(workflow_file))
        assert imported.returncode == 0, imported
        assert f"imported {DAY_SLUG} as a draft" in imported.stdout
        draft = erp.draft(DAY_SLUG)
        assert (draft.problems, draft.warnings) == ([], [])
        assert "session" in draft.document

        # A retried publish with its key is the same version, not a second one.
        version = erp.publish(DAY_SLUG, "first version", idempotency_key="day-v1")
        again = erp.publish(DAY_SLUG, "first version", idempotency_key="day-v1")
        assert (version.number, again.number, version.author) == (1, 1, "day-erp")
        assert [v.number for v in erp.versions(DAY_SLUG)] == [1]
        assert not erp.workflow(DAY_SLUG).has_draft
        assert [c.used_by for c in erp.credentials() if c.name == "day-portal"] == [[DAY_SLUG]]

        assert erp.session_template(DAY_SLUG).status == "never baked"
        baked = command(stack, erp_token, "workflows", "bake", DAY_SLUG, "--wait")
        assert baked.returncode == 0, (baked, stack.log_tail())
        assert f"session template of {DAY_SLUG} v1: ready" in baked.stdout
        assert erp.session_template(DAY_SLUG).status == "ready"

        # Every minute: the scheduler's tick (every 15 s) launches it within the test.
        made_at = datetime.now(UTC)
        schedule = erp.create_schedule(
            DAY_SLUG, "Every minute", "* * * * *",
            inputs={"invoice": scheduled_invoice.number,
                    "amount": f"{scheduled_invoice.amount_due:.2f}"},
        )  # fmt: skip
        assert (schedule.in_words, schedule.owner, schedule.paused) == (
            "every minute (UTC)",
            "day-erp",
            False,
        )
        first = schedule.next_times[0]
        assert made_at < first <= made_at + timedelta(minutes=1)
        assert first.second == 0
        assert schedule.next_times == [first + timedelta(minutes=n) for n in range(5)]

        run = erp.launch(DAY_SLUG, {"invoice": invoice.number, "amount": amount},
                         callback_url=callback_url)  # fmt: skip
        assert run.callback is not None
        secret = run.callback["secret"]

        # The workflow's events from its first: this run's, and the run the schedule launched,
        # which is cancelled and its schedule paused as soon as it shows (one run pays).
        seen: list[Event] = []
        scheduled: list[int] = []

        def saw(event: Event) -> None:
            seen.append(event)
            other = event.data["run"]
            if other != run.id and other not in scheduled:
                scheduled.append(other)
                erp.change_schedule(schedule.id, paused=True)
                erp.cancel(other)

        def ours(status: str) -> bool:
            return any(
                e.type == "run.status" and e.data["run"] == run.id and e.data["status"] == status
                for e in seen
            )

        for event in erp.events(workflows=[DAY_SLUG], last_event_id="0"):
            saw(event)
            if event.type == "approval.requested" and event.data["run"] == run.id:
                break
        approval_id = seen[-1].data["approval"]
        request = rory.approval(approval_id)
        assert request.run == run.id
        facts = {fact["fact"]: fact for fact in request.facts}
        assert (facts["amount"]["value"], facts["reference"]["value"]) == (amount, invoice.number)
        decided = rory.decide(approval_id, approve=True, evidence_sha256=request.evidence_sha256)
        assert decided.status == "approved"

        # The stream again from the last event read: the rest, nothing twice.
        for event in erp.events(workflows=[DAY_SLUG], last_event_id=seen[-1].id):
            saw(event)
            if scheduled and any(ours(status) for status in FINAL_STATUSES):
                break
        ids = [int(e.id) for e in seen]
        assert ids == sorted(set(ids))
        assert (ours("running"), ours("succeeded")) == (True, True), [
            (e.type, e.data) for e in seen
        ]
        done = erp.run(run.id)
        assert done.status == "succeeded", (done.failure_reason, stack.log_tail())
        assert str(done.outputs["receipt"]).startswith("RCPT-")
        steps = [e for e in seen if e.type == "step" and e.data["run"] == run.id]
        assert len(steps) == len(done.raw["steps"])

        # The schedule fired once, launching as its owner with its inputs, then was paused.
        [launched] = scheduled
        assert erp.run(launched).inputs["invoice"] == scheduled_invoice.number
        assert erp.wait(launched, until=FINAL_STATUSES, timeout=60).status == "cancelled"
        fired = erp.schedule(schedule.id)
        assert (fired.last_run, fired.paused, fired.next_times) == (launched, True, [])
        assert fired.last_outcome == f"launched run #{launched}"
        listed = command(stack, erp_token, "schedules", "list", "--workflow", DAY_SLUG)
        assert f"schedule #{schedule.id} {DAY_SLUG} 'Every minute': every minute (UTC), paused" in (
            listed.stdout
        )
        erp.delete_schedule(schedule.id)
        assert erp.schedules(workflow=DAY_SLUG) == []

        # Archived, nothing launches it; restored, it is listed again.
        archived = command(stack, erp_token, "workflows", "archive", DAY_SLUG)
        assert archived.returncode == 0, archived
        assert f"{DAY_SLUG}: archived" in archived.stdout
        with pytest.raises(ApiError) as refused_launch:
            erp.launch(DAY_SLUG, {"invoice": invoice.number, "amount": amount})
        assert (refused_launch.value.status, refused_launch.value.detail) == (
            409,
            "this workflow is archived",
        )
        assert DAY_SLUG in [w.slug for w in erp.workflows(archived=True)]
        assert erp.restore(DAY_SLUG).archived is False
        assert DAY_SLUG in [w.slug for w in erp.workflows()]

        # The callback: the approval request, then the run's end, each signed with its secret.
        delivered = signed_until(inbox, secret, "run.finished")
        assert [d["type"] for d in delivered] == ["approval.requested", "run.finished"]
        assert delivered[0]["data"]["evidence_sha256"] == request.evidence_sha256
        assert delivered[-1]["data"]["id"] == run.id
        assert delivered[-1]["data"]["outputs"]["receipt"] == done.outputs["receipt"]

        bundle = erp.download_bundle(run.id, tmp_path / "evidence.zip")

    with zipfile.ZipFile(bundle) as archive:
        sums = {}
        for line in archive.read("SHA256SUMS").decode().splitlines():
            digest, name = line.split("  ", 1)
            sums[name] = digest
        assert set(sums) == set(archive.namelist()) - {"SHA256SUMS"}
        for name, digest in sums.items():
            assert hashlib.sha256(archive.read(name)).hexdigest() == digest, name
        timeline = json.loads(archive.read("timeline.json"))
    assert (timeline["run"]["id"], timeline["run"]["status"]) == (run.id, "succeeded")
    assert timeline["run"]["version"]["number"] == 1
    # Runs fork the baked session: the login is none of the run's steps.
    assert "log-in" not in [step["step_id"] for step in timeline["steps"]]
    [approval] = timeline["approvals"]
    assert approval["evidence_sha256_matches"]
    assert [(d["reviewer"], d["verdict"], d["evidence_sha256"]) for d in approval["decisions"]] == [
        ("rory.reviewer", "approve", request.evidence_sha256)
    ]
    assert f"{invoice.number}.csv" in [a["filename"] for a in timeline["artifacts"]]
    assert timeline["audit_events_hashes_ok"]
    assert timeline["missing_files"] == []
