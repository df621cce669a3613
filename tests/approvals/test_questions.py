"""Questions a run asks people (the ask step): who may answer, once, in time, and a one-time code
that is never stored in clear. Runs are parked at their question without a browser; the real
thing, with Chromium and the portal's SMS page, is in test_ask.py."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.db import connections, transaction
from django.utils import timezone

from approvals import questions
from approvals.models import Question
from approvals.selectors import questions_for
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.models import Run
from tests.factories import user_with_role
from tests.patching import patch_destroy_sandbox
from workflows.models import Workflow

INPUTS = {"invoice": "INV-1001", "amount": "1,250.00"}
CODE = "482913"


@pytest.fixture
def destroyed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    gone: list[dict[str, Any]] = []
    patch_destroy_sandbox(monkeypatch, gone.append)
    return gone


@pytest.fixture
def treasury(db: None) -> Group:
    return Group.objects.create(name="Treasury")


def asking(
    user: User,
    workflow: Workflow,
    *,
    kind: str = "code",
    answered_by: str = "launcher",
    options: list[str] | None = None,
) -> Question:
    """A run waiting at its ask step, as the runner leaves it (sandbox record included)."""
    run = services.run_launch(workflow_id=workflow.pk, user=user, raw_inputs=INPUTS)
    now = timezone.now()
    sandbox = {"backend": "local", "run_key": f"run-{run.pk}-x", "host": "h"}
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.AWAITING_ANSWER, sandbox=sandbox, deadline_at=now + timedelta(minutes=9)
    )
    return Question.objects.create(
        run=run,
        step_index=4,
        step_id="ask-code",
        text="Type the code the portal sent by SMS",
        kind=kind,
        options=options or [],
        save_as="sms_code",
        answered_by=answered_by,
        timeout_minutes=10,
        expires_at=now + timedelta(minutes=10),
    )


def answer(question: Question, user: User, value: str = CODE) -> Question:
    return questions.question_answer(question_id=question.pk, user=user, answer=value)


@pytest.mark.django_db
def test_the_launcher_answers_and_the_run_goes_on_on_its_host(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)
    deadline_before = Run.objects.get(pk=question.run_id).deadline_at
    assert deadline_before is not None

    with time_machine.travel(timezone.now() + timedelta(minutes=3), tick=False):
        answer(question, operator, "482-913")

    question.refresh_from_db()
    run = Run.objects.get(pk=question.run_id)
    assert question.status == Question.Status.ANSWERED
    assert question.answerer == operator
    assert run.status == Run.Status.RUNNING
    # The wait for the answer does not use up the run's own time.
    assert run.deadline_at is not None
    assert run.deadline_at - deadline_before >= timedelta(minutes=3)
    assert continuations == [
        {"task": "runs.answer", "queue": "host.h", "run_id": run.pk, "question_id": question.pk}
    ]
    event = AuditEvent.objects.get(action="question.answered", object_id=str(question.pk))
    assert event.actor == operator
    assert event.after == {"status": "answered", "answer": "••••"}


@pytest.mark.django_db
def test_a_code_is_never_stored_in_clear_and_is_wiped_once_taken(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)
    answer(question, operator)

    question.refresh_from_db()
    assert question.answer == ""
    assert question.answer_sealed
    assert CODE not in question.answer_sealed
    stored = [
        str(AuditEvent.objects.filter(run_id=question.run_id).values_list("after", "extra")),
        str(list(Run.objects.get(pk=question.run_id).events.values_list("payload", flat=True))),
    ]
    assert not any(CODE in text for text in stored)

    with transaction.atomic():
        locked = Question.objects.select_for_update().get(pk=question.pk)
        assert questions.question_take_answer(locked) == CODE
    question.refresh_from_db()
    assert question.answer_sealed == ""


@pytest.mark.django_db
def test_a_text_or_a_choice_is_kept_as_an_output_would_be(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    suppliers = ["Nordwind GmbH", "Nordwind Logistik GmbH"]
    choice = asking(operator, demo_workflow, kind="choice", options=suppliers)

    with pytest.raises(questions.QuestionRefused, match="choose one of: Nordwind GmbH, Nordwind"):
        answer(choice, operator, "Nordwind")
    answer(choice, operator, "Nordwind Logistik GmbH")

    choice.refresh_from_db()
    assert choice.answer == "Nordwind Logistik GmbH"
    assert choice.answer_sealed == ""
    with transaction.atomic():
        locked = Question.objects.select_for_update().get(pk=choice.pk)
        assert questions.question_take_answer(locked) == "Nordwind Logistik GmbH"


@pytest.mark.django_db
def test_an_answer_that_is_no_code_is_refused_in_words(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)

    for wrong in ("", "  ", "12", "48291!", "1234567890123"):
        with pytest.raises(questions.QuestionRefused) as refused:
            answer(question, operator, wrong)
        assert str(refused.value) in ("type an answer", "a code is 3 to 12 letters or digits")
        assert refused.value.field_errors["answer"]

    question.refresh_from_db()
    assert question.status == Question.Status.PENDING
    assert continuations == []


@pytest.mark.django_db
def test_only_the_launcher_answers_a_question_asked_of_the_launcher(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)
    colleague = user_with_role(Role.OPERATORS, username="otto")
    admin = user_with_role(Role.ADMINS, username="ada")

    for stranger in (colleague, admin):
        with pytest.raises(questions.QuestionRefused, match="only the person who launched"):
            answer(question, stranger)

    question.refresh_from_db()
    assert question.status == Question.Status.PENDING
    assert not AuditEvent.objects.filter(action="question.answered").exists()
    assert continuations == []


@pytest.mark.django_db
def test_a_question_asked_of_a_group_is_answered_by_its_members_only(
    operator: User, demo_workflow: Workflow, treasury: Group, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow, answered_by="Treasury")
    member = user_with_role(Role.REVIEWERS, username="tara")
    member.groups.add(treasury)

    assert [q.pk for q in questions_for(member)] == [question.pk]
    assert questions_for(operator) == []
    with pytest.raises(questions.QuestionRefused, match="only members of Treasury"):
        answer(question, operator)  # launching the run is not being in the group
    answer(question, member)

    question.refresh_from_db()
    assert question.answerer == member
    assert questions_for(member) == []


@pytest.mark.django_db
def test_a_second_answer_is_refused_saying_who_answered(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    question = asking(operator, demo_workflow)
    answer(question, operator)

    with pytest.raises(questions.QuestionRefused, match="already answered by olivia"):
        answer(question, operator, "111111")

    assert len(continuations) == 1
    assert AuditEvent.objects.filter(action="question.answered").count() == 1


@pytest.mark.django_db
def test_nobody_answered_in_time_fails_the_run_with_that_reason(
    operator: User,
    demo_workflow: Workflow,
    continuations: list[dict[str, Any]],
    destroyed: list[dict[str, Any]],
) -> None:
    question = asking(operator, demo_workflow)

    with time_machine.travel(question.expires_at - timedelta(seconds=1)):
        assert questions.question_expire_due() == []
    with time_machine.travel(question.expires_at + timedelta(seconds=1)):
        with pytest.raises(questions.QuestionRefused, match="too late: the question expired at"):
            answer(question, operator)
        assert questions.question_expire_due() == [question.pk]
        assert questions.question_expire_due() == []
        with pytest.raises(questions.QuestionRefused, match="too late: nobody answered within"):
            answer(question, operator)

    question.refresh_from_db()
    run = Run.objects.get(pk=question.run_id)
    assert question.status == Question.Status.EXPIRED
    assert run.status == Run.Status.FAILED
    assert run.failure_reason == (
        "nobody answered 'Type the code the portal sent by SMS' within 10 minutes "
        "(asked of the person who launched the run)"
    )
    assert [d["run_key"] for d in destroyed] == [f"run-{run.pk}-x"]
    assert AuditEvent.objects.filter(action="question.expired", run_id=run.pk).count() == 1
    assert continuations == []


@pytest.mark.django_db
def test_cancelling_a_waiting_run_withdraws_its_question(
    operator: User,
    demo_workflow: Workflow,
    continuations: list[dict[str, Any]],
    destroyed: list[dict[str, Any]],
) -> None:
    question = asking(operator, demo_workflow)

    services.run_cancel(run_id=question.run_id, user=operator)

    question.refresh_from_db()
    assert question.status == Question.Status.VOIDED
    assert question.reason == "cancelled by olivia"
    with pytest.raises(questions.QuestionRefused, match="no longer waits for this answer"):
        answer(question, operator)
    assert continuations == []


@pytest.mark.django_db
def test_a_run_cancelled_after_the_answer_forgets_the_sealed_code(
    operator: User,
    demo_workflow: Workflow,
    continuations: list[dict[str, Any]],
    destroyed: list[dict[str, Any]],
) -> None:
    question = asking(operator, demo_workflow)
    answer(question, operator)

    services.run_cancel(run_id=question.run_id, user=operator)

    question.refresh_from_db()
    assert question.status == Question.Status.VOIDED
    assert question.answer_sealed == ""


@pytest.mark.django_db(transaction=True)
def test_ten_members_answering_at_once_make_one_answer_and_one_continuation(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    treasury = Group.objects.create(name="Treasury")
    question = asking(operator, demo_workflow, answered_by="Treasury")
    people = [user_with_role(Role.OPERATORS, username=f"member{i}") for i in range(10)]
    for person in people:
        person.groups.add(treasury)
    barrier = threading.Barrier(len(people))
    outcomes: list[str] = []

    def type_code(user: User) -> None:
        try:
            barrier.wait()
            answer(question, user)
            outcomes.append("answered")
        except questions.QuestionRefused as exc:
            outcomes.append(str(exc).split(" by ")[0])
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()

    threads = [threading.Thread(target=type_code, args=(user,)) for user in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    question.refresh_from_db()
    assert question.status == Question.Status.ANSWERED
    assert outcomes.count("answered") == 1
    assert outcomes.count("this question was already answered") == 9
    assert len(continuations) == 1
    assert AuditEvent.objects.filter(action="question.answered").count() == 1


@pytest.mark.django_db
def test_the_people_who_may_answer_are_told(
    operator: User,
    demo_workflow: Workflow,
    treasury: Group,
    mailoutbox: list[Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    from sessions.engine.plan import Question as Asked

    member = user_with_role(Role.REVIEWERS, username="tara", email="tara@example.test")
    member.groups.add(treasury)
    user_with_role(Role.REVIEWERS, username="rory", email="rory@example.test")
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    asked = Asked(
        step_index=2, step_id="which-supplier", text="Which supplier is meant?", answer="choice",
        options=("Nordwind GmbH", "Nordwind Logistik GmbH"), save_as="supplier",
        answered_by="Treasury", timeout_minutes=30,
    )  # fmt: skip

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        question = questions.question_open(run=Run.objects.get(pk=run.pk), question=asked)

    [mail] = mailoutbox
    assert mail.to == ["tara@example.test"]
    assert "Which supplier is meant?" in mail.subject
    assert f"/runs/{run.pk}/#question" in mail.body
    event = AuditEvent.objects.get(action="question.asked", object_id=str(question.pk))
    assert event.after is not None
    assert event.after["options"] == ["Nordwind GmbH", "Nordwind Logistik GmbH"]
    assert abs(question.expires_at - question.created_at - timedelta(minutes=30)) < timedelta(
        seconds=1
    )


@pytest.mark.django_db
def test_an_answer_whose_continuation_was_lost_is_sent_again_by_housekeeping(
    operator: User, demo_workflow: Workflow, continuations: list[dict[str, Any]]
) -> None:
    from sessions.durability import _continuation_lost

    question = asking(operator, demo_workflow)
    answer(question, operator)
    continuations.clear()  # the message a killed worker had taken

    assert not _continuation_lost(question.run_id, timezone.now() - timedelta(minutes=1))
    assert _continuation_lost(question.run_id, timezone.now() + timedelta(seconds=1))

    assert continuations == [
        {"task": "runs.answer", "queue": "host.h", "run_id": question.run_id,
         "question_id": question.pk}
    ]  # fmt: skip


def open_question(
    run: Run, *, answered_by: str = "Treasury", timeout_minutes: int = 15
) -> Question:
    """A question opened as the runner opens it (notifications sent once it commits)."""
    from sessions.engine.plan import Question as Asked

    asked = Asked(
        step_index=2, step_id="which-supplier", text="Which supplier is meant?", answer="choice",
        options=("Nordwind GmbH", "Nordwind Logistik GmbH"), save_as="supplier",
        answered_by=answered_by, timeout_minutes=timeout_minutes,
    )  # fmt: skip
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_ANSWER)
        return questions.question_open(run=services.lock_run(run.pk), question=asked)


@pytest.mark.parametrize(
    ("minutes", "after"),
    [(15, timedelta(minutes=10)), (60, timedelta(minutes=45)), (10, timedelta(minutes=5)),
     (6, timedelta(minutes=3)), (24 * 60, timedelta(hours=18))],
)  # fmt: skip
def test_the_reminder_comes_when_a_quarter_is_left_at_least_five_minutes_never_in_the_first_half(
    minutes: int, after: timedelta
) -> None:
    asked = timezone.now()
    question = Question(created_at=asked, expires_at=asked + timedelta(minutes=minutes))

    assert questions.question_reminder_at(question) == asked + after


@pytest.mark.django_db
def test_the_people_who_may_answer_are_reminded_once_before_the_timeout(
    operator: User,
    demo_workflow: Workflow,
    treasury: Group,
    mailoutbox: list[Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    member = user_with_role(Role.REVIEWERS, username="tara", email="tara@example.test")
    member.groups.add(treasury)
    user_with_role(Role.REVIEWERS, username="rory", email="rory@example.test")
    run = services.run_launch(workflow_id=demo_workflow.pk, user=operator, raw_inputs=INPUTS)
    with django_capture_on_commit_callbacks(execute=True):
        question = open_question(run)
    mailoutbox.clear()
    due = questions.question_reminder_at(question)

    with django_capture_on_commit_callbacks(execute=True):
        with time_machine.travel(due - timedelta(seconds=1), tick=False):
            assert questions.question_remind_due() == []
        with time_machine.travel(due, tick=False):
            assert questions.question_remind_due() == [question.pk]
            assert questions.question_remind_due() == []
        with time_machine.travel(question.expires_at - timedelta(seconds=1), tick=False):
            assert questions.question_remind_due() == []

    [mail] = mailoutbox
    assert mail.to == ["tara@example.test"]
    assert mail.subject.startswith(f"Reminder: run #{run.pk} of ")
    assert "still asks you: Which supplier is meant?" in mail.subject
    assert "Nobody has answered yet" in mail.body
    assert f"/runs/{run.pk}/#question" in mail.body
    question.refresh_from_db()
    assert question.reminded_at == due
    assert question.status == Question.Status.PENDING
    event = AuditEvent.objects.get(action="question.reminded")
    assert event.object_id == str(question.pk)
    assert event.run_id == run.pk


@pytest.mark.django_db
def test_an_answered_or_withdrawn_question_is_not_reminded(
    operator: User,
    demo_workflow: Workflow,
    continuations: list[dict[str, Any]],
    destroyed: list[dict[str, Any]],
    mailoutbox: list[Any],
) -> None:
    answered = asking(operator, demo_workflow)
    answer(answered, operator)
    withdrawn = asking(operator, demo_workflow)
    services.run_cancel(run_id=withdrawn.run_id, user=operator)

    with time_machine.travel(answered.expires_at - timedelta(minutes=1)):
        assert questions.question_remind_due() == []

    assert not AuditEvent.objects.filter(action="question.reminded").exists()
    assert Question.objects.filter(reminded_at__isnull=False).count() == 0


@pytest.mark.django_db(transaction=True)
def test_two_housekeeping_passes_at_once_remind_once(
    operator: User, demo_workflow: Workflow, mailoutbox: list[Any]
) -> None:
    operator.email = "olivia@example.test"
    operator.save(update_fields=["email"])
    question = asking(operator, demo_workflow)
    due = questions.question_reminder_at(question)
    barrier = threading.Barrier(2)
    results: list[list[int]] = []

    def housekeeping() -> None:
        try:
            barrier.wait()
            results.append(questions.question_remind_due())
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()

    with time_machine.travel(due + timedelta(seconds=1), tick=False):
        threads = [threading.Thread(target=housekeeping) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    assert sorted(results) == [[], [question.pk]]
    assert AuditEvent.objects.filter(action="question.reminded").count() == 1
    assert [m.to for m in mailoutbox] == [["olivia@example.test"]]
