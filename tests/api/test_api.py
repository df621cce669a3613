from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.services import evidence_hash
from pandaweb.audit.models import AuditEvent
from sessions.models import Run, StepResult
from tests.api.conftest import Api, make_token
from tests.factories import ApprovalRequestFactory, user_with_role
from tests.patching import patch_dispatch
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

GOOD = {"invoice": "INV-1001", "amount": "1250.00"}


@pytest.fixture(autouse=True)
def continuations(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Approving dispatches the run's continuation; nothing executes here."""
    sent: list[dict[str, Any]] = []
    patch_dispatch(monkeypatch, lambda task, queue=None, **kw: sent.append(kw))
    return sent


def launch(api: Api, body: dict[str, Any] | None = None, key: str = "") -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return api.post("/runs/", body or {"workflow": "acme-pay-invoice", "inputs": GOOD}, **headers)


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    document = json.loads(response.content)
    assert document["status"] == status
    assert document["title"]
    assert document["detail"]
    assert document["type"]
    return document


def pending_approval(**kwargs: Any) -> ApprovalRequest:
    evidence = {"url": "http://127.0.0.1:8001/pay", "inputs": {"amount": "1250.00"}}
    return ApprovalRequestFactory.create(
        evidence=evidence, evidence_sha256=evidence_hash(evidence), **kwargs
    )


# Authentication and problems --------------------------------------------------------------------


def test_it_refuses_a_request_without_a_token_as_a_problem(client: Any) -> None:
    response = client.get("/api/v1/runs/")
    document = problem(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert document["instance"] == "/api/v1/runs/"


def test_it_refuses_an_unknown_token_like_a_missing_one(client: Any) -> None:
    response = client.get("/api/v1/runs/", headers={"Authorization": "Bearer pw_nope"})
    problem(response, 401)


def test_an_unknown_endpoint_is_a_problem_too(client: Any) -> None:
    problem(client.get("/api/v1/nothing/here"), 404)


def test_it_serves_the_openapi_document_and_the_docs_page_without_a_cdn(client: Any) -> None:
    schema = client.get("/api/v1/openapi.json")
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert "/api/v1/runs/" in paths
    assert "/api/v1/approvals/{approval_id}/decision" in paths
    answer = paths["/api/v1/runs/{run_id}/questions/{question_id}/answer"]["post"]
    assert "Scope: ``questions:answer``" in answer["description"]
    assert "Scope: ``questions:answer``" in paths["/api/v1/questions/"]["get"]["description"]
    page = client.get("/api/v1/docs")
    html = page.content.decode()
    assert page.status_code == 200
    assert "/static/ninja/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower()
    # No inline script: only the JSON settings block (not executed) and external files.
    scripts = html.count("<script")
    assert scripts == html.count("<script src=") + html.count('<script type="application/json"')
    # Swagger UI styles its widgets inline; its scripts stay our own files.
    policy = page["Content-Security-Policy"]
    assert "style-src 'self' 'unsafe-inline'" in policy
    assert "script-src 'self';" in policy


# Launch -----------------------------------------------------------------------------------------


def test_it_launches_a_run_with_typed_inputs(operator: User, demo_workflow: Workflow) -> None:
    api = Api(make_token(operator))
    response = launch(api)
    assert response.status_code == 201, response.content
    body = response.json()
    run = Run.objects.get()
    assert body["id"] == run.pk
    assert body["status"] == "queued"
    assert run.inputs["amount"] == "1250.00"
    assert run.launched_by == operator
    event = AuditEvent.objects.get(action="run.launched")
    assert event.actor == operator
    assert event.extra["via"]["channel"] == "api"
    assert event.extra["via"]["name"].startswith("token-")


def test_a_launch_over_the_limit_says_its_priority_and_how_many_wait_ahead(
    operator: User, acme_credential: object
) -> None:
    from tests.sessions.test_queue import limited

    limited(operator, 1)
    api = Api(make_token(operator))
    first = launch(api).json()
    normal = launch(api).json()
    urgent = launch(api, {"workflow": "acme-pay-invoice", "inputs": GOOD, "priority": "high"})

    assert (first["priority"], first["queued_ahead"]) == ("normal", None)
    assert (normal["priority"], normal["queued_ahead"]) == ("normal", 0)
    assert urgent.status_code == 201, urgent.content
    assert (urgent.json()["priority"], urgent.json()["queued_ahead"]) == ("high", 0)
    assert api.get(f"/runs/{normal['id']}").json()["queued_ahead"] == 1
    refused = problem(
        launch(api, {"workflow": "acme-pay-invoice", "inputs": GOOD, "priority": "asap"}), 422
    )
    assert refused["errors"] == [
        {"field": "priority", "message": "Choose a priority: low, normal or high."}
    ]


def test_it_maps_invalid_inputs_to_field_paths(operator: User, demo_workflow: Workflow) -> None:
    api = Api(make_token(operator))
    body = {"workflow": "acme-pay-invoice", "inputs": {"invoice": "nope", "amount": "1.234"}}
    document = problem(launch(api, body), 422)
    fields = {e["field"] for e in document["errors"]}
    assert fields == {"inputs.invoice", "inputs.amount"}
    assert not Run.objects.exists()


def test_it_maps_a_malformed_body_to_field_paths(operator: User, demo_workflow: Workflow) -> None:
    api = Api(make_token(operator))
    document = problem(launch(api, {"inputs": {"amount": [1]}}), 422)
    fields = {e["field"] for e in document["errors"]}
    assert "workflow" in fields
    assert any(f.startswith("inputs.amount") for f in fields)


def test_it_answers_an_unknown_workflow_with_a_field_error(operator: User) -> None:
    document = problem(launch(Api(make_token(operator)), {"workflow": "nope", "inputs": {}}), 422)
    assert document["errors"][0]["field"] == "workflow"


def test_it_returns_the_same_run_for_the_same_key_and_body(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))
    first = launch(api, key="erp-4711")
    again = launch(
        api, {"workflow": "acme-pay-invoice", "inputs": {**GOOD, "amount": "1250"}}, key="erp-4711"
    )
    assert first.status_code == 201
    assert again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.count() == 1


def test_it_refuses_the_same_key_with_another_body(operator: User, demo_workflow: Workflow) -> None:
    api = Api(make_token(operator))
    launch(api, key="erp-4711")
    other = {"workflow": "acme-pay-invoice", "inputs": {**GOOD, "amount": "99.00"}}
    document = problem(launch(api, other, key="erp-4711"), 409)
    assert document["type"].endswith("idempotency-key-reused")
    assert Run.objects.count() == 1


def test_it_scopes_idempotency_keys_per_owner(operator: User, demo_workflow: Workflow) -> None:
    from pandaweb.core.roles import Role

    colleague = user_with_role(Role.OPERATORS)
    mine = launch(Api(make_token(operator)), key="k1")
    theirs = launch(Api(make_token(colleague)), key="k1")
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]


@pytest.mark.django_db(transaction=True)
def test_it_makes_one_run_for_concurrent_requests_with_one_key(
    operator: User, demo_workflow: Workflow
) -> None:
    token = make_token(operator)
    answers: list[Any] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            barrier.wait()
            answers.append(launch(Api(token), key="same-key"))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Run.objects.count() == 1
    assert {a.json()["id"] for a in answers} == {Run.objects.get().pk}
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201]


# Scopes and roles -------------------------------------------------------------------------------


def test_it_refuses_a_scope_the_token_lacks(operator: User, demo_workflow: Workflow) -> None:
    api = Api(make_token(operator, ["runs:read"]))
    document = problem(launch(api), 403)
    assert document["type"].endswith("missing-scope")
    assert not Run.objects.exists()


def test_a_scope_beyond_the_owners_role_grants_nothing(
    reviewer: User, operator: User, demo_workflow: Workflow
) -> None:
    token = make_token(operator, ["runs:launch", "runs:read"])
    operator.groups.clear()  # the role is taken away after the token was made
    document = problem(launch(Api(token)), 403)
    assert document["type"].endswith("scope-beyond-role")
    assert not Run.objects.exists()


ENDPOINTS: list[tuple[str, str, str]] = [
    ("get", "/workflows/", "workflows:read"),
    ("get", "/workflows/acme-pay-invoice/versions/1", "workflows:read"),
    ("get", "/workflows/acme-pay-invoice/versions/1/yaml", "workflows:read"),
    ("get", "/runs/", "runs:read"),
    ("get", "/runs/{run}", "runs:read"),
    ("post", "/runs/{run}/cancel", "runs:launch"),
    ("get", "/runs/{run}/bundle", "audit:read"),
    ("get", "/questions/", "questions:answer"),
    ("get", "/approvals/", "approvals:read"),
    ("get", "/approvals/{approval}", "approvals:read"),
    ("post", "/approvals/{approval}/decision", "approvals:decide"),
    ("get", "/audit/export", "audit:read"),
    ("get", "/audit/verify", "audit:read"),
]
ROLES = ["Operators", "Reviewers", "Compliance", "Admins", None]


@pytest.mark.parametrize(("method", "path", "scope"), ENDPOINTS)
@pytest.mark.parametrize("role", ROLES)
def test_every_endpoint_needs_its_scope_and_the_role_behind_it(
    method: str, path: str, scope: str, role: str | None, demo_workflow: Workflow
) -> None:
    from pandaweb.api.scopes import SCOPE_CAPABILITY, Scope
    from pandaweb.core.roles import ROLE_CAPABILITIES, Role

    approval = pending_approval()
    url = path.format(run=approval.run_id, approval=approval.pk)
    user = user_with_role(Role(role) if role else None)
    body = {"verdict": "reject", "evidence_sha256": approval.evidence_sha256, "reason": "no"}
    role_allows = (
        role is not None and SCOPE_CAPABILITY[Scope(scope)] in ROLE_CAPABILITIES[Role(role)]
    )
    # Without the scope: 403 whatever the role.
    from pandaweb.api.services import effective_scopes

    others = [s.value for s in effective_scopes(user, [s.value for s in Scope]) if s != scope]
    without = Api(make_token(user, others)) if others else None
    if without is not None:
        answer = getattr(without, method)(url, body) if method == "post" else without.get(url)
        problem(answer, 403)
    if not role_allows:
        # The scope cannot even be granted on a token of this role.
        from pandaweb.api.services import TokenError

        with pytest.raises(TokenError):
            make_token(user, [scope])
        return
    api = Api(make_token(user, [scope]))
    answer = api.post(url, body) if method == "post" else api.get(url)
    if path.endswith("/decision") and role == "Admins":
        assert answer.status_code == 200, answer.content  # admins may decide any group's
    else:
        assert answer.status_code in {200, 201}, answer.content


# No existence leaks ------------------------------------------------------------------------------


def test_a_missing_run_and_a_forbidden_run_look_alike(
    operator: User, stranger: User, demo_workflow: Workflow
) -> None:
    launch(Api(make_token(operator)))
    run = Run.objects.get()
    reader = Api(make_token(operator, ["workflows:read"]))
    # Without the scope: the same 403 for the real run and one that never existed.
    real, missing = reader.get(f"/runs/{run.pk}"), reader.get(f"/runs/{run.pk + 999}")
    assert real.status_code == missing.status_code == 403
    assert json.loads(real.content)["detail"] == json.loads(missing.content)["detail"]
    allowed = Api(make_token(operator, ["runs:read"]))
    gone = allowed.get(f"/runs/{run.pk + 999}")
    assert problem(gone, 404)["detail"] == "no such object, or not yours to see"
    for path in (f"/runs/{run.pk}/files/../../etc/passwd", f"/runs/{run.pk}/artifacts/1"):
        problem(allowed.get(path), 404)


# Get and list -----------------------------------------------------------------------------------


def seed_steps(run: Run, count: int) -> None:
    now = timezone.now()
    StepResult.objects.bulk_create(
        StepResult(
            run=run,
            index=i,
            step_id=f"s{i}",
            step_type="click",
            sentence="Click",
            status="succeeded",
            started_at=now,
            duration_ms=5,
            screenshot=f"steps/{i:03}.jpg",
        )
        for i in range(count)
    )


def test_get_run_shows_steps_outputs_approvals_and_links(
    operator: User, demo_workflow: Workflow
) -> None:
    approval = pending_approval()
    run = approval.run
    run.outputs = {"reference": "PAY-1"}
    run.save(update_fields=["outputs"])
    seed_steps(run, 3)
    body = Api(make_token(operator)).get(f"/runs/{run.pk}").json()
    assert body["status"] == "awaiting_approval"
    assert body["outputs"] == {"reference": "PAY-1"}
    assert [s["index"] for s in body["steps"]] == [0, 1, 2]
    assert body["steps"][1]["screenshot"] == f"/api/v1/runs/{run.pk}/files/steps/001.jpg"
    assert body["approvals"][0]["evidence_sha256"] == approval.evidence_sha256
    assert body["links"]["bundle"] == f"/api/v1/runs/{run.pk}/bundle"


def test_the_query_count_of_get_and_list_does_not_grow_with_the_data(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))
    small = pending_approval()
    seed_steps(small.run, 1)
    api.get("/runs/")  # warm: the token's last-used write happens once a minute at most
    with CaptureQueriesContext(connection) as few:
        api.get(f"/runs/{small.run_id}")
    with CaptureQueriesContext(connection) as few_list:
        api.get("/runs/")
    big = pending_approval()
    seed_steps(big.run, 40)
    ApprovalRequestFactory.create(run=big.run, evidence_sha256="0" * 64)
    for _ in range(30):
        Run.objects.create(workflow=big.run.workflow, version=big.run.version, launched_by=operator)
    with CaptureQueriesContext(connection) as many:
        api.get(f"/runs/{big.run_id}")
    with CaptureQueriesContext(connection) as many_list:
        api.get("/runs/")
    assert len(few) == len(many)
    assert len(few_list) == len(many_list)


def test_the_list_pages_by_cursor_and_stays_stable_under_new_runs(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))
    for n in range(5):
        launch(api, {"workflow": "acme-pay-invoice", "inputs": {**GOOD, "invoice": f"INV-000{n}"}})
    first = api.get("/runs/", {"limit": 2}).json()
    launch(api, {"workflow": "acme-pay-invoice", "inputs": {**GOOD, "invoice": "INV-0099"}})
    second = api.get("/runs/", {"limit": 2, "cursor": first["next_cursor"]}).json()
    third = api.get("/runs/", {"limit": 2, "cursor": second["next_cursor"]}).json()
    ids = [r["id"] for page in (first, second, third) for r in page["items"]]
    oldest_five = sorted(Run.objects.values_list("pk", flat=True))[:5]
    assert ids == sorted(oldest_five, reverse=True)
    assert third["next_cursor"] is None


def test_the_list_filters_by_input_status_launcher_and_date(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))
    launch(api, {"workflow": "acme-pay-invoice", "inputs": {**GOOD, "invoice": "INV-0001"}})
    launch(api, {"workflow": "acme-pay-invoice", "inputs": {**GOOD, "invoice": "INV-0002"}})
    Run.objects.filter(inputs__invoice="INV-0002").update(status="failed", outputs={"ref": "X9"})

    def ids(**params: Any) -> list[str]:
        return [r["inputs"]["invoice"] for r in api.get("/runs/", params).json()["items"]]

    assert ids(input="invoice=INV-0001") == ["INV-0001"]
    assert ids(output="ref=X9") == ["INV-0002"]
    assert ids(status="failed") == ["INV-0002"]
    assert ids(launched_by="olivia", workflow="acme-pay-invoice") == ["INV-0002", "INV-0001"]
    assert ids(launched_by="nobody") == []
    tomorrow = (timezone.now() + timedelta(days=1)).isoformat()
    assert ids(created_from=tomorrow) == []
    problem(api.get("/runs/", {"input": "no-equals"}), 422)
    problem(api.get("/runs/", {"cursor": "@@@"}), 422)
    problem(api.get("/runs/", {"status": "bogus"}), 422)


def test_cancel_goes_through_the_service_and_is_audited_with_the_token(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))
    run_id = launch(api).json()["id"]
    body = api.post(f"/runs/{run_id}/cancel").json()
    assert body["status"] == "cancelled"
    assert Run.objects.get(pk=run_id).status == Run.Status.CANCELLED
    event = AuditEvent.objects.get(action="run.cancelled")
    assert event.extra["via"]["channel"] == "api"


# Workflows --------------------------------------------------------------------------------------


def test_the_version_schema_describes_patterns_money_and_defaults(
    operator: User, demo_workflow: Workflow
) -> None:
    api = Api(make_token(operator))
    listed = api.get("/workflows/").json()
    assert [w["slug"] for w in listed] == ["acme-pay-invoice"]
    body = api.get(listed[0]["links"]["latest"].removeprefix("/api/v1")).json()
    schema = body["inputs_schema"]
    assert schema["properties"]["invoice"]["pattern"] == r"^(?:INV-\d{4})$"
    assert schema["properties"]["amount"]["x-currency"] == "EUR"
    assert schema["properties"]["amount"]["x-minimum"] == "0.01"
    assert schema["required"] == ["invoice", "amount"]
    assert schema["additionalProperties"] is False
    yaml_text = api.get("/workflows/acme-pay-invoice/versions/1/yaml").content.decode()
    assert "slug: acme-pay-invoice" in yaml_text
    problem(api.get("/workflows/acme-pay-invoice/versions/9"), 404)


# Approvals --------------------------------------------------------------------------------------


def test_a_reviewer_lists_and_approves_quoting_the_evidence_hash(
    reviewer: User, continuations: list[dict[str, Any]]
) -> None:
    approval = pending_approval()
    api = Api(make_token(reviewer))
    listed = api.get("/approvals/").json()
    assert [a["id"] for a in listed] == [approval.pk]
    seen = api.get(f"/approvals/{approval.pk}").json()
    assert seen["evidence"]["url"] == "http://127.0.0.1:8001/pay"
    answer = api.post(
        f"/approvals/{approval.pk}/decision",
        {"verdict": "approve", "evidence_sha256": seen["evidence_sha256"]},
    )
    assert answer.status_code == 200, answer.content
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    decision = ApprovalDecision.objects.get()
    assert decision.reviewer == reviewer
    event = AuditEvent.objects.get(action="approval.decided")
    assert event.actor == reviewer
    assert event.extra["via"]["channel"] == "api"
    assert continuations  # the run goes on


def test_it_refuses_a_verdict_on_other_evidence(reviewer: User) -> None:
    approval = pending_approval()
    answer = Api(make_token(reviewer)).post(
        f"/approvals/{approval.pk}/decision", {"verdict": "approve", "evidence_sha256": "f" * 64}
    )
    document = problem(answer, 409)
    assert document["type"].endswith("evidence-mismatch")
    assert document["evidence_sha256"] == approval.evidence_sha256
    assert not ApprovalDecision.objects.exists()


def test_it_refuses_self_approval_through_the_api() -> None:
    from pandaweb.core.roles import Role

    approval = pending_approval()
    # Loaded afresh, as a request loads its user: the launcher's object has its permissions
    # cached since it imported the workflow (team_for_new asked), before this role was added.
    launcher = User.objects.get(pk=approval.run.launched_by_id)
    launcher.groups.add(*user_with_role(Role.REVIEWERS).groups.all())
    answer = Api(make_token(launcher)).post(
        f"/approvals/{approval.pk}/decision",
        {"verdict": "approve", "evidence_sha256": approval.evidence_sha256},
    )
    assert "someone else" in problem(answer, 403)["detail"]
    assert not ApprovalDecision.objects.exists()
    assert Api(make_token(launcher)).get("/approvals/").json() == []


def test_it_refuses_an_expired_request(reviewer: User) -> None:
    approval = pending_approval()
    token = make_token(reviewer)
    with time_machine.travel(approval.expires_at + timedelta(minutes=1)):
        answer = Api(token).post(
            f"/approvals/{approval.pk}/decision",
            {"verdict": "approve", "evidence_sha256": approval.evidence_sha256},
        )
    assert "expired" in problem(answer, 409)["detail"]
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.EXPIRED
    assert not ApprovalDecision.objects.exists()


def test_a_rejection_needs_a_reason_as_a_field_error(reviewer: User) -> None:
    approval = pending_approval()
    answer = Api(make_token(reviewer)).post(
        f"/approvals/{approval.pk}/decision",
        {"verdict": "reject", "evidence_sha256": approval.evidence_sha256},
    )
    assert problem(answer, 422)["errors"][0]["field"] == "reason"


def test_quorum_keeps_the_request_open_after_one_approval(
    reviewer: User, second_reviewer: User
) -> None:
    approval = pending_approval(quorum=2)
    body = {"verdict": "approve", "evidence_sha256": approval.evidence_sha256}
    first = Api(make_token(reviewer)).post(f"/approvals/{approval.pk}/decision", body).json()
    assert first["status"] == "pending"
    assert first["approvals"] == 1
    second = Api(make_token(second_reviewer)).post(f"/approvals/{approval.pk}/decision", body)
    assert second.json()["status"] == "approved"


# Audit ------------------------------------------------------------------------------------------


def test_compliance_exports_a_signed_trail_and_verifies_the_chain(
    compliance: User, operator: User, demo_workflow: Workflow
) -> None:
    import io

    from pandaweb.audit.export import verify_export

    api = Api(make_token(compliance))
    answer = api.get("/audit/export", {"workflow": "acme-pay-invoice"})
    assert answer.status_code == 200
    check = verify_export(io.BytesIO(b"".join(answer.streaming_content)))
    assert check.ok
    assert AuditEvent.objects.filter(action="audit.exported", actor=compliance).exists()
    verified = api.get("/audit/verify").json()
    assert verified["ok"] is True
    assert verified["count"] == AuditEvent.objects.count()
    assert problem(api.get("/audit/export", {"workflow": "nope"}), 422)["errors"][0]["field"] == (
        "workflow"
    )


def test_the_bundle_downloads_and_is_audited(compliance: User) -> None:
    approval = pending_approval()
    answer = Api(make_token(compliance)).get(f"/runs/{approval.run_id}/bundle")
    assert answer.status_code == 200
    content = b"".join(answer.streaming_content)
    assert content[:2] == b"PK"
    assert AuditEvent.objects.filter(action="audit.run_bundle_exported", actor=compliance).exists()
