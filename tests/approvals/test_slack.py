"""Chat approvals in Slack, end to end through pandaweb's HTTP endpoints.

The real Slack Web API cannot be reached from here, so ``WebClient`` talks to a fake of it on
loopback (``tests/approvals/fake_slack.py``) that records every call. The callbacks are real:
signed with the signing secret and a timestamp exactly as Slack signs them.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from approvals import services as approvals
from approvals import slack
from approvals.models import ApprovalRequest
from pandaweb.core.roles import Role
from pandaweb.reviewers import services as reviewers
from pandaweb.reviewers.models import SlackCard, SlackIdentity
from tests.approvals.fake_slack import FakeSlack, block_action, signed, view_submission
from tests.approvals.reach import (
    CHANNEL,
    SECRET,
    TEAM,
    background,
    fake_slack,
    open_request,
    reach_workflow,
)
from tests.factories import user_with_role
from tests.patching import patch_destroy_sandbox
from workflows.models import Workflow

__all__ = ["background", "fake_slack"]

A = ApprovalRequest.Status
INTERACTIONS = "/integrations/slack/interactions"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def workflow(operator: User, acme_credential: Any) -> Workflow:
    return reach_workflow(operator, slack_channel=CHANNEL)


def linked(username: str, slack_user_id: str, role: Role = Role.REVIEWERS) -> User:
    user = user_with_role(role, username=username, email=f"{username}@example.test")
    SlackIdentity.objects.create(user=user, team_id=TEAM, slack_user_id=slack_user_id)
    return user


def button(approval: ApprovalRequest, evidence: str | None = None) -> str:
    return json.dumps({"a": approval.pk, "h": evidence or approval.evidence_sha256})


def click(
    approval: ApprovalRequest,
    slack_user: str,
    action: str = "approve",
    *,
    evidence: str | None = None,
    secret: str = SECRET,
) -> Any:
    fields = block_action(
        team=TEAM, user=slack_user, action_id=action, value=button(approval, evidence)
    )
    return Client().post(INTERACTIONS, **signed(secret, fields))


def ephemerals(fake: FakeSlack, slack_user: str) -> list[str]:
    return [
        c.params["text"] for c in fake.of("chat.postEphemeral") if c.params["user"] == slack_user
    ]


def card_text(call: Any) -> str:
    return json.dumps(call.params["blocks"])


def test_it_posts_a_card_to_the_workflows_channel_when_a_request_opens(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    approval = open_request(operator, workflow)

    [post] = fake_slack.of("chat.postMessage")
    assert post.params["channel"] == CHANNEL
    assert post.token == "xoxb-test-token"
    blocks = post.params["blocks"]
    text = card_text(post)
    assert approval.action in text
    assert "1,250.00 EUR" in text
    assert f"/approvals/{approval.pk}/" in text
    assert f"<!date^{int(approval.expires_at.timestamp())}^" in text
    [image] = [b for b in blocks if b["type"] == "image"]
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert [e["action_id"] for e in actions["elements"]] == ["approve", "reject", "open"]
    assert json.loads(actions["elements"][0]["value"]) == {
        "a": approval.pk,
        "h": approval.evidence_sha256,
    }
    card = SlackCard.objects.get(approval=approval)
    assert (card.channel, card.ts) == (CHANNEL, post.params.get("ts") or card.ts)

    # Slack fetches the picture without a session: the signed link works, a forged one does not.
    path = image["image_url"].removeprefix("http://127.0.0.1:8000")
    picture = Client().get(path)
    assert picture.status_code == 200
    assert picture["Content-Type"] == "image/png"
    assert Client().get(path.replace(".png", "x.png")).status_code == 404


def test_the_card_link_expires(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    approval = open_request(operator, workflow)
    url = slack.card_image_url(approval).removeprefix("http://127.0.0.1:8000")
    import time_machine

    with time_machine.travel(timezone.now() + timedelta(days=2)):
        assert Client().get(url).status_code == 404


def test_a_linked_reviewer_approves_from_slack_and_every_card_shows_it(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    rory = linked("rory", "U0RORY")
    approval = open_request(operator, workflow)

    response = click(approval, "U0RORY")

    assert response.status_code == 200
    approval.refresh_from_db()
    assert approval.status == A.APPROVED
    assert [d.reviewer for d in approval.decisions.all()] == [rory]
    assert {"task": "runs.continue", "run_id": approval.run_id, "approval_id": approval.pk} in [
        dict(s.items()) for s in background
    ]
    # The channel card and rory's direct message are both updated, without buttons.
    updates = fake_slack.of("chat.update")
    assert {u.params["channel"] for u in updates} == {CHANNEL, "D0RORY"}
    for update in updates:
        assert "Approved" in card_text(update)
        assert '"actions"' not in card_text(update)
    assert ephemerals(fake_slack, "U0RORY") == [
        f"Approved. Run #{approval.run_id} continues with the action."
    ]


def test_it_refuses_an_unlinked_slack_user_whatever_their_display_name(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    user_with_role(Role.REVIEWERS, username="someone")  # the payload's display name
    approval = open_request(operator, workflow)

    click(approval, "U0STRANGER")

    approval.refresh_from_db()
    assert approval.status == A.PENDING
    assert not approval.decisions.exists()
    [refusal] = ephemerals(fake_slack, "U0STRANGER")
    assert "not linked to a pandaweb user" in refusal
    assert fake_slack.of("chat.update") == []


def test_it_refuses_forged_and_stale_signatures(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    linked("rory", "U0RORY")
    approval = open_request(operator, workflow)
    fields = block_action(team=TEAM, user="U0RORY", action_id="approve", value=button(approval))

    forged = Client().post(INTERACTIONS, **signed("not-the-secret", fields))
    stale = Client().post(INTERACTIONS, **signed(SECRET, fields, timestamp=int(time.time()) - 600))
    unsigned = Client().post(
        INTERACTIONS, data=signed(SECRET, fields)["data"], content_type="text/plain"
    )

    assert [forged.status_code, stale.status_code, unsigned.status_code] == [401, 401, 401]
    assert "not signed by Slack" in forged.content.decode()
    approval.refresh_from_db()
    assert approval.status == A.PENDING
    assert fake_slack.of("chat.postEphemeral") == []


def test_it_refuses_a_replayed_callback(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    linked("rory", "U0RORY")
    linked("rita", "U0RITA")
    approval = open_request(operator, workflow, quorum=2)
    request = signed(
        SECRET, block_action(team=TEAM, user="U0RORY", action_id="approve", value=button(approval))
    )

    first = Client().post(INTERACTIONS, **request)
    again = Client().post(INTERACTIONS, **request)

    assert first.status_code == 200
    assert again.status_code == 401
    assert "replay" in again.content.decode()
    assert approval.decisions.count() == 1


def test_the_policy_holds_in_slack_self_approval_quorum_and_evidence(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    launcher = linked("lena", "U0LENA", Role.OPERATORS)
    launcher.groups.add(Group.objects.get(name=Role.REVIEWERS.value))
    rory, rita = linked("rory", "U0RORY"), linked("rita", "U0RITA")
    approval = open_request(launcher, workflow, quorum=2)

    click(approval, "U0LENA")
    assert "You launched this run" in ephemerals(fake_slack, "U0LENA")[0]

    click(approval, "U0RORY", evidence="0" * 64)
    assert "The evidence changed since you opened it" in ephemerals(fake_slack, "U0RORY")[0]
    assert not approval.decisions.exists()

    click(approval, "U0RORY")
    approval.refresh_from_db()
    assert approval.status == A.PENDING
    assert "(1 of 2)" in ephemerals(fake_slack, "U0RORY")[1]
    assert "(1 of 2)" in card_text(fake_slack.of("chat.update")[-1])

    click(approval, "U0RITA")
    approval.refresh_from_db()
    assert approval.status == A.APPROVED
    assert {d.reviewer for d in approval.decisions.all()} == {rory, rita}
    assert "Approved" in card_text(fake_slack.of("chat.update")[-1])


def test_a_late_click_on_an_expired_request_is_refused_and_the_card_says_expired(
    operator: User,
    workflow: Workflow,
    fake_slack: FakeSlack,
    background: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    destroyed: list[dict[str, Any]] = []
    patch_destroy_sandbox(monkeypatch, destroyed.append)
    linked("rory", "U0RORY")
    approval = open_request(operator, workflow)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    click(approval, "U0RORY")

    approval.refresh_from_db()
    assert approval.status == A.EXPIRED
    assert not approval.decisions.exists()
    assert "already expired" in ephemerals(fake_slack, "U0RORY")[0]
    assert "Expired" in card_text(fake_slack.of("chat.update")[-1])

    click(approval, "U0RORY")  # and again, now that it is closed
    assert "already expired" in ephemerals(fake_slack, "U0RORY")[1]
    assert [d["run_key"] for d in destroyed] == [f"run-{approval.run_id}-x"]


def test_reject_asks_for_a_reason_in_a_modal_then_rejects(
    operator: User,
    workflow: Workflow,
    fake_slack: FakeSlack,
    background: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    destroyed: list[dict[str, Any]] = []
    patch_destroy_sandbox(monkeypatch, destroyed.append)
    linked("rory", "U0RORY")
    approval = open_request(operator, workflow)

    click(approval, "U0RORY", "reject")
    [opened] = fake_slack.of("views.open")
    assert opened.params["trigger_id"].startswith("trigger-")
    metadata = opened.params["view"]["private_metadata"]
    approval.refresh_from_db()
    assert approval.status == A.PENDING

    empty = Client().post(
        INTERACTIONS,
        **signed(SECRET, view_submission(team=TEAM, user="U0RORY", metadata=metadata, reason=" ")),
    )
    assert empty.json()["response_action"] == "errors"
    assert "needs a reason" in empty.json()["errors"]["reason"]

    done = Client().post(
        INTERACTIONS,
        **signed(
            SECRET,
            view_submission(team=TEAM, user="U0RORY", metadata=metadata, reason="Wrong payee"),
        ),
    )
    assert done.status_code == 200
    assert done.content == b""
    approval.refresh_from_db()
    assert approval.status == A.REJECTED
    assert approval.decisions.get().reason == "Wrong payee"
    assert "Wrong payee" in card_text(fake_slack.of("chat.update")[-1])
    assert [d["run_key"] for d in destroyed] == [f"run-{approval.run_id}-x"]


def test_a_decision_on_the_page_updates_the_card(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    rory = user_with_role(Role.REVIEWERS, username="rory")
    approval = open_request(operator, workflow)

    approvals.approval_decide(
        approval_id=approval.pk, user=rory, approve=True, evidence_sha256=approval.evidence_sha256
    )

    [update] = fake_slack.of("chat.update")
    assert update.params["channel"] == CHANNEL
    assert "Approved* by rory" in card_text(update)


def test_a_passkey_request_sends_the_reviewer_to_the_page(
    operator: User, acme_credential: Any, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    workflow = reach_workflow(operator, slack_channel=CHANNEL, passkey="always")
    linked("rory", "U0RORY")
    approval = open_request(operator, workflow)

    posts = fake_slack.of("chat.postMessage")
    assert {p.params["channel"] for p in posts} == {CHANNEL, "U0RORY"}  # and rory's DM
    post = posts[0]
    [actions] = [b for b in post.params["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for e in actions["elements"]] == ["open"]
    assert "needs a passkey" in card_text(post)

    click(approval, "U0RORY")  # an Approve button of a card built without the step-up
    approval.refresh_from_db()
    assert approval.status == A.PENDING
    assert "needs your passkey" in ephemerals(fake_slack, "U0RORY")[0]
    assert f"/approvals/{approval.pk}/" in ephemerals(fake_slack, "U0RORY")[0]
    click(approval, "U0RORY", "reject")
    assert "needs your passkey" in ephemerals(fake_slack, "U0RORY")[1]
    assert fake_slack.of("views.open") == []


def test_a_slack_account_is_linked_only_by_a_fresh_code_sent_through_slack(
    fake_slack: FakeSlack, db: None
) -> None:
    rory = user_with_role(Role.REVIEWERS, username="rory")
    code = reviewers.slack_link_code_issue(user=rory)

    def command(text: str, user: str = "U0RORY", secret: str = SECRET) -> Any:
        fields = {"team_id": TEAM, "user_id": user, "command": "/pandaweb", "text": text}
        return Client().post("/integrations/slack/commands", **signed(secret, fields))

    assert command(f"link {code}", secret="forged").status_code == 401
    assert command("link WRONGCODE1").json()["text"].startswith("Not linked")
    assert not SlackIdentity.objects.exists()

    answer = command(f"link {code.lower()}")
    assert answer.json() == {
        "response_type": "ephemeral",
        "text": "Linked: your Slack account now decides as pandaweb user rory.",
    }
    identity = SlackIdentity.objects.get()
    assert (identity.user, identity.team_id, identity.slack_user_id) == (rory, TEAM, "U0RORY")

    assert "unknown, used or expired" in command(f"link {code}", user="U0MALLORY").json()["text"]
    assert SlackIdentity.objects.get().slack_user_id == "U0RORY"


# Questions ---------------------------------------------------------------------------------------

CODE = "482913"


def ask_for_a_code(launcher: User, workflow: Workflow, answered_by: str = "launcher") -> Any:
    """A run of ``workflow`` asking its launcher for a one-time code, as the runner asks."""
    from django.db import transaction

    from approvals import questions
    from sessions import services
    from sessions.engine.plan import Question as Asked
    from sessions.models import Run
    from tests.approvals.reach import INPUTS

    run = services.run_launch(workflow_id=workflow.pk, user=launcher, raw_inputs=INPUTS)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.AWAITING_ANSWER, sandbox={"backend": "local", "run_key": "k", "host": "h"}
    )
    asked = Asked(
        step_index=4, step_id="ask-sms-code", text="Type the code the portal sent by SMS",
        answer="code", options=(), save_as="sms_code", answered_by=answered_by, timeout_minutes=15,
    )  # fmt: skip
    with transaction.atomic():
        return questions.question_open(run=services.lock_run(run.pk), question=asked)


def said(call: Any) -> str:
    return json.dumps(call.params, ensure_ascii=False)


def test_a_question_goes_to_the_workflows_channel_and_its_people_with_a_link_never_the_code(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    from approvals import questions

    SlackIdentity.objects.create(user=operator, team_id=TEAM, slack_user_id="U0OLIVIA")
    linked("rory", "U0RORY")  # a reviewer, not asked: no message

    question = ask_for_a_code(operator, workflow)

    posts = fake_slack.wait_for("chat.postMessage", 2)
    assert sorted(p.params["channel"] for p in posts) == [CHANNEL, "U0OLIVIA"]
    for post in posts:
        blocks = post.params["blocks"]
        text = card_text(post)
        assert "Type the code the portal sent by SMS" in text
        assert "olivia, who launched the run" in text
        assert f"http://127.0.0.1:8000/runs/{question.run_id}/#question" in text
        assert f"<!date^{int(question.expires_at.timestamp())}^" in text
        # Answering stays in pandaweb: a link, no buttons that decide, no input.
        [actions] = [b for b in blocks if b["type"] == "actions"]
        assert [(e["action_id"], e["url"]) for e in actions["elements"]] == [
            ("open", f"http://127.0.0.1:8000/runs/{question.run_id}/#question")
        ]
        assert not [b for b in blocks if b["type"] == "input"]

    questions.question_answer(question_id=question.pk, user=operator, answer=CODE)
    with time_machine.travel(questions.question_reminder_at(question) + timedelta(seconds=1)):
        assert questions.question_remind_due() == []  # answered: nobody is reminded

    # Every copy now says it was answered, and by whom: nobody follows a link to answer it again.
    updates = fake_slack.wait_for("chat.update", 2)
    posted = question.slack_messages.values_list("channel", "ts")
    assert sorted((u.params["channel"], u.params["ts"]) for u in updates) == sorted(posted)
    assert {channel for channel, _ in posted} == {CHANNEL, "D0OLIVIA"}
    for update in updates:
        text = card_text(update)
        assert "Answered* by olivia" in text
        assert not [b for b in update.params["blocks"] if b["type"] == "actions"]
    assert len(fake_slack.of("chat.postMessage")) == 2
    assert all(CODE not in said(call) for call in fake_slack.calls)
    # Told once: the next look finds every message already showing it.
    assert slack.slack_question_messages_update(question_id=question.pk) == 0


def test_the_questions_messages_say_when_nobody_answered_in_time(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    from approvals import questions

    question = ask_for_a_code(operator, workflow)
    fake_slack.wait_for("chat.postMessage", 1)

    with time_machine.travel(question.expires_at + timedelta(seconds=1)):
        assert questions.question_expire_due() == [question.pk]

    [update] = fake_slack.wait_for("chat.update", 1)
    assert [(update.params["channel"], update.params["ts"])] == list(
        question.slack_messages.values_list("channel", "ts")
    )
    assert "Nobody answered* in time; the run failed" in card_text(update)
    assert not [b for b in update.params["blocks"] if b["type"] == "actions"]


def test_a_group_question_says_which_group_and_its_reminder_goes_the_same_ways(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    from approvals import questions

    treasury = Group.objects.create(name="Treasury")
    tara = linked("tara", "U0TARA")
    tara.groups.add(treasury)
    question = ask_for_a_code(operator, workflow, answered_by="Treasury")
    first = fake_slack.wait_for("chat.postMessage", 2)
    assert sorted(p.params["channel"] for p in first) == [CHANNEL, "U0TARA"]
    assert "members of Treasury" in card_text(first[0])

    with time_machine.travel(questions.question_reminder_at(question) + timedelta(seconds=1)):
        assert questions.question_remind_due() == [question.pk]
        assert questions.question_remind_due() == []

    posts = fake_slack.wait_for("chat.postMessage", 4)[2:]
    assert sorted(p.params["channel"] for p in posts) == [CHANNEL, "U0TARA"]
    for post in posts:
        text = card_text(post)
        assert "Reminder, still waiting for an answer" in text
        assert "members of Treasury" in text
        assert f"/runs/{question.run_id}/#question" in text
    assert len(fake_slack.of("chat.postMessage")) == 4


def posted_cards(fake: FakeSlack) -> list[Any]:
    return [c for c in fake.of("chat.postMessage") if "thread_ts" not in c.params]


def thread_replies(fake: FakeSlack) -> list[Any]:
    return [c for c in fake.of("chat.postMessage") if "thread_ts" in c.params]


def test_a_reminder_updates_each_card_and_replies_in_its_thread_instead_of_a_second_card(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    linked("rory", "U0RORY")
    approval = open_request(operator, workflow)
    ApprovalRequest.objects.filter(pk=approval.pk).update(remind_before_minutes=10)
    cards = {c.channel: c.ts for c in SlackCard.objects.filter(approval=approval)}
    assert set(cards) == {CHANNEL, "D0RORY"}

    with time_machine.travel(approval.expires_at - timedelta(minutes=9), tick=False):
        assert approvals.approval_remind_due() == [approval.pk]

    assert len(posted_cards(fake_slack)) == 2  # no second card, in the channel or the DM
    replies = thread_replies(fake_slack)
    assert {(r.params["channel"], r.params["thread_ts"]) for r in replies} == set(cards.items())
    for reply in replies:
        assert reply.params["text"].startswith("Reminder: expires in 9 min")
    updates = fake_slack.of("chat.update")
    assert {(u.params["channel"], u.params["ts"]) for u in updates} == set(cards.items())
    for update in updates:
        assert "Reminder: expires in 9 min" in card_text(update)
        assert update.params["blocks"][1]["text"]["text"].startswith(":alarm_clock:")

    click(approval, "U0RORY")
    # Decided: the cards say so, and the reminder is gone from them.
    for update in fake_slack.of("chat.update")[2:]:
        assert "Approved" in card_text(update)
        assert "Reminder" not in card_text(update)


def test_an_escalation_updates_the_cards_to_say_to_which_group(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    linked("rory", "U0RORY")
    tess = linked("tess", "U0TESS", role=Role.ADMINS)
    tess.groups.add(Group.objects.create(name="Treasury"))
    approval = open_request(operator, workflow)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        escalate_after_minutes=20, escalation_group="Treasury"
    )
    assert {c.channel for c in SlackCard.objects.all()} == {CHANNEL, "D0RORY", "D0TESS"}

    with time_machine.travel(approval.created_at + timedelta(minutes=21), tick=False):
        assert approvals.approval_escalate_due() == [approval.pk]

    updates = fake_slack.of("chat.update")
    assert {u.params["channel"] for u in updates} == {CHANNEL, "D0RORY", "D0TESS"}
    for update in updates:
        assert "Escalated to Treasury" in card_text(update)
    # Tess already had the card (as an admin): she is told in its thread, not with a copy.
    assert len(posted_cards(fake_slack)) == 3
    replies = {r.params["channel"]: r.params["text"] for r in thread_replies(fake_slack)}
    assert set(replies) == {CHANNEL, "D0TESS"}
    assert all(text.startswith("Escalated to Treasury") for text in replies.values())


def test_an_escalation_brings_the_card_to_a_member_who_had_none(
    operator: User, workflow: Workflow, fake_slack: FakeSlack, background: list[dict[str, Any]]
) -> None:
    approval = open_request(operator, workflow)
    tess = linked("tess", "U0TESS", role=Role.OPERATORS)
    tess.groups.add(Group.objects.create(name="Treasury"))
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        escalate_after_minutes=20, escalation_group="Treasury"
    )

    with time_machine.travel(approval.created_at + timedelta(minutes=21), tick=False):
        assert approvals.approval_escalate_due() == [approval.pk]

    new = [c for c in posted_cards(fake_slack) if c.params["channel"] == "U0TESS"]
    assert len(new) == 1
    assert new[0].params["text"].startswith("Escalated to Treasury. Approval needed: ")
    assert "Escalated to Treasury" in card_text(new[0])
    assert SlackCard.objects.get(channel="D0TESS").addressed_to == "U0TESS"
