"""Signed checkpoints of the chain's head: written at an interval and on every export, kept
outside the database, and checked by `audit_verify --checkpoints` against each tamper case that
the chain alone cannot see (a cut tail, a rewrite with recomputed hashes), and against forged or
edited checkpoints."""

from __future__ import annotations

import base64
import json
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings as django_settings
from django.core import mail
from django.db import connection
from django.test import Client
from pytest_django.fixtures import Settings

from pandaweb.audit import chain
from pandaweb.audit.checkpoints import (
    FORMAT,
    _signed_bytes,
    audit_checkpoint_write,
)
from pandaweb.audit.export import public_key_b64
from pandaweb.audit.exports import AuditFilter, audit_export_to_file
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.audit.tasks import audit_checkpoint_task
from pandaweb.audit.triggers import append_only_suspended
from pandaweb.core.roles import Role
from tests.audit.test_tamper import trail, verify
from tests.factories import user_with_role
from tests.sessions.conftest import acme_credential, demo_workflow, no_background_runs, operator

__all__ = ["acme_credential", "demo_workflow", "no_background_runs", "operator", "trail"]

pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpoints(settings: Settings) -> Path:
    return Path(settings.AUDIT_CHECKPOINT_DIR)


def files(directory: Path) -> list[Path]:
    return sorted(directory.glob("checkpoint-*.json"))


def rewrite_from(sequence: int, **change: str) -> None:
    """Edit one event, then recompute its hash and every later one: the chain verifies again."""
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence=sequence).update(**change)
        prev = AuditEvent.objects.get(sequence=sequence - 1).hash
        for event in AuditEvent.objects.filter(sequence__gte=sequence).order_by("sequence"):
            fields = event.chain_fields()
            fields["prev_hash"] = prev
            new_hash = chain.event_hash(fields, prev)
            AuditEvent.objects.filter(pk=event.pk).update(prev_hash=prev, hash=new_hash)
            prev = new_hash


def test_an_untouched_trail_matches_its_checkpoints(trail: int, checkpoints: Path) -> None:
    audit_checkpoint_write(reason="interval")
    code, message = verify("--checkpoints", str(checkpoints))

    assert code == 0
    assert message.strip().endswith("matches 1 signed checkpoint(s)")


def test_a_truncated_tail_is_caught_against_a_checkpoint(trail: int, checkpoints: Path) -> None:
    audit_checkpoint_write(reason="interval")
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence__gt=trail - 3).delete()

    # Alone, a chain cut short looks like a shorter, intact chain...
    assert verify()[0] == 0
    code, message = verify("--checkpoints", str(checkpoints))

    assert code == 1
    assert message.startswith(f"audit chain BROKEN at sequence {trail - 2}: the chain ends at")
    assert f"signed sequence {trail} (truncated)" in message


def test_a_rewritten_chain_is_caught_against_a_checkpoint(trail: int, checkpoints: Path) -> None:
    audit_checkpoint_write(reason="interval")
    rewrite_from(trail // 2, actor_label="someone-else")

    # The recomputed chain verifies on its own...
    assert verify()[0] == 0
    code, message = verify("--checkpoints", str(checkpoints))

    assert code == 1
    assert message.startswith(f"audit chain BROKEN at sequence {trail}: event {trail} differs")
    assert "rewritten" in message


def test_a_checkpoint_forged_with_another_key_is_refused(trail: int, checkpoints: Path) -> None:
    rewrite_from(3, actor_label="someone-else")
    head = AuditEvent.objects.order_by("-sequence").first()
    assert head is not None
    forger = Ed25519PrivateKey.generate()
    fields = {
        "format": FORMAT,
        "sequence": head.sequence,
        "hash": head.hash,
        "time": "2026-01-01T00:00:00.000000Z",
        "reason": "interval",
        "public_key": public_key_b64(forger.public_key()),
    }
    signature = base64.b64encode(forger.sign(_signed_bytes(fields))).decode()
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / "checkpoint-999.json").write_text(json.dumps({**fields, "signature": signature}))

    code, message = verify("--checkpoints", str(checkpoints))

    assert code == 1
    assert "checkpoint-999.json is signed by key" in message
    assert "not by the expected key" in message


def test_an_edited_checkpoint_is_refused(trail: int, checkpoints: Path) -> None:
    written = audit_checkpoint_write(reason="interval")
    assert written is not None
    assert written.path is not None
    rewrite_from(3, actor_label="someone-else")
    data = json.loads(written.path.read_text())
    data["hash"] = AuditEvent.objects.get(sequence=data["sequence"]).hash
    written.path.chmod(0o644)
    written.path.write_text(json.dumps(data))

    code, message = verify("--checkpoints", str(checkpoints))

    assert code == 1
    assert "the signature does not match its content" in message


def test_an_empty_checkpoint_directory_is_not_a_pass(trail: int, tmp_path: Path) -> None:
    code, message = verify("--checkpoints", str(tmp_path))

    assert code == 1
    assert "no checkpoint in" in message


def test_the_interval_writes_only_when_the_head_moved(checkpoints: Path) -> None:
    assert audit_checkpoint_write(reason="interval") is None  # an empty trail has no head
    audit_record(action="test.first", object_type="test", object_id="1")
    audit_checkpoint_task()
    audit_checkpoint_task()
    assert len(files(checkpoints)) == 1

    audit_record(action="test.second", object_type="test", object_id="2")
    audit_checkpoint_task()

    written = [json.loads(path.read_text()) for path in files(checkpoints)]
    heads = AuditEvent.objects.order_by("sequence").values_list("sequence", "hash")
    assert [(c["sequence"], c["hash"]) for c in written] == list(heads)
    assert {c["reason"] for c in written} == {"interval"}


def test_every_export_writes_a_checkpoint_of_the_head_it_left(checkpoints: Path) -> None:
    compliance = user_with_role(Role.COMPLIANCE)
    audit_record(action="test.first", object_type="test", object_id="1")

    for _ in range(2):
        audit_export_to_file(user=compliance, filters=AuditFilter()).unlink()

    written = [json.loads(path.read_text()) for path in files(checkpoints)]
    exported = AuditEvent.objects.filter(action="audit.exported").order_by("sequence")
    assert [(c["sequence"], c["hash"], c["reason"]) for c in written] == [
        (event.sequence, event.hash, "export") for event in exported
    ]


def test_checkpoints_are_mailed_to_compliance_when_configured(
    checkpoints: Path, settings: Settings
) -> None:
    settings.AUDIT_CHECKPOINT_EMAILS = ["compliance@example.test"]
    audit_record(action="test.first", object_type="test", object_id="1")

    written = audit_checkpoint_write(reason="interval")

    assert written is not None
    (message,) = mail.outbox
    assert message.to == ["compliance@example.test"]
    assert f"sequence {written.sequence}" in message.subject
    assert written.hash in message.body


def test_scale_out_schedules_checkpoints_with_beat() -> None:
    entry = django_settings.CELERY_BEAT_SCHEDULE["audit-checkpoint"]

    assert entry["task"] == audit_checkpoint_task.name == "audit.checkpoint"
    assert entry["schedule"] == float(django_settings.AUDIT_CHECKPOINT_INTERVAL_SECONDS)


def test_an_export_re_signed_with_another_key_is_refused_without_naming_a_key(
    trail: int, tmp_path: Path
) -> None:
    compliance = user_with_role(Role.COMPLIANCE)
    path = audit_export_to_file(user=compliance, filters=AuditFilter())
    forger = Ed25519PrivateKey.generate()
    forged = tmp_path / "forged.zip"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(forged, "w") as target:
        for item in source.infolist():
            content = source.read(item.filename)
            if item.filename == "manifest.json":
                manifest = json.loads(content)
                manifest["public_key"] = public_key_b64(forger.public_key())
                content = json.dumps(manifest).encode()
                signature = base64.b64encode(forger.sign(content))
                target.writestr("manifest.sig", signature)
            if item.filename != "manifest.sig":
                target.writestr(item, content)
    path.unlink()

    code, message = verify("--export", str(forged))

    assert code == 1
    assert message.startswith("audit export BROKEN: signed by key ")
    assert "not by the pinned key" in message


def test_the_audit_pages_verify_button_checks_the_checkpoints_too(
    trail: int, checkpoints: Path
) -> None:
    client = Client()
    client.force_login(user_with_role(Role.COMPLIANCE))  # signing in is an event too
    head = AuditEvent.objects.order_by("-sequence").values_list("sequence", flat=True)[0]
    audit_checkpoint_write(reason="interval")
    with append_only_suspended(connection):
        AuditEvent.objects.filter(sequence__gt=head - 3).delete()

    response = client.post("/audit/verify/", headers={"HX-Request": "true"})

    page = response.content.decode()
    assert f"Broken at event #{head - 2}:" in page
    assert f"signed sequence {head} (truncated)" in page
