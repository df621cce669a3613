"""What the API does with input it cannot take: always a problem document, never an HTML page or
a crash, and a parameter pattern that means the same thing to the server as to a client."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from sessions.models import Run
from tests.api.conftest import Api, make_token
from tests.api.test_api import GOOD, launch, problem
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "body",
    [
        {"workflow": "acme-pay-invoice", "inputs": {**GOOD, "invoice": "INV-1\x00040"}},
        {"workflow": "acme-pay\x00-invoice", "inputs": GOOD},
        {"workflow": "acme-pay-invoice", "inputs": GOOD, "note\x00": "x"},
    ],
    ids=["input", "workflow", "key"],
)
def test_a_nul_character_in_any_string_is_a_422_naming_where(
    operator: User, demo_workflow: Workflow, body: dict[str, Any]
) -> None:
    api = Api(make_token(operator))
    document = problem(launch(api, body), 422)
    assert "null character" in str(document).lower()
    assert Run.objects.count() == 0


def test_a_nul_character_in_a_query_or_header_is_a_422(operator: User) -> None:
    api = Api(make_token(operator))
    problem(api.get("/runs/", {"q": "INV\x00"}), 422)


def test_a_nul_in_a_decision_comment_is_a_422(operator: User) -> None:
    api = Api(make_token(operator))
    problem(api.post("/approvals/1/decision", {"decision": "approve", "note": "ok\x00"}), 422)


@pytest.mark.parametrize("path", ["/runs/abc", "/runs/abc/cancel", "/runs/99999999999999999999"])
def test_a_bad_id_in_a_path_is_a_json_problem(operator: User, path: str) -> None:
    api = Api(make_token(operator))
    response = api.get(path)
    assert response["Content-Type"] == "application/problem+json", response.content
    assert response.status_code in (404, 422)


def test_an_unexpected_error_is_a_500_problem_without_a_traceback(
    operator: User, demo_workflow: Workflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions import selectors

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the secret database password is hunter2")

    monkeypatch.setattr(selectors, "run_keyset", broken)
    api = Api(make_token(operator))
    api.client.raise_request_exception = False
    response = api.get("/runs/")
    document = problem(response, 500)
    assert "hunter2" not in response.content.decode()
    assert "Traceback" not in response.content.decode()
    assert document["type"]


@pytest.mark.parametrize(
    ("field", "value"), [("invoice", "INV-１０４０"), ("amount", "１２５０.00")]
)
def test_a_digit_is_an_ascii_digit(
    operator: User, demo_workflow: Workflow, field: str, value: str
) -> None:
    """A published pattern's digit class means 0-9 to a client reading the JSON Schema: the
    server must not accept other scripts' digits under it, nor in a number."""
    api = Api(make_token(operator))
    document = problem(
        launch(api, {"workflow": "acme-pay-invoice", "inputs": {**GOOD, field: value}}), 422
    )
    assert [error["field"] for error in document["errors"]] == [f"inputs.{field}"]
    assert Run.objects.count() == 0
