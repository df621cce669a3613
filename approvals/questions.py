"""Questions a run asks people (the ``ask`` step): opening, answering, expiring, withdrawing.

Like approvals, every change locks the run first and then the question, in one transaction with
its audit event; the page, the HTTP API and housekeeping all call these functions. The run waits
holding no worker: the answer dispatches its continuation to any worker of the sandbox's host.

A one-time code is never stored in clear: it is sealed with the credential keys when answered,
opened and wiped (one transaction) by the continuation, which holds it in memory only.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q as DQ
from django.db.models import QuerySet
from django.utils import timezone

from approvals.events import publish_pending_changed
from approvals.models import Question
from approvals.slack import slack_question_channel
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.core.dispatch import dispatch, task_named
from pandaweb.core.models import Membership
from pandaweb.core.permissions import people_with, user_can
from pandaweb.core.roles import Capability
from pandaweb.reviewers.notify import ApprovalEvent, notify
from sessions.engine.steps.ask import ASK_LAUNCHER, ask_audience, one_time_code
from sessions.engine.vocabulary import MASK
from sessions.models import Run
from sessions.services.records import lock_run
from sessions.services.runstate import destroy_sandbox, host_queue, transition
from workflows.services import vault

logger = logging.getLogger(__name__)

Q = Question.Status


class QuestionRefused(Exception):
    """The answer is not allowed or no longer possible; the message is for people."""

    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


# Opening -----------------------------------------------------------------------------------------


def question_open(*, run: Run, question: Any) -> Question:
    """Record what an ask step asks (inside the caller's transaction, ``run`` locked) and tell
    the people who may answer, after commit. ``question`` is the runner's ``Question``."""
    asked = Question.objects.create(
        run=run,
        step_index=question.step_index,
        step_id=question.step_id,
        text=question.text,
        kind=question.answer,
        options=list(question.options),
        save_as=question.save_as,
        answered_by=question.answered_by,
        timeout_minutes=question.timeout_minutes,
        expires_at=timezone.now() + timedelta(minutes=question.timeout_minutes),
    )
    audit_record(
        action="question.asked",
        object_type="question",
        object_id=asked.pk,
        team_id=run.team_id,
        actor_kind=AuditEvent.ActorKind.RUNNER,
        after={
            "question": asked.text,
            "kind": asked.kind,
            "options": asked.options,
            "answered_by": asked.answered_by,
            "expires_at": asked.expires_at.isoformat(),
        },
        run_id=run.pk,
    )
    publish_pending_changed()
    _notify(asked)
    return asked


def _group_members(question: Question) -> QuerySet[User]:
    """The people of the group a question is asked of, in the run's team: a Django group of
    that name, or a membership of that role in the team; and all of them must be allowed to
    watch the team's runs (where the answer is given)."""
    team_id = question.run.team_id
    group = question.answered_by
    in_group = DQ(groups__name=group)
    if group in Membership.TeamRole.values:
        in_group |= DQ(team_memberships__team_id=team_id, team_memberships__role=group)
    members = User.objects.filter(in_group).values("pk")
    return people_with(Capability.VIEW_RUNS, team_id=team_id).filter(pk__in=members)


def question_answerers(question: Question) -> list[User]:
    """The active people who may answer ``question``."""
    if question.answered_by == ASK_LAUNCHER:
        launcher = question.run.launched_by
        return [launcher] if launcher.is_active else []
    return list(_group_members(question).order_by("pk"))


def _notify(question: Question, *, reminder: bool = False) -> None:
    """Tell the people who may answer ``question``, once the caller's transaction commits: each
    through the channels they chose (``notify``: e-mail, Slack direct message, browser push,
    quiet hours), and the workflow's Slack approval channel when it has one. ``reminder``: the
    message once more before the timeout. Only the question and a link travel: the answer is
    given in pandaweb."""

    run = question.run
    url = f"{settings.PANDAWEB_BASE_URL}/runs/{run.pk}/#question"
    if reminder:
        title = f"Reminder: run #{run.pk} of {run.workflow.name} still asks you: {question.text}"
        lead = (
            "Nobody has answered yet; without an answer the run fails at "
            f"{question.expires_at:%Y-%m-%d %H:%M} UTC.\n\n"
        )
    else:
        title = f"Run #{run.pk} of {run.workflow.name} asks you: {question.text}"
        lead = ""
    event = ApprovalEvent(
        kind="question.reminded" if reminder else "question.asked",
        approval_id=question.pk,
        title=title,
        body=(
            f"{lead}{question.text}\n\nRun #{run.pk} of {run.workflow.name}, launched by "
            f"{run.launched_by.get_username()}, waits for the answer until "
            f"{question.expires_at:%Y-%m-%d %H:%M} UTC. Answer on the run page: {url}\n"
        ),
        url=url,
    )
    users = question_answerers(question)

    def send() -> None:
        for user in users:
            notify(user, event)

    transaction.on_commit(send)
    channel = slack_question_channel(question)
    if channel:
        dispatch(
            task_named("approvals.slack_question_post"),
            question_id=question.pk,
            channel=channel,
            reminder=reminder,
        )


def _tell_chat_it_closed(question: Question) -> None:
    """Once the caller's transaction commits, the Slack messages about ``question`` say how it
    ended, so nobody follows a link to a question already answered."""

    if settings.SLACK_BOT_TOKEN:
        dispatch(task_named("approvals.slack_question_messages_update"), question_id=question.pk)


# Answering ---------------------------------------------------------------------------------------


def question_refusal(user: Any, question: Question) -> str | None:
    """Why ``user`` may not answer ``question`` (None when they may)."""
    if not user.is_authenticated or not user.is_active:
        return "sign in to answer"
    if not user_can(user, Capability.VIEW_RUNS, team_id=question.run.team_id):
        return "you may not answer questions of another team's runs"
    if question.answered_by == ASK_LAUNCHER:
        if question.run.launched_by_id != user.pk:
            return "only the person who launched the run may answer this question"
        return None
    if not _group_members(question).filter(pk=user.pk).exists():
        return f"only members of {question.answered_by} may answer this question"
    return None


def _closed(question: Question) -> str | None:
    """Why ``question`` takes no answer any more (None while it does)."""
    if question.status == Q.ANSWERED:
        who = question.answerer.get_username() if question.answerer else "someone"
        return f"this question was already answered by {who}"
    if question.status == Q.EXPIRED:
        return f"too late: nobody answered within {_minutes(question.timeout_minutes)}"
    if question.status == Q.VOIDED:
        return f"the run no longer waits for this answer ({question.reason})"
    if question.expires_at <= timezone.now():
        return f"too late: the question expired at {question.expires_at:%H:%M} UTC"
    return None


def _clean(question: Question, raw: str) -> str:
    text = (raw or "").strip()
    if not text:
        raise QuestionRefused("type an answer", {"answer": ["type an answer"]})
    if question.kind == Question.Kind.CODE:
        try:
            return one_time_code(text)
        except ValueError as exc:
            raise QuestionRefused(str(exc), {"answer": [str(exc)]}) from None
    if question.kind == Question.Kind.CHOICE:
        if text not in question.options:
            message = "choose one of: " + ", ".join(question.options)
            raise QuestionRefused(message, {"answer": [message]})
        return text
    if len(text) > 1000:
        raise QuestionRefused("at most 1000 characters", {"answer": ["at most 1000 characters"]})
    return text


def question_answer(*, question_id: int, user: User, answer: str) -> Question:
    """Answer a pending question: the run goes on from its ask step on a worker of the
    sandbox's host. One transaction with the run and the question locked; not idempotent:
    a second answer, a late one or one from someone not allowed raises QuestionRefused.
    """

    with transaction.atomic():
        run_id = Question.objects.values_list("run_id", flat=True).get(pk=question_id)
        run = lock_run(run_id)
        question = Question.objects.select_for_update().get(pk=question_id)
        closed = _closed(question)
        if closed:
            raise QuestionRefused(closed)
        refusal = question_refusal(user, question)
        if refusal:
            raise QuestionRefused(refusal)
        if run.status != Run.Status.AWAITING_ANSWER:
            raise QuestionRefused(f"the run is {run.get_status_display().lower()}, not waiting")
        value = _clean(question, answer)
        now = timezone.now()
        question.status = Q.ANSWERED
        question.answerer = user
        question.answered_at = now
        if question.kind == Question.Kind.CODE:
            question.answer_sealed = _vault().seal({"code": value})
        else:
            question.answer = value
        question.save()
        audit_record(
            action="question.answered",
            object_type="question",
            object_id=question.pk,
            team_id=run.team_id,
            actor=user,
            before={"status": Q.PENDING},
            after={
                "status": Q.ANSWERED,
                "answer": MASK if question.kind == Question.Kind.CODE else value,
            },
            run_id=run.pk,
        )
        waited = now - question.created_at
        transition(
            run,
            Run.Status.RUNNING,
            actor=user,
            reason=f"step {question.step_index + 1} answered by {user.get_username()}",
            heartbeat_at=now,
            # Like an approval's wait, the wait for an answer does not use up the run's time.
            deadline_at=(run.deadline_at + waited) if run.deadline_at else None,
        )
        publish_pending_changed()
        _tell_chat_it_closed(question)
        # Sent once this transaction commits (dispatch waits for it).
        dispatch_answer_continuation(
            run_id, question_id, host=str((run.sandbox or {}).get("host") or "")
        )
    return question


def dispatch_answer_continuation(run_id: int, question_id: int, *, host: str | None = None) -> None:
    """Queue the run's continuation after an answer for any worker of its sandbox's host.
    Sending it twice is harmless: it runs once per question."""

    if host is None:
        host = str((Run.objects.get(pk=run_id).sandbox or {}).get("host") or "")
    queue = host_queue(host) if host else None
    dispatch(task_named("runs.answer"), queue=queue, run_id=run_id, question_id=question_id)


def question_take_answer(question: Question) -> str:
    """The answer, for the continuation (``question`` locked, in the caller's transaction): a
    sealed code is opened and wiped, so it exists in clear only in the runner's memory."""
    if question.kind != Question.Kind.CODE:
        return question.answer
    code = _vault().open(question.answer_sealed)["code"]
    question.answer_sealed = ""
    question.save(update_fields=["answer_sealed"])
    return code


def _vault() -> Any:
    return vault()


# Ending ------------------------------------------------------------------------------------------


def _minutes(minutes: int) -> str:
    return f"{minutes} minute{'' if minutes == 1 else 's'}"


# A reminder comes when a quarter of the question's time is left, but at least this long before
# the end (a code sent by SMS needs a minute to type), and never in its first half (a short
# question is not reminded right after it was asked).
REMIND_AT_LEAST_BEFORE = timedelta(minutes=5)


def question_reminder_at(question: Question) -> datetime:
    """When the people who may answer ``question`` are reminded: 15 minutes to answer → after
    10; an hour → after 45; 10 minutes → after 5; a day → 6 hours before the end."""
    return _reminder_at(question.created_at, question.expires_at)


def _reminder_at(asked: datetime, expires: datetime) -> datetime:
    total = expires - asked
    return max(asked + total / 2, expires - max(total / 4, REMIND_AT_LEAST_BEFORE))


def question_remind_due() -> list[int]:
    """Tell the people who may answer each pending question once more, through the channels
    of the first message, at ``question_reminder_at``. Idempotent: a question is reminded at
    most once, whatever passes run at once; a conditional update on ``reminded_at`` claims it
    under the run's lock (the order every question change takes)."""

    now = timezone.now()
    due = Question.objects.filter(
        status=Q.PENDING, reminded_at__isnull=True, expires_at__gt=now
    ).values_list("pk", "run_id", "created_at", "expires_at")
    reminded = []
    for question_id, run_id, created_at, expires_at in due:
        if _reminder_at(created_at, expires_at) > now:
            continue
        with transaction.atomic():
            lock_run(run_id)
            claimed = Question.objects.filter(
                pk=question_id, status=Q.PENDING, reminded_at__isnull=True, expires_at__gt=now
            ).update(reminded_at=now)
            if claimed != 1:
                continue  # answered, withdrawn or reminded by another pass meanwhile
            question = Question.objects.select_related(
                "run__workflow", "run__launched_by", "run__version"
            ).get(pk=question_id)
            audit_record(
                action="question.reminded",
                object_type="question",
                object_id=question.pk,
                team_id=question.run.team_id,
                after={"reminded_at": now.isoformat(), "expires_at": expires_at.isoformat()},
                run_id=run_id,
            )
            _notify(question, reminder=True)
        reminded.append(question_id)
    return reminded


def question_expire_due() -> list[int]:
    """Fail the runs whose question nobody answered in time, and destroy their browsers.
    Idempotent: a question is expired once, re-checked under the locks."""

    expired = []
    due = Question.objects.filter(status=Q.PENDING, expires_at__lte=timezone.now())
    for question_id, run_id in due.values_list("pk", "run_id"):
        with transaction.atomic():
            run = lock_run(run_id)
            question = Question.objects.select_for_update().get(pk=question_id)
            if question.status != Q.PENDING or question.expires_at > timezone.now():
                continue
            reason = (
                f"nobody answered '{question.text}' within {_minutes(question.timeout_minutes)} "
                f"(asked of {ask_audience(question.answered_by)})"
            )
            question.status = Q.EXPIRED
            question.reason = reason
            question.save(update_fields=["status", "reason"])
            audit_record(
                action="question.expired",
                object_type="question",
                object_id=question.pk,
                team_id=run.team_id,
                after={"expired_at": question.expires_at.isoformat()},
                run_id=run.pk,
            )
            sandbox = run.sandbox
            if run.status == Run.Status.AWAITING_ANSWER:
                transition(run, Run.Status.FAILED, reason=reason, sandbox=None)
            publish_pending_changed()
            _tell_chat_it_closed(question)
        if sandbox:
            destroy_sandbox(sandbox)
        expired.append(question_id)
    return expired


def question_void_pending(*, run: Run, reason: str) -> None:
    """Withdraw the open question of a run that stops waiting for another reason, and wipe a
    code nobody took (inside the caller's transaction, ``run`` locked)."""
    open_questions = Question.objects.select_for_update().filter(
        run=run, status__in=[Q.PENDING, Q.ANSWERED], continued_at__isnull=True
    )
    for question in open_questions:
        question.status = Q.VOIDED
        question.reason = reason
        question.answer_sealed = ""
        question.save(update_fields=["status", "reason", "answer_sealed"])
        audit_record(
            action="question.voided",
            object_type="question",
            object_id=question.pk,
            team_id=run.team_id,
            after={"reason": reason},
            run_id=run.pk,
        )
        publish_pending_changed()
        _tell_chat_it_closed(question)
