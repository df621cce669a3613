"""Schedules over the API: list, read, make, change, pause or resume, delete. The schedule
page's services do each, with its rules (the cron expression and time zone checked, the inputs
checked like a launch's) and its audit events.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any, Literal

from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Router, Schema, Status
from pydantic import Field

from pandaweb.api.access import token_with_scope
from pandaweb.api.problems import Problem, field_errors
from pandaweb.api.schemas import InputValue
from pandaweb.api.scopes import Scope
from pandaweb.core.permissions import in_teams
from pandaweb.core.roles import Capability
from pandaweb.schedules import selectors, services
from pandaweb.schedules.models import Schedule
from workflows.models import Workflow

router = Router(tags=["schedules"])

INVALID = "the request is not valid"

Overlap = Literal["skip", "queue_one"]
Missed = Literal["run_once", "skip"]

CRON_DESCRIPTION = (
    "Five fields: minute hour day-of-month month day-of-week (0 6 * * 1-5 is 06:00 on weekdays)."
)
OVERLAP_DESCRIPTION = (
    "While the previous run is still active: skip the tick, or queue_one run that starts when it "
    "ends."
)
MISSED_DESCRIPTION = "Ticks missed while pandaweb was down: run_once for all of them, or skip them."


class ScheduleOut(Schema):
    id: int
    workflow: str
    name: str
    cron: str
    timezone: str
    in_words: str = Field(description="The expression in words, as the schedule page says it.")
    inputs: dict[str, Any]
    overlap: str
    missed: str
    paused: bool
    owner: str = Field(description="Who its runs launch as: whoever saved it last.")
    next_times: list[datetime] = Field(description="The next five launch times (none if paused).")
    last_fired_at: datetime | None
    last_outcome: str
    last_run: int | None
    created_at: datetime
    updated_at: datetime
    links: dict[str, str]


class ScheduleIn(Schema):
    workflow: str = Field(description="The workflow's slug; its latest published version runs.")
    name: str = Field(max_length=200)
    cron: str = Field(max_length=120, description=CRON_DESCRIPTION)
    timezone: str = Field("UTC", max_length=64, description="A name like Europe/Berlin or UTC.")
    inputs: dict[str, InputValue] = Field(
        default_factory=dict, description="One value per parameter, checked like a launch's."
    )
    overlap: Overlap = Field("skip", description=OVERLAP_DESCRIPTION)
    missed: Missed = Field("run_once", description=MISSED_DESCRIPTION)
    paused: bool = Field(False, description="Make it paused: it launches nothing until resumed.")


class ScheduleChangeIn(Schema):
    """Only the fields sent change; ``inputs`` sent replace all the inputs."""

    name: str | None = Field(None, max_length=200)
    cron: str | None = Field(None, max_length=120, description=CRON_DESCRIPTION)
    timezone: str | None = Field(None, max_length=64)
    inputs: dict[str, InputValue] | None = None
    overlap: Overlap | None = Field(None, description=OVERLAP_DESCRIPTION)
    missed: Missed | None = Field(None, description=MISSED_DESCRIPTION)
    paused: bool | None = Field(None, description="true pauses it, false resumes it.")


def _out(schedule: Schedule) -> ScheduleOut:
    return ScheduleOut(
        id=schedule.pk,
        workflow=schedule.workflow.slug,
        name=schedule.name,
        cron=schedule.cron,
        timezone=schedule.timezone,
        in_words=selectors.schedule_in_words(schedule),
        inputs=dict(schedule.inputs),
        overlap=schedule.overlap,
        missed=schedule.missed,
        paused=schedule.paused,
        owner=schedule.owner.get_username(),
        next_times=selectors.schedule_next_times(schedule),
        last_fired_at=schedule.last_fired_at,
        last_outcome=schedule.last_outcome,
        last_run=schedule.last_run_id,
        created_at=schedule.created_at,
        updated_at=schedule.updated_at,
        links={
            "self": reverse("api:schedule_get", kwargs={"schedule_id": schedule.pk}),
            "page": reverse("schedules:detail", kwargs={"schedule_id": schedule.pk}),
        },
    )


def _refused(exc: services.ScheduleError) -> Problem:
    """The service names parameters by their own names: they are ``inputs.<name>`` here."""
    plain = {"name", "cron", "timezone", "overlap", "missed"}
    named = {
        (name if name in plain or name == "__all__" else f"inputs.{name}"): messages
        for name, messages in exc.field_errors.items()
    }
    if not named:
        return Problem(409, str(exc))
    return Problem(422, INVALID, errors=field_errors(named))


def _workflow_refusal(slug: str, user: User) -> Problem | None:
    """The schedule page's own refusal, before its form: no published version to launch (nor
    a workflow, when it is another team's)."""
    workflow = in_teams(Workflow.objects.filter(slug=slug), user, Capability.VIEW_WORKFLOWS).first()
    if workflow is None:
        message = f"no workflow has the slug {slug!r}"
    elif workflow.archived:
        message = "this workflow is archived"
    else:
        return None
    return Problem(422, INVALID, errors=[{"field": "workflow", "message": message}])


@router.get("/", response=list[ScheduleOut], url_name="schedule_list", summary="List schedules")
def schedule_list(request: HttpRequest, workflow: str = "") -> list[ScheduleOut]:
    """Every schedule (``?workflow=<slug>``: one workflow's) of the teams where the token's owner
    sees workflows, by workflow and name, each with its expression in words and next launch
    times. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    return [_out(s) for s in selectors.schedule_list(user=context.user, workflow_slug=workflow)]


@router.get(
    "/{int:schedule_id}", response=ScheduleOut, url_name="schedule_get", summary="Get a schedule"
)
def schedule_get(request: HttpRequest, schedule_id: int) -> ScheduleOut:
    """The schedule as its page shows it. Scope: ``workflows:read``."""
    context = token_with_scope(request, Scope.WORKFLOWS_READ)
    return _out(selectors.schedule_get(schedule_id, user=context.user))


@router.post(
    "/", response={201: ScheduleOut}, url_name="schedule_create", summary="Make a schedule"
)
def schedule_create(request: HttpRequest, payload: ScheduleIn) -> Status[ScheduleOut]:
    """Launch the workflow's latest published version on a cron expression in a time zone,
    with fixed inputs, as the token's owner (audited as ``schedule.created``). A wrong
    expression, time zone or input is a 422 naming the field (``cron``, ``inputs.amount``).
    Scope: ``schedules:write``."""
    context = token_with_scope(request, Scope.SCHEDULES_WRITE)
    if refusal := _workflow_refusal(payload.workflow, context.user):
        raise refusal
    workflow = Workflow.objects.get(slug=payload.workflow)
    spec = services.ScheduleSpec(
        name=payload.name,
        cron=payload.cron,
        timezone=payload.timezone.strip(),
        inputs=payload.inputs,
        overlap=payload.overlap,
        missed=payload.missed,
    )
    try:
        with transaction.atomic():
            schedule = services.schedule_create(
                workflow_id=workflow.pk, user=context.user, spec=spec
            )
            if payload.paused:
                services.schedule_set_paused(
                    schedule_id=schedule.pk, user=context.user, paused=True
                )
    except services.ScheduleError as exc:
        raise _refused(exc) from None
    return Status(201, _out(selectors.schedule_get(schedule.pk, user=context.user)))


@router.patch(
    "/{int:schedule_id}",
    response=ScheduleOut,
    url_name="schedule_update",
    summary="Change, pause or resume a schedule",
)
def schedule_update(
    request: HttpRequest, schedule_id: int, payload: ScheduleChangeIn
) -> ScheduleOut:
    """Change the fields sent, as the schedule page's Save does: the next time counts afresh
    from now, and whoever changes when or what it launches becomes its owner (its runs launch
    as them). ``paused`` pauses or resumes it as the page's button does; resuming starts from
    the next tick, nothing paused over is made up. All or nothing; sending what it already is
    changes nothing and writes no audit event. Scope: ``schedules:write``."""
    context = token_with_scope(request, Scope.SCHEDULES_WRITE)
    schedule = selectors.schedule_get(schedule_id, user=context.user)
    sent = payload.model_dump(exclude_unset=True)
    nulls = sorted(name for name, value in sent.items() if value is None)
    if nulls:
        raise Problem(
            422,
            INVALID,
            errors=[{"field": name, "message": "may not be null"} for name in nulls],
        )
    current: dict[str, Any] = {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "inputs": dict(schedule.inputs),
        "overlap": schedule.overlap,
        "missed": schedule.missed,
    }
    wanted = {**current, **{k: v for k, v in sent.items() if k in current}}
    wanted["timezone"] = wanted["timezone"].strip()
    try:
        with transaction.atomic():
            if wanted != current:
                services.schedule_update(
                    schedule_id=schedule.pk, user=context.user, spec=services.ScheduleSpec(**wanted)
                )
            if "paused" in sent:
                services.schedule_set_paused(
                    schedule_id=schedule.pk, user=context.user, paused=sent["paused"]
                )
    except services.ScheduleError as exc:
        raise _refused(exc) from None
    return _out(selectors.schedule_get(schedule.pk, user=context.user))


@router.delete(
    "/{int:schedule_id}",
    response={204: None},
    url_name="schedule_delete",
    summary="Delete a schedule",
)
def schedule_delete(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """It launches nothing more; the runs it launched stay (audited as ``schedule.deleted``,
    with what it was). Scope: ``schedules:write``."""
    context = token_with_scope(request, Scope.SCHEDULES_WRITE)
    schedule = selectors.schedule_get(schedule_id, user=context.user)
    # Deleted by another request since it was read: what this one asked for.
    try:
        with contextlib.suppress(Schedule.DoesNotExist):
            services.schedule_delete(schedule_id=schedule.pk, user=context.user)
    except services.ScheduleError as exc:
        raise _refused(exc) from None
    return HttpResponse(status=204)
