from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import transaction

from pandaweb.audit.models import AuditEvent
from pandaweb.schedules import cron, services
from pandaweb.schedules.models import Schedule
from sessions import services as run_services
from sessions.models import Run
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

INPUTS = {"invoice": "INV-1001", "amount": "1,250.00"}
# A Monday, 05:00 in Berlin (CET, UTC+1).
MONDAY = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def spec(**changes: object) -> services.ScheduleSpec:
    values: dict[str, object] = {
        "name": "Weekday run",
        "cron": "0 6 * * 1-5",
        "timezone": "Europe/Berlin",
        "inputs": INPUTS,
        "overlap": Schedule.Overlap.SKIP,
        "missed": Schedule.Missed.RUN_ONCE,
    }
    values.update(changes)
    return services.ScheduleSpec(**values)  # type: ignore[arg-type]


def make(operator: User, workflow: Workflow, **changes: object) -> Schedule:
    with time_machine.travel(MONDAY, tick=False):
        return services.schedule_create(
            workflow_id=workflow.pk, user=operator, spec=spec(**changes)
        )


def end(run: Run) -> None:
    with transaction.atomic():
        locked = run_services.lock_run(run.pk)
        locked.status = Run.Status.RUNNING
        run_services.transition(locked, Run.Status.SUCCEEDED)


def test_it_describes_common_expressions_in_words() -> None:
    assert cron.describe("0 6 * * 1-5", "Europe/Berlin") == "at 06:00 on weekdays (Europe/Berlin)"
    assert cron.describe("*/15 * * * *", "UTC") == "every 15 minutes (UTC)"
    assert cron.describe("30 7 1,15 * *", "UTC") == "at 07:30 on days 1 and 15 of the month (UTC)"
    assert cron.describe("0 22 * * sun", "UTC") == "at 22:00 on Sunday (UTC)"
    # Day of month and day of week together: cron ORs them, so the words quote it instead.
    assert cron.describe("0 6 1 * 1", "UTC") == "on the cron schedule '0 6 1 * 1' (UTC)"


def test_next_times_follow_the_time_zone_across_daylight_saving() -> None:
    times = cron.next_times("0 6 * * *", "Europe/Berlin", datetime(2026, 3, 27, 12, tzinfo=UTC), 2)

    assert [t.astimezone(UTC).hour for t in times] == [5, 4]  # CET, then CEST


def test_it_creates_a_schedule_with_typed_inputs_and_its_next_time(
    operator: User, demo_workflow: Workflow
) -> None:
    schedule = make(operator, demo_workflow)

    assert schedule.inputs["amount"] == "1250.00"
    assert schedule.next_fire_at == datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
    event = AuditEvent.objects.get(action="schedule.created")
    assert event.actor == operator
    assert (event.after or {})["cron"] == "0 6 * * 1-5"


def test_it_refuses_bad_cron_zone_and_inputs_field_by_field(
    operator: User, demo_workflow: Workflow
) -> None:
    with pytest.raises(services.ScheduleError) as refused:
        services.schedule_create(
            workflow_id=demo_workflow.pk,
            user=operator,
            spec=spec(cron="0 25 * * *", timezone="Mars/Olympus", inputs={"invoice": "1001"}),
        )

    errors = refused.value.field_errors
    assert set(errors) >= {"cron", "timezone", "invoice", "amount"}
    assert errors["invoice"] == ["must match the pattern INV-\\d{4}"]
    assert not Schedule.objects.exists()


def test_a_due_schedule_launches_one_run_as_its_owner(
    operator: User, demo_workflow: Workflow
) -> None:
    schedule = make(operator, demo_workflow)

    with time_machine.travel(datetime(2026, 11, 30, 5, 0, 5, tzinfo=UTC), tick=False):
        fired = services.schedules_tick()
        again = services.schedules_tick()

    run = Run.objects.get()
    assert fired == {schedule.pk: f"launched run #{run.pk}"}
    assert again == {}
    assert run.launched_by == operator
    assert run.inputs["invoice"] == "INV-1001"
    schedule.refresh_from_db()
    assert schedule.last_run == run
    assert schedule.next_fire_at == datetime(2026, 12, 1, 5, 0, tzinfo=UTC)


def test_a_tick_fires_once_when_two_schedulers_race(
    operator: User, demo_workflow: Workflow
) -> None:
    schedule = make(operator, demo_workflow)
    stale_copy = Schedule.objects.get(pk=schedule.pk)

    with time_machine.travel(datetime(2026, 11, 30, 5, 0, 5, tzinfo=UTC), tick=False):
        first = services.schedule_fire(schedule_id=schedule.pk)
        # The second scheduler read the row before the first claimed it: its claim on the old
        # next_fire_at touches no row.
        claimed = Schedule.objects.filter(
            pk=schedule.pk, next_fire_at=stale_copy.next_fire_at
        ).update(last_outcome="second")

    assert first is not None
    assert first.startswith("launched")
    assert claimed == 0
    assert Run.objects.count() == 1


def test_missed_ticks_run_once_not_in_a_burst(operator: User, demo_workflow: Workflow) -> None:
    schedule = make(operator, demo_workflow)

    # Down from Monday to Thursday afternoon: three ticks missed.
    with time_machine.travel(datetime(2026, 12, 3, 15, 0, tzinfo=UTC), tick=False):
        services.schedules_tick()
        services.schedules_tick()

    assert Run.objects.count() == 1
    schedule.refresh_from_db()
    assert schedule.next_fire_at == datetime(2026, 12, 4, 5, 0, tzinfo=UTC)


def test_missed_ticks_are_skipped_when_the_schedule_says_so(
    operator: User, demo_workflow: Workflow
) -> None:
    schedule = make(operator, demo_workflow, missed=Schedule.Missed.SKIP)

    with time_machine.travel(datetime(2026, 12, 3, 15, 0, tzinfo=UTC), tick=False):
        services.schedules_tick()

    assert not Run.objects.exists()
    schedule.refresh_from_db()
    assert schedule.last_outcome.startswith("skipped the tick of 2026-11-30 05:00 UTC")


def test_it_skips_while_the_previous_run_is_active(operator: User, demo_workflow: Workflow) -> None:
    schedule = make(operator, demo_workflow)
    with time_machine.travel(datetime(2026, 11, 30, 5, 0, 5, tzinfo=UTC), tick=False):
        services.schedules_tick()
    with time_machine.travel(datetime(2026, 12, 1, 5, 0, 5, tzinfo=UTC), tick=False):
        outcome = services.schedules_tick()

    assert outcome == {schedule.pk: "skipped: the previous run is still active"}
    assert Run.objects.count() == 1


def test_queue_one_starts_one_run_when_the_previous_ends(
    operator: User, demo_workflow: Workflow
) -> None:
    schedule = make(operator, demo_workflow, overlap=Schedule.Overlap.QUEUE_ONE)
    with time_machine.travel(datetime(2026, 11, 30, 5, 0, 5, tzinfo=UTC), tick=False):
        services.schedules_tick()
    with time_machine.travel(datetime(2026, 12, 1, 5, 0, 5, tzinfo=UTC), tick=False):
        services.schedules_tick()
    with time_machine.travel(datetime(2026, 12, 2, 5, 0, 5, tzinfo=UTC), tick=False):
        second_tick = services.schedules_tick()
        end(Run.objects.get())
        released = services.schedules_tick()
        services.schedules_tick()

    assert second_tick == {schedule.pk: "skipped: one run is already queued behind the active one"}
    assert next(iter(released.values())).startswith("launched run #")
    assert Run.objects.count() == 2
    schedule.refresh_from_db()
    assert schedule.queued_at is None


def test_pausing_stops_firing_and_resuming_does_not_replay(
    operator: User, demo_workflow: Workflow
) -> None:
    schedule = make(operator, demo_workflow)

    with time_machine.travel(MONDAY, tick=False):
        services.schedule_set_paused(schedule_id=schedule.pk, user=operator, paused=True)
    with time_machine.travel(datetime(2026, 12, 2, 12, 0, tzinfo=UTC), tick=False):
        services.schedules_tick()
        services.schedule_set_paused(schedule_id=schedule.pk, user=operator, paused=False)
        services.schedules_tick()

    assert not Run.objects.exists()
    schedule.refresh_from_db()
    assert schedule.next_fire_at == datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
    assert list(
        AuditEvent.objects.filter(object_type="schedule").values_list("action", flat=True)
    ) == ["schedule.created", "schedule.paused", "schedule.resumed"]


def test_editing_is_audited_with_before_and_after(operator: User, demo_workflow: Workflow) -> None:
    schedule = make(operator, demo_workflow)

    with time_machine.travel(MONDAY, tick=False):
        services.schedule_update(
            schedule_id=schedule.pk, user=operator, spec=spec(cron="30 7 * * *")
        )
        services.schedule_update(
            schedule_id=schedule.pk, user=operator, spec=spec(cron="30 7 * * *")
        )

    event = AuditEvent.objects.get(action="schedule.updated")
    assert ((event.before or {})["cron"], (event.after or {})["cron"]) == (
        "0 6 * * 1-5",
        "30 7 * * *",
    )
    schedule.refresh_from_db()
    assert schedule.next_fire_at == datetime(2026, 11, 30, 6, 30, tzinfo=UTC)


def test_it_refuses_to_launch_for_an_owner_who_lost_the_right(
    operator: User, demo_workflow: Workflow
) -> None:
    schedule = make(operator, demo_workflow)
    operator.groups.clear()

    with time_machine.travel(datetime(2026, 11, 30, 5, 0, 5, tzinfo=UTC), tick=False):
        outcome = services.schedules_tick()

    assert outcome == {schedule.pk: "not launched: olivia may no longer launch runs"}
    assert not Run.objects.exists()
    assert AuditEvent.objects.filter(action="schedule.launch_refused").count() == 1
