"""Scratch sessions: what the services refuse and record, and a real session (local sandbox,
egress proxy, system Chromium) against the demo portal on loopback: a rehearsal that skips the
irreversible step, picking on the live page, the allowlist, and the browser gone on closing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.demo_portal import lab
from sessions.models import ScratchSession
from sessions.services import installation_tag, scratch, scratch_worker
from tests.factories import user_with_role
from tests.patching import patch_destroy_sandbox, patch_dispatch
from tests.sessions.conftest import processes_with
from workflows import services as workflow_services
from workflows.models import Credential, Workflow

S = ScratchSession.Status


def document(portal: str) -> dict[str, Any]:
    host = portal.removeprefix("http://")
    return {
        "pandaweb": 1,
        "name": "Sign in, tried live",
        "slug": "sign-in-live",
        "settings": {"allowed_hosts": [host], "credentials": ["acme-portal"]},
        "steps": [
            {"id": "open-login", "type": "goto", "url": f"{portal}/login"},
            {
                "id": "sign-in",
                "type": "click",
                "irreversible": True,
                "target": {"role": "button", "name": "Sign in"},
                "expect": {"url": "**/dashboard"},
            },
            {
                "id": "log-in",
                "type": "login",
                "credential": "acme-portal",
                "username": {"label": "Username"},
                "password": {"label": "Password"},
                # What a login step says unless told otherwise; this portal's reads "Sign in".
                "submit": {"role": "button", "name": "Log in"},
            },
            {"id": "partner-offers", "type": "goto", "url": f"{portal}/lab/external"},
            {"id": "open-draft-order", "type": "goto", "url": f"{portal}/lab/draft-order"},
            {
                "id": "delete-draft",
                "type": "click",
                "target": {"role": "button", "name": "Delete draft"},
            },
        ],
    }


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The work the services queue, kept for the test to do (or not)."""
    queued: list[dict[str, Any]] = []
    patch_dispatch(monkeypatch, lambda task, **kwargs: queued.append({"task": task, **kwargs}))
    return queued


@pytest.fixture
def workflow(operator: User, acme_credential: Credential) -> Workflow:
    text = yaml.safe_dump(document("http://127.0.0.1:8001"))
    return workflow_services.workflow_import(user=operator, text=text)


def ready(session: ScratchSession, **fields: Any) -> ScratchSession:
    ScratchSession.objects.filter(pk=session.pk).update(status=S.READY, **fields)
    session.refresh_from_db()
    return session


@pytest.mark.django_db
def test_opening_is_audited_queued_and_the_same_session_comes_back(
    operator: User, workflow: Workflow, asked: list[dict[str, Any]]
) -> None:
    session = scratch.scratch_open(workflow_id=workflow.pk, user=operator)

    assert scratch.scratch_open(workflow_id=workflow.pk, user=operator) == session
    assert [a["task"].name for a in asked] == ["scratch.start"]
    assert session.expires_at > timezone.now() + timedelta(minutes=14)
    opened = AuditEvent.objects.get(action="scratch.opened")
    assert (opened.after or {})["allowed_hosts"] == ["127.0.0.1:8001"]


@pytest.mark.django_db
def test_opening_is_refused_past_the_installations_limit_and_without_a_host(
    operator: User, workflow: Workflow, asked: list[dict[str, Any]], settings: Any
) -> None:
    settings.SCRATCH_SESSIONS_MAX = 1
    scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    other = user_with_role(Role.OPERATORS, username="otto")

    with pytest.raises(scratch.ScratchError, match="all 1 scratch sessions are in use"):
        scratch.scratch_open(workflow_id=workflow.pk, user=other)
    Workflow.objects.filter(pk=workflow.pk).update(allowed_hosts=[])
    settings.SCRATCH_SESSIONS_MAX = 5
    with pytest.raises(scratch.ScratchError, match="allows no host"):
        scratch.scratch_open(workflow_id=workflow.pk, user=other)


@pytest.mark.django_db
def test_work_is_asked_one_piece_at_a_time_by_its_owner_only(
    operator: User, workflow: Workflow, asked: list[dict[str, Any]]
) -> None:
    session = scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    with pytest.raises(scratch.ScratchError, match="still starting"):
        scratch.scratch_ask(scratch_id=session.pk, user=operator, action="look")
    ready(session, sandbox={"host": "worker-7", "allowed_hosts": ["127.0.0.1:8001"]})

    scratch.scratch_ask(scratch_id=session.pk, user=operator, action="run_to", step_id="sign-in")

    work = asked[-1]
    assert (work["task"].name, work["queue"], work["index"]) == ("scratch.act", "host.worker-7", 1)
    assert [s["id"] for s in work["steps"]][:4] == [
        "open-login",
        "sign-in",
        "log-in",
        "partner-offers",
    ]
    with pytest.raises(scratch.ScratchError, match="busy running steps 1 to 2"):
        scratch.scratch_ask(scratch_id=session.pk, user=operator, action="look")
    other = user_with_role(Role.OPERATORS, username="otto")
    with pytest.raises(ScratchSession.DoesNotExist):
        scratch.scratch_ask(scratch_id=session.pk, user=other, action="look")
    ready(session)
    with pytest.raises(scratch.ScratchError, match="no step 'gone'"):
        scratch.scratch_ask(scratch_id=session.pk, user=operator, action="try", step_id="gone")
    with pytest.raises(scratch.ScratchError, match="no element \\[3\\]"):
        scratch.scratch_ask(scratch_id=session.pk, user=operator, action="pick", element=3)


@pytest.mark.django_db
def test_a_session_ends_when_its_workflows_allowed_hosts_change(
    operator: User, workflow: Workflow, asked: list[dict[str, Any]], monkeypatch: Any
) -> None:
    destroyed: list[dict[str, Any]] = []
    patch_destroy_sandbox(monkeypatch, destroyed.append)
    session = scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    sandbox = {"run_key": "scratch-x", "allowed_hosts": ["127.0.0.1:8001"]}
    ready(session, sandbox=sandbox)
    Workflow.objects.filter(pk=workflow.pk).update(allowed_hosts=["127.0.0.1:8002"])

    with pytest.raises(scratch.ScratchError, match="allowed hosts changed"):
        scratch.scratch_ask(scratch_id=session.pk, user=operator, action="look")

    session.refresh_from_db()
    assert (session.status, destroyed) == (S.CLOSED, [sandbox])


@pytest.mark.django_db
def test_an_expired_session_ends_and_its_browser_is_destroyed(
    operator: User, workflow: Workflow, asked: list[dict[str, Any]], monkeypatch: Any
) -> None:
    destroyed: list[dict[str, Any]] = []
    patch_destroy_sandbox(monkeypatch, destroyed.append)
    session = scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    ready(session, sandbox={"run_key": "scratch-x"}, expires_at=timezone.now())

    assert scratch.scratch_housekeeping()["expired"] == [session.pk]

    session.refresh_from_db()
    assert (session.status, session.sandbox) == (S.EXPIRED, None)
    assert destroyed == [{"run_key": "scratch-x"}]
    assert AuditEvent.objects.filter(action="scratch.expired", object_id=str(session.pk)).exists()
    with pytest.raises(scratch.ScratchError, match="has ended"):
        scratch.scratch_ask(scratch_id=session.pk, user=operator, action="look")


@pytest.mark.django_db
def test_a_browser_that_never_started_and_work_never_done_are_said_so(
    operator: User, workflow: Workflow, asked: list[dict[str, Any]], monkeypatch: Any
) -> None:
    patch_destroy_sandbox(monkeypatch, lambda sandbox: None)
    late = scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    other = user_with_role(Role.OPERATORS, username="otto")
    busy = scratch.scratch_open(workflow_id=workflow.pk, user=other)
    ScratchSession.objects.filter(pk=late.pk).update(
        created_at=timezone.now() - scratch.START_LIMIT - timedelta(seconds=1)
    )
    ready(busy)
    scratch.scratch_ask(scratch_id=busy.pk, user=other, action="look")
    ScratchSession.objects.filter(pk=busy.pk).update(
        busy_since=timezone.now() - scratch.WORK_LIMIT - timedelta(seconds=1)
    )

    report = scratch.scratch_housekeeping()

    assert (report["not_started"], report["work_lost"]) == ([late.pk], [busy.pk])
    late.refresh_from_db()
    busy.refresh_from_db()
    assert (late.status, late.reason) == (S.FAILED, "the browser did not start within 3 minutes")
    assert (busy.status, busy.reason) == (
        S.READY, "looking at the page was not done: its worker stopped; ask again",
    )  # fmt: skip
    assert scratch.scratch_housekeeping() == {"expired": [], "not_started": [], "work_lost": []}


@pytest.mark.django_db
def test_a_picked_target_goes_into_the_draft_and_an_irreversible_step_asks_for_its_id(
    operator: User, workflow: Workflow, asked: list[dict[str, Any]]
) -> None:
    session = scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    proposal = {"target": {"role": "button", "name": "Log on", "exact": True}, "matches": 1}
    ready(session, picked={"element": {"number": 4}, "proposals": [proposal]})

    with pytest.raises(workflow_services.WorkflowError) as refused:
        scratch.scratch_use_target(
            scratch_id=session.pk, user=operator, step_id="sign-in", field="target", proposal=0
        )
    assert "type its id" in str(refused.value.field_errors)
    scratch.scratch_use_target(
        scratch_id=session.pk,
        user=operator,
        step_id="sign-in",
        field="target",
        proposal=0,
        confirm="sign-in",
    )

    draft = workflow.versions.get(status="draft")
    assert draft.steps[1]["target"] == {"role": "button", "name": "Log on", "exact": True}
    event = AuditEvent.objects.get(action="workflow.step_target_picked")
    assert event.after == {"target": draft.steps[1]["target"]}
    assert (event.extra["scratch_session"], event.extra["matches"]) == (session.pk, 1)


@pytest.mark.browser
@pytest.mark.usefixtures("run_files_in_tmp")
@pytest.mark.django_db(transaction=True)
def test_a_real_session_skips_the_irreversible_step_picks_on_the_page_and_keeps_to_the_allowlist(
    operator: User, acme_credential: Credential, portal: str, asked: list[dict[str, Any]]
) -> None:
    text = yaml.safe_dump(document(portal))
    workflow = workflow_services.workflow_import(user=operator, text=text)
    session = scratch.scratch_open(workflow_id=workflow.pk, user=operator)
    scratch_worker.scratch_start(scratch_id=session.pk)
    session.refresh_from_db()
    assert session.status == S.READY, session.reason
    key = (session.sandbox or {})["run_key"]
    assert key.startswith(f"scratch-{session.pk}-{installation_tag()}")
    assert processes_with(key)

    def do(action: str, **kwargs: Any) -> ScratchSession:
        scratch.scratch_ask(scratch_id=session.pk, user=operator, action=action, **kwargs)  # type: ignore[arg-type]
        work = {k: v for k, v in asked[-1].items() if k not in ("task", "queue")}
        scratch_worker.scratch_act(**work)
        session.refresh_from_db()
        assert session.status == S.READY, session.reason
        return session

    do("run_to", step_id="sign-in")
    assert session.results["open-login"]["status"] == "succeeded"
    skipped = session.results["sign-in"]
    assert skipped["status"] == "skipped"
    assert skipped["error"] == "never done in a scratch session: it is irreversible"
    # Never clicked: the browser is still on the sign-in page.
    assert session.url.endswith("/login")

    elements = (session.observation or {})["elements"]
    button = next(e for e in elements if e["role"] == "button" and e["name"] == "Sign in")
    do("pick", element=button["number"])
    first = (session.picked or {})["proposals"][0]
    assert (first["kind"], first["matches"], first["compact"]) == (
        "role", 1, "button 'Sign in' exact",
    )  # fmt: skip
    username = next(e for e in elements if e["role"] == "textbox" and e["name"] == "Username")
    do("pick", element=username["number"])
    kinds = [p["kind"] for p in (session.picked or {})["proposals"]]
    assert kinds[:2] == ["role", "label"]
    assert kinds[-1] == "css"

    # Recorded: typing into the field, as a new parameter whose default is what was typed.
    step_id, not_done = scratch.scratch_record(
        scratch_id=session.pk, user=operator, proposal=0, value="acme-demo",
        value_as="parameter", name="portal_user", after="open-login",
    )  # fmt: skip
    assert (step_id, not_done) == ("fill-username", "")
    draft = workflow.versions.get(status="draft")
    assert draft.steps[1] == {
        "id": "fill-username", "type": "fill", "value": "{{ params.portal_user }}",
        "target": {"role": "textbox", "name": "Username", "exact": True},
    }  # fmt: skip
    assert draft.parameters[-1]["default"] == "acme-demo"
    scratch_worker.scratch_act(**{k: v for k, v in asked[-1].items() if k not in ("task", "queue")})
    session.refresh_from_db()
    assert session.results["fill-username"]["status"] == "succeeded"
    password = next(e for e in elements if e["name"] == "Password")
    do("pick", element=password["number"])
    assert (session.picked or {})["secret"] is True
    with pytest.raises(scratch.ScratchError, match="takes a secret"):
        scratch.scratch_record(
            scratch_id=session.pk, user=operator, proposal=0, value="portal-demo-2026"
        )
    scratch.scratch_record(
        scratch_id=session.pk, user=operator, proposal=0, value_as="credential",
        name="acme-portal.password", after="fill-username",
    )  # fmt: skip
    scratch_worker.scratch_act(**{k: v for k, v in asked[-1].items() if k not in ("task", "queue")})
    session.refresh_from_db()
    assert session.results["fill-password"]["status"] == "succeeded"
    assert "portal-demo-2026" not in str(workflow.versions.get(status="draft").steps)

    do("run_to", step_id="log-in")
    assert session.results["log-in"]["status"] == "failed"
    (proposal,) = scratch.scratch_page_proposals(session)
    assert (proposal.step_id, proposal.field) == ("log-in", "submit")
    best = proposal.candidates[0]
    assert (best.role, best.name) == ("button", "Sign in")
    scratch.scratch_use_element(
        scratch_id=session.pk, user=operator, step_id="log-in", field="submit", number=best.number
    )
    draft = workflow.versions.get(status="draft")
    log_in = next(step for step in draft.steps if step["id"] == "log-in")
    assert log_in["submit"] == {"role": "button", "name": "Sign in", "exact": True}

    do("run_to", step_id="partner-offers")
    assert {k: r["status"] for k, r in session.results.items()} == {
        "open-login": "succeeded", "fill-username": "succeeded", "fill-password": "succeeded",
        "sign-in": "skipped", "log-in": "succeeded", "partner-offers": "succeeded",
    }  # fmt: skip
    assert session.url.endswith("/lab/external")
    used = AuditEvent.objects.filter(action="credential.used")
    assert {str(e.extra) for e in used} == {str({"scratch_session": session.pk})}
    assert lab.OTHER_LOOPBACK_HOST in " ".join(session.refused)
    assert AuditEvent.objects.filter(action="scratch.egress_denied").exists()

    # "Delete draft" reads final, but on the page it only opens a dialog: no warning then.
    def warnings() -> list[str]:
        workflow.refresh_from_db()
        return workflow_services.draft_review(
            workflow, workflow.versions.get(status="draft")
        ).warnings

    assert any("delete-draft" in w or "'Delete'" in w for w in warnings())
    # Not marked irreversible, yet it reads final: not done unless tried alone, confirmed.
    do("run_to", step_id="delete-draft")
    assert session.results["delete-draft"]["status"] == "skipped"
    assert "reads like a final action" in session.results["delete-draft"]["error"]
    do("try", step_id="delete-draft", confirm="delete-draft")
    assert session.results["delete-draft"]["learned"] == (
        "it opened the dialog 'Delete draft order PO-2026-0611?'"
    )
    assert warnings() == []
    learned = AuditEvent.objects.get(action="workflow.page_learned")
    assert learned.actor_id == operator.pk
    tried = AuditEvent.objects.filter(action="scratch.asked").last()
    assert tried is not None
    assert (tried.after or {})["clicked_although_final_sounding"] == "delete-draft"
    # Learned, it is done in a run up to it like any other step.
    do("run_to", step_id="delete-draft")
    assert session.results["delete-draft"]["status"] == "succeeded"

    scratch.scratch_close(scratch_id=session.pk, user=operator)
    assert not processes_with(key)
    assert not scratch.scratch_files_dir(session.pk).exists()
