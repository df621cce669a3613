"""The audit trail by team: every team's event names its team and joins that team's own chain, a
team's trail exports and verifies without the others', and a team's compliance person reaches
only their teams' events."""

from __future__ import annotations

import ast
import io
import itertools
import json
import zipfile
from io import StringIO
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse
from pytest_django.fixtures import Settings

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from pandaweb.audit import chain, export, signing
from pandaweb.audit.export import verify_export
from pandaweb.audit.exports import AuditExportError, AuditFilter, audit_export
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record, audit_verify_database, audit_verify_team
from pandaweb.audit.triggers import append_only_suspended
from pandaweb.core.models import Team
from pandaweb.core.roles import Role
from sessions.models import Run
from sessions.services import run_launch
from tests.api.conftest import Api, make_token
from tests.factories import (
    ApprovalRequestFactory,
    member_of,
    user_with_role,
    waiting_run,
)
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def data_dir(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(signing.ENV_NAME, raising=False)
    settings.DATA_DIR = tmp_path / "data"
    return Path(settings.DATA_DIR)


def run_of(team: Team) -> Run:
    """A run parked at its gate, of a workflow of ``team``."""
    run = waiting_run()
    Workflow.objects.filter(pk=run.workflow_id).update(team=team)
    Run.objects.filter(pk=run.pk).update(team=team)
    run.refresh_from_db()
    return run


def record(action: str, *, team: Team | None = None, **kwargs: Any) -> AuditEvent:
    with transaction.atomic():
        return audit_record(
            action=action,
            object_type=kwargs.pop("object_type", "workflow"),
            object_id=kwargs.pop("object_id", 1),
            team_id=team.pk if team is not None else None,
            **kwargs,
        )


def interleaved(payables: Team, procurement: Team) -> None:
    """Events of two teams and of the installation, mixed along the global chain."""
    for number in range(3):
        record("workflow.edited", team=payables, object_id=number)
        record("workflow.edited", team=procurement, object_id=number)
        record("auth.logged_in", object_type="user", object_id=number)


def jsonl(path: Path) -> list[dict[str, Any]]:
    with zipfile.ZipFile(path) as archive:
        return [json.loads(line) for line in archive.read("events.jsonl").splitlines()]


def rewrite_member(path: Path, name: str, content: bytes) -> None:
    """Replace one file of an export zip, leaving the others (and the signed manifest) as they
    are: what someone editing a copy of an export would do."""
    with zipfile.ZipFile(path) as archive:
        files = {info.filename: archive.read(info) for info in archive.infolist()}
    files[name] = content
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)


def lines(records: list[dict[str, Any]]) -> bytes:
    return b"".join(
        json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        for r in records
    )


def verify_command(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=err)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


# The team on every event -------------------------------------------------------------------------


def test_a_launch_and_a_decision_are_recorded_on_the_runs_team(
    payables: Team, procurement: Team
) -> None:
    workflow = run_of(payables).workflow
    operator = member_of(payables, Role.OPERATORS)
    # A global reviewer: who decides is the approvals' rule; the event goes to the run's team.
    reviewer = user_with_role(Role.REVIEWERS)

    run = run_launch(workflow_id=workflow.pk, user=operator, raw_inputs={})
    approval = ApprovalRequestFactory.create(run=run_of(payables))
    approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        reason="ok",
        evidence_sha256=approval.evidence_sha256,
    )

    launched = AuditEvent.objects.get(action="run.launched", run_id=run.pk)
    decided = AuditEvent.objects.get(action="approval.decided", approval_id=approval.pk)
    assert launched.team_id == payables.pk
    assert decided.team_id == payables.pk
    assert AuditEvent.objects.filter(team_id=procurement.pk).count() == 0
    assert audit_verify_team(team_id=payables.pk).ok
    assert audit_verify_database().ok


def test_a_runs_event_recorded_without_its_team_is_given_the_runs(payables: Team) -> None:
    run = run_of(payables)

    event = record("run.noted", object_type="run", object_id=run.pk, run_id=run.pk)

    assert event.team_id == payables.pk
    assert event.team_prev_hash is not None


def test_an_installation_event_has_no_team_and_no_team_link() -> None:
    person = user_with_role(None)

    event = record("auth.logged_in", object_type="user", object_id=person.pk, actor=person)

    assert (event.team_id, event.team_prev_hash, event.team_hash) == (None, None, None)
    assert audit_verify_database().ok


# The team chain ----------------------------------------------------------------------------------


def test_each_team_event_links_to_the_previous_event_of_its_own_team(
    payables: Team, procurement: Team
) -> None:
    interleaved(payables, procurement)

    ours = list(AuditEvent.objects.filter(team_id=payables.pk).order_by("sequence"))

    assert ours[0].team_prev_hash == chain.GENESIS
    for before, after in itertools.pairwise(ours):
        assert after.team_prev_hash == before.team_hash
        assert after.prev_hash != before.hash  # another team's event sits between them
    result = audit_verify_team(team_id=payables.pk)
    assert (result.ok, result.count, result.last_hash) == (True, 3, ours[-1].team_hash)
    assert audit_verify_database().ok


def test_an_event_written_before_team_chains_still_verifies() -> None:
    # As it was written before: no team fields in what was hashed (a team_id only set by the
    # version before team chains, which did not hash it).
    with transaction.atomic():
        first = audit_record(action="auth.logged_in", object_type="user", object_id=1)
    fields = {**first.chain_fields(), "sequence": 2, "prev_hash": first.hash, "team_id": 7}
    old_hash = chain.event_hash({name: fields[name] for name in chain.HASHED_FIELDS}, first.hash)
    with append_only_suspended(connection):
        AuditEvent.objects.create(
            **{name: fields[name] for name in chain.HASHED_FIELDS if name != "actor_id"},
            team_id=7,
            hash=old_hash,
        )

    assert audit_verify_database().ok
    assert record("auth.logged_out", object_type="user").sequence == 3
    assert audit_verify_database().ok


def test_the_team_id_of_a_team_event_is_under_its_hash(payables: Team, procurement: Team) -> None:
    interleaved(payables, procurement)
    moved = AuditEvent.objects.filter(team_id=payables.pk).order_by("sequence")[1]

    with append_only_suspended(connection):
        AuditEvent.objects.filter(pk=moved.pk).update(team_id=procurement.pk)

    result = audit_verify_database()
    assert (result.ok, result.first_bad_sequence) == (False, moved.sequence)
    assert result.reason == "hash does not match the event's content"


def test_verify_team_detects_an_edited_removed_and_reordered_event(
    payables: Team, procurement: Team
) -> None:
    interleaved(payables, procurement)
    rows = list(
        AuditEvent.objects.filter(team_id=payables.pk)
        .order_by("sequence")
        .values(*chain.STORED_FIELDS)
    )
    edited = [dict(row) for row in rows]
    edited[1]["object_id"] = "99"

    assert chain.verify_team(rows, team_id=payables.pk).ok
    assert chain.verify_team(edited, team_id=payables.pk).reason == (
        "hash does not match the event's content"
    )
    removed = chain.verify_team([rows[0], rows[2]], team_id=payables.pk)
    assert (removed.first_bad_sequence, removed.reason) == (
        rows[2]["sequence"],
        "team_prev_hash does not match the team's previous event",
    )
    reordered = chain.verify_team([rows[1], rows[0]], team_id=payables.pk)
    assert not reordered.ok
    foreign = chain.verify_team(rows, team_id=procurement.pk)
    assert foreign.reason == f"the event is not on the chain of team {procurement.pk}"


def test_audit_verify_team_checks_one_teams_chain_in_the_database(
    payables: Team, procurement: Team
) -> None:
    interleaved(payables, procurement)
    theirs = AuditEvent.objects.filter(team_id=procurement.pk).order_by("sequence")[1]

    code, out, _ = verify_command("--team", "payables")
    assert code == 0
    assert out.startswith("audit chain of team payables OK: 3 events, team head ")

    with append_only_suspended(connection):
        AuditEvent.objects.filter(pk=theirs.pk).update(object_id="edited")

    assert verify_command("--team", "payables")[0] == 0  # not payables' event
    code, _, err = verify_command("--team", "procurement")
    assert code == 1
    assert err == (
        f"audit chain of team procurement BROKEN at sequence {theirs.sequence}: "
        "hash does not match the event's content\n"
    )
    with pytest.raises(CommandError, match=r"^no team has the slug 'nobody'$"):
        verify_command("--team", "nobody")


# Team exports ------------------------------------------------------------------------------------


def test_a_teams_export_holds_its_events_only_and_verifies_alone(
    data_dir: Path, payables: Team, procurement: Team, tmp_path: Path
) -> None:
    interleaved(payables, procurement)
    carla = member_of(payables, Role.COMPLIANCE, username="carla")
    path = tmp_path / "payables.zip"

    with path.open("wb") as out:
        manifest = audit_export(user=carla, filters=AuditFilter(), out=out)

    records = jsonl(path)
    assert {r["team_id"] for r in records} == {payables.pk}
    assert len(records) == 3
    assert manifest.team is not None
    assert manifest.team["slug"] == "payables"
    assert manifest.team["chained"] is True
    assert manifest.team["first_team_prev_hash"] == chain.GENESIS
    assert manifest.team["last_team_hash"] == records[-1]["team_hash"]
    check = verify_export(path, public_key=signing.public_key_b64())
    assert check.ok, check.reason
    exported = AuditEvent.objects.get(action="audit.exported")
    assert exported.team_id == payables.pk
    code, said, _ = verify_command("--export", str(path))
    assert code == 0
    assert "of team payables, its chain checked alone" in said


@pytest.fixture
def team_export(data_dir: Path, payables: Team, procurement: Team, tmp_path: Path) -> Path:
    interleaved(payables, procurement)
    record("workflow.edited", team=payables, object_id=3)
    carla = member_of(payables, Role.COMPLIANCE, username="carla")
    path = tmp_path / "payables.zip"
    with path.open("wb") as out:
        audit_export(user=carla, filters=AuditFilter(), out=out)
    return path


def test_an_edited_event_of_a_team_export_is_detected(team_export: Path) -> None:
    records = jsonl(team_export)
    records[1]["object_id"] = "edited"
    rewrite_member(team_export, "events.jsonl", lines(records))

    check = verify_export(team_export, public_key=signing.public_key_b64())

    assert not check.ok
    assert check.first_bad_sequence == records[1]["sequence"]
    assert check.reason == "hash does not match the event's content"


def test_a_removed_event_of_a_team_export_is_detected_by_its_team_link(
    team_export: Path, payables: Team
) -> None:
    records = jsonl(team_export)
    del records[1]
    # Even with the file's signed hashes out of the way, the team chain breaks where it was.
    check = chain.verify_team(records, team_id=payables.pk)
    assert (check.first_bad_sequence, check.reason) == (
        records[1]["sequence"],
        "team_prev_hash does not match the team's previous event",
    )
    rewrite_member(team_export, "events.jsonl", lines(records))

    assert not verify_export(team_export, public_key=signing.public_key_b64()).ok


def test_another_teams_event_cannot_be_slipped_into_a_team_export(
    team_export: Path, procurement: Team
) -> None:
    records = jsonl(team_export)
    theirs = AuditEvent.objects.filter(team_id=procurement.pk).order_by("sequence").first()
    assert theirs is not None
    foreign = json.loads(chain.canonical(theirs.chain_fields()))
    foreign |= {"hash": theirs.hash, "team_hash": theirs.team_hash}
    records.insert(1, foreign)
    records.sort(key=lambda r: r["sequence"])
    rewrite_member(team_export, "events.jsonl", lines(records))

    check = verify_export(team_export, public_key=signing.public_key_b64())

    assert not check.ok
    assert check.first_bad_sequence == theirs.sequence


def test_a_global_compliance_person_exports_one_team_or_the_whole_trail(
    data_dir: Path, payables: Team, procurement: Team, tmp_path: Path
) -> None:
    interleaved(payables, procurement)
    carla = user_with_role(Role.COMPLIANCE, username="carla")
    trail = AuditEvent.objects.count()  # with the role changes of making carla

    whole, team = io.BytesIO(), io.BytesIO()
    everything = audit_export(user=carla, filters=AuditFilter(), out=whole)
    one = audit_export(user=carla, filters=AuditFilter(team="procurement"), out=team)

    assert everything.team is None
    assert everything.count == trail
    assert one.team is not None
    assert one.team["slug"] == "procurement"
    assert one.count == 3
    assert verify_export(whole, public_key=signing.public_key_b64()).ok
    assert verify_export(team, public_key=signing.public_key_b64()).ok


def test_compliance_of_one_team_cannot_export_another_teams_trail(
    data_dir: Path, payables: Team, procurement: Team, tmp_path: Path
) -> None:
    interleaved(payables, procurement)
    carla = member_of(payables, Role.COMPLIANCE, username="carla")
    before = AuditEvent.objects.count()

    # The same words as for a team that does not exist: another team's slug leaks nothing.
    with pytest.raises(AuditExportError, match=r"^no team has the slug 'procurement'$"):
        audit_export(user=carla, filters=AuditFilter(team="procurement"), out=io.BytesIO())
    with pytest.raises(AuditExportError, match=r"^no team has the slug 'nowhere'$"):
        audit_export(user=carla, filters=AuditFilter(team="nowhere"), out=io.BytesIO())

    assert AuditEvent.objects.count() == before


def test_the_export_command_exports_a_team(
    data_dir: Path, payables: Team, procurement: Team, tmp_path: Path
) -> None:
    interleaved(payables, procurement)
    user_with_role(Role.COMPLIANCE, username="carla")
    path = tmp_path / "procurement.zip"
    out = StringIO()

    call_command("audit_export", out=str(path), as_user="carla", team="procurement", stdout=out)

    assert out.getvalue().startswith("exported 3 events of team procurement (sequences ")
    assert verify_command("--export", str(path))[0] == 0


# The pages ---------------------------------------------------------------------------------------


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)  # itself an installation event (auth.logged_in)
    return client


def test_the_trail_page_shows_a_team_person_their_teams_events_only(
    payables: Team, procurement: Team
) -> None:
    interleaved(payables, procurement)
    carla = member_of(payables, Role.COMPLIANCE, username="carla")
    admin = user_with_role(Role.ADMINS, username="ada")
    before = AuditEvent.objects.count()

    mine = signed_in(carla).get(reverse("audit:index"))
    everything = signed_in(admin).get(reverse("audit:index"))
    searched = signed_in(carla).get(reverse("audit:index"), {"action": "auth."})

    assert [r.event.team_id for r in mine.context["rows"]] == [payables.pk] * 3
    assert mine.context["total"] == 3
    # The sign-ins of both (installation events) are listed for the admin only.
    assert everything.context["total"] == before + 2
    assert searched.context["total"] == 0


def test_another_teams_run_timeline_is_no_such_run(payables: Team, procurement: Team) -> None:
    ours, theirs = run_of(payables), run_of(procurement)
    carla = member_of(payables, Role.COMPLIANCE, username="carla")
    client = signed_in(carla)

    assert client.get(reverse("audit:run", args=[ours.pk])).status_code == 200
    refused = client.get(reverse("audit:run", args=[theirs.pk]))
    assert refused.status_code == 404
    bundle = client.post(reverse("audit:run_bundle", args=[theirs.pk]))
    assert bundle.status_code == 404


def test_verifying_on_the_page_checks_a_team_persons_chains_alone(
    payables: Team, procurement: Team
) -> None:
    interleaved(payables, procurement)
    carla = member_of(payables, Role.COMPLIANCE, username="carla")
    theirs = AuditEvent.objects.filter(team_id=procurement.pk).first()
    assert theirs is not None
    with append_only_suspended(connection):
        AuditEvent.objects.filter(pk=theirs.pk).update(object_id="edited")

    response = signed_in(carla).post(reverse("audit:verify"))

    result = response.context["verify"]
    assert result.ok  # payables' chain is intact; procurement's edit is not theirs to see
    # carla's own sign-in is an installation event: on the global chain only.
    assert result.count == 3


def test_decisions_of_another_teams_approval_stay_on_that_teams_chain(
    payables: Team, procurement: Team
) -> None:
    approval = ApprovalRequestFactory.create(run=run_of(procurement))
    reviewer = user_with_role(Role.REVIEWERS)

    approval_decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        reason="fine",
        evidence_sha256=approval.evidence_sha256,
    )

    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalRequest.Status.APPROVED
    assert not AuditEvent.objects.filter(team_id=payables.pk).exists()
    assert audit_verify_team(team_id=procurement.pk).count >= 1


def test_the_team_columns_were_added_without_dropping_the_append_only_triggers(
    payables: Team,
) -> None:
    event = record("workflow.edited", team=payables)

    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(team_hash=chain.GENESIS)
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()


@pytest.mark.parametrize("module", [chain, export])
def test_the_offline_verifier_imports_no_django(module: ModuleType) -> None:
    # An auditor verifies a team's export with chain.py and export.py alone.
    tree = ast.parse(Path(str(module.__file__)).read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
        )
    }

    assert not imported & {"django", "celery", "channels", "sessions", "workflows", "approvals"}


def test_a_team_compliance_token_exports_and_verifies_its_team_only(
    data_dir: Path, payables: Team, procurement: Team
) -> None:
    interleaved(payables, procurement)
    carla = member_of(payables, Role.COMPLIANCE, username="carla")
    api = Api(make_token(carla))

    answer = api.get("/audit/export")
    refused = api.get("/audit/export", {"team": "procurement"})
    verified = api.get("/audit/verify").json()

    assert answer.status_code == 200
    check = verify_export(io.BytesIO(b"".join(answer.streaming_content)))
    assert check.ok, check.reason
    assert check.manifest is not None
    assert check.manifest["team"]["slug"] == "payables"
    assert refused.status_code == 422
    assert json.loads(refused.content)["detail"] == "no team has the slug 'procurement'"
    assert verified["team"] == "payables"
    assert verified["ok"] is True
    assert verified["count"] == AuditEvent.objects.filter(team_id=payables.pk).count()
    assert api.get("/audit/verify", {"team": "procurement"}).status_code == 422
