from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connections, transaction

from pandaweb.core.roles import Role
from pandaweb.schedules import services as schedule_services
from pandaweb.schedules.models import Schedule
from pandaweb.webhooks import services
from pandaweb.webhooks.models import Attempt, Message
from sessions import services as run_services
from sessions.models import Run
from tests.factories import user_with_role
from tests.webhooks.conftest import Receiver
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 4


def race(work: Callable[[], Any]) -> list[Any]:
    """Run ``work`` in WORKERS threads released at the same moment; their results."""
    barrier = threading.Barrier(WORKERS)
    results: list[Any] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            barrier.wait()
            result = work()
        except Exception as exc:  # reported as a result so that the test sees it
            result = exc
        finally:
            connections.close_all()
        with lock:
            results.append(result)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_workers_racing_for_one_message_deliver_it_once(
    operator: User, demo_workflow: Workflow, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The delivery queued on commit would win before the race starts.
    monkeypatch.setattr(services, "dispatch", lambda task, **kwargs: None)
    admin = user_with_role(Role.ADMINS, username="ada")
    _, receiver.secret = services.subscription_create(
        user=admin, name="ERP", url=receiver.url, events=["run.finished"], workflow_id=None
    )
    run = run_services.run_launch(
        workflow_id=demo_workflow.pk,
        user=operator,
        raw_inputs={"invoice": "INV-1001", "amount": "1.00"},
    )
    with transaction.atomic():
        locked = run_services.lock_run(run.pk)
        locked.status = Run.Status.RUNNING
        run_services.transition(locked, Run.Status.SUCCEEDED)
    message = Message.objects.get()

    results = race(lambda: services.message_deliver(message_id=message.pk))

    assert [r for r in results if isinstance(r, Exception)] == []
    # At most one racer delivered (none if a housekeeping drain of this process got there first).
    assert len([r for r in results if r is not None]) <= 1
    assert Attempt.objects.count() == 1
    assert len(receiver.received) == 1
    assert receiver.received[0]["verified"]


def test_schedulers_racing_for_one_tick_launch_one_run(
    operator: User, demo_workflow: Workflow
) -> None:
    with time_machine.travel(datetime(2026, 11, 30, 4, 0, tzinfo=UTC), tick=False):
        schedule = schedule_services.schedule_create(
            workflow_id=demo_workflow.pk,
            user=operator,
            spec=schedule_services.ScheduleSpec(
                name="Mornings",
                cron="0 6 * * *",
                timezone="Europe/Berlin",
                inputs={"invoice": "INV-1001", "amount": "1.00"},
                overlap=Schedule.Overlap.SKIP,
                missed=Schedule.Missed.RUN_ONCE,
            ),
        )
    tick = datetime(2026, 11, 30, 5, 0, 3, tzinfo=UTC)

    results = race(lambda: schedule_services.schedules_tick(now=tick))

    assert [r for r in results if isinstance(r, Exception)] == []
    assert Run.objects.count() == 1
    assert sum(len(r) for r in results) <= 1
    schedule.refresh_from_db()
    assert schedule.next_fire_at == datetime(2026, 12, 1, 5, 0, tzinfo=UTC)
