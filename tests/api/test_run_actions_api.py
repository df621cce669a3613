"""Run again, continue from a step and reconcile over the API: the run page's services and rules."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import ApprovalRequestFactory, user_with_role
from tests.patching import patch_dispatch
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

INPUTS = {"invoice": "INV-1001", "amount": "12.00"}


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_dispatch(monkeypatch, lambda task, queue=None, **kw: None)


def failed(operator: User, workflow: Workflow, step: str) -> Run:
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs=INPUTS)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FAILED,
        failure_step=step,
        outputs={"amount_seen": "12.00"},
        finished_at=timezone.now(),
    )
    run.refresh_from_db()
    return run


def step_ids(workflow: Workflow) -> list[str]:
    version = workflow.versions.get(number=1)
    return [str(s["id"]) for s in (version.document or {})["steps"]]


def test_run_again_takes_the_originals_inputs_and_links_to_it(
    operator: User, demo_workflow: Workflow
) -> None:
    original = failed(operator, demo_workflow, "receipt")
    api = Api(make_token(operator))

    answer = api.post(f"/runs/{original.pk}/again", {})

    assert answer.status_code == 201, answer.content
    body = json.loads(answer.content)
    assert body["rerun_of"] == original.pk
    assert body["inputs"] == original.inputs
    assert body["start_step"] is None
    event = AuditEvent.objects.get(action="run.launched", object_id=str(body["id"]))
    assert (event.after or {})["rerun_of"] == original.pk


def test_a_failed_run_says_where_it_may_continue_and_continues_there(
    operator: User, demo_workflow: Workflow
) -> None:
    ids = step_ids(demo_workflow)
    original = failed(operator, demo_workflow, "open-pay-form")
    api = Api(make_token(operator))

    offered = json.loads(api.get(f"/runs/{original.pk}").content)["continue_from"]
    assert [c["step_id"] for c in offered] == ids[1:]
    assert all(c["allowed"] for c in offered)
    answer = api.post(f"/runs/{original.pk}/again", {"start_step": ids[8]})

    assert answer.status_code == 201, answer.content
    body = json.loads(answer.content)
    assert body["start_step"] == ids[8]
    assert body["outputs"] == {"amount_seen": "12.00"}
    assert Run.objects.get(pk=body["id"]).start_index == 8


def test_continuing_past_an_approved_irreversible_step_is_refused_in_words(
    operator: User, demo_workflow: Workflow
) -> None:
    ids = step_ids(demo_workflow)
    paying = ids.index("submit-payment")
    original = failed(operator, demo_workflow, "receipt")
    ApprovalRequest.objects.create(
        run=original, step_index=paying, step_id="submit-payment",
        status=ApprovalRequest.Status.APPROVED, expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    api = Api(make_token(operator))

    offered = {
        c["step_id"]: c
        for c in json.loads(api.get(f"/runs/{original.pk}").content)["continue_from"]
    }
    document = problem(api.post(f"/runs/{original.pk}/again", {"start_step": ids[paying + 1]}), 409)

    assert offered["submit-payment"]["allowed"]
    assert not offered[ids[paying + 1]]["allowed"]
    assert "reconcile" in offered[ids[paying + 1]]["reason"]
    assert "irreversible" in document["detail"]
    assert not Run.objects.filter(rerun_of=original).exists()


def test_an_unknown_step_and_bad_inputs_name_their_field(
    operator: User, demo_workflow: Workflow
) -> None:
    original = failed(operator, demo_workflow, "receipt")
    api = Api(make_token(operator))

    unknown = problem(api.post(f"/runs/{original.pk}/again", {"start_step": "no-such"}), 422)
    bad = problem(api.post(f"/runs/{original.pk}/again", {"inputs": {"amount": "lots"}}), 422)

    assert unknown["errors"][0]["field"] == "start_step"
    assert "no step 'no-such'" in unknown["errors"][0]["message"]
    assert any(e["field"].startswith("inputs.") for e in bad["errors"])
    assert not Run.objects.filter(rerun_of=original).exists()


def test_the_same_key_answers_the_same_new_run_and_refuses_another_rerun(
    operator: User, demo_workflow: Workflow
) -> None:
    original = failed(operator, demo_workflow, "receipt")
    other = failed(operator, demo_workflow, "receipt")
    api = Api(make_token(operator))
    key = {"Idempotency-Key": "again-1"}

    first = api.post(f"/runs/{original.pk}/again", {}, **key)
    second = api.post(f"/runs/{original.pk}/again", {}, **key)
    elsewhere = api.post(f"/runs/{other.pk}/again", {}, **key)
    changed = api.post(f"/runs/{original.pk}/again", {"inputs": {**INPUTS, "amount": "13"}}, **key)

    assert (first.status_code, second.status_code) == (201, 200)
    assert json.loads(first.content)["id"] == json.loads(second.content)["id"]
    assert problem(elsewhere, 409)["type"].endswith("idempotency-key-reused")
    assert problem(changed, 409)["type"].endswith("idempotency-key-reused")
    assert Run.objects.filter(rerun_of__in=[original, other]).count() == 1


def test_a_launch_key_is_not_answered_with_a_rerun(operator: User, demo_workflow: Workflow) -> None:
    original = failed(operator, demo_workflow, "receipt")
    api = Api(make_token(operator))
    api.post(f"/runs/{original.pk}/again", {}, **{"Idempotency-Key": "k"})

    launch = api.post(
        "/runs/", {"workflow": demo_workflow.slug, "inputs": INPUTS}, **{"Idempotency-Key": "k"}
    )

    assert problem(launch, 409)["type"].endswith("idempotency-key-reused")


def test_run_again_needs_runs_launch(operator: User, demo_workflow: Workflow) -> None:
    original = failed(operator, demo_workflow, "receipt")
    reader = Api(make_token(operator, ["runs:read"]))

    assert problem(reader.post(f"/runs/{original.pk}/again", {}), 403)["type"].endswith(
        "missing-scope"
    )


# Reconcile ---------------------------------------------------------------------------------------


@pytest.fixture
def uncertain() -> ApprovalRequest:
    """An approved action whose end nobody recorded, approved by rory."""
    approval = ApprovalRequestFactory.create()
    rory = user_with_role(Role.REVIEWERS, username="rory")
    ApprovalDecision.objects.create(
        request=approval,
        reviewer=rory,
        verdict=ApprovalDecision.Verdict.APPROVE,
        evidence_sha256=approval.evidence_sha256,
    )
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        status=ApprovalRequest.Status.APPROVED, intent_at=timezone.now()
    )
    Run.objects.filter(pk=approval.run_id).update(status=Run.Status.NEEDS_RECONCILIATION)
    return approval


def reconcile(user: User, approval: ApprovalRequest, **body: Any) -> Any:
    return Api(make_token(user)).post(
        f"/runs/{approval.run_id}/reconcile",
        {"happened": True, "note": "RCPT-2026-000001 in the portal", **body},
    )


def test_another_reviewer_reconciles_and_it_is_audited(uncertain: ApprovalRequest) -> None:
    vera = user_with_role(Role.REVIEWERS, username="vera")

    answer = reconcile(vera, uncertain)

    assert answer.status_code == 200, answer.content
    assert json.loads(answer.content)["status"] == Run.Status.SUCCEEDED
    event = AuditEvent.objects.filter(run_id=uncertain.run_id, action="run.succeeded").get()
    assert event.actor == vera
    assert event.extra["reconciled"]["note"] == "RCPT-2026-000001 in the portal"


def test_the_approver_and_the_launcher_are_refused_in_words(uncertain: ApprovalRequest) -> None:
    rory = User.objects.get(username="rory")

    refused = problem(reconcile(rory, uncertain), 403)

    assert "you approved this action" in refused["detail"]
    assert Run.objects.get(pk=uncertain.run_id).status == Run.Status.NEEDS_RECONCILIATION


def test_a_note_is_required_and_a_settled_run_is_refused(uncertain: ApprovalRequest) -> None:
    vera = user_with_role(Role.REVIEWERS, username="vera")

    empty = problem(reconcile(vera, uncertain, note="  "), 422)
    reconcile(vera, uncertain)
    again = problem(reconcile(vera, uncertain, happened=False), 409)

    assert empty["errors"] == [{"field": "note", "message": "This field is required."}]
    assert "does not need reconciliation" in again["detail"]
    assert Run.objects.get(pk=uncertain.run_id).status == Run.Status.SUCCEEDED
