"""Take control: who may, one at a time, and what the run and the audit trail record."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import User

from pandaweb.audit.bundles import run_bundle_to_file
from pandaweb.audit.models import AuditEvent
from pandaweb.core.roles import Role
from sessions import services
from sessions.engine.filmstrip import filmstrip_append
from sessions.events import run_live_group
from sessions.models import ControlSession, Run
from tests.approvals.test_views import evidence
from tests.factories import ApprovalRequestFactory, user_with_role, waiting_run
from tests.sessions.test_live import cookie_for, socket

CLICK = {"at": "2026-12-02T08:00:00+00:00", "kind": "click", "x": 640.0, "y": 400.0}


def running_run() -> Run:
    run = waiting_run()
    run.status = Run.Status.RUNNING
    run.save(update_fields=["status"])
    return run


@pytest.mark.django_db
def test_an_operator_takes_control_with_an_event_and_an_audit_entry() -> None:
    run = running_run()
    operator = user_with_role(Role.OPERATORS)

    session = services.control_open(run_id=run.pk, user_id=operator.pk, step_index=2)

    run.refresh_from_db()
    assert session.closed_at is None
    assert session.files_dir == f"control/{session.pk}"
    assert run.events.filter(type="control_opened").get().payload == {
        "session": session.pk, "by": operator.username, "before_step": 2,
    }  # fmt: skip
    opened = AuditEvent.objects.filter(action="run.control_opened").get()
    assert opened.actor_id == operator.pk
    assert opened.run_id == run.pk


@pytest.mark.django_db
@pytest.mark.parametrize("role", [Role.REVIEWERS, Role.COMPLIANCE, None])
def test_it_refuses_control_to_anyone_without_the_right(role: Role | None) -> None:
    run = running_run()
    person = user_with_role(role)

    with pytest.raises(services.RunError, match="not take control"):
        services.control_open(run_id=run.pk, user_id=person.pk, step_index=0)

    assert not ControlSession.objects.exists()
    assert not AuditEvent.objects.filter(action="run.control_opened").exists()


@pytest.mark.django_db
def test_it_refuses_a_second_controller_while_the_first_has_control() -> None:
    run = running_run()
    first, second = user_with_role(Role.OPERATORS), user_with_role(Role.OPERATORS)
    services.control_open(run_id=run.pk, user_id=first.pk, step_index=0)

    with pytest.raises(services.RunError, match=f"{first.username} has control"):
        services.control_open(run_id=run.pk, user_id=second.pk, step_index=0)

    assert ControlSession.objects.filter(run=run).count() == 1


@pytest.mark.django_db
def test_it_refuses_control_of_a_run_that_is_not_running() -> None:
    run = waiting_run()
    operator = user_with_role(Role.OPERATORS)

    with pytest.raises(services.RunError, match="this run is waiting for approval"):
        services.control_open(run_id=run.pk, user_id=operator.pk, step_index=0)


@pytest.mark.django_db
def test_closing_records_the_inputs_once_and_frees_the_run_for_the_next_controller() -> None:
    run = running_run()
    first, second = user_with_role(Role.OPERATORS), user_with_role(Role.OPERATORS)
    session = services.control_open(run_id=run.pk, user_id=first.pk, step_index=1)

    for _twice in range(2):
        services.control_close(
            session_id=session.pk, reason="handed back", inputs=[CLICK], navigated=True,
            typed=False, urls=["http://127.0.0.1:8001/lab/checkpoint"], frames=3,
        )  # fmt: skip

    session.refresh_from_db()
    assert session.closed_at is not None
    assert (session.inputs, session.navigated, session.typed, session.frames) == (
        [CLICK], True, False, 3,
    )  # fmt: skip
    closed = AuditEvent.objects.filter(action="run.control_closed").get().after or {}
    assert closed["input_events"] == [CLICK]
    assert closed["navigated"] is True
    assert run.events.filter(type="control_closed").count() == 1
    services.control_open(run_id=run.pk, user_id=second.pk, step_index=1)


@pytest.mark.django_db
def test_withdrawing_a_request_for_control_is_an_event_and_an_audit_entry() -> None:
    run = running_run()
    operator = user_with_role(Role.OPERATORS)

    services.control_request_withdraw(run_id=run.pk, user_id=operator.pk, during_step=1)

    run.refresh_from_db()
    event = run.events.get(type="control_request_withdrawn")
    assert (event.seq, event.payload) == (
        run.last_event_seq, {"by": operator.username, "during_step": 1},
    )  # fmt: skip
    withdrawn = AuditEvent.objects.get(action="run.control_request_withdrawn")
    assert (withdrawn.actor_id, withdrawn.run_id) == (operator.pk, run.pk)
    assert withdrawn.after == {"during_step": 2}
    assert not ControlSession.objects.exists()


@pytest.mark.django_db
def test_a_withdrawal_the_audit_trail_cannot_take_leaves_no_event_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = running_run()
    operator = user_with_role(Role.OPERATORS)

    def refuse(**kwargs: Any) -> None:
        raise RuntimeError("the audit trail is unavailable")

    monkeypatch.setattr("sessions.services.control.audit_record", refuse)
    with pytest.raises(RuntimeError):
        services.control_request_withdraw(run_id=run.pk, user_id=operator.pk, during_step=0)

    run.refresh_from_db()
    assert (run.last_event_seq, run.events.count()) == (0, 0)


@pytest.mark.django_db(transaction=True)
async def test_the_live_socket_refuses_control_of_a_waiting_run_in_words() -> None:
    run = await database_sync_to_async(waiting_run)()
    operator: User = await database_sync_to_async(user_with_role)(Role.OPERATORS)

    controlling = socket(f"/ws/runs/{run.pk}/live/", await cookie_for(operator))
    connected, _ = await controlling.connect()
    assert connected
    await controlling.send_to(text_data=json.dumps({"type": "control", "action": "take"}))
    answer = json.loads(await controlling.receive_from())
    await controlling.disconnect()

    assert answer == {
        "type": "refused",
        "reason": "Take control is possible while the run's browser is working; this run is "
        "waiting for approval.",
    }


@pytest.mark.django_db(transaction=True)
async def test_the_live_socket_refuses_control_to_a_reviewer_and_forwards_an_operators() -> None:
    run = await database_sync_to_async(running_run)()
    reviewer: User = await database_sync_to_async(user_with_role)(Role.REVIEWERS)
    operator: User = await database_sync_to_async(user_with_role)(Role.OPERATORS)

    watching = socket(f"/ws/runs/{run.pk}/live/", await cookie_for(reviewer))
    connected, _ = await watching.connect()
    assert connected
    await watching.send_to(text_data=json.dumps({"type": "control", "action": "take"}))
    answer = json.loads(await watching.receive_from())
    assert answer == {
        "type": "refused",
        "reason": "You may watch this run but not take control of it.",
    }
    await watching.disconnect()

    controlling = socket(f"/ws/runs/{run.pk}/live/", await cookie_for(operator))
    connected, _ = await controlling.connect()
    assert connected
    await controlling.send_to(text_data=json.dumps({"type": "control", "action": "take"}))
    # Nobody holds this run's browser here, so the request is forwarded and nothing refuses it.
    assert await controlling.receive_nothing(timeout=0.5)
    await controlling.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_live_socket_sends_a_frame_as_bytes_and_the_pages_dialog_as_text() -> None:
    run = await database_sync_to_async(running_run)()
    reviewer: User = await database_sync_to_async(user_with_role)(Role.REVIEWERS)
    watching = socket(f"/ws/runs/{run.pk}/live/", await cookie_for(reviewer))
    connected, _ = await watching.connect()
    assert connected
    layer = get_channel_layer()
    jpeg = b"\xff\xd8 the masked frame \xff\xd9"

    await layer.group_send(
        run_live_group(run.pk),
        {"type": "live.frame", "jpeg": jpeg, "width": 960, "height": 540,
         "device_width": 1280.0, "device_height": 720.0, "captured_at": 1.5, "masks": 2},
    )  # fmt: skip
    message = await watching.receive_output()
    await layer.group_send(
        run_live_group(run.pk),
        {"type": "live.dialog", "kind": "confirm", "message": "Remove supplier?",
         "default_prompt": ""},
    )  # fmt: skip
    dialog = json.loads(await watching.receive_from())
    await watching.disconnect()

    data = message["bytes"]
    (length,) = struct.unpack(">I", data[:4])
    assert json.loads(data[4 : 4 + length]) == {
        "width": 960, "height": 540, "device_width": 1280.0, "device_height": 720.0,
        "captured_at": 1.5, "masks": 2,
    }  # fmt: skip
    assert data[4 + length :] == jpeg
    assert dialog == {
        "type": "dialog", "kind": "confirm", "message": "Remove supplier?", "default_prompt": "",
    }  # fmt: skip


@pytest.mark.django_db
def test_the_evidence_bundle_holds_each_take_over_and_the_filmstrip(
    settings: Any, tmp_path: Path
) -> None:
    settings.RUN_FILES_DIR = tmp_path / "runs"
    run = running_run()
    operator = user_with_role(Role.OPERATORS)
    session = services.control_open(run_id=run.pk, user_id=operator.pk, step_index=0)
    control_dir = services.run_files_dir(run.pk) / session.files_dir
    control_dir.mkdir(parents=True)
    (control_dir / "inputs.jsonl").write_text(json.dumps(CLICK) + "\n")
    (control_dir / "frame-00001.jpg").write_bytes(b"\xff\xd8 a frame")
    services.control_close(
        session_id=session.pk, reason="handed back", inputs=[CLICK], navigated=False,
        typed=False, urls=[], frames=1,
    )  # fmt: skip
    for number in (1, 2):
        filmstrip_append(
            services.run_files_dir(run.pk), number=number, jpeg=b"\xff\xd8 film %d" % number,
            at=1_764_662_400.0 + number, masks=1,
        )  # fmt: skip
    compliance = user_with_role(Role.COMPLIANCE)

    path = run_bundle_to_file(run_id=run.pk, user=compliance)
    try:
        with zipfile.ZipFile(path) as bundle:
            names = set(bundle.namelist())
            timeline = json.loads(bundle.read("timeline.json"))
    finally:
        path.unlink()

    assert {
        f"control/{session.files_dir}/inputs.jsonl",
        f"control/{session.files_dir}/frame-00001.jpg",
        "filmstrip/filmstrip/frame-00001.jpg",
        "filmstrip/filmstrip/frame-00002.jpg",
    } <= names
    [control] = timeline["control_sessions"]
    assert (control["by"], control["inputs"]) == (operator.username, [CLICK])
    assert [frame["matches_record"] for frame in timeline["filmstrip"]] == [True, True]


@pytest.mark.django_db
def test_the_approval_page_says_a_person_had_control_and_what_they_did(client: Any) -> None:
    operators = [
        {"by": "olivia.operator", "inputs": 3, "navigated": True, "typed": True,
         "urls": ["http://127.0.0.1:8001/invoices"],
         "dialogs": ["a confirm dialog saying 'Leave?' — accepted by olivia.operator"]},
    ]  # fmt: skip
    approval = ApprovalRequestFactory.create(evidence=evidence(operators=operators))
    client.force_login(user_with_role(Role.REVIEWERS))

    body = client.get(f"/approvals/{approval.pk}/").content.decode()

    assert "A person had control of this run's browser before this step." in body
    assert (
        "olivia.operator: 3 inputs, typed, went to http://127.0.0.1:8001/invoices; a confirm "
        "dialog saying &#x27;Leave?&#x27; — accepted by olivia.operator"
    ) in body
