"""A session template that went stale, re-baked through the API, for real: bakes and runs in
local sandboxes (system Chromium) against the bundled demo portal on loopback."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from sessions.engine.vocabulary import STALE_SESSION
from sessions.models import Run, SessionTemplate
from sessions.services import baking, execution
from tests.api.conftest import Api, make_token
from tests.demo_portal.conftest import fetch_json
from tests.sessions.conftest import publish, session_document
from workflows.models import Credential

pytestmark = [
    pytest.mark.usefixtures("run_files_in_tmp"),
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


def launch_and_execute(api: Api, slug: str) -> Run:
    launched = api.post("/runs/", {"workflow": slug, "inputs": {}})
    assert launched.status_code == 201, launched.content
    execution.run_execute(run_id=launched.json()["id"])
    return Run.objects.get(pk=launched.json()["id"])


def test_a_stale_template_rebaked_through_the_api_lets_runs_start_logged_in_again(
    operator: User, acme_credential: Credential, portal: str
) -> None:
    workflow = publish(operator, session_document(portal))
    api = Api(make_token(operator))
    template_path = f"/workflows/{workflow.slug}/session-template"
    first = launch_and_execute(api, workflow.slug)  # bakes the template inline
    assert first.status == Run.Status.SUCCEEDED, first.failure_reason
    assert fetch_json(f"{portal}/api/sessions/expire", method="POST") == {"closed": 1}
    logged_out = launch_and_execute(api, workflow.slug)
    assert logged_out.failure_reason == STALE_SESSION
    assert api.get(template_path).json()["status"] == "stale"

    requested = api.post(f"{template_path}/bake")

    assert requested.status_code == 202, requested.content
    assert requested.json()["status"] == "baking"
    # What the worker does with the bake the request queued.
    baking.template_bake(template_id=requested.json()["template"])
    ready = api.get(template_path).json()
    assert (ready["status"], ready["template"]) == ("ready", requested.json()["template"])
    run = launch_and_execute(api, workflow.slug)
    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert run.session_template_id == requested.json()["template"]
    replaced = SessionTemplate.objects.get(pk=first.session_template_id or 0)
    assert replaced.status == SessionTemplate.Status.RETIRED
