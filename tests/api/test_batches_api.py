"""Batches over the API: the batch page's checks of every row, partial launches, retries."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile

from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from pandaweb.schedules.models import Batch, BatchRow
from sessions.models import Run
from tests.api.conftest import Api, make_token
from tests.api.test_api import problem
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

GOOD_ROWS = [
    {"invoice": "INV-1001", "amount": "1250.00"},
    {"invoice": "INV-1002", "amount": 10},
]
# Line 3's amount has three decimals, line 4's invoice breaks the pattern.
MIXED_CSV = "invoice,amount\nINV-1001,10.00\nINV-1002,1.234\nnope,20.00\nINV-1004,30.00\n"


@pytest.fixture
def launcher(operator: User, demo_workflow: Workflow) -> Api:
    return Api(make_token(operator))


def post_csv(api: Api, text: str, query: str = "", **headers: str) -> Any:
    return api.client.post(
        f"/api/v1/batches/csv?workflow=acme-pay-invoice{query}",
        text,
        content_type="text/csv",
        headers={"Authorization": f"Bearer {api.token}", **headers},
    )


def rows(workflow: str = "acme-pay-invoice", **body: Any) -> dict[str, Any]:
    return {"workflow": workflow, "rows": GOOD_ROWS, **body}


def test_it_launches_one_run_per_json_row_and_reports_progress(
    launcher: Api, operator: User
) -> None:
    response = launcher.post("/batches/", rows())

    assert response.status_code == 201, response.content
    body = response.json()
    batch = Batch.objects.get()
    assert body["id"] == batch.pk
    assert body["total"] == 2
    assert [r["row"] for r in body["rows"]] == [1, 2]
    assert [r["inputs"]["amount"] for r in body["rows"]] == ["1250.00", "10.00"]
    assert Run.objects.filter(launched_by=operator).count() == 2
    assert all(r["run"] for r in body["rows"])
    event = AuditEvent.objects.get(action="batch.created")
    assert (event.after or {})["rows"] == 2
    assert event.extra["via"]["channel"] == "api"
    again = launcher.get(f"/batches/{batch.pk}").json()
    assert again["rows"] == body["rows"]


def test_an_invalid_row_refuses_the_whole_batch_naming_each_row_and_field(
    launcher: Api,
) -> None:
    refused = problem(post_csv(launcher, MIXED_CSV), 422)

    assert refused["type"].endswith("batch-refused")
    assert refused["detail"] == "2 problems in the file; nothing was launched."
    assert [(e["row"], e["field"]) for e in refused["errors"]] == [(3, "amount"), (4, "invoice")]
    assert not Batch.objects.exists()
    assert not Run.objects.exists()
    json_rows = [*GOOD_ROWS, {"invoice": "INV-1003", "amount": "-5", "color": "red"}]
    refused_json = problem(launcher.post("/batches/", rows(rows=json_rows)), 422)
    assert {(e["row"], e["field"]) for e in refused_json["errors"]} == {(3, "amount"), (3, "")}
    assert not Run.objects.exists()


def test_launch_valid_rows_launches_them_and_reports_the_others(
    launcher: Api,
) -> None:
    response = post_csv(launcher, MIXED_CSV, "&launch_valid_rows=true")

    assert response.status_code == 201, response.content
    body = response.json()
    assert [(p["row"], p["field"]) for p in body["invalid"]] == [(3, "amount"), (4, "invoice")]
    statuses = {r["row"]: r["status"] for r in body["rows"]}
    assert statuses[3] == statuses[4] == "invalid"
    assert Run.objects.count() == 2
    assert BatchRow.objects.filter(status=BatchRow.Status.INVALID).count() == 2
    event = AuditEvent.objects.get(action="batch.created")
    assert ((event.after or {})["rows"], (event.after or {})["invalid_rows"]) == (2, [3, 4])
    outputs = launcher.get(f"/batches/{body['id']}/outputs.csv")
    assert outputs["Content-Type"] == "text/csv; charset=utf-8"
    assert outputs.content.decode().count("\n") == 5


def test_no_valid_row_launches_nothing_even_with_the_flag(launcher: Api) -> None:
    only_bad = "invoice,amount\nnope,1.00\n"

    refused = problem(post_csv(launcher, only_bad, "&launch_valid_rows=true"), 422)

    assert refused["errors"][0]["row"] == 2
    assert not Batch.objects.exists()


def test_a_file_is_taken_as_an_upload_too_and_its_columns_checked(launcher: Api) -> None:
    upload = SimpleUploadedFile("invoices.csv", b"invoice,amount\nINV-1001,10.00\n", "text/csv")
    response = launcher.client.post(
        "/api/v1/batches/csv?workflow=acme-pay-invoice",
        {"file": upload},
        headers={"Authorization": f"Bearer {launcher.token}"},
    )
    assert response.status_code == 201, response.content
    assert response.json()["filename"] == "invoices.csv"

    columns = problem(post_csv(launcher, "invoice,colour\nINV-1001,red\n"), 422)
    assert columns["detail"] == "The columns do not match the workflow's parameters."
    assert {e["field"] for e in columns["errors"]} == {"file"}
    empty = problem(post_csv(launcher, ""), 422)
    assert empty["errors"][0]["field"] == "file"
    unknown = problem(launcher.post("/batches/", rows(workflow="nope")), 422)
    assert unknown["errors"] == [
        {"field": "workflow", "message": "no workflow has the slug 'nope'"}
    ]
    shape = problem(launcher.post("/batches/", rows(rows=[["INV-1001"]])), 422)
    assert shape["errors"][0]["field"].startswith("rows.0")


def test_the_same_idempotency_key_replays_the_batch_and_another_body_is_a_conflict(
    launcher: Api,
) -> None:
    first = launcher.post("/batches/", rows(), **{"Idempotency-Key": "erp-batch-7"})
    again = launcher.post("/batches/", rows(), **{"Idempotency-Key": "erp-batch-7"})
    other = launcher.post(
        "/batches/", rows(launch_valid_rows=True), **{"Idempotency-Key": "erp-batch-7"}
    )

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    conflict = problem(other, 409)
    assert conflict["type"].endswith("idempotency-key-reused")
    assert Batch.objects.count() == 1
    assert Run.objects.count() == 2
    assert AuditEvent.objects.filter(action="batch.created").count() == 1
    csv_first = post_csv(launcher, MIXED_CSV, "&launch_valid_rows=1", **{"Idempotency-Key": "k"})
    csv_again = post_csv(launcher, MIXED_CSV, "&launch_valid_rows=1", **{"Idempotency-Key": "k"})
    assert (csv_first.status_code, csv_again.status_code) == (201, 200)


def test_launching_needs_the_launch_scope_and_a_role_that_launches(
    operator: User, demo_workflow: Workflow
) -> None:
    reader = Api(make_token(operator, ["runs:read", "workflows:read"]))
    launcher = Api(make_token(operator, ["runs:launch"]))
    reviewer = Api(make_token(user_with_role(Role.REVIEWERS, username="rory"), ["runs:read"]))

    missing = problem(reader.post("/batches/", rows()), 403)
    missing_csv = problem(post_csv(reader, "invoice,amount\nINV-1001,1.00\n"), 403)
    batch_id = launcher.post("/batches/", rows()).json()["id"]
    operator.groups.clear()
    beyond = problem(launcher.post("/batches/", rows()), 403)

    assert missing["type"].endswith("missing-scope")
    assert missing_csv["type"].endswith("missing-scope")
    assert beyond["type"].endswith("scope-beyond-role")
    assert Batch.objects.count() == 1
    assert reviewer.get(f"/batches/{batch_id}").status_code == 200
    assert problem(reviewer.get("/batches/999999"), 404)


def test_every_new_endpoint_is_in_the_openapi_document_with_a_summary_and_its_scope(
    client: Any,
) -> None:
    paths = json.loads(client.get("/api/v1/openapi.json").content)["paths"]

    expected = {
        ("/api/v1/credentials/", "get"): "workflows:read",
        ("/api/v1/credentials/", "post"): "credentials:write",
        ("/api/v1/credentials/{name}/value", "post"): "credentials:write",
        ("/api/v1/schedules/", "get"): "workflows:read",
        ("/api/v1/schedules/", "post"): "schedules:write",
        ("/api/v1/schedules/{schedule_id}", "get"): "workflows:read",
        ("/api/v1/schedules/{schedule_id}", "patch"): "schedules:write",
        ("/api/v1/schedules/{schedule_id}", "delete"): "schedules:write",
        ("/api/v1/batches/", "post"): "runs:launch",
        ("/api/v1/batches/csv", "post"): "runs:launch",
        ("/api/v1/batches/{batch_id}", "get"): "runs:read",
        ("/api/v1/batches/{batch_id}/outputs.csv", "get"): "runs:read",
    }
    for (path, method), scope in expected.items():
        operation = paths[path][method]
        assert f"Scope: ``{scope}``" in operation["description"], (path, method)
        assert operation["summary"][0].isupper(), (path, method)
    csv_body = paths["/api/v1/batches/csv"]["post"]["requestBody"]["content"]
    assert set(csv_body) == {"text/csv", "multipart/form-data"}
    headers = {p["name"] for p in paths["/api/v1/batches/"]["post"]["parameters"]}
    assert "Idempotency-Key" in headers
