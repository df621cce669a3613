"""The records every dashboard page needs to have something to show: runs in each state, an
approval and a question waiting, a schedule, a batch, a webhook with a delivery, tokens, a service
account, a scratch session and a workflow with a second version. Run inside the stack
(``manage.py shell``) by ``test_every_page``; prints the ids the pages are addressed by, as JSON
on its last line. No browser and no worker take part: the rows are written as they would be
left, so the pages render the states without waiting minutes for real runs to reach them."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from approvals.models import ApprovalRequest, Question
from pandaweb.api import services as api_services
from pandaweb.core.roles import DEMO_USERS, Role
from pandaweb.schedules.models import Batch, BatchRow, Schedule
from pandaweb.schedules.services import ScheduleSpec, schedule_create
from pandaweb.webhooks.models import Event, Message, Subscription
from pandaweb.webhooks.services import subscription_create
from sessions.models import Run, ScratchSession, StepResult
from workflows import services as workflow_services
from workflows.models import Credential, Workflow

# A workflow of its own, so the tests that share the stack still find the demo workflows as
# they left them (version 1, their own concurrency slots) and their own approvals.
SLUG = "every-page-pay-invoice"
# Long unbroken values, as portals hand them out: a page must wrap or scroll them in place.
LONG_REFERENCE = "PAY-2026-0042-" + "7F3A9C" * 12
LONG_REASON = (
    "expected text 'Payment scheduled' did not appear within 10 s; the portal showed "
    "https://127.0.0.1:8001/invoices/INV-2026-0042/pay?step=confirm&session=" + "a1b2c3" * 10
)


def _run(status: str, launcher: User, workflow: Workflow, **fields: Any) -> Run:
    version = workflow.versions.filter(status="published").order_by("-number")[0]
    now = timezone.now()
    return Run.objects.create(
        workflow=workflow,
        version=version,
        launched_by=launcher,
        status=status,
        inputs={"invoice": "INV-2042", "amount": "1250.00", "iban": "DE89370400440532013000"},
        started_at=now - timedelta(minutes=3),
        **fields,
    )


def _steps(run: Run, *, failed_at: int | None = None, count: int = 3) -> None:
    started = run.started_at or timezone.now()
    for index, step in enumerate((run.version.steps or [])[:count]):
        failed = index == failed_at
        StepResult.objects.create(
            run=run,
            index=index,
            step_id=step["id"],
            step_type=step["type"],
            sentence=f"Step {index + 1} ({step['id']}) on the portal's page {LONG_REFERENCE}",
            status=StepResult.Status.FAILED if failed else StepResult.Status.SUCCEEDED,
            started_at=started + timedelta(seconds=index),
            duration_ms=420,
            url="http://127.0.0.1:8001/invoices/INV-2026-0042?from=" + "x" * 80,
            title="Acme portal",
            error=LONG_REASON if failed else "",
            # The page the failed step saw, so its healing page has candidates to offer.
            observation=(
                {
                    "elements": [
                        {"number": 1, "role": "button", "name": "Accept all", "interactive": True},
                        {"number": 2, "role": "link", "name": LONG_REFERENCE, "interactive": True},
                    ],
                    "text": f'[1] button "Accept all"\n[2] link "{LONG_REFERENCE}"',
                }
                if failed
                else None
            ),
        )


def seed() -> None:
    operator = User.objects.get(username=DEMO_USERS[Role.OPERATORS])
    admin = User.objects.get(username=DEMO_USERS[Role.ADMINS])
    workflow = Workflow.objects.filter(slug=SLUG).first()
    if workflow is None:
        demo = Workflow.objects.get(slug="acme-pay-invoice").versions.get(number=1).document
        document = {**(demo or {}), "slug": SLUG, "name": "Pay an Acme invoice (every page)"}
        workflow = workflow_services.workflow_import(user=operator, text=json.dumps(document))
        workflow_services.workflow_publish(
            workflow_id=workflow.pk, user=operator, message="v1", accept_warnings=True
        )
        # A second version, so the versions list and the diff have two to compare.
        document["description"] = "Pays one open invoice; a second version, a new description."
        workflow_services.workflow_import(user=operator, text=json.dumps(document))
        workflow_services.workflow_publish(
            workflow_id=workflow.pk, user=operator, message="v2", accept_warnings=True
        )

    now = timezone.now()
    # No worker beats for it: a heartbeat an hour ahead keeps the reaper (60 s without one)
    # from ending it before its page is checked.
    running = _run(
        Run.Status.RUNNING, operator, workflow, heartbeat_at=now + timedelta(hours=1), worker="seed"
    )
    _steps(running, count=2)
    waiting = _run(Run.Status.AWAITING_APPROVAL, operator, workflow)
    _steps(waiting)
    approval = ApprovalRequest.objects.create(
        run=waiting,
        step_index=3,
        step_id="pay",
        action="Click the button 'Submit supplier payment' on http://127.0.0.1:8001/pay/INV-2042",
        expires_at=now + timedelta(hours=1),
        # What the gate records (sessions.engine.gatekeeping.gate_evidence), pictures aside.
        evidence={
            "step_index": 3,
            "step_id": "pay",
            "url": "http://127.0.0.1:8001/invoices/INV-2042/pay?confirm=" + "9f" * 40,
            "target": None,
            "filled": [
                {"field": "Amount", "value": "1250.00"},
                {"field": "IBAN", "value": "DE89370400440532013000"},
            ],
            "page_text": f"Pay invoice INV-2042 Amount due 1,250.00 EUR Reference {LONG_REFERENCE}",
            "action": "Click the button 'Submit supplier payment'",
            "expect": "the text 'Payment scheduled' appears",
            "dialog": "",
            "title": "Pay invoice INV-2042 — Acme Supplier Portal",
            "inputs": waiting.inputs,
            "outputs": {"reference": LONG_REFERENCE},
        },
    )
    answering = _run(Run.Status.AWAITING_ANSWER, operator, workflow)
    _steps(answering)
    question = Question.objects.create(
        run=answering,
        expires_at=now + timedelta(hours=1),
        step_index=3,
        step_id="sms-code",
        text="The portal sent a code by SMS to the phone ending 42. What is it?",
        kind=Question.Kind.CODE,
        save_as="code",
        answered_by="launcher",
        timeout_minutes=60,
    )
    failed = _run(
        Run.Status.FAILED,
        operator,
        workflow,
        finished_at=now,
        failure_step="accept-cookies",
        failure_reason=LONG_REASON,
        steps_executed=4,
    )
    _steps(failed, failed_at=3, count=4)
    # A second failure of the same step, so the failures page has two runs to compare.
    failed_again = _run(
        Run.Status.FAILED, operator, workflow, finished_at=now, failure_step="accept-cookies",
        failure_reason="the button 'Accept' was not on the page", steps_executed=4,
    )  # fmt: skip
    _steps(failed_again, failed_at=3, count=4)
    finished = _run(
        Run.Status.SUCCEEDED,
        operator,
        workflow,
        finished_at=now,
        outputs={"confirmation": LONG_REFERENCE, "amount_paid": "1250.00"},
        steps_executed=3,
    )
    _steps(finished)

    # An approved payment that was started and never confirmed: a person checks the portal.
    unsure = _run(
        Run.Status.NEEDS_RECONCILIATION,
        operator,
        workflow,
        finished_at=now,
        failure_reason="the worker stopped after starting the approved step 'pay'",
    )
    _steps(unsure, count=4)
    ApprovalRequest.objects.create(
        run=unsure,
        status=ApprovalRequest.Status.APPROVED,
        step_index=4,
        step_id="pay",
        action="Click the button 'Submit supplier payment' on http://127.0.0.1:8001/pay/INV-2042",
        expires_at=now,
        decided_at=now,
        intent_at=now,
    )
    cancelled = _run(
        Run.Status.CANCELLED,
        operator,
        workflow,
        finished_at=now,
        failure_reason="cancelled by olivia",
    )
    _steps(cancelled, count=2)

    schedule = schedule_create(
        workflow_id=workflow.pk,
        user=operator,
        spec=ScheduleSpec(
            name="Monthly supplier payment",
            cron="0 6 1 * *",
            timezone="Europe/Berlin",
            inputs={"invoice": "INV-2042", "amount": "1250.00", "iban": "DE89370400440532013000"},
            overlap="skip",
            missed="run_once",
        ),
    )
    batch = Batch.objects.create(
        workflow=workflow,
        version_number=1,
        filename="invoices-" + "march-" * 8 + ".csv",
        columns=["invoice", "amount", "iban"],
        created_by=operator,
    )
    BatchRow.objects.create(
        batch=batch,
        line=2,
        inputs=finished.inputs,
        status="launched",
        run=finished,
        launched_at=now,
    )
    BatchRow.objects.create(batch=batch, line=3, inputs=failed.inputs, status="refused",
                            error=LONG_REASON)  # fmt: skip

    subscription, _ = subscription_create(
        user=admin,
        name="ERP run outcomes",
        # Nothing listens there (and nothing leaves the machine): only this workflow's events.
        url="http://127.0.0.1:9/hooks/pandaweb/" + "runs/" * 10,
        events=[Event.RUN_FINISHED, Event.RUN_FAILED],
        workflow_id=workflow.pk,
    )
    message = Message.objects.create(
        subscription=subscription,
        msg_id="msg_" + "2a" * 16,
        event=Event.RUN_FINISHED,
        payload={"type": "run.finished", "data": {"run": finished.pk, "ref": LONG_REFERENCE}},
        status=Message.Status.FAILED,
        attempts=3,
        next_attempt_at=now,
        last_status_code=502,
        last_error="502 Bad Gateway from " + subscription.url,
    )

    api_services.token_create(
        actor=operator,
        owner=operator,
        name="nightly ERP export with a long descriptive name",
        scopes=["runs:read"],
        expires_at=None,
    )
    account = api_services.service_account_create(
        actor=admin, username="erp-integration", roles=[Role.OPERATORS.value],
        description="The ERP launches payment runs",
    )  # fmt: skip
    api_services.token_create(
        actor=admin, owner=account.user, name="erp", scopes=["runs:read"], expires_at=None
    )

    scratch = ScratchSession.objects.create(
        workflow=workflow,
        started_by=operator,
        status=ScratchSession.Status.CLOSED,
        expires_at=now + timedelta(minutes=30),
        ended_at=now,
        reason="closed by its author",
    )
    print(
        json.dumps(  # the ids, for the pages' addresses
            {
                "slug": SLUG,
                "running": running.pk,
                "waiting": waiting.pk,
                "answering": answering.pk,
                "failed": failed.pk,
                "failed_again": failed_again.pk,
                "finished": finished.pk,
                "unsure": unsure.pk,
                "cancelled": cancelled.pk,
                "approval": approval.pk,
                "question": question.pk,
                "schedule": schedule.pk,
                "batch": batch.pk,
                "subscription": subscription.pk,
                "message": message.pk,
                "scratch": scratch.pk,
                "credential": Credential.objects.order_by("pk").first().pk,  # type: ignore[union-attr]
            }
        )
    )


def settle(ids: dict[str, Any]) -> None:
    """End what the seed left waiting, so tests that run later on the stack count only their
    own pending approvals, questions and active runs, and no schedule of it fires."""
    waiting = [ids[name] for name in ("running", "waiting", "answering")]
    Run.objects.filter(pk__in=waiting).update(
        status=Run.Status.CANCELLED, finished_at=timezone.now()
    )
    ApprovalRequest.objects.filter(pk=ids["approval"]).update(status=ApprovalRequest.Status.VOIDED)
    Question.objects.filter(pk=ids["question"]).update(status=Question.Status.VOIDED)
    Schedule.objects.filter(pk=ids["schedule"]).update(paused=True)
    Subscription.objects.filter(pk=ids["subscription"]).update(active=False)
