"""A run never types another team's credential: the demo workflow in a local sandbox (system
Chromium) against the bundled demo portal, its credential moved to another team since."""

from __future__ import annotations

import pytest
import yaml
from django.contrib.auth.models import User

from pandaweb.audit.models import AuditEvent
from pandaweb.demo_portal.server import PortalServer
from sessions import services
from sessions.models import Run
from sessions.services import execution
from tests.factories import team_make
from tests.sessions.conftest import (
    EXAMPLE,
    no_background_runs,
    publish,
    session_templates_go_first,
)
from workflows.models import Credential

__all__ = ["no_background_runs", "session_templates_go_first"]

pytestmark = [
    pytest.mark.usefixtures("run_files_in_tmp", "no_background_runs"),
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


def test_a_run_fails_with_the_reason_instead_of_typing_another_teams_credential(
    operator: User, acme_credential: Credential, portal_server: PortalServer, portal: str
) -> None:
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", portal.removeprefix("http://"))
    )
    workflow = publish(operator, document)
    Credential.objects.filter(pk=acme_credential.pk).update(team=team_make("procurement"))
    invoice = next(i for i in portal_server.state.invoices() if i.status == "open")
    run = services.run_launch(
        workflow_id=workflow.pk,
        user=operator,
        raw_inputs={"invoice": invoice.number, "amount": f"{invoice.amount_due:.2f}"},
    )

    execution.run_execute(run_id=run.pk)

    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert run.failure_reason == (
        "not started: the credential 'acme-portal' belongs to Procurement, not to this "
        "workflow's team"
    )
    assert not AuditEvent.objects.filter(action="credential.used").exists()
    assert run.steps_executed == 0
