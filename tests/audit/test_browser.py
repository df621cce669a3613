"""The audit pages: the trail with its filters and pages, chain verification on demand, a run's
timeline and its evidence bundle, for Compliance and Admins only.

Runs are made without a browser: launched, moved through their states and given steps, a blocked
connection and an approval through the same services the runner uses, with small pictures
written to a run files directory under tmp_path."""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import pytest
import time_machine
import yaml
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone
from PIL import Image
from playwright.sync_api import sync_playwright

from approvals import services as approvals
from approvals.models import ApprovalRequest
from pandaweb.audit import chain
from pandaweb.audit.bundles import EXPORTED_ACTION, run_bundle_to_file
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.audit.triggers import append_only_suspended
from pandaweb.core.roles import Role
from sessions import services
from sessions.engine.chromium import HEADLESS_ARGS, find_chromium
from sessions.engine.plan import Gate
from sessions.engine.steps.base import ArtifactFile, StepRecord
from sessions.models import Run, StepResult
from sessions.services import writer
from tests.factories import user_with_role
from tests.patching import patch_dispatch
from tests.sessions.conftest import EXAMPLE, publish
from workflows import services as workflow_services
from workflows.models import Workflow

pytestmark = [pytest.mark.usefixtures("run_files_in_tmp"), pytest.mark.django_db]

INPUTS = {"invoice": "INV-1009", "amount": "547.70"}
PAY_URL = "http://127.0.0.1:8001/invoices/INV-1009/pay"
APPROVE_REASON = "Amount and IBAN match invoice INV-1009"


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch queues the run, an approval its continuation; nothing runs them here."""
    monkeypatch.setattr(services.runstate, "dispatch", lambda task, **kwargs: None)
    monkeypatch.setattr(services.templates, "dispatch", lambda task, **kwargs: None)
    patch_dispatch(monkeypatch, lambda task, queue=None, **kw: None)


@pytest.fixture
def operator(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="olivia")


@pytest.fixture
def demo_workflow(operator: User) -> Workflow:
    """The example workflow (pay an invoice), published by the operator."""
    workflow_services.credential_create(
        user=operator,
        name="acme-portal",
        kind="username_password",
        description="",
        values={"username": "acme-demo", "password": "portal-demo-2026"},
    )
    return publish(operator, yaml.safe_load(EXAMPLE.read_text()))


@pytest.fixture
def compliance(db: None) -> User:
    return user_with_role(Role.COMPLIANCE, username="carla")


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def picture(color: tuple[int, int, int], fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), color).save(buffer, format=fmt)
    return buffer.getvalue()


def transition(run: Run, to: str, **fields: Any) -> None:
    with transaction.atomic():
        services.transition(services.lock_run(run.pk), to, **fields)


def record_step(run: Run, index: int, step_id: str, sentence: str, **extra: Any) -> StepResult:
    observation = {
        "url": PAY_URL,
        "title": "Pay INV-1009",
        "text": f'- heading "Pay invoice INV-1009"\n[1] button "{sentence}"',
    }
    record = StepRecord(
        index=index,
        step_id=step_id,
        step_type="click",
        sentence=sentence,
        status="succeeded",
        started_at=timezone.now(),
        duration_ms=120 + index,
        url=PAY_URL,
        title="Pay INV-1009",
        observation=observation,
        observation_chars=len(observation["text"]),
        observation_tokens=12,
        screenshot=picture((40 * index % 255, 120, 200)),
        **extra,
    )
    return writer.run_record_step(run_id=run.pk, record=record)


def approval_evidence() -> dict[str, Any]:
    return {
        "step_index": 2,
        "step_id": "submit-payment",
        "action": f"Click the button 'Submit payment' on {PAY_URL}",
        "url": PAY_URL,
        "title": "Pay INV-1009",
        "target": {"description": "the button 'Submit payment'", "tag": "button",
                   "box": {"x": 10, "y": 10, "width": 40, "height": 20}},
        "filled": [],
    }  # fmt: skip


def audited_run(workflow: Workflow, launcher: User, reviewer: User, files: Path) -> Run:
    """A run with two steps (one with a download), a blocked connection, an approval request
    and a reviewer's approval, recorded as the runner and the decision page record them."""
    run = services.run_launch(workflow_id=workflow.pk, user=launcher, raw_inputs=INPUTS)
    transition(run, Run.Status.STARTING)
    transition(run, Run.Status.RUNNING, started_at=timezone.now())
    record_step(run, 0, "open-invoice", "Open invoice INV-1009")
    receipt = files / str(run.pk) / "downloads" / "invoice INV-1009.pdf"
    receipt.parent.mkdir(parents=True, exist_ok=True)
    receipt.write_bytes(b"%PDF-1.4 a tiny invoice\n")
    digest = hashlib.sha256(receipt.read_bytes()).hexdigest()
    artifact = ArtifactFile("invoice", receipt.name, receipt, digest, receipt.stat().st_size)
    record_step(run, 1, "download-invoice", "Download the invoice", artifacts=[artifact])
    attempt = SimpleNamespace(
        host="tracker.example.net", port=443, method="CONNECT", reason="not an allowed host",
        quiet=False,
    )  # fmt: skip
    writer.run_record_denial(run_id=run.pk, attempt=attempt)
    gate = Gate.of(approval_evidence(), picture((250, 250, 250), "PNG"))
    with transaction.atomic():
        locked = services.lock_run(run.pk)
        approval = approvals.approval_open(run=locked, gate=gate, previous=None)
        services.transition(locked, Run.Status.AWAITING_APPROVAL, reason="irreversible step")
    approvals.approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        reason=APPROVE_REASON,
        evidence_sha256=approval.evidence_sha256,
    )
    run.refresh_from_db()
    return run


@pytest.fixture
def run(demo_workflow: Workflow, operator: User, reviewer: User, run_files_in_tmp: Path) -> Run:
    return audited_run(demo_workflow, operator, reviewer, run_files_in_tmp)


def sequences(body: str) -> list[int]:
    """The events of the table, in the order shown."""
    return [int(s) for s in re.findall(r'<tr id="event-(\d+)"', body)]


def record(action: str, count: int = 1, **fields: Any) -> list[AuditEvent]:
    events = []
    for number in range(count):
        with transaction.atomic():
            events.append(
                audit_record(action=action, object_type="test", object_id=number, **fields)
            )
    return events


# The trail and its filters -----------------------------------------------------------------------


def test_the_trail_lists_events_newest_first_with_links_details_and_short_hashes(
    run: Run, compliance: User
) -> None:
    body = client_for(compliance).get(f"/audit/?run={run.pk}").content.decode()

    shown = sequences(body)
    expected = list(
        AuditEvent.objects.filter(run_id=run.pk)
        .order_by("-sequence")
        .values_list("sequence", flat=True)
    )
    assert shown == expected
    decided = AuditEvent.objects.get(action="approval.decided")
    assert f'href="/audit/runs/{run.pk}/"' in body
    assert f'href="/approvals/{decided.approval_id}/"' in body
    assert f">{decided.hash[:12]}</code>" in body
    # The whole hash and its predecessor are readable, not only in a hover title.
    assert f'<code class="hash-full">{decided.hash}</code>' in body
    assert f'<code class="hash-full">{decided.prev_hash}</code>' in body
    assert APPROVE_REASON in body  # the decision's "after" JSON, in its <details>
    assert "rory" in body


def test_the_action_filter_is_a_prefix(run: Run, compliance: User) -> None:
    client = client_for(compliance)

    approval_events = sequences(client.get("/audit/?action=approval.").content.decode())
    decided = sequences(client.get("/audit/?action=approval.decided").content.decode())

    assert approval_events == list(
        AuditEvent.objects.filter(action__startswith="approval.")
        .order_by("-sequence")
        .values_list("sequence", flat=True)
    )
    assert len(approval_events) == 2  # requested, decided
    assert decided == [AuditEvent.objects.get(action="approval.decided").sequence]


def test_the_datalist_offers_known_actions_and_their_families(run: Run, compliance: User) -> None:
    body = client_for(compliance).get("/audit/").content.decode()

    datalist = body[body.index('<datalist id="audit-actions">') :]
    datalist = datalist[: datalist.index("</datalist>")]
    assert '<option value="run.">' in datalist
    assert '<option value="approval.decided">' in datalist
    assert '<option value="run.step_executed">' in datalist


def test_the_actor_filter_matches_the_username_case_insensitively(
    run: Run, compliance: User
) -> None:
    client = client_for(compliance)

    by_rory = sequences(client.get("/audit/?actor=RORY").content.decode())
    by_runner = sequences(client.get("/audit/?actor=runner").content.decode())

    rory = AuditEvent.objects.filter(actor__username="rory").order_by("-sequence")
    assert by_rory == list(rory.values_list("sequence", flat=True))
    assert AuditEvent.objects.get(sequence=by_rory[0]).action == "approval.decided"
    assert by_runner
    assert all(AuditEvent.objects.get(sequence=s).actor_kind == "runner" for s in by_runner)


def test_the_run_filter_keeps_one_run(
    run: Run, demo_workflow: Workflow, operator: User, compliance: User
) -> None:
    other = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)

    body = client_for(compliance).get(f"/audit/?run={other.pk}").content.decode()

    assert sequences(body) == [AuditEvent.objects.get(run_id=other.pk).sequence]


def test_the_date_range_includes_both_days(compliance: User) -> None:
    days = {}
    for day in (10, 14, 15, 20):
        with time_machine.travel(datetime(2025, 1, day, 23, 59, 59, tzinfo=UTC), tick=False):
            days[day] = record("dated.event")[0].sequence
    client = client_for(compliance)

    body = client.get("/audit/?date_from=2025-01-14&date_to=2025-01-15").content.decode()
    assert sequences(body) == [days[15], days[14]]
    body = client.get("/audit/?date_from=2025-01-15").content.decode()
    assert set(sequences(body)) >= {days[15], days[20]}
    assert days[14] not in sequences(body)
    assert sequences(client.get("/audit/?date_to=2025-01-10").content.decode()) == [days[10]]


def test_a_reversed_date_range_is_reported_not_applied(compliance: User) -> None:
    record("x.y", 2)

    body = client_for(compliance).get("/audit/?date_from=2025-02-01&date_to=2025-01-01").content
    text = body.decode()

    assert "The end date is before the start date." in text
    assert len(sequences(text)) == AuditEvent.objects.count()


def test_the_workflow_filter_keeps_the_workflows_own_events_and_its_runs(
    run: Run, demo_workflow: Workflow, operator: User, compliance: User
) -> None:
    other = Workflow.objects.create(
        name="Other portal", slug="other-portal", owner=operator,
        reviewer_group=Group.objects.get(name=Role.REVIEWERS.value),
    )  # fmt: skip
    with transaction.atomic():
        audit_record(
            action="workflow.created", object_type="workflow", object_id=other.pk, actor=operator
        )
    client = client_for(compliance)

    mine = sequences(client.get(f"/audit/?workflow={demo_workflow.slug}").content.decode())
    theirs = sequences(client.get("/audit/?workflow=other-portal").content.decode())

    expected = AuditEvent.objects.filter(run_id=run.pk) | AuditEvent.objects.filter(
        object_type="workflow", object_id=str(demo_workflow.pk)
    )
    assert mine == list(expected.order_by("-sequence").values_list("sequence", flat=True))
    assert any(AuditEvent.objects.get(sequence=s).action == "workflow.published" for s in mine)
    assert theirs == [
        AuditEvent.objects.get(object_id=str(other.pk), object_type="workflow").sequence
    ]
    body = client.get("/audit/").content.decode()
    assert '<option value="other-portal">Other portal</option>' in body


def test_pages_of_fifty_walk_back_and_forth_by_sequence(compliance: User) -> None:
    made = [e.sequence for e in record("page.test", 120)]
    newest_first = made[::-1]
    client = client_for(compliance)

    first = client.get("/audit/?action=page.test").content.decode()
    assert sequences(first) == newest_first[:50]
    # The total of the filter, not of the page.
    assert "120 events match these filters." in first
    assert "Newer" not in first
    older = re.search(r'href="(/audit/\?action=page.test&amp;before=\d+)"', first)
    assert older is not None
    second = client.get(older.group(1).replace("&amp;", "&")).content.decode()
    assert sequences(second) == newest_first[50:100]
    third = client.get(f"/audit/?action=page.test&before={newest_first[99]}").content.decode()
    assert sequences(third) == newest_first[100:]
    assert "Older" not in third
    newer = re.search(r'href="(/audit/\?action=page.test&amp;after=\d+)"', third)
    assert newer is not None
    back = client.get(newer.group(1).replace("&amp;", "&")).content.decode()
    assert sequences(back) == newest_first[50:100]
    # New events on top do not shift an older page.
    record("page.test", 3)
    assert (
        sequences(client.get(older.group(1).replace("&amp;", "&")).content.decode())
        == (newest_first[50:100])
    )


def test_htmx_filtering_swaps_only_the_table(run: Run, compliance: User) -> None:
    client = client_for(compliance)

    partial = client.get("/audit/?action=run.", headers={"HX-Request": "true"}).content.decode()
    full = client.get("/audit/?action=run.").content.decode()

    assert partial.lstrip().startswith('<div id="audit-table">')
    assert "<html" not in partial
    assert "audit-filters" not in partial
    assert sequences(partial) == sequences(full) != []
    # The form refreshes the table on change, and still works as a plain GET form.
    assert 'hx-get="/audit/"' in full
    assert 'hx-target="#audit-table"' in full
    assert 'method="get" action="/audit/"' in full
    # Back to a pushed URL that htmx no longer has in its cache: the whole page again.
    restore = client.get(
        "/audit/?action=run.", headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}
    )
    assert "<html" in restore.content.decode()


def test_a_refused_connection_names_its_host_and_reason_in_the_list(
    run: Run, compliance: User
) -> None:
    body = client_for(compliance).get("/audit/?action=run.egress_denied").content.decode()

    denial = AuditEvent.objects.get(action="run.egress_denied", run_id=run.pk).after or {}
    [line] = re.findall(r'<p class="small audit-denial">(.*?)</p>', body)
    assert line == (
        f"{denial['method']} <code>{denial['host']}:{denial['port']}</code>: {denial['reason']}"
    )


def test_htmx_filtering_also_updates_the_export_form_with_the_filters_applied(
    run: Run, compliance: User
) -> None:
    client = client_for(compliance)

    partial = client.get(
        f"/audit/?action=run.&run={run.pk}&date_from=2026-02-02&date_to=2026-01-01",
        headers={"HX-Request": "true"},
    ).content.decode()

    oob = partial[partial.index('<div id="audit-export-filters" hx-swap-oob="true">') :]
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', oob))
    # The reversed date range is reported and not applied to the list, so not exported either.
    assert hidden == {"action": "run.", "run": str(run.pk), "date_from": "2026-02-02"}
    full = client.get("/audit/?action=run.").content.decode()
    assert 'id="audit-export-filters">' in full
    assert "hx-swap-oob" not in full
    # No snapshot of the trail in the browser's storage: back and forward ask the server.
    assert 'hx-history="false"' in full


# Verifying the chain ---------------------------------------------------------------------------


def test_the_chain_is_verified_only_on_demand(
    compliance: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def verify() -> None:
        calls.append(1)

    monkeypatch.setattr("pandaweb.audit.views.audit_verify_database", verify)
    record("x.y", 3)

    body = client_for(compliance).get("/audit/").content.decode()

    assert calls == []
    assert "Verify the chain now" in body
    assert 'hx-post="/audit/verify/"' in body


def test_verify_reports_an_intact_chain_with_its_count_and_head(compliance: User) -> None:
    record("x.y", 4)
    client = client_for(compliance)
    head = AuditEvent.objects.order_by("-sequence").first()
    assert head is not None

    response = client.post("/audit/verify/", headers={"HX-Request": "true"})

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="chain-status"')
    assert "Intact." in body
    assert f"All {AuditEvent.objects.count()} events" in body
    assert head.hash in body


def test_verify_names_the_first_tampered_event(compliance: User) -> None:
    events = record("x.y", 5)
    with append_only_suspended(connection):
        AuditEvent.objects.filter(pk=events[2].pk).update(after={"forged": True})
    client = client_for(compliance)

    htmx = client.post("/audit/verify/", headers={"HX-Request": "true"}).content.decode()
    plain = client.post("/audit/verify/").content.decode()

    for body in (htmx, plain):
        assert f"Broken at event #{events[2].sequence}:" in body
        assert "hash does not match the event&#x27;s content" in body
    assert "<html" in plain
    assert "audit-table" in plain


# The run timeline ------------------------------------------------------------------------------


def test_the_run_timeline_joins_everything_in_time_order(run: Run, compliance: User) -> None:
    body = client_for(compliance).get(f"/audit/runs/{run.pk}/").content.decode()

    kinds = re.findall(r'<li class="atl atl-(\w+)"', body)
    assert kinds == [
        "status",  # launched: queued
        "status",  # starting
        "status",  # running
        "step",
        "step",
        "denial",
        "approval",
        "status",  # awaiting approval
        "decision",
        "status",  # running again
    ]
    assert "no audit event recorded this" not in body  # each entry carries its audit event
    order = [
        "Open invoice INV-1009",
        "Download the invoice",
        "tracker.example.net:443",
        "Click the button &#x27;Submit payment&#x27;",
        APPROVE_REASON,
    ]
    positions = [body.index(text) for text in order]
    assert positions == sorted(positions)


def test_the_run_timeline_shows_pictures_hashes_and_who_decided(run: Run, compliance: User) -> None:
    body = client_for(compliance).get(f"/audit/runs/{run.pk}/").content.decode()

    step = StepResult.objects.get(run=run, index=0)
    approval = ApprovalRequest.objects.get(run=run)
    decision = approval.decisions.get()
    assert f'<a href="/runs/{run.pk}/files/{step.screenshot}"' in body
    assert f'src="/runs/{run.pk}/files/{step.thumbnail}"' in body
    assert step.screenshot_sha256 in body
    assert step.observation_sha256 in body
    assert f'src="/runs/{run.pk}/files/{approval.outlined}"' in body
    assert approval.evidence_sha256 in body
    assert "<strong>rory</strong>" in body
    assert "approved" in body
    assert decision.evidence_sha256 == approval.evidence_sha256
    assert "= the request's evidence" in body
    assert "all recompute ✓" in body
    assert f'action="/audit/runs/{run.pk}/bundle.zip"' in body


def test_an_unknown_run_is_404(compliance: User) -> None:
    assert client_for(compliance).get("/audit/runs/999999/").status_code == 404


# The evidence bundle ---------------------------------------------------------------------------


def download(client: Client, run: Run) -> zipfile.ZipFile:
    response = client.post(f"/audit/runs/{run.pk}/bundle.zip")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert f'filename="run-{run.pk}-evidence.zip"' in response["Content-Disposition"]
    content = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    return zipfile.ZipFile(io.BytesIO(content))


def test_the_bundle_holds_every_file_with_correct_sha256sums(run: Run, compliance: User) -> None:
    bundle = download(client_for(compliance), run)

    names = set(bundle.namelist())
    steps = list(StepResult.objects.filter(run=run).order_by("index"))
    approval = ApprovalRequest.objects.get(run=run)
    expected = {
        "index.html", "timeline.json", "SHA256SUMS",
        "observations/001-open-invoice.json", "observations/002-download-invoice.json",
        f"screenshots/{approval.screenshot}", f"screenshots/{approval.outlined}",
        "artifacts/downloads/invoice INV-1009.pdf",
    }  # fmt: skip
    for step in steps:
        expected |= {f"screenshots/{step.screenshot}", f"screenshots/{step.overlay}"}
    assert names == expected
    sums = {}
    for line in bundle.read("SHA256SUMS").decode().splitlines():
        digest, name = line.split("  ", 1)
        sums[name] = digest
    assert set(sums) == names - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256(bundle.read(name)).hexdigest() == digest, name
    # The files are the ones the run recorded.
    for step in steps:
        assert sums[f"screenshots/{step.screenshot}"] == step.screenshot_sha256
        observation = f"observations/{step.index + 1:03d}-{step.step_id}.json"
        assert sums[observation] == step.observation_sha256
    assert sums[f"screenshots/{approval.outlined}"] == approval.evidence["outlined_sha256"]
    assert sums["artifacts/downloads/invoice INV-1009.pdf"] == run.artifacts.get().sha256


def test_the_timeline_json_has_run_facts_decisions_and_chain_hashes(
    run: Run, compliance: User
) -> None:
    timeline = json.loads(download(client_for(compliance), run).read("timeline.json"))

    assert timeline["run"]["id"] == run.pk
    assert timeline["run"]["launched_by"] == "olivia"
    assert timeline["generated_by"] == "carla"
    assert [s["step_id"] for s in timeline["steps"]] == ["open-invoice", "download-invoice"]
    assert all(s["screenshot"]["matches_record"] for s in timeline["steps"])
    assert all(s["observation"]["matches_record"] for s in timeline["steps"])
    (approval,) = timeline["approvals"]
    assert approval["evidence_sha256_matches"] is True
    assert approval["outlined"]["matches_record"] is True
    assert approval["decisions"] == [
        {
            "reviewer": "rory",
            "reviewer_id": User.objects.get(username="rory").pk,
            "reviewer_name": "",
            "verdict": "approve",
            "reason": APPROVE_REASON,
            "evidence_sha256": approval["evidence_sha256"],
            "created_at": approval["decisions"][0]["created_at"],
        }
    ]
    stored = AuditEvent.objects.filter(run_id=run.pk, sequence__lt=_export_sequence(run))
    assert [(e["sequence"], e["hash"]) for e in timeline["audit_events"]] == list(
        stored.order_by("sequence").values_list("sequence", "hash")
    )
    for event in timeline["audit_events"]:  # checkable offline with chain.py alone
        assert chain.event_hash(event, event["prev_hash"]) == event["hash"]
    assert [row["kind"] for row in timeline["timeline"]][:4] == [
        "status",
        "status",
        "status",
        "step",
    ]
    assert timeline["missing_files"] == []


def _export_sequence(run: Run) -> int:
    return AuditEvent.objects.get(action=EXPORTED_ACTION, run_id=run.pk).sequence


class _References(HTMLParser):
    """Every attribute value and every <style> / <script> text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[str] = []
        self.tags: list[str] = []
        self._in_code = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.values.extend(value or "" for _, value in attrs)
        self._in_code = tag in ("style", "script")

    def handle_endtag(self, tag: str) -> None:
        self._in_code = False

    def handle_data(self, data: str) -> None:
        if self._in_code:
            self.values.append(data)


def test_the_summary_page_refers_to_nothing_outside_the_bundle(run: Run, compliance: User) -> None:
    bundle = download(client_for(compliance), run)
    html = bundle.read("index.html").decode()
    parser = _References()
    parser.feed(html)

    for value in parser.values:
        assert not re.search(r"https?:|//|@import", value, re.IGNORECASE), value
    assert "script" not in parser.tags
    assert "link" not in parser.tags
    assert "Content-Security-Policy" in html
    # Pictures and files by relative links that exist in the zip.
    links = re.findall(r'(?:href|src)="([^"]+)"', html)
    names = set(bundle.namelist())
    assert links
    assert all(unquote(link) in names for link in links)
    assert APPROVE_REASON in html
    assert "rory" in html
    # The pages the robot visited are evidence: shown as text, never as links.
    assert f'href="{PAY_URL}' not in html


def test_each_export_records_exactly_one_audit_event(run: Run, compliance: User) -> None:
    client = client_for(compliance)
    before = AuditEvent.objects.count()

    bundle = download(client, run)

    new = AuditEvent.objects.filter(sequence__gt=before)
    assert list(new.values_list("action", flat=True)) == [EXPORTED_ACTION]
    event = new.get()
    assert event.actor == compliance
    assert event.run_id == run.pk
    assert event.after is not None
    assert event.after["sha256sums_sha256"] == hashlib.sha256(bundle.read("SHA256SUMS")).hexdigest()
    assert event.after["files"] == len(bundle.namelist()) - 1
    download(client, run)
    assert AuditEvent.objects.filter(action=EXPORTED_ACTION, run_id=run.pk).count() == 2


def test_a_picture_changed_or_lost_on_disk_shows_in_the_bundle(
    run: Run, compliance: User, run_files_in_tmp: Path
) -> None:
    first, second = StepResult.objects.filter(run=run).order_by("index")
    (run_files_in_tmp / str(run.pk) / first.screenshot).write_bytes(picture((255, 0, 0)))
    (run_files_in_tmp / str(run.pk) / second.overlay).unlink()

    bundle = download(client_for(compliance), run)

    timeline = json.loads(bundle.read("timeline.json"))
    assert timeline["steps"][0]["screenshot"]["matches_record"] is False
    assert timeline["missing_files"] == [{"path": second.overlay, "for": "step 2"}]
    html = bundle.read("index.html").decode()
    assert f"differs from the recorded {first.screenshot_sha256}" in html
    assert "1 recorded file could not be found" in html
    event = AuditEvent.objects.get(action=EXPORTED_ACTION)
    assert event.after is not None
    assert event.after["missing_files"] == [second.overlay]


def test_the_bundle_file_is_the_callers_and_removed_when_served(
    run: Run, compliance: User, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = run_bundle_to_file(run_id=run.pk, user=compliance)
    assert path.parent == tmp_path
    assert zipfile.is_zipfile(path)
    path.unlink()

    download(client_for(compliance), run)

    assert list(tmp_path.glob("pandaweb-run-*.zip")) == []


def test_the_bundle_is_a_post(run: Run, compliance: User) -> None:
    assert client_for(compliance).get(f"/audit/runs/{run.pk}/bundle.zip").status_code == 405
    assert not AuditEvent.objects.filter(action=EXPORTED_ACTION).exists()


@pytest.mark.browser
def test_the_summary_page_opens_offline_with_its_pictures(
    run: Run, compliance: User, tmp_path: Path
) -> None:
    folder = tmp_path / "bundle"
    download(client_for(compliance), run).extractall(folder)
    requested: list[str] = []
    # A browser of its own, closed before the test's database teardown (Playwright's sync API
    # runs an event loop in this thread while it is open).
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=find_chromium(settings.ENGINE_CONFIG.chromium),
            args=list(HEADLESS_ARGS),
            headless=True,
        )
        context = browser.new_context(offline=True)
        context.on("request", lambda request: requested.append(request.url))
        page = context.new_page()
        page.goto((folder / "index.html").as_uri())
        page.wait_for_load_state("load")
        images = page.evaluate("document.images.length")
        broken = page.evaluate(
            "[...document.images].filter(i => !i.complete || i.naturalWidth === 0).length"
        )
        heading = page.locator("h1").inner_text()
        browser.close()

    assert heading.startswith(f"Run #{run.pk}")
    assert images == 3  # the two steps' overlays and the outlined approval picture
    assert broken == 0
    assert requested
    assert all(url.startswith("file://") for url in requested)


# Who may see it --------------------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.OPERATORS, Role.REVIEWERS, None])
def test_only_compliance_and_admins_read_verify_and_export(role: Role | None, run: Run) -> None:
    outsider = client_for(user_with_role(role, username="outsider"))
    allowed = [
        client_for(user_with_role(Role.COMPLIANCE, username="carla")),
        client_for(user_with_role(Role.ADMINS, username="ada")),
    ]

    for url in ("/audit/", f"/audit/runs/{run.pk}/", "/audit/?action=run."):
        assert outsider.get(url).status_code == 403
        assert outsider.get(url, headers={"HX-Request": "true"}).status_code == 403
        for client in allowed:
            assert client.get(url).status_code == 200
    for url in ("/audit/verify/", f"/audit/runs/{run.pk}/bundle.zip"):
        assert outsider.post(url).status_code == 403
    assert not AuditEvent.objects.filter(action=EXPORTED_ACTION).exists()
    for client in allowed:
        assert client.post("/audit/verify/").status_code == 200
        assert client.post(f"/audit/runs/{run.pk}/bundle.zip").status_code == 200
    assert AuditEvent.objects.filter(action=EXPORTED_ACTION).count() == 2


def test_compliance_exports_the_filtered_trail_as_a_signed_zip_that_verifies(
    tmp_path: Path,
) -> None:
    from pandaweb.audit import signing
    from pandaweb.audit.export import verify_export

    carla = user_with_role(Role.COMPLIANCE, username="carla-exports")
    with transaction.atomic():
        for number in range(3):
            audit_record(action="run.launched", object_type="run", object_id=number)
        audit_record(action="workflow.created", object_type="workflow", object_id=1)
    client = Client()
    client.force_login(carla)

    page = client.get("/audit/").content.decode()
    assert signing.public_key_b64() in page
    response = client.post("/audit/export/", {"action": "run."})

    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    archive = tmp_path / "export.zip"
    archive.write_bytes(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    check = verify_export(archive, public_key=signing.public_key_b64())
    assert check.ok, check.reason
    assert check.count == 3
    assert AuditEvent.objects.filter(action="audit.exported", actor=carla).count() == 1
    for role in (Role.OPERATORS, Role.REVIEWERS):
        other = Client()
        other.force_login(user_with_role(role, username=f"no-export-{role.value}"))
        assert other.post("/audit/export/", {}).status_code == 403
