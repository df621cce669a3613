"""The ask step for real: the demo workflow that changes the payout account, in a local sandbox
(system Chromium) behind its egress proxy, waits for the SMS code the bundled portal sent; the
launcher answers, a worker of the host continues, the portal takes the code. The code shows
nowhere: not in events, the audit trail, outputs, observations, nor the question's row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User

from approvals import questions
from approvals.models import Question
from pandaweb.audit.models import AuditEvent
from pandaweb.demo_portal.server import PortalServer
from sessions import services
from sessions.models import Run
from sessions.services import execution
from tests.demo_portal.conftest import fetch_json
from tests.sessions.conftest import processes_with, publish
from workflows.models import Credential

pytestmark = [
    pytest.mark.usefixtures("run_files_in_tmp"),
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples" / "acme-change-payout.yaml"


def asking_run(operator: User, portal: str) -> Run:
    document = yaml.safe_load(
        EXAMPLE.read_text().replace("127.0.0.1:8001", portal.removeprefix("http://"))
    )
    workflow = publish(operator, document)
    run = services.run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})
    execution.run_execute(run_id=run.pk)
    run.refresh_from_db()
    return run


def everything_stored_about(run: Run) -> str:
    rows = [
        list(run.events.values_list("payload", flat=True)),
        list(AuditEvent.objects.filter(run_id=run.pk).values_list("before", "after", "extra")),
        list(run.step_results.values_list("sentence", "error", "observation", "title", "url")),
        list(Question.objects.filter(run=run).values()),
        run.outputs,
        run.failure_reason,
    ]
    return json.dumps(rows, default=str)


def test_the_run_waits_for_the_sms_code_and_the_portal_takes_it(
    operator: User,
    acme_credential: Credential,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
    mailoutbox: list[Any],
) -> None:
    operator.email = "olivia@example.test"
    operator.save()
    run = asking_run(operator, portal)

    assert run.status == Run.Status.AWAITING_ANSWER, run.failure_reason
    assert run.sandbox is not None
    key = run.sandbox["run_key"]
    question = run.questions.get()
    assert question.text.startswith("Type the six-digit code the Acme portal just sent by SMS")
    assert question.kind == Question.Kind.CODE
    assert processes_with(f"/{key}/"), "the browser must wait, alive, for the answer"
    [mail] = mailoutbox
    assert mail.to == ["olivia@example.test"]
    sms = fetch_json(f"{portal}/api/last-code")
    code = sms["code"]
    assert len(code) == 6

    questions.question_answer(question_id=question.pk, user=operator, answer=code)
    assert [c["task"] for c in continuations] == ["runs.answer"]
    execution.run_answer_continue(run_id=run.pk, question_id=question.pk)
    execution.run_answer_continue(run_id=run.pk, question_id=question.pk)  # a duplicate: nothing

    run.refresh_from_db()
    question.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.failure_reason
    assert len(fetch_json(f"{portal}/api/lab")["sms_confirmations"]) == 1
    assert question.status == Question.Status.ANSWERED
    assert question.answer_sealed == ""
    steps = {s.step_id: s for s in run.step_results.all()}
    assert steps["ask-sms-code"].sentence == (
        "Ask the person who launched the run: 'Type the six-digit code the Acme portal just sent "
        "by SMS to +49 151 ••• 4711' — answered by olivia"
    )
    assert steps["fill-sms-code"].sentence == "Fill the field labelled 'SMS code' with '••••'"
    assert steps["fill-sms-code"].status == "succeeded"
    assert code not in everything_stored_about(run)
    assert processes_with(f"/{key}/") == []


def test_a_wrong_code_is_typed_and_the_portal_refuses_it(
    operator: User,
    acme_credential: Credential,
    portal_server: PortalServer,
    portal: str,
    continuations: list[dict[str, Any]],
) -> None:
    run = asking_run(operator, portal)
    question = run.questions.get()
    real = fetch_json(f"{portal}/api/last-code")["code"]
    wrong = f"{(int(real) + 1) % 1_000_000:06d}"

    questions.question_answer(question_id=question.pk, user=operator, answer=wrong)
    execution.run_answer_continue(run_id=run.pk, question_id=question.pk)

    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert run.failure_step == "save-account"
    assert run.failure_reason == (
        "the portal refused: The code is wrong or was already used; nothing was changed."
    )
    assert fetch_json(f"{portal}/api/lab")["sms_confirmations"] == []
    assert wrong not in everything_stored_about(run)
