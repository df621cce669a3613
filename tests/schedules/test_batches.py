from __future__ import annotations

import csv
import io

import pytest
import yaml
from django.contrib.auth.models import User
from django.db import transaction
from pytest_django.fixtures import Settings

from pandaweb.audit.models import AuditEvent
from pandaweb.schedules import services
from pandaweb.schedules.models import Batch, BatchRow
from sessions import services as run_services
from sessions.models import Run
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

GOOD = (
    'invoice,amount\nINV-1001,"1,250.00"\nINV-1002,10.00\nINV-1003,20.00\n'
    "INV-1004,30.00\nINV-1005,40.00\n"
)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The runs handed to a worker, in order (nothing executes them here)."""
    runs: list[int] = []
    monkeypatch.setattr(
        run_services.runstate, "dispatch", lambda task, **kwargs: runs.append(kwargs["run_id"])
    )
    return runs


def upload(operator: User, workflow: Workflow, text: str | bytes) -> Batch:
    content = text.encode() if isinstance(text, str) else text
    return services.batch_create(
        workflow_id=workflow.pk, user=operator, filename="invoices.csv", content=content
    )


def refused(operator: User, workflow: Workflow, text: str | bytes) -> list[str]:
    with pytest.raises(services.BatchRefused) as caught:
        upload(operator, workflow, text)
    assert not Batch.objects.exists()
    assert not Run.objects.exists()
    return [str(caught.value), *caught.value.problems]


def end(run: Run, outputs: dict[str, str] | None = None) -> None:
    with transaction.atomic():
        locked = run_services.lock_run(run.pk)
        locked.status = Run.Status.RUNNING
        run_services.transition(locked, Run.Status.SUCCEEDED, outputs=outputs or {})


def test_it_launches_every_row_and_the_queue_runs_the_bound_at_once_in_order(
    operator: User, demo_workflow: Workflow, sent: list[int]
) -> None:
    batch = upload(operator, demo_workflow, GOOD)

    rows = list(batch.rows.order_by("line").select_related("run"))
    assert [r.status for r in rows] == ["launched"] * 5
    assert [r.run.inputs["invoice"] for r in rows if r.run] == [
        "INV-1001", "INV-1002", "INV-1003", "INV-1004", "INV-1005",
    ]  # fmt: skip
    assert rows[0].inputs["amount"] == "1250.00"
    assert all(r.run and r.run.launched_by == operator for r in rows)
    # The workflow's limit (3 by default): the first three lines go, the rest wait in order.
    assert sent == [r.run.pk for r in rows[:3] if r.run]
    assert [r.run.waits_for_slot for r in rows if r.run] == [False] * 3 + [True] * 2
    event = AuditEvent.objects.get(action="batch.created")
    assert event.after == {
        "workflow": demo_workflow.slug, "version": 1, "filename": "invoices.csv", "rows": 5,
    }  # fmt: skip


def test_a_finished_run_hands_its_slot_to_the_next_line(
    operator: User, demo_workflow: Workflow, sent: list[int]
) -> None:
    batch = upload(operator, demo_workflow, GOOD)
    first = batch.rows.get(line=2)
    assert first.run is not None

    end(first.run)

    fourth = batch.rows.get(line=5)
    assert fourth.run is not None
    assert sent[-1] == fourth.run.pk
    assert Run.objects.filter(status=Run.Status.QUEUED, dispatched_at=None).count() == 1


def test_rows_left_waiting_are_launched_by_the_tick(
    operator: User, demo_workflow: Workflow, sent: list[int]
) -> None:
    batch = upload(operator, demo_workflow, GOOD)
    # A row left waiting (its launch committed, the row's own update was lost).
    row = batch.rows.get(line=6)
    launched = row.run_id
    BatchRow.objects.filter(pk=row.pk).update(status=BatchRow.Status.WAITING, run=None)

    services.batches_release_all()
    services.batches_release_all()

    row.refresh_from_db()
    assert row.status == BatchRow.Status.LAUNCHED
    # Launched once: the launch's idempotency key of the batch and line found the same run.
    assert row.run_id == launched
    assert Run.objects.count() == 5


def test_the_bound_is_a_setting_of_the_version(
    operator: User, acme_credential: object, sent: list[int]
) -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["settings"]["max_concurrent_runs"] = 1
    workflow = publish(operator, document)
    published = workflow.versions.get(number=1).document or {}
    assert published["settings"]["max_concurrent_runs"] == 1

    upload(operator, workflow, GOOD)

    assert len(sent) == 1


def test_it_refuses_the_whole_file_for_one_bad_row(operator: User, demo_workflow: Workflow) -> None:
    text = "invoice,amount\nINV-1001,10.00\n1002,12.345\nINV-1003,\n"

    problems = refused(operator, demo_workflow, text)

    assert problems == [
        "3 problems in the file; nothing was launched.",
        "Line 3, invoice: must match the pattern INV-\\d{4}",
        "Line 3, amount: '12.345' has more than 2 decimals (if it means 12,345, write 12345.00)",
        "Line 4, amount: is required",
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("invoice;amount\nINV-1001;10.00\n".encode("utf-16"), "The file is not UTF-8 text"),
        (b"", "The file is empty"),
        ("invoice\nINV-1001\n", "Missing columns for required parameters: amount."),
        ("invoice,amount,colour\nINV-1001,1.00,red\n", "Unknown columns: colour."),
        ("invoice,amount\n", "The file has a header line but no rows to launch."),
        ('invoice,amount\nINV-1001,"1.00\n', "Line 2: this is not readable CSV"),
        ("invoice,amount\nINV-1001,1.00,extra\n", "Line 2: has 3 cells, the header has 2."),
    ],
)
def test_it_refuses_files_it_cannot_read_with_a_clear_reason(
    operator: User, demo_workflow: Workflow, content: str | bytes, expected: str
) -> None:
    problems = refused(operator, demo_workflow, content)

    assert any(p.startswith(expected) for p in problems), problems


def test_it_refuses_too_many_rows(
    operator: User, demo_workflow: Workflow, settings: Settings
) -> None:
    settings.BATCH_MAX_ROWS = 4

    problems = refused(operator, demo_workflow, GOOD)

    assert problems == ["The file has 5 rows; one batch takes at most 4."]


def test_it_reads_semicolons_and_a_byte_order_mark(operator: User, demo_workflow: Workflow) -> None:
    batch = upload(operator, demo_workflow, "\ufeffinvoice;amount\r\nINV-1001;1,250.00\r\n")

    assert batch.rows.get().inputs["amount"] == "1250.00"


def test_outputs_csv_neutralises_formulas(operator: User, demo_workflow: Workflow) -> None:
    batch = upload(operator, demo_workflow, GOOD)
    first = batch.rows.get(line=2)
    assert first.run is not None
    end(first.run, {"receipt": '=HYPERLINK("http://evil")', "note": "-5"})

    table = list(csv.reader(io.StringIO(services.batch_outputs_csv(batch))))

    assert table[0] == [
        "line",
        "run",
        "status",
        "invoice",
        "amount",
        "note",
        "receipt",
        "failure_reason",
    ]
    assert table[1][2:] == [
        "succeeded",
        "INV-1001",
        "1250.00",
        "'-5",
        '\'=HYPERLINK("http://evil")',
        "",
    ]
    last = batch.rows.get(line=6)
    assert table[5][:3] == ["6", str(last.run_id), "queued"]
