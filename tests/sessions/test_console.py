from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalRequest
from pandaweb.audit.models import AuditEvent
from pandaweb.core.models import Membership
from pandaweb.core.roles import Role
from sessions import console, console_services, services
from sessions.models import Run, RunEvent, RunSeen, SavedRunView
from tests.factories import member_of, team_make, user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_rerun_dispatch(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(services.runstate, "dispatch", lambda task, **kwargs: sent.append(kwargs))
    return sent


def launch(user: User, workflow: Workflow, invoice: str = "INV-1001") -> Run:
    return services.run_launch(
        workflow_id=workflow.pk, user=user, raw_inputs={"invoice": invoice, "amount": "12.00"}
    )


def finished(run: Run, status: str, *, step: str = "", reason: str = "", **fields: Any) -> Run:
    """Put a run in a final state directly (these tests are about reading, not executing)."""
    Run.objects.filter(pk=run.pk).update(
        status=status,
        failure_step=step,
        failure_reason=reason,
        finished_at=fields.pop("finished_at", timezone.now()),
        **fields,
    )
    run.refresh_from_db()
    return run


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# Search --------------------------------------------------------------------------------------


def test_it_finds_a_run_by_an_input_and_by_an_output(
    operator: User, demo_workflow: Workflow
) -> None:
    wanted = launch(operator, demo_workflow, "INV-4242")
    launch(operator, demo_workflow, "INV-1111")
    other = launch(operator, demo_workflow, "INV-2222")
    other.outputs = {"receipt": "PAY-77-XY"}
    other.save(update_fields=["outputs"])

    by_input = console.run_page(console.RunFilter.from_params({"q": "inv-4242"}), user=operator)
    by_output = console.run_page(console.RunFilter.from_params({"q": "pay-77"}), user=operator)

    assert [r.pk for r in by_input.runs] == [wanted.pk]
    assert [r.pk for r in by_output.runs] == [other.pk]
    other.refresh_from_db()
    assert "pay-77-xy" in other.search_text


def test_the_list_page_searches_filters_and_keeps_them_in_the_address(
    operator: User, demo_workflow: Workflow
) -> None:
    failed = finished(launch(operator, demo_workflow, "INV-5000"), "failed", step="pay")
    finished(launch(operator, demo_workflow, "INV-5001"), "succeeded")

    body = client_for(operator).get("/runs/", {"status": "failed", "q": "INV-50"}).content.decode()

    assert f'id="run-{failed.pk}"' in body
    assert body.count('<tr id="run-') == 1
    assert "status=failed" in body  # the export and pager links carry the filters


def test_every_filter_narrows_the_list(operator: User, demo_workflow: Workflow) -> None:
    colleague = user_with_role(Role.OPERATORS, username="carl")
    mine = finished(launch(operator, demo_workflow), "failed", step="submit-payment")
    theirs = finished(launch(colleague, demo_workflow), "succeeded")
    Run.objects.filter(pk=theirs.pk).update(created_at=timezone.now() - timedelta(days=10))

    def ids(**params: str) -> list[int]:
        return [
            r.pk
            for r in console.run_page(console.RunFilter.from_params(params), user=operator).runs
        ]

    assert ids(by="carl") == [theirs.pk]
    assert ids(step="submit-payment") == [mine.pk]
    assert ids(workflow=demo_workflow.slug, version="1") == [mine.pk, theirs.pk]
    assert ids(version="2") == []
    assert ids(since=str(timezone.localdate())) == [mine.pk]
    until = str(timezone.localdate() - timedelta(days=5))
    assert ids(until=until) == [theirs.pk]
    assert ids(backend=mine.sandbox_backend) == [mine.pk, theirs.pk]
    assert ids(backend="microvm") == []


def test_it_refuses_bad_filter_values_with_a_message_not_an_error(operator: User) -> None:
    response = client_for(operator).get(
        "/runs/", {"since": "yesterday", "status": "bogus", "sort": "password", "after": "!!"}
    )

    assert response.status_code == 200
    assert "Use a date like" in response.content.decode()


# Keyset pages ---------------------------------------------------------------------------------


def test_pages_reach_every_run_once_and_do_not_shift_when_runs_are_launched(
    operator: User, demo_workflow: Workflow
) -> None:
    runs = [launch(operator, demo_workflow, f"INV-{1000 + i}") for i in range(7)]
    flt = console.RunFilter.from_params({})

    first = console.run_page(flt, user=operator, size=3)
    launch(operator, demo_workflow, "INV-9999")  # arrives while someone pages
    second = console.run_page(flt, user=operator, cursor=first.next_cursor, size=3)
    third = console.run_page(flt, user=operator, cursor=second.next_cursor, size=3)

    seen = [r.pk for page in (first, second, third) for r in page.runs]
    assert seen == [r.pk for r in reversed(runs)]
    assert third.next_cursor == ""


@pytest.mark.parametrize("sort", ["status", "-status", "steps", "-steps", "workflow", "created"])
def test_sorted_pages_neither_skip_nor_repeat(
    sort: str, operator: User, demo_workflow: Workflow
) -> None:
    for i in range(9):
        run = launch(operator, demo_workflow, f"INV-{2000 + i}")
        finished(run, ["failed", "succeeded", "cancelled"][i % 3], steps_executed=i % 4)
    flt = console.RunFilter.from_params({"sort": sort})

    seen: list[int] = []
    cursor = ""
    while True:
        page = console.run_page(flt, user=operator, cursor=cursor, size=2)
        seen += [r.pk for r in page.runs]
        cursor = page.next_cursor
        if not cursor:
            break

    assert sorted(seen) == sorted(Run.objects.values_list("pk", flat=True))
    assert len(seen) == len(set(seen)) == 9


def test_the_list_and_home_use_the_same_number_of_queries_with_more_data(
    operator: User, demo_workflow: Workflow
) -> None:
    client = client_for(operator)

    def queries(path: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(path).status_code == 200
        return len(captured)

    finished(launch(operator, demo_workflow), "failed", step="s0", reason="r0")
    small = {path: queries(path) for path in ("/runs/", "/", "/runs/failures/")}
    for i in range(30):
        run = launch(operator, demo_workflow, f"INV-{3000 + i}")
        finished(run, "failed" if i % 2 else "succeeded", step=f"s{i % 3}", reason=f"r{i % 2}")
    large = {path: queries(path) for path in ("/runs/", "/", "/runs/failures/")}

    assert large == small


# CSV export ----------------------------------------------------------------------------------


def test_the_export_is_the_current_view_with_formulas_defused(
    operator: User, demo_workflow: Workflow
) -> None:
    run = launch(operator, demo_workflow, "INV-7000")
    finished(run, "failed", step="pay", reason='=HYPERLINK("http://evil","x")')
    finished(launch(operator, demo_workflow, "INV-7001"), "succeeded")

    response = client_for(operator).get("/runs/export.csv", {"status": "failed"})
    content = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    rows = list(csv.reader(io.StringIO(content.decode())))

    assert response["Content-Disposition"].startswith("attachment;")
    assert rows[0][0] == "run"
    assert [row[0] for row in rows[1:]] == [str(run.pk)]
    assert rows[1][rows[0].index("failure_reason")] == '\'=HYPERLINK("http://evil","x")'


@pytest.mark.parametrize("cell", ["=1+1", "+1", "-1", "@SUM(A1)", "\tx"])
def test_it_neutralises_every_formula_start(cell: str) -> None:
    assert console.csv_cell(cell) == "'" + cell


# Saved views ---------------------------------------------------------------------------------


def test_saved_views_belong_to_their_person(operator: User) -> None:
    colleague = user_with_role(Role.OPERATORS, username="carl")
    client_for(operator).post(
        "/runs/views/", {"name": "Failed pay", "status": "failed", "step": "pay", "q": "INV"}
    )
    view = SavedRunView.objects.get(user=operator)

    assert view.query == "q=INV&status=failed&step=pay"
    assert "Failed pay" not in client_for(colleague).get("/runs/").content.decode()
    assert client_for(colleague).post(f"/runs/views/{view.pk}/delete/").status_code == 404
    assert SavedRunView.objects.filter(pk=view.pk).exists()

    client_for(operator).post(f"/runs/views/{view.pk}/delete/")
    assert not SavedRunView.objects.exists()


def test_someone_in_several_teams_narrows_the_list_and_a_saved_view_to_one(
    operator: User, demo_workflow: Workflow
) -> None:
    payables, procurement = team_make("payables"), team_make("procurement")
    ours = launch(operator, demo_workflow, invoice="INV-7001")
    theirs = launch(operator, demo_workflow, invoice="INV-7002")
    Run.objects.filter(pk=ours.pk).update(team=payables)
    Run.objects.filter(pk=theirs.pk).update(team=procurement)
    person = member_of(payables, Role.REVIEWERS)
    Membership.objects.create(team=procurement, user=person, role=Role.REVIEWERS.value)
    client = client_for(person)

    both = client.get("/runs/").content.decode()
    one = client.get("/runs/?team=payables").content.decode()
    client.post("/runs/views/", {"name": "Payables", "team": "payables"})

    assert 'name="team"' in both
    assert f'href="/runs/{ours.pk}/"' in both
    assert f'href="/runs/{theirs.pk}/"' in both
    assert f'href="/runs/{ours.pk}/"' in one
    assert f'href="/runs/{theirs.pk}/"' not in one
    assert SavedRunView.objects.get(user=person).query == "team=payables"


# Re-run ---------------------------------------------------------------------------------------


def test_run_again_launches_a_linked_run_with_edited_inputs(
    operator: User, demo_workflow: Workflow, no_rerun_dispatch: list[dict[str, Any]]
) -> None:
    original = finished(launch(operator, demo_workflow, "INV-8000"), "failed", step="log-in")
    client = client_for(operator)

    form = client.get(f"/runs/{original.pk}/again/").content.decode()
    assert 'value="INV-8000"' in form
    response = client.post(
        f"/runs/{original.pk}/again/",
        {"param_invoice": "INV-8001", "param_amount": "12.00", "param_iban": "DE97",
         "idempotency_key": "again-1"},
    )  # fmt: skip

    rerun = Run.objects.get(rerun_of=original)
    assert response["Location"] == f"/runs/{rerun.pk}/"
    assert rerun.inputs["invoice"] == "INV-8001"
    assert rerun.version_id == original.version_id
    assert rerun.status == Run.Status.QUEUED
    assert rerun.start_index == 0
    assert no_rerun_dispatch[-1] == {"run_id": rerun.pk}
    assert [sent["run_id"] for sent in no_rerun_dispatch].count(rerun.pk) == 1
    audit = AuditEvent.objects.get(action="run.launched", object_id=str(rerun.pk))
    assert audit.after is not None
    assert audit.after["rerun_of"] == original.pk
    assert f"/runs/{rerun.pk}/" in client.get(f"/runs/{original.pk}/").content.decode()


def test_it_refuses_run_again_to_people_who_cannot_launch(
    operator: User, demo_workflow: Workflow
) -> None:
    reviewer = user_with_role(Role.REVIEWERS, username="rita")
    original = finished(launch(operator, demo_workflow), "failed")

    response = client_for(reviewer).post(f"/runs/{original.pk}/again/", {"idempotency_key": "x"})

    assert response.status_code == 403
    assert not Run.objects.filter(rerun_of=original).exists()


def test_continue_from_a_step_starts_there_with_the_outputs_so_far(
    operator: User, demo_workflow: Workflow
) -> None:
    original = finished(launch(operator, demo_workflow), "failed", step="open-pay-form")
    Run.objects.filter(pk=original.pk).update(outputs={"amount_seen": "12.00"})

    rerun, _ = console_services.run_rerun(
        run_id=original.pk,
        user=operator,
        raw_inputs=original.inputs,
        start_index=8,
    )

    assert rerun.start_index == 8
    assert rerun.outputs == {"amount_seen": "12.00"}
    assert rerun.rerun_of_id == original.pk


def test_it_refuses_to_continue_past_an_approved_irreversible_step(
    operator: User, demo_workflow: Workflow
) -> None:
    original = finished(launch(operator, demo_workflow), "failed", step="receipt")
    ApprovalRequest.objects.create(
        run=original,
        step_index=13,
        step_id="submit-payment",
        status=ApprovalRequest.Status.APPROVED,
        expires_at=timezone.now() + timedelta(hours=1),
    )

    checks = {c.index: c for c in console_services.run_continue_checks(original)}
    with pytest.raises(services.RunError, match="irreversible"):
        console_services.run_rerun(
            run_id=original.pk, user=operator, raw_inputs=original.inputs, start_index=14
        )

    assert checks[13].allowed  # before the payment: nothing irreversible skipped
    assert not checks[14].allowed
    assert "reconcile" in checks[14].reason
    assert not Run.objects.filter(rerun_of=original).exists()
    page = client_for(operator).get(f"/runs/{original.pk}/").content.decode()
    # Each step named, the one that failed marked, none past the approved payment offered.
    assert (
        f'<a href="/runs/{original.pk}/again/?start=13">Continue from step 14</a>: '
        "Click the button &#x27;Submit payment&#x27; — irreversible"
    ) in page
    assert "Step 15, Wait until " in page
    assert "not possible" in page
    assert '<li class="continue-failed">' in page
    assert page.count("this step failed") == 1
    assert "/again/?start=14" not in page


def test_a_reconciled_run_may_continue_past_its_irreversible_step(
    operator: User, demo_workflow: Workflow
) -> None:
    original = finished(launch(operator, demo_workflow), "failed", step="receipt")
    ApprovalRequest.objects.create(
        run=original, step_index=13, step_id="submit-payment",
        status=ApprovalRequest.Status.APPROVED, expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    RunEvent.objects.create(
        run=original,
        seq=99,
        type="status",
        payload={"from": "needs_reconciliation", "to": "failed"},
    )

    rerun, _ = console_services.run_rerun(
        run_id=original.pk, user=operator, raw_inputs=original.inputs, start_index=14
    )

    assert rerun.start_index == 14


# Home and triage ------------------------------------------------------------------------------


def test_home_shows_what_needs_me(operator: User, demo_workflow: Workflow) -> None:
    reviewer = user_with_role(Role.REVIEWERS, username="rita")
    waiting = launch(operator, demo_workflow)
    Run.objects.filter(pk=waiting.pk).update(status=Run.Status.AWAITING_APPROVAL)
    approval = ApprovalRequest.objects.create(
        run=waiting, step_index=13, step_id="submit-payment", action="Pay 12.00 EUR",
        expires_at=timezone.now() + timedelta(minutes=30),
    )  # fmt: skip
    finished(launch(operator, demo_workflow), "failed", step="log-in", reason="bad password")

    mine = client_for(operator).get("/").content.decode()
    theirs = client_for(reviewer).get("/").content.decode()

    # The launcher cannot approve their own run: it is not "waiting for" them.
    assert f"/approvals/{approval.pk}/" not in mine
    assert "Failed in the last day" in mine
    assert "bad password" in mine
    assert f"/approvals/{approval.pk}/" in theirs
    assert "data-expires-in" in theirs


def stopped_at_gate(run: Run, status: str, **approval: Any) -> ApprovalRequest:
    return ApprovalRequest.objects.create(
        run=run, step_index=13, step_id="submit-payment", action="Pay 12.00 EUR",
        expires_at=timezone.now() - timedelta(days=3), status=status, **approval,
    )  # fmt: skip


def test_runs_stopped_at_their_approval_or_by_the_portal_stay_on_home_until_seen(
    operator: User, demo_workflow: Workflow
) -> None:
    colleague = user_with_role(Role.OPERATORS, username="colin")
    long_ago = timezone.now() - timedelta(days=3)
    expired = finished(launch(operator, demo_workflow), "cancelled", finished_at=long_ago)
    stopped_at_gate(expired, "expired", reason="approval expired")
    rejected = finished(launch(operator, demo_workflow), "cancelled", finished_at=long_ago)
    stopped_at_gate(rejected, "rejected", reason="rejected by rita: wrong payee")
    refused = finished(
        launch(operator, demo_workflow), "failed", reason="the portal refused: already paid"
    )
    stopped_at_gate(
        refused, "approved", refused_at=timezone.now(), action_result="This invoice is already paid"
    )
    paid = finished(launch(operator, demo_workflow), "succeeded")
    stopped_at_gate(paid, "approved", completed_at=timezone.now())
    home = client_for(operator)

    page = home.get("/").content.decode()
    assert "Stopped before acting" in page
    for run in (expired, rejected, refused):
        assert f'id="stopped-{run.pk}"' in page
    assert f'id="stopped-{paid.pk}"' not in page
    assert "Nobody decided its approval before it expired." in page
    assert "Approval rejected by rita: wrong payee" in page
    assert "The portal refused: This invoice is already paid" in page
    assert "Failed in the last day" not in page  # the refused run is listed once, as stopped
    assert "Stopped before acting" not in client_for(colleague).get("/").content.decode()

    assert home.get(f"/runs/{expired.pk}/").status_code == 200
    assert client_for(colleague).post(f"/runs/{refused.pk}/dismiss/").status_code == 302
    response = home.post(f"/runs/{rejected.pk}/dismiss/", follow=True)

    page = response.content.decode()
    assert response.redirect_chain == [("/", 302)]
    assert f"Run #{rejected.pk} is off your home page" in page
    assert f'id="stopped-{expired.pk}"' not in page
    assert f'id="stopped-{rejected.pk}"' not in page
    assert f'id="stopped-{refused.pk}"' in page  # the colleague's mark is their own
    assert sorted(RunSeen.objects.values_list("run_id", "user__username")) == sorted(
        [(expired.pk, "olivia"), (rejected.pk, "olivia"), (refused.pk, "colin")]
    )
    assert not AuditEvent.objects.filter(action__contains="seen").exists()


def test_triage_groups_failures_by_workflow_step_and_reason(
    operator: User, demo_workflow: Workflow
) -> None:
    for _ in range(3):
        finished(launch(operator, demo_workflow), "failed", step="log-in", reason="bad password")
    finished(launch(operator, demo_workflow), "failed", step="log-in", reason="portal down")
    finished(launch(operator, demo_workflow), "succeeded")

    groups = console.failure_groups(user=operator, days=7)

    assert [(g.step, g.reason, g.count) for g in groups] == [
        ("log-in", "bad password", 3),
        ("log-in", "portal down", 1),
    ]
    assert groups[0].per_day[-1] == 3
    first, last = groups[0].first_run_id, groups[0].last_run_id
    for run_id, text in [(first, "Log in\nError 503"), (last, "Log in\nError 500")]:
        from sessions.models import StepResult

        StepResult.objects.create(
            run_id=run_id, index=1, step_id="log-in", step_type="login", sentence="Log in",
            status="failed", started_at=timezone.now(), duration_ms=5, observation={"text": text},
        )  # fmt: skip
    page = client_for(operator).get("/runs/failures/compare/", {"a": first, "b": last})
    body = page.content.decode()
    assert '<span class="diff-del">-Error 503</span>' in body
    assert '<span class="diff-add">+Error 500</span>' in body


# Evidence viewer ------------------------------------------------------------------------------


def step(run: Run, index: int, step_id: str, step_type: str) -> None:
    from sessions.models import StepResult

    StepResult.objects.create(
        run=run, index=index, step_id=step_id, step_type=step_type, sentence=f"Step {step_id}",
        status="succeeded", started_at=timezone.now(), duration_ms=10,
    )  # fmt: skip


def test_the_step_page_shows_neighbours_values_read_and_who_approved(
    operator: User, demo_workflow: Workflow
) -> None:
    from approvals.models import ApprovalDecision

    reviewer = user_with_role(Role.REVIEWERS, username="rita")
    run = finished(launch(operator, demo_workflow), "succeeded", outputs={"total": "12.00 EUR"})
    for index, step_id, kind in [(4, "open-invoice", "goto"), (5, "read-invoice", "extract"),
                                 (13, "submit-payment", "click")]:  # fmt: skip
        step(run, index, step_id, kind)
    approval = ApprovalRequest.objects.create(
        run=run, step_index=13, step_id="submit-payment", status="approved",
        expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    ApprovalDecision.objects.create(
        request=approval, reviewer=reviewer, verdict="approve", reason="amount checked"
    )
    client = client_for(operator)

    extract = client.get(f"/runs/{run.pk}/steps/5/").content.decode()
    payment = client.get(f"/runs/{run.pk}/steps/13/").content.decode()

    assert f'data-prev="/runs/{run.pk}/steps/4/"' in extract
    assert f'data-next="/runs/{run.pk}/steps/13/"' in extract
    assert "<dt>total</dt><dd>12.00 EUR</dd>" in extract
    assert "Approved by <strong>rita</strong>" in payment
    assert "amount checked" in payment
    assert "data-next" not in payment


def test_htmx_swaps_push_the_tidy_address_and_the_workflow_page_stays_put(
    operator: User, demo_workflow: Workflow
) -> None:
    client = client_for(operator)
    swap = {"HX-Request": "true", "HX-Target": "run-results"}

    results = client.get("/runs/", {"q": "INV", "status": "", "by": ""}, headers=swap)
    embedded = client.get(f"/runs/workflow/{demo_workflow.slug}/", headers={"HX-Request": "true"})

    assert results["HX-Push-Url"] == "/runs/?q=INV"
    assert "<html" not in results.content.decode()
    assert "HX-Push-Url" not in embedded
    assert 'id="workflow-runs"' in embedded.content.decode()


def test_the_system_page_counts_live_sandboxes_by_the_host_they_run_on(
    operator: User, demo_workflow: Workflow
) -> None:
    for host in ("worker-a", "worker-a", "worker-b"):
        run = launch(operator, demo_workflow)
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.RUNNING, sandbox={"backend": "local", "host": host}
        )

    assert console.capacity().sandboxes_by_host == [("worker-a", 2), ("worker-b", 1)]
