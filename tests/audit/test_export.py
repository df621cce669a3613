from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import stat
import subprocess
import sys
import tracemalloc
import zipfile
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import time_machine
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from pytest_django.fixtures import Settings

from pandaweb.audit import exports, signing
from pandaweb.audit.chain import GENESIS, HASHED_FIELDS, event_hash
from pandaweb.audit.export import (
    COLUMNS,
    ExportError,
    Manifest,
    UnreadableExport,
    csv_row,
    fingerprint,
    public_key_b64,
    verify_export,
    write_export,
)
from pandaweb.audit.exports import AuditFilter, audit_export, audit_export_to_file, audit_filtered
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from pandaweb.core.roles import Role
from sessions.models import Run
from tests.factories import user_with_role
from workflows import services as workflow_services

T0 = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
MiB = 1024 * 1024
# What "bounded" means here: far below what the events would take if they were held (40 000
# events are about 100 MB as dicts), far above the export's own buffers (about 3 MiB).
MEMORY_BOUND = 32 * MiB


def event_at(sequence: int, prev_hash: str, **overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "sequence": sequence,
        "occurred_at": T0 + timedelta(seconds=sequence),
        "actor_kind": "user",
        "actor_id": 7,
        "actor_label": "olivia.operator",
        "action": "run.step_succeeded",
        "object_type": "run",
        "object_id": str(40 + sequence % 3),
        "before": {"status": "running"},
        "after": {"status": "succeeded", "amount": "1250.00", "title": "Électricité, mars"},
        "request_id": f"req-{sequence}",
        "client_ip": "192.0.2.10",
        "run_id": 40 + sequence % 3,
        "step_id": 900 + sequence,
        "approval_id": None,
        "extra": {},
        "prev_hash": prev_hash,
    }
    event.update(overrides)
    event["hash"] = event_hash(event, prev_hash)
    return event


def chained(
    count: int,
    *,
    after: tuple[int, str] = (0, GENESIS),
    changes: dict[int, dict[str, Any]] | None = None,
    **common: Any,
) -> Iterator[dict[str, Any]]:
    """A valid chain of ``count`` events after (sequence, hash) ``after``, generated as it is
    consumed: ``common`` changes every event, ``changes`` single ones (by sequence)."""
    start, prev_hash = after
    for sequence in range(start + 1, start + count + 1):
        event = event_at(sequence, prev_hash, **common, **(changes or {}).get(sequence, {}))
        prev_hash = event["hash"]
        yield event


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def export_to(
    path: Path, events: Iterable[dict[str, Any]], key: Ed25519PrivateKey, **filter_: Any
) -> Manifest:
    with path.open("wb") as out:
        return write_export(events, out=out, filter=filter_, private_key=key, tmp_dir=path.parent)


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rezip(path: Path, changes: dict[str, bytes]) -> None:
    """Rewrite the zip with some members replaced (the others byte for byte as they were)."""
    content = {**members(path), **changes}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in content.items():
            archive.writestr(name, data)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def jsonl_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in members(path)["events.jsonl"].splitlines()]


def csv_rows(path: Path) -> list[list[str]]:
    text = members(path)["events.csv"].decode("utf-8-sig")
    return list(csv.reader(io.StringIO(text, newline="")))


def csv_bytes(rows: list[list[str]]) -> bytes:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows)
    return ("\ufeff" + text.getvalue()).encode()


def edit_jsonl(path: Path, sequence: int, change: Callable[[dict[str, Any]], None]) -> None:
    lines = members(path)["events.jsonl"].splitlines(keepends=True)
    for index, line in enumerate(lines):
        record = json.loads(line)
        if record["sequence"] == sequence:
            change(record)
            text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            lines[index] = text.encode() + b"\n"
    rezip(path, {"events.jsonl": b"".join(lines)})


# The file format ---------------------------------------------------------------------------------


def test_an_export_round_trips_and_its_manifest_describes_it(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    events = list(chained(12))

    manifest = export_to(path, iter(events), key, action="run.")
    check = verify_export(path, public_key=public_key_b64(key.public_key()))

    assert check.ok, check.reason
    assert check.count == 12
    files = members(path)
    assert sorted(files) == ["events.csv", "events.jsonl", "manifest.json", "manifest.sig"]
    document = json.loads(files["manifest.json"])
    assert document["format"] == "pandaweb-audit-export/2"
    assert document["filter"] == {"action": "run."}
    assert (document["count"], document["first_sequence"], document["last_sequence"]) == (12, 1, 12)
    assert document["first_prev_hash"] == GENESIS
    assert document["last_hash"] == events[-1]["hash"]
    assert document["contiguous"] is True
    assert document["public_key"] == public_key_b64(key.public_key())
    for name in ("events.jsonl", "events.csv"):
        assert document["files"][name]["bytes"] == len(files[name])
        assert document["files"][name]["sha256"] == sha256(files[name])
    key.public_key().verify(base64.b64decode(files["manifest.sig"]), files["manifest.json"])
    assert manifest.count == 12
    assert manifest.sha256 == sha256(files["manifest.json"])


def test_the_jsonl_is_the_exact_canonical_copy_that_rehashes(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    events = list(chained(3))
    export_to(path, iter(events), key)

    records = jsonl_records(path)

    assert [sorted(record) for record in records] == [sorted((*HASHED_FIELDS, "hash"))] * 3
    assert records[0]["occurred_at"] == "2025-03-01T09:30:01.000000Z"
    for record, event in zip(records, events, strict=True):
        assert record["hash"] == event["hash"] == event_hash(record, record["prev_hash"])


def test_the_csv_has_a_bom_and_opens_with_the_csv_module(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(5), key)

    raw = members(path)["events.csv"]
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"), newline="")))

    assert raw.startswith(b"\xef\xbb\xbfsequence,occurred_at,")
    assert b"\r\n" in raw
    assert [row["sequence"] for row in rows] == ["1", "2", "3", "4", "5"]
    assert list(rows[0]) == list(COLUMNS)
    assert rows[0]["occurred_at"] == "2025-03-01T09:30:01.000000Z"
    assert rows[0]["approval_id"] == ""
    assert json.loads(rows[0]["after"])["title"] == "Électricité, mars"


def test_formula_like_values_are_neutralised_in_the_csv_only(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    hostile = {
        "actor_label": '=HYPERLINK("http://evil.example","click")',
        "object_id": "+1+1",
        "request_id": "@SUM(A1:A9)",
        "object_type": "-2",
        "action": "\tcmd",
    }
    export_to(path, chained(3, changes={2: hostile}), key)

    row = dict(zip(COLUMNS, csv_rows(path)[2], strict=True))
    record = jsonl_records(path)[1]

    for column, value in hostile.items():
        assert row[column] == "'" + value
        assert record[column] == value
    assert row["client_ip"] == "192.0.2.10"
    assert verify_export(path).ok


def test_a_filtered_export_with_gaps_verifies_and_says_it_is_not_contiguous(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    events = [event for event in chained(10) if event["sequence"] in {3, 4, 5, 8, 10}]

    export_to(path, iter(events), key, run_id=41)
    check = verify_export(path)

    assert check.ok, check.reason
    assert check.count == 5
    assert check.manifest is not None
    assert check.manifest["contiguous"] is False
    assert check.manifest["first_prev_hash"] == events[0]["prev_hash"]


def test_an_empty_export_verifies(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = tmp_path / "trail.zip"

    manifest = export_to(path, iter(()), key)
    check = verify_export(path)

    assert check.ok
    assert (manifest.count, manifest.first_sequence, manifest.last_hash) == (0, None, None)
    assert csv_rows(path) == [list(COLUMNS)]


def test_events_out_of_order_are_refused(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    events = list(chained(3))

    with pytest.raises(ExportError, match="sequence 2"):
        export_to(tmp_path / "trail.zip", [events[0], events[2], events[1]], key)


# Tampering ---------------------------------------------------------------------------------------


def test_an_edited_csv_cell_fails_naming_its_sequence(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(10), key)
    rows = csv_rows(path)
    rows[7][COLUMNS.index("after")] = rows[7][COLUMNS.index("after")].replace("1250.00", "12.50")

    rezip(path, {"events.csv": csv_bytes(rows)})
    check = verify_export(path)

    assert not check.ok
    assert check.first_bad_sequence == 7
    assert check.reason == "events.csv differs from events.jsonl in 'after'"
    assert check.count == 7  # the event itself is intact in the JSONL


def test_an_edited_jsonl_line_fails_at_its_sequence(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(10), key)

    edit_jsonl(path, 6, lambda record: record["after"].update(amount="9999.00"))
    check = verify_export(path)

    assert not check.ok
    assert check.first_bad_sequence == 6
    assert check.reason == "hash does not match the event's content"
    assert check.count == 5


def test_an_event_rehashed_after_an_edit_breaks_the_next_link(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(10), key)

    def forge(record: dict[str, Any]) -> None:
        record["actor_label"] = "someone.else"
        record["hash"] = event_hash(record, record["prev_hash"])

    edit_jsonl(path, 4, forge)
    rows = csv_rows(path)
    rows[4] = csv_row(jsonl_records(path)[3])
    rezip(path, {"events.csv": csv_bytes(rows)})
    check = verify_export(path)

    assert (check.ok, check.first_bad_sequence) == (False, 5)
    assert "prev_hash" in check.reason


def test_a_removed_line_with_a_rehashed_but_unsigned_manifest_fails_the_signature(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    events = list(chained(10))
    export_to(path, iter(events), key)
    files = members(path)
    jsonl = b"".join(line for line in files["events.jsonl"].splitlines(keepends=True)[:-1])
    shorter_csv = csv_bytes(csv_rows(path)[:-1])
    manifest = json.loads(files["manifest.json"])
    manifest.update(count=9, last_sequence=9, last_hash=events[8]["hash"])
    for name, data in (("events.jsonl", jsonl), ("events.csv", shorter_csv)):
        manifest["files"][name] = {"sha256": sha256(data), "bytes": len(data)}

    rezip(
        path,
        {
            "events.jsonl": jsonl,
            "events.csv": shorter_csv,
            "manifest.json": json.dumps(manifest, indent=2).encode(),
        },
    )
    check = verify_export(path)

    assert not check.ok
    assert check.first_bad_sequence is None
    assert "signature" in check.reason


def test_only_a_pinned_key_catches_an_export_re_signed_with_another_key(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(4), key)
    forger = Ed25519PrivateKey.generate()
    manifest = json.loads(members(path)["manifest.json"])
    manifest["public_key"] = public_key_b64(forger.public_key())
    manifest_bytes = json.dumps(manifest, indent=2).encode()
    rezip(
        path,
        {
            "manifest.json": manifest_bytes,
            "manifest.sig": base64.b64encode(forger.sign(manifest_bytes)),
        },
    )

    unpinned = verify_export(path)
    pinned = verify_export(path, public_key=public_key_b64(key.public_key()))

    assert unpinned.ok  # self-consistent: only the key says who signed it
    assert not pinned.ok
    assert pinned.reason == (
        f"signed by key {fingerprint(public_key_b64(forger.public_key()))}, "
        f"not by the expected key {fingerprint(public_key_b64(key.public_key()))}"
    )


def test_a_jsonl_cut_off_in_the_middle_of_a_line_fails(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(10), key)
    jsonl = members(path)["events.jsonl"]

    rezip(path, {"events.jsonl": jsonl[: len(jsonl) * 2 // 3]})
    check = verify_export(path)

    assert not check.ok
    assert check.first_bad_sequence == check.count + 1
    assert re.fullmatch(r"events\.jsonl line \d+ is cut off \(no line end\)", check.reason)


def test_a_jsonl_missing_its_last_lines_fails_at_the_first_missing_sequence(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(10), key)
    lines = members(path)["events.jsonl"].splitlines(keepends=True)

    rezip(path, {"events.jsonl": b"".join(lines[:7])})
    check = verify_export(path)

    assert not check.ok
    assert check.first_bad_sequence == 8
    assert check.reason == (
        "events.jsonl holds 7 events up to sequence 7; the manifest says 10 up to sequence 10"
    )


def test_a_line_removed_from_a_filtered_export_fails_although_gaps_are_allowed(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, (event for event in chained(12) if event["sequence"] % 2), key)
    lines = members(path)["events.jsonl"].splitlines(keepends=True)
    rows = csv_rows(path)
    del lines[2], rows[3]  # sequence 5, from both files

    rezip(path, {"events.jsonl": b"".join(lines), "events.csv": csv_bytes(rows)})
    check = verify_export(path)

    assert not check.ok
    assert "the manifest says 6 up to sequence 11" in check.reason


def test_a_tampered_trail_is_exported_as_evidence_and_fails_where_it_breaks(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "trail.zip"
    events = list(chained(6))
    events[2] = {**events[2], "action": "run.cancelled"}  # edited in the database, hash kept

    export_to(path, iter(events), key)
    check = verify_export(path)

    assert (check.ok, check.first_bad_sequence, check.count) == (False, 3, 2)


def test_a_file_that_is_not_a_zip_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "trail.zip"
    path.write_bytes(b"sequence,occurred_at\r\n")

    with pytest.raises(UnreadableExport):
        verify_export(path)
    with pytest.raises(UnreadableExport):
        verify_export(tmp_path / "missing.zip")


def test_an_extra_or_missing_member_fails(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(2), key)

    rezip(path, {"notes.txt": b"hello"})
    assert verify_export(path).reason == "unexpected file 'notes.txt' in the export"

    content = members(path)
    del content["notes.txt"], content["manifest.sig"]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in content.items():
            archive.writestr(name, data)
    assert verify_export(path).reason == "manifest.sig is missing from the export"


# The signing key ---------------------------------------------------------------------------------


@pytest.fixture
def data_dir(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(signing.ENV_NAME, raising=False)
    settings.DATA_DIR = tmp_path / "data"
    return Path(settings.DATA_DIR)


def test_without_configuration_a_key_is_generated_once_with_mode_0600(data_dir: Path) -> None:
    first = signing.public_key_b64()
    second = signing.public_key_b64()

    key_file = data_dir / "audit_signing_key"
    assert first == second
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(base64.b64decode(key_file.read_text().strip())) == 32
    assert list(data_dir.iterdir()) == [key_file]  # no partial file left behind
    assert re.fullmatch(r"[0-9a-f]{4}( [0-9a-f]{4}){3}", signing.public_key_fingerprint())


def test_the_key_comes_from_the_environment_when_set(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = bytes(range(32))
    monkeypatch.setenv(signing.ENV_NAME, base64.b64encode(raw).decode())

    expected = Ed25519PrivateKey.from_private_bytes(raw).public_key()
    assert signing.public_key_b64() == public_key_b64(expected)
    assert not (data_dir / "audit_signing_key").exists()


@pytest.mark.parametrize("value", ["not base64!", base64.b64encode(b"short").decode()])
def test_a_bad_key_in_the_environment_is_a_one_line_configuration_error(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(signing.ENV_NAME, value)

    with pytest.raises(ImproperlyConfigured) as error:
        signing.signing_key()

    message = str(error.value)
    assert message == (
        "PANDAWEB_AUDIT_SIGNING_KEY is not an Ed25519 private key (base64 of 32 raw bytes)"
    )
    assert value not in message
    with pytest.raises(CommandError, match=r"^PANDAWEB_AUDIT_SIGNING_KEY is not"):
        call_command("audit_public_key", stdout=StringIO())


def test_the_public_key_command_prints_the_key_and_its_fingerprint(data_dir: Path) -> None:
    out = StringIO()

    call_command("audit_public_key", stdout=out)

    assert out.getvalue() == (
        f"{signing.public_key_b64()}\nfingerprint {signing.public_key_fingerprint()}\n"
    )


# The service and the commands --------------------------------------------------------------------


@pytest.fixture
def carla(db: None) -> User:
    return user_with_role(Role.COMPLIANCE, username="carla")


@pytest.fixture
def olivia(db: None) -> User:
    return user_with_role(Role.OPERATORS, username="olivia")


def record(action: str, *, actor: User | None = None, **kwargs: Any) -> AuditEvent:
    with transaction.atomic():
        return audit_record(
            action=action,
            object_type=kwargs.pop("object_type", "run"),
            object_id=kwargs.pop("object_id", 1),
            actor=actor,
            **kwargs,
        )


def exported(path: Path) -> list[tuple[int, str]]:
    return [(record["sequence"], record["action"]) for record in jsonl_records(path)]


@pytest.mark.django_db
def test_the_export_records_one_event_that_is_never_in_its_own_range(
    data_dir: Path, carla: User
) -> None:
    for number in range(3):
        record("run.launched", object_id=number, run_id=number)
    before = AuditEvent.objects.count()

    first = audit_export_to_file(user=carla, filters=AuditFilter())
    second = audit_export_to_file(user=carla, filters=AuditFilter())

    assert first.parent == data_dir / "exports"
    events = AuditEvent.objects.filter(action="audit.exported").order_by("sequence")
    assert AuditEvent.objects.count() == before + 2
    assert [event.actor for event in events] == [carla, carla]
    one = events[0]
    manifest = json.loads(members(first)["manifest.json"])
    assert one.object_type == "audit_export"
    assert one.object_id == sha256(members(first)["manifest.json"])
    assert one.after is not None
    assert one.after["count"] == before == manifest["count"]
    assert one.after["manifest_sha256"] == one.object_id
    assert one.after["filter"] == {"up_to_sequence": before}
    assert [action for _, action in exported(first)].count("audit.exported") == 0
    assert [action for _, action in exported(second)].count("audit.exported") == 1
    assert verify_export(first, public_key=signing.public_key_b64()).ok
    assert verify_export(second, public_key=signing.public_key_b64()).ok


@pytest.mark.django_db
def test_exporting_needs_the_export_capability(data_dir: Path, olivia: User) -> None:
    before = AuditEvent.objects.count()

    with pytest.raises(PermissionDenied):
        audit_export(user=olivia, filters=AuditFilter(), out=io.BytesIO())

    assert AuditEvent.objects.count() == before


@pytest.mark.django_db
def test_filters_select_by_action_prefix_run_actor_and_workflow(
    data_dir: Path, carla: User, olivia: User
) -> None:
    workflow = workflow_services.workflow_create(user=olivia, name="Pay invoices", slug="pay")
    other = workflow_services.workflow_create(user=olivia, name="Other", slug="other")
    run = Run.objects.create(workflow=workflow, version=workflow.versions.get(), launched_by=olivia)
    stranger = Run.objects.create(workflow=other, version=other.versions.get(), launched_by=olivia)
    launched = record("run.launched", actor=olivia, object_id=run.pk, run_id=run.pk)
    step = record("run.step_succeeded", object_id=run.pk, run_id=run.pk, step_id=5)
    elsewhere = record("run.launched", actor=olivia, object_id=stranger.pk, run_id=stranger.pk)
    approval = record("approval.requested", object_type="approval", run_id=run.pk, approval_id=9)
    workflow_created = AuditEvent.objects.get(action="workflow.created", object_id=workflow.pk)

    def sequences(**filters: Any) -> list[int]:
        return list(audit_filtered(AuditFilter(**filters)).values_list("sequence", flat=True))

    assert sequences(action="run.") == [launched.sequence, step.sequence, elsewhere.sequence]
    assert sequences(run_id=run.pk) == [launched.sequence, step.sequence, approval.sequence]
    assert sequences(workflow="pay") == [
        workflow_created.sequence,
        launched.sequence,
        step.sequence,
        approval.sequence,
    ]
    assert sequences(action="run.", actor="olivia") == [launched.sequence, elsewhere.sequence]
    path = audit_export_to_file(user=carla, filters=AuditFilter(workflow="pay"))
    assert exported(path) == [
        (workflow_created.sequence, "workflow.created"),
        (launched.sequence, "run.launched"),
        (step.sequence, "run.step_succeeded"),
        (approval.sequence, "approval.requested"),
    ]
    manifest = json.loads(members(path)["manifest.json"])
    assert manifest["filter"]["workflow"] == "pay"
    assert manifest["contiguous"] is False
    assert verify_export(path).ok
    with pytest.raises(exports.AuditExportError, match="no workflow has the slug 'nope'"):
        audit_export(user=carla, filters=AuditFilter(workflow="nope"), out=io.BytesIO())


@pytest.mark.django_db
def test_a_date_range_takes_whole_days_in_the_site_time_zone(data_dir: Path, carla: User) -> None:
    days = {}
    for day in (1, 2, 3):
        with time_machine.travel(datetime(2025, 3, day, 23, 59, tzinfo=UTC), tick=False):
            days[day] = record("run.launched", object_id=day).sequence

    path = audit_export_to_file(
        user=carla, filters=AuditFilter(date_from=date(2025, 3, 2), date_to=date(2025, 3, 3))
    )

    assert exported(path) == [(days[2], "run.launched"), (days[3], "run.launched")]
    manifest = json.loads(members(path)["manifest.json"])
    assert manifest["filter"]["date_from"] == "2025-03-02"
    assert manifest["filter"]["time_zone"] == django_settings.TIME_ZONE
    assert manifest["contiguous"] is True
    assert verify_export(path).ok


@pytest.mark.django_db
def test_the_export_command_writes_a_zip_that_the_verify_command_accepts(
    data_dir: Path, carla: User, tmp_path: Path
) -> None:
    for number in range(4):
        record("run.launched", object_id=number, run_id=number)
    path = tmp_path / "out" / "trail.zip"
    path.parent.mkdir()
    out = StringIO()

    call_command("audit_export", out=str(path), as_user="carla", action="run.", stdout=out)

    assert re.fullmatch(
        r"exported 4 events \(sequences \d+\.\.\d+\) to .*trail\.zip; "
        r"manifest sha256 [0-9a-f]{64}, signed by key [0-9a-f ]{19}\n",
        out.getvalue(),
    )
    assert sorted(p.name for p in path.parent.iterdir()) == ["trail.zip"]
    verified = StringIO()
    call_command(
        "audit_verify", export=str(path), public_key=signing.public_key_b64(), stdout=verified
    )
    assert verified.getvalue().startswith("audit export OK: 4 events (sequences ")
    assert verified.getvalue().endswith(
        f"signed by key {signing.public_key_fingerprint()} (the expected key)\n"
    )
    with pytest.raises(CommandError, match="exists"):
        call_command("audit_export", out=str(path), as_user="carla", stdout=StringIO())


@pytest.mark.django_db
def test_the_export_command_refuses_in_one_line(
    data_dir: Path, olivia: User, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trail.zip"

    with pytest.raises(CommandError, match=r"^no user 'nobody'$"):
        call_command("audit_export", out=str(path), as_user="nobody")
    with pytest.raises(CommandError, match="capability 'export_audit'"):
        call_command("audit_export", out=str(path), as_user="olivia")
    with pytest.raises(CommandError, match="--to is before --from"):
        call_command(
            "audit_export", "--from", "2025-03-02", "--to", "2025-03-01", out=str(path),
            as_user="olivia",
        )  # fmt: skip
    monkeypatch.setenv(signing.ENV_NAME, "x")
    olivia.is_superuser = True
    olivia.save()
    with pytest.raises(CommandError, match=r"^PANDAWEB_AUDIT_SIGNING_KEY is not an Ed25519"):
        call_command("audit_export", out=str(path), as_user="olivia")
    assert not path.exists()
    assert list(tmp_path.glob("*.partial")) == []


def verify_command(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=err)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_the_verify_command_exit_codes_for_exports(
    tmp_path: Path, key: Ed25519PrivateKey, settings: Settings
) -> None:
    path = tmp_path / "trail.zip"
    export_to(path, chained(9), key)
    public = public_key_b64(key.public_key())

    # Signed by another key than this installation's: refused unless that key is pinned.
    code, _, err = verify_command("--export", str(path))
    assert (
        code,
        err.startswith(f"audit export BROKEN: signed by key {fingerprint(public)}, "),
    ) == (
        1,
        True,
    )
    settings.AUDIT_PUBLIC_KEY_FINGERPRINT = fingerprint(public).upper()
    code, out, _ = verify_command("--export", str(path))
    assert code == 0
    assert out.startswith("audit export OK: 9 events (sequences 1..9), head ")
    assert out.endswith(f"signed by key {fingerprint(public)} (the pinned key)\n")

    other = public_key_b64(Ed25519PrivateKey.generate().public_key())
    code, _, err = verify_command("--export", str(path), "--public-key", other)
    assert (code, err.startswith("audit export BROKEN: signed by key ")) == (1, True)

    edit_jsonl(path, 4, lambda record: record.update(object_id="999"))
    code, _, err = verify_command("--export", str(path), "--public-key", public)
    assert (code, err) == (
        1,
        "audit export BROKEN at sequence 4: hash does not match the event's content\n",
    )

    code, _, err = verify_command("--export", str(tmp_path / "missing.zip"))
    assert code == 2
    assert err.startswith("audit export UNREADABLE: ")
    code, _, err = verify_command("--export", str(path), "--public-key", "not-a-key")
    assert (code, "not an Ed25519 public key" in err) == (2, True)
    with pytest.raises(CommandError, match="--public-key needs --export"):
        verify_command("--public-key", public)
    code, out, _ = verify_command()  # the database mode is unchanged
    assert (code, out.startswith("audit chain OK: ")) == (0, True)


# Memory ------------------------------------------------------------------------------------------


def traced_peak(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.django_db
def test_a_database_export_streams_with_bounded_memory(
    data_dir: Path, carla: User, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 3000
    head = AuditEvent.objects.order_by("-sequence").values_list("sequence", "hash")[0]
    system = chained(count, after=head, actor_kind="system", actor_id=None, actor_label="system")
    rows = [AuditEvent(**event) for event in system]
    AuditEvent.objects.bulk_create(rows, batch_size=500)
    held = traced_peak(lambda: list(AuditEvent.objects.values(*HASHED_FIELDS, "hash")))
    del rows
    # Small chunks, so that holding every row would show against the chunk the export holds.
    monkeypatch.setattr(exports, "CHUNK_SIZE", 200)
    path = tmp_path / "trail.zip"

    def export() -> None:
        with path.open("wb") as out:
            audit_export(user=carla, filters=AuditFilter(), out=out)

    peak = traced_peak(export)

    print(
        f"\n{count} database events: export peak {peak / MiB:.1f} MiB (tracemalloc), "
        f"holding the rows alone {held / MiB:.1f} MiB"
    )
    assert verify_export(path).count == head[0] + count
    assert peak < MEMORY_BOUND
    assert peak < held


@pytest.mark.slow
def test_an_export_of_40k_events_streams_with_bounded_memory(tmp_path: Path) -> None:
    count = 40_000
    # The benchmark, smaller, in a child process: its peak resident size is the export's own
    # (C buffers included), without the pytest process's history; tracemalloc would slow this
    # interpreter down about eightfold.
    result = subprocess.run(
        [
            sys.executable,
            "bench/audit_export.py",
            "--events",
            str(count),
            "--json",
            "--tmp-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=django_settings.BASE_DIR,
    )
    figures = json.loads(result.stdout)

    print(
        f"\n{count} events: peak resident growth {figures['growth'] / MiB:.1f} MiB while writing "
        f"{figures['event_bytes'] / 1e6:.0f} MB of events "
        f"({figures['zip_bytes'] / 1e6:.0f} MB zipped) in {figures['seconds']:.0f} s"
    )
    assert figures["count"] == count
    assert figures["growth"] < MEMORY_BOUND
