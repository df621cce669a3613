from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from pandaweb.audit.models import AuditEvent
from sessions import console_services, durability, services
from sessions.models import Run, RunEvent
from tests.sessions.conftest import EXAMPLE, publish
from workflows.models import Credential, Workflow

pytestmark = pytest.mark.django_db

INPUTS = {"invoice": "INV-1001", "amount": "12.00"}
S = Run.Status


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The runs handed to a worker (``runs.execute``), in order."""
    runs: list[int] = []
    monkeypatch.setattr(
        services.runstate, "dispatch", lambda task, **kwargs: runs.append(kwargs["run_id"])
    )
    return runs


def limited(operator: User, limit: int) -> Workflow:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["settings"]["max_concurrent_runs"] = limit
    return publish(operator, document)


@pytest.fixture
def one_at_a_time(operator: User, acme_credential: Credential) -> Workflow:
    return limited(operator, 1)


def launch(user: User, workflow: Workflow, priority: int = Run.Priority.NORMAL) -> Run:
    return services.run_launch(
        workflow_id=workflow.pk, user=user, raw_inputs=INPUTS, priority=priority
    )


def start(run: Run) -> None:
    with transaction.atomic():
        locked = services.lock_run(run.pk)
        services.transition(locked, S.STARTING)
        services.transition(locked, S.RUNNING)


def settle(run: Run, to: str) -> None:
    with transaction.atomic():
        services.transition(services.lock_run(run.pk), to, reason="test", sandbox=None)


def waiting_order(workflow: Workflow) -> list[int]:
    return list(
        Run.objects.filter(workflow=workflow, status=S.QUEUED, dispatched_at=None)
        .order_by("-priority", "created_at", "id")
        .values_list("pk", flat=True)
    )


def test_runs_over_the_limit_wait_without_being_sent(
    operator: User, one_at_a_time: Workflow, sent: list[int]
) -> None:
    first, second, third = (launch(operator, one_at_a_time) for _ in range(3))

    assert sent == [first.pk]
    assert first.dispatched_at is not None
    assert not first.waits_for_slot
    assert second.waits_for_slot
    assert third.waits_for_slot
    assert [services.queue_position(r) for r in (first, second, third)] == [None, 0, 1]
    launched = AuditEvent.objects.filter(action="run.launched").order_by("pk")
    assert [e.after["queue"] for e in launched if e.after] == ["dispatched", "waiting", "waiting"]
    assert launched.last().after["ahead"] == 1  # type: ignore[union-attr,index]


def test_a_settled_run_hands_its_slot_to_the_highest_priority_then_the_oldest(
    operator: User, one_at_a_time: Workflow, sent: list[int]
) -> None:
    running = launch(operator, one_at_a_time)
    normal = launch(operator, one_at_a_time)
    low = launch(operator, one_at_a_time, Run.Priority.LOW)
    high = launch(operator, one_at_a_time, Run.Priority.HIGH)
    later_high = launch(operator, one_at_a_time, Run.Priority.HIGH)
    assert [services.queue_position(r) for r in (normal, low, high, later_high)] == [2, 3, 0, 1]

    order = []
    current = running
    for _ in range(4):
        start(current)
        settle(current, S.SUCCEEDED)
        current = Run.objects.get(pk=sent[-1])
        order.append(current.pk)

    assert order == [high.pk, later_high.pk, normal.pk, low.pk]
    assert sent == [running.pk, *order]
    dispatched = AuditEvent.objects.filter(action="run.dispatched", object_id=str(high.pk)).get()
    assert dispatched.after is not None
    assert dispatched.after["priority"] == "high"
    assert dispatched.after["limit"] == 1
    assert RunEvent.objects.filter(run=high, type="dispatched").count() == 1


@pytest.mark.parametrize(
    "to", [S.FAILED, S.CANCELLED, S.EXPIRED, S.INTERRUPTED, S.NEEDS_RECONCILIATION]
)
def test_every_way_of_settling_releases_the_slot(
    operator: User, one_at_a_time: Workflow, sent: list[int], to: str
) -> None:
    running, waiting = launch(operator, one_at_a_time), launch(operator, one_at_a_time)
    start(running)

    settle(running, to)

    waiting.refresh_from_db()
    assert sent == [running.pk, waiting.pk]
    assert waiting.status == S.QUEUED
    assert waiting.dispatched_at is not None


def test_a_run_waiting_for_approval_keeps_its_slot(
    operator: User, one_at_a_time: Workflow, sent: list[int]
) -> None:
    running, waiting = launch(operator, one_at_a_time), launch(operator, one_at_a_time)
    start(running)
    with transaction.atomic():
        services.transition(services.lock_run(running.pk), S.AWAITING_APPROVAL)

    assert sent == [running.pk]
    waiting.refresh_from_db()
    assert waiting.waits_for_slot


def test_a_lost_worker_releases_the_slot_through_the_reaper(
    operator: User, one_at_a_time: Workflow, sent: list[int]
) -> None:
    running, waiting = launch(operator, one_at_a_time), launch(operator, one_at_a_time)
    start(running)
    Run.objects.filter(pk=running.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))

    assert services.run_reap(stale_after=timedelta(minutes=1)) == [running.pk]

    assert sent == [running.pk, waiting.pk]


def test_a_waiting_run_can_be_cancelled_and_the_ones_behind_move_up(
    operator: User, one_at_a_time: Workflow, sent: list[int]
) -> None:
    launch(operator, one_at_a_time)
    first, second = launch(operator, one_at_a_time), launch(operator, one_at_a_time)

    services.run_cancel(run_id=first.pk, user=operator)

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == S.CANCELLED
    assert first.dispatched_at is None
    assert services.queue_position(second) == 0
    assert len(sent) == 1  # the slot was never free: nothing else was sent
    assert AuditEvent.objects.filter(action="run.cancelled", object_id=str(first.pk)).exists()


def test_a_raised_limit_is_filled_by_housekeeping(
    operator: User, one_at_a_time: Workflow, sent: list[int]
) -> None:
    launch(operator, one_at_a_time)
    waiting = [launch(operator, one_at_a_time) for _ in range(3)]
    # A new version with a higher limit: nobody settles, housekeeping fills the new slots.
    document = yaml.safe_load(EXAMPLE.read_text())
    document["settings"]["max_concurrent_runs"] = 3
    publish(operator, document)
    assert services.concurrency_limit(one_at_a_time) == 3

    released = services.queues_release_all()

    assert released == [waiting[0].pk, waiting[1].pk]
    assert waiting_order(one_at_a_time) == [waiting[2].pk]
    assert services.queues_release_all() == []


def test_a_rerun_waits_in_the_same_queue_with_the_original_priority(
    operator: User, one_at_a_time: Workflow, sent: list[int]
) -> None:
    original = launch(operator, one_at_a_time, Run.Priority.HIGH)
    rerun, _ = console_services.run_rerun(run_id=original.pk, user=operator, raw_inputs=INPUTS)

    assert rerun.waits_for_slot
    assert rerun.priority == Run.Priority.HIGH
    assert sent == [original.pk]


@pytest.mark.parametrize(
    ("given", "priority"),
    [("", 1), (None, 1), ("low", 0), ("High", 2), (" normal ", 1), ("2", 2), (0, 0)],
)
def test_priorities_are_read_by_name_or_number(given: Any, priority: int) -> None:
    assert services.parse_priority(given) == priority


@pytest.mark.parametrize("given", ["urgent", "7", -1, True, 2.5])
def test_an_unknown_priority_is_refused_in_words(given: Any) -> None:
    with pytest.raises(services.RunError) as refused:
        services.parse_priority(given)
    assert refused.value.field_errors == {"priority": ["Choose a priority: low, normal or high."]}


def test_launch_refuses_an_unknown_priority(operator: User, one_at_a_time: Workflow) -> None:
    with pytest.raises(services.RunError):
        launch(operator, one_at_a_time, priority=5)
    assert not Run.objects.exists()


def test_the_lost_message_safety_net_leaves_waiting_runs_to_the_queue(
    operator: User, one_at_a_time: Workflow, sent: list[int], settings: Any
) -> None:
    settings.RUN_REDISPATCH_AFTER_SECONDS = 30
    launch(operator, one_at_a_time)
    waiting = launch(operator, one_at_a_time)
    Run.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(hours=1))

    assert durability.runs_redispatch_queued() == []
    assert waiting.pk not in sent


def test_the_system_page_lists_each_workflows_queue(
    operator: User, one_at_a_time: Workflow, sent: list[int], client: Any
) -> None:
    from pandaweb.core.roles import Role
    from tests.factories import user_with_role

    launch(operator, one_at_a_time)
    oldest = launch(operator, one_at_a_time)
    launch(operator, one_at_a_time, Run.Priority.HIGH)
    client.force_login(user_with_role(Role.ADMINS, username="ada"))

    page = client.get("/system/").content.decode()

    row = page.split(f">{one_at_a_time.name}</a>", 1)[1].split("</tr>", 1)[0]
    assert '<td class="num">2</td>' in row  # waiting
    assert "1 of 1" in row  # holding a slot, of the limit
    assert f"#{oldest.pk}" in row  # the oldest waiting, whatever the priorities
