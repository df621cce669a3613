"""Signed exports of the audit trail, written and verified as streams (no Django imports).

An export is a zip of four files:

``events.jsonl``
    One event per line, in sequence order: exactly the fields ``chain.event_hash`` covers
    (``chain.HASHED_FIELDS``, which include ``prev_hash``, and for an event on a team chain
    ``chain.TEAM_FIELDS``) plus ``hash`` (and ``team_hash`` for a team's event), in the chain's
    canonical form (sorted keys, no whitespace, UTF-8, datetimes as
    ``2025-01-31T09:05:00.000000Z``). This is the exact copy: each line re-hashes to its
    ``hash`` with ``chain.event_hash``.
``events.csv``
    The same events for a spreadsheet: UTF-8 with a byte order mark (without it Excel reads the
    file as the local code page), CRLF line ends, the columns of ``COLUMNS`` (format 1:
    ``COLUMNS_1``); ``before``, ``after`` and ``extra`` as compact JSON; empty cells for null. A
    cell starting with ``=``, ``+``, ``-``, ``@``, TAB or CR gets a leading apostrophe, because a
    spreadsheet would run it as a formula, and the trail holds text that came from web forms and
    portals. The CSV is therefore a view, not a copy: trust and verify ``events.jsonl``.
``manifest.json``
    ``format`` (``FORMAT``), ``created_at``, ``filter`` (what selected the events), ``count``,
    ``first_sequence``, ``last_sequence``, ``first_prev_hash`` (the chain hash before the first
    event), ``last_hash`` (the hash of the last event), ``contiguous`` (no sequence is skipped
    between the first and the last), ``files`` (``{name: {sha256, bytes}}`` of the two event
    files), ``public_key`` (base64 of the raw Ed25519 public key) and ``team`` (null, or for a
    team's export: its ``id`` and ``slug``, ``chained`` (the events are the team's chain without a
    gap, see below), ``first_team_prev_hash`` and ``last_team_hash``). Nulls for an empty export.
``manifest.sig``
    base64 of the Ed25519 signature over the exact bytes of ``manifest.json``.

A filtered export (by action, actor, run...) skips the events that do not match, so its events are
usually not a contiguous slice of the chain. Each event is then checked on its own: its hash must
be the hash of its content and its own ``prev_hash``; where two exported events are neighbours in
the chain (sequence n follows n - 1), the later must link to the earlier's hash. Across a gap the
skipped events are not in the file to link through: the signed manifest (count, file hashes) is
what fixes that nothing was removed or added. An export without gaps (``contiguous``) is checked
as one slice of the chain: every link, anchored on ``first_prev_hash``, ending at ``last_hash``.

A team's export holds that team's events only, so it has gaps in the global chain wherever
another team or the installation had an event. It is verified on the team's own chain instead
(``chain.verify_team``): every event must be on the manifest's team's chain, and when the
manifest says ``chained`` (the export was narrowed by team and dates only) every event links to
the one before it by ``team_prev_hash``, anchored on ``first_team_prev_hash`` and ending at
``last_team_hash``, so an edited, removed, added or reordered event of the team shows and another
team's event cannot be slipped in. A team export narrowed further (by action, actor...) is checked
event by event, like a filtered export.

Format 1 exports (before teams: no team fields, no team columns in the CSV) are still verified.

Memory: ``write_export`` holds one event at a time. The JSONL goes straight into the zip; the CSV
goes to a temporary file (a zip is written one member at a time) and is copied in afterwards,
hashed on the way. ``verify_export`` reads both event files side by side, line by line.
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import io
import json
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import zip_longest
from typing import IO, TYPE_CHECKING, Any, TypeGuard

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pandaweb.audit import chain

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

FORMAT = "pandaweb-audit-export/2"
# Format 1: the same without the team fields and columns; still verified.
FORMAT_1 = "pandaweb-audit-export/1"
JSONL_NAME = "events.jsonl"
CSV_NAME = "events.csv"
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"

COLUMNS_1: tuple[str, ...] = (
    "sequence",
    "occurred_at",
    "actor_kind",
    "actor_id",
    "actor_label",
    "action",
    "object_type",
    "object_id",
    "run_id",
    "step_id",
    "approval_id",
    "request_id",
    "client_ip",
    "before",
    "after",
    "extra",
    "prev_hash",
    "hash",
)
COLUMNS: tuple[str, ...] = (*COLUMNS_1, "team_id", "team_prev_hash", "team_hash")
_JSON_COLUMNS = frozenset({"before", "after", "extra"})
# What spreadsheets read as the start of a formula (OWASP "CSV injection").
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_RECORD_FIELDS = frozenset((*chain.HASHED_FIELDS, "hash"))
_TEAM_RECORD_FIELDS = _RECORD_FIELDS | {*chain.TEAM_FIELDS, "team_hash"}
# The chain's canonical JSON form; one encoder for every line and cell rather than one per call.
_compact_json = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode
_CHUNK = 1024 * 1024
# The manifest and signature are read whole: refuse a zip that claims more than they can need.
_MAX_MANIFEST_BYTES = 1024 * 1024
_MAX_SIGNATURE_BYTES = 1024


class ExportError(Exception):
    """An event handed to ``write_export`` cannot be exported (out of order, not hashable)."""

    def __init__(self, sequence: Any, reason: str) -> None:
        super().__init__(f"cannot export the event at sequence {sequence!r}: {reason}")
        self.sequence = sequence
        self.reason = reason


class UnreadableExport(Exception):
    """The file could not be read as a zip archive at all (missing, unreadable, corrupt)."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """What ``write_export`` wrote into manifest.json, and the sha256 of those exact bytes."""

    created_at: str
    filter: Mapping[str, Any]
    count: int
    first_sequence: int | None
    last_sequence: int | None
    first_prev_hash: str | None
    last_hash: str | None
    contiguous: bool
    files: Mapping[str, Mapping[str, Any]]
    public_key: str
    sha256: str
    team: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TeamScope:
    """Whose export this is, for ``write_export``: the team's id and slug, and whether its events
    are the team's chain without a gap (narrowed by team and dates only)."""

    id: int
    slug: str
    chained: bool


@dataclass(frozen=True, slots=True)
class ExportCheck:
    ok: bool
    reason: str = ""
    # The sequence where the events go wrong; None for a problem of the file as a whole
    # (signature, manifest, a file's hash) or a line whose sequence cannot be known.
    first_bad_sequence: int | None = None
    # Events that passed every check before the first problem.
    count: int = 0
    # The parsed manifest once its signature has verified (None before that).
    manifest: Mapping[str, Any] | None = None


# Keys ---------------------------------------------------------------------------------------------


def private_key_from_b64(text: str) -> Ed25519PrivateKey:
    """The key from base64 of its raw 32 bytes; ValueError (never echoing the text) otherwise."""
    return Ed25519PrivateKey.from_private_bytes(_raw_key(text, "private"))


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(_raw_key(text, "public"))


def _raw_key(text: str, kind: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError, AttributeError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"not an Ed25519 {kind} key (base64 of 32 raw bytes)")
    return raw


def public_key_b64(key: Ed25519PublicKey) -> str:
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")


def fingerprint(public_key: str) -> str:
    """A short form of a base64 public key for people to compare: ``3f2a 9c01 77be 0d4e``
    (the first 16 hex digits of the sha256 of the raw key)."""
    digest = hashlib.sha256(_raw_key(public_key, "public")).hexdigest()
    return " ".join(digest[index : index + 4] for index in range(0, 16, 4))


# Writing ------------------------------------------------------------------------------------------


def write_export(
    events: Iterable[Mapping[str, Any]],
    *,
    out: IO[bytes],
    filter: Mapping[str, Any],
    private_key: Ed25519PrivateKey,
    tmp_dir: str | os.PathLike[str] | None = None,
    team: TeamScope | None = None,
) -> Manifest:
    """Write ``events`` (in sequence order, each with the hashed fields and ``hash``) as a signed
    export zip to ``out``, holding one event at a time.

    ``filter`` is recorded in the manifest as given (it must be JSON). The CSV is spooled to a
    temporary file in ``tmp_dir`` (default: the system's), which needs room for it. ``team``: this
    is that team's export (``events`` are the team's only), verified on its team chain.

    The events are exported as they are, not judged: an export of a tampered trail is evidence, and
    ``verify_export`` names where it breaks. Raises ExportError for events out of sequence order or
    with content the chain cannot hash; ``out`` then holds an incomplete zip to discard.
    """
    created = datetime.now(UTC)
    span = _Span()
    team_span = _TeamSpan()
    jsonl_digest = hashlib.sha256()
    jsonl_bytes = 0
    # Checked before the long part: the manifest must be able to hold it.
    filter_copy = json.loads(json.dumps(dict(filter), allow_nan=False))
    with (
        zipfile.ZipFile(out, "w") as archive,
        tempfile.TemporaryFile(dir=tmp_dir, prefix="audit-export-", suffix=".csv") as spool,
    ):
        text = io.TextIOWrapper(spool, encoding="utf-8", newline="")
        text.write("\ufeff")
        rows = csv.writer(text)
        rows.writerow(COLUMNS)
        with (
            archive.open(_member(JSONL_NAME, created), "w", force_zip64=True) as member,
            # Compressing line by line costs more than making the lines: batch them.
            io.BufferedWriter(member, _CHUNK) as jsonl,  # type: ignore[arg-type]
        ):
            for event in events:
                record = _record(event)
                sequence = record["sequence"]
                if not _is_int(sequence) or sequence <= (span.last_sequence or 0):
                    raise ExportError(sequence, f"not after sequence {span.last_sequence}")
                span.add(record)
                team_span.add(record)
                line = _jsonl_line(record)
                jsonl.write(line)
                jsonl_digest.update(line)
                jsonl_bytes += len(line)
                rows.writerow(csv_row(record))
        text.flush()
        text.detach()  # keep the spool open: closing the wrapper would close it
        spool.seek(0)
        csv_digest = hashlib.sha256()
        csv_bytes = 0
        with archive.open(_member(CSV_NAME, created), "w", force_zip64=True) as member:
            while chunk := spool.read(_CHUNK):
                member.write(chunk)
                csv_digest.update(chunk)
                csv_bytes += len(chunk)

        public_key = public_key_b64(private_key.public_key())
        document: dict[str, Any] = {
            "format": FORMAT,
            "created_at": chain.format_datetime(created),
            "filter": filter_copy,
            "count": span.count,
            "first_sequence": span.first_sequence,
            "last_sequence": span.last_sequence,
            "first_prev_hash": span.first_prev_hash,
            "last_hash": span.last_hash,
            "contiguous": not span.gaps,
            "files": {
                JSONL_NAME: {"sha256": jsonl_digest.hexdigest(), "bytes": jsonl_bytes},
                CSV_NAME: {"sha256": csv_digest.hexdigest(), "bytes": csv_bytes},
            },
            "public_key": public_key,
            "team": None
            if team is None
            else {
                "id": team.id,
                "slug": team.slug,
                "chained": team.chained,
                "first_team_prev_hash": team_span.first_team_prev_hash,
                "last_team_hash": team_span.last_team_hash,
            },
        }
        manifest_bytes = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()
        signature = base64.b64encode(private_key.sign(manifest_bytes)) + b"\n"
        archive.writestr(_member(MANIFEST_NAME, created), manifest_bytes)
        archive.writestr(_member(SIGNATURE_NAME, created), signature)
    return Manifest(
        created_at=document["created_at"],
        filter=document["filter"],
        count=span.count,
        first_sequence=span.first_sequence,
        last_sequence=span.last_sequence,
        first_prev_hash=span.first_prev_hash,
        last_hash=span.last_hash,
        contiguous=not span.gaps,
        files=document["files"],
        public_key=public_key,
        sha256=hashlib.sha256(manifest_bytes).hexdigest(),
        team=document["team"],
    )


def _member(name: str, created: datetime) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=created.timetuple()[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def _record(event: Mapping[str, Any]) -> dict[str, Any]:
    """The event as events.jsonl holds it: the canonical hashed fields, plus ``hash``."""
    sequence = event.get("sequence")
    try:
        record: dict[str, Any] = json.loads(chain.canonical(event))
    except KeyError as exc:
        raise ExportError(sequence, f"field {exc.args[0]!r} is missing") from None
    except (TypeError, ValueError) as exc:
        raise ExportError(sequence, f"unhashable content: {exc}") from None
    record["hash"] = event.get("hash")
    if chain.on_team_chain(event):
        record["team_hash"] = event.get("team_hash")
    return record


def _jsonl_line(record: Mapping[str, Any]) -> bytes:
    return _compact_json(record).encode("utf-8") + b"\n"


def csv_row(record: Mapping[str, Any], columns: tuple[str, ...] = COLUMNS) -> list[str]:
    """The CSV cells of one events.jsonl record, in ``columns`` order."""
    cells = []
    for name in columns:
        value = record.get(name)
        if value is None:
            cell = ""
        elif name in _JSON_COLUMNS:
            cell = _compact_json(value)
        else:
            cell = str(value)
        cells.append("'" + cell if cell.startswith(_FORMULA_STARTS) else cell)
    return cells


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class _Span:
    """What a manifest states about a stream of events in sequence order, gathered as they pass."""

    count: int = 0
    first_sequence: int | None = None
    first_prev_hash: str | None = None
    last_sequence: int | None = None
    last_hash: str | None = None
    gaps: bool = False

    def add(self, record: Mapping[str, Any]) -> None:
        sequence = record["sequence"]
        if self.last_sequence is None:
            self.first_sequence = sequence
            self.first_prev_hash = record["prev_hash"]
        elif sequence > self.last_sequence + 1:
            self.gaps = True
        self.count += 1
        self.last_sequence = sequence
        self.last_hash = record["hash"]


@dataclass
class _TeamSpan:
    """The team chain's ends in a stream of a team's events."""

    first_team_prev_hash: str | None = None
    last_team_hash: str | None = None

    def add(self, record: Mapping[str, Any]) -> None:
        if not chain.on_team_chain(record):
            return
        if self.last_team_hash is None:
            self.first_team_prev_hash = record["team_prev_hash"]
        self.last_team_hash = record.get("team_hash")


class _TeamWalk:
    """Checks a team export's events on the team's chain as they stream past (the module
    docstring says what), holding only the last one's team hash."""

    def __init__(self, team: Mapping[str, Any]) -> None:
        self._team_id = team["id"]
        self._chained = team["chained"]
        self._first_team_prev_hash = team["first_team_prev_hash"]
        self._last_team_hash = team["last_team_hash"]
        self.span = _TeamSpan()

    def step(self, record: Mapping[str, Any]) -> tuple[int | None, str] | None:
        sequence = record.get("sequence")
        if self._chained:
            expected = (
                self._first_team_prev_hash
                if self.span.last_team_hash is None
                else self.span.last_team_hash
            )
        else:
            expected = None  # each event on its own: anchored on its own team_prev_hash
        alone = chain.verify_team((record,), team_id=self._team_id, first_team_prev_hash=expected)
        if not alone.ok:
            return (sequence if _is_int(sequence) else None), alone.reason
        self.span.add(record)
        return None

    def end(self) -> tuple[int | None, str] | None:
        """Whether the team chain's ends are the manifest's (a cut tail otherwise)."""
        if (self.span.first_team_prev_hash, self.span.last_team_hash) != (
            self._first_team_prev_hash,
            self._last_team_hash,
        ):
            return None, "the team chain's ends differ from the manifest's team hashes"
        return None


class _Walk:
    """Checks the events of an export as they stream past, holding only the last one's sequence
    and hash (see the module docstring for what is checked across gaps).

    The first event must be the manifest's ``first_sequence`` and link to its ``first_prev_hash``;
    a ``contiguous`` export may skip no sequence.
    """

    def __init__(
        self, *, first_sequence: int | None, first_prev_hash: str | None, contiguous: bool
    ) -> None:
        self._first_sequence = first_sequence
        self._first_prev_hash = first_prev_hash
        self._contiguous = contiguous
        self.span = _Span()

    def expected(self) -> int | None:
        """The sequence the next event should have, where that is known."""
        last = self.span.last_sequence
        if last is None:
            return self._first_sequence
        return last + 1 if self._contiguous else None

    def step(self, record: Mapping[str, Any]) -> tuple[int | None, str] | None:
        """Check the next event; (bad sequence, reason) at the first problem, else None."""
        sequence = record.get("sequence")
        if not _is_int(sequence) or sequence < 1:
            return self.expected(), f"{sequence!r} is not a sequence number"
        prev_hash = record.get("prev_hash")
        last = self.span.last_sequence
        if last is None:
            if sequence != self._first_sequence:
                return self._first_sequence, (
                    f"the first event is {sequence}, the manifest says {self._first_sequence}"
                )
            if prev_hash != self._first_prev_hash:
                return sequence, "prev_hash differs from the manifest's first_prev_hash"
        elif sequence <= last:
            return last + 1, f"sequence {sequence} is out of order (after {last})"
        elif sequence > last + 1:
            if self._contiguous:
                return last + 1, f"sequence {last + 1} is missing (next event is {sequence})"
        elif prev_hash != self.span.last_hash:
            return sequence, "prev_hash does not match the previous event's hash"
        # The event as a one-event slice of the chain: its fields, and its hash over its content
        # and its prev_hash (which must be the genesis hash for sequence 1).
        alone = chain.verify((record,), start_sequence=sequence)
        if not alone.ok:
            return sequence, alone.reason
        self.span.add(record)
        return None


# Verifying ----------------------------------------------------------------------------------------


def verify_export(
    path: str | os.PathLike[str] | IO[bytes], *, public_key: str | None = None
) -> ExportCheck:
    """Check an export zip offline, reading it as a stream.

    Checks, in order: the signature of manifest.json (with the public key it names, and that this
    is ``public_key`` when given: base64, e.g. the installation's, or the export proves only that
    someone signed it); every event of events.jsonl (hash, links, order, the manifest's first and
    last sequence and hashes, the count); that each CSV row is what that event renders to; the
    sha256 and size of both files. Stops at the first problem.

    Raises ValueError for a malformed ``public_key`` and UnreadableExport when the file cannot be
    read as a zip; a readable file that is not a valid export gives ``ok=False``.
    """
    pinned = public_key_from_b64(public_key) if public_key is not None else None
    try:
        with zipfile.ZipFile(path) as archive:
            return _verify_archive(archive, pinned)
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UnreadableExport(str(exc) or type(exc).__name__) from None


def _verify_archive(archive: zipfile.ZipFile, pinned: Ed25519PublicKey | None) -> ExportCheck:
    names = archive.namelist()
    expected = {JSONL_NAME, CSV_NAME, MANIFEST_NAME, SIGNATURE_NAME}
    missing = sorted(expected - set(names))
    if missing:
        return ExportCheck(ok=False, reason=f"{missing[0]} is missing from the export")
    for name in names:
        if name not in expected:
            return ExportCheck(ok=False, reason=f"unexpected file {name!r} in the export")
    if len(names) != len(expected):
        # Two members of one name: different tools would show different content.
        return ExportCheck(ok=False, reason="the export holds a file twice")

    manifest_bytes = _read_small(archive, MANIFEST_NAME, _MAX_MANIFEST_BYTES)
    signature_text = _read_small(archive, SIGNATURE_NAME, _MAX_SIGNATURE_BYTES)
    if manifest_bytes is None or signature_text is None:
        return ExportCheck(ok=False, reason="manifest.json or manifest.sig is too large")
    try:
        manifest = json.loads(manifest_bytes)
    except ValueError:
        return ExportCheck(ok=False, reason="manifest.json is not JSON")
    if not isinstance(manifest, dict) or manifest.get("format") not in (FORMAT, FORMAT_1):
        return ExportCheck(ok=False, reason=f"manifest.json is not a {FORMAT} manifest")
    key_text = manifest.get("public_key")
    try:
        embedded = public_key_from_b64(key_text if isinstance(key_text, str) else "")
        signature = base64.b64decode(signature_text.strip(), validate=True)
    except (ValueError, binascii.Error):
        return ExportCheck(ok=False, reason="manifest public_key or manifest.sig is not base64")
    try:
        embedded.verify(signature, manifest_bytes)
    except InvalidSignature:
        return ExportCheck(
            ok=False, reason="the signature does not match manifest.json (changed after signing)"
        )
    if pinned is not None and public_key_b64(pinned) != public_key_b64(embedded):
        return ExportCheck(
            ok=False,
            reason=(
                f"signed by key {fingerprint(public_key_b64(embedded))}, "
                f"not by the expected key {fingerprint(public_key_b64(pinned))}"
            ),
        )

    bad_field = _manifest_problem(manifest)
    if bad_field is not None:
        return ExportCheck(ok=False, reason=f"manifest.json: {bad_field}", manifest=manifest)
    walk = _Walk(
        first_sequence=manifest["first_sequence"],
        first_prev_hash=manifest["first_prev_hash"],
        contiguous=manifest["contiguous"],
    )
    with archive.open(JSONL_NAME) as jsonl_member, archive.open(CSV_NAME) as csv_member:
        jsonl = _Meter(jsonl_member)
        csv_meter = _Meter(csv_member)
        lines = io.BufferedReader(jsonl, _CHUNK)
        csv_text = io.TextIOWrapper(io.BufferedReader(csv_meter, _CHUNK), "utf-8", newline="")
        _allow_csv_fields_of(manifest["files"][CSV_NAME]["bytes"])
        problem = _check_events(lines, csv_text, walk, manifest)
        if problem is None:
            for name, meter in ((JSONL_NAME, jsonl), (CSV_NAME, csv_meter)):
                listed = manifest["files"][name]
                if (meter.digest.hexdigest(), meter.size) != (listed["sha256"], listed["bytes"]):
                    problem = None, f"{name} does not match its sha256 and size in the manifest"
                    break
    if problem is not None:
        return ExportCheck(
            ok=False,
            reason=problem[1],
            first_bad_sequence=problem[0],
            count=walk.span.count,
            manifest=manifest,
        )
    return ExportCheck(ok=True, count=walk.span.count, manifest=manifest)


def _allow_csv_fields_of(size: int) -> None:
    """Let the CSV reader take a field as large as the whole file (an event's JSON is one field,
    and the reader's default limit of 128 kB is smaller than events the trail can hold).

    The limit is per process: it is only ever raised, so a verification running in another
    thread never sees it lowered under its feet. No field can outgrow the file it is in."""
    wanted = min(max(size, 0), sys.maxsize)
    if wanted > csv.field_size_limit():
        csv.field_size_limit(wanted)


def _read_small(archive: zipfile.ZipFile, name: str, limit: int) -> bytes | None:
    with archive.open(name) as member:
        content = member.read(limit + 1)
    return content if len(content) <= limit else None


def _manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """What is malformed in a (signed) manifest: a bug or another format version, not tampering."""

    for name in ("first_sequence", "last_sequence"):
        if not (manifest.get(name) is None or _is_int(manifest.get(name))):
            return f"{name} is not a sequence number"
    for name in ("first_prev_hash", "last_hash"):
        if not (manifest.get(name) is None or isinstance(manifest.get(name), str)):
            return f"{name} is not a hash"
    if not _is_int(manifest.get("count")) or not isinstance(manifest.get("contiguous"), bool):
        return "count or contiguous is missing"
    team = manifest.get("team")
    if team is not None and not (
        manifest.get("format") == FORMAT
        and isinstance(team, dict)
        and _is_int(team.get("id"))
        and isinstance(team.get("slug"), str)
        and isinstance(team.get("chained"), bool)
        and all(
            team.get(name) is None or isinstance(team.get(name), str)
            for name in ("first_team_prev_hash", "last_team_hash")
        )
    ):
        return "team is not a team's id, slug, chained flag and hashes"
    files = manifest.get("files")
    for name in (JSONL_NAME, CSV_NAME):
        listed = files.get(name) if isinstance(files, dict) else None
        if not (
            isinstance(listed, dict)
            and isinstance(listed.get("sha256"), str)
            and _is_int(listed.get("bytes"))
        ):
            return f"files lacks the sha256 and size of {name}"
    return None


def _check_events(
    lines: Iterable[bytes], csv_text: io.TextIOWrapper, walk: _Walk, manifest: Mapping[str, Any]
) -> tuple[int | None, str] | None:
    """Walk events.jsonl line by line, and events.csv row by row beside it."""
    team = manifest.get("team")
    team_walk = _TeamWalk(team) if team is not None else None
    columns, record_fields = (
        (COLUMNS, (_RECORD_FIELDS, _TEAM_RECORD_FIELDS))
        if manifest["format"] == FORMAT
        else (COLUMNS_1, (_RECORD_FIELDS,))
    )
    try:
        if csv_text.read(1) != "\ufeff":
            return None, "events.csv does not start with a UTF-8 byte order mark"
        rows: Iterator[list[str]] = csv.reader(csv_text)
        if next(rows, None) != list(columns):
            return None, "events.csv does not have the expected header row"
    except (csv.Error, UnicodeDecodeError) as exc:
        return None, f"events.csv cannot be read: {exc}"

    for number, line in enumerate(lines, start=1):
        where = f"events.jsonl line {number}"
        if not line.endswith(b"\n"):
            return walk.expected(), f"{where} is cut off (no line end)"
        try:
            record = json.loads(line)
        except ValueError:
            return walk.expected(), f"{where} is not JSON"
        if not isinstance(record, dict):
            return walk.expected(), f"{where} is not a JSON object"
        fields = _TEAM_RECORD_FIELDS if chain.on_team_chain(record) else _RECORD_FIELDS
        if fields not in record_fields or record.keys() != fields:
            odd = sorted(record.keys() ^ _RECORD_FIELDS)
            return walk.expected(), f"{where} has missing or unexpected fields {odd}"
        problem = walk.step(record)
        if problem is None and team_walk is not None:
            problem = team_walk.step(record)
        if problem is not None:
            return problem
        sequence = walk.span.last_sequence
        try:
            row = next(rows, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            return sequence, f"events.csv cannot be read at this event: {exc}"
        if row is None:
            return sequence, "events.csv ends before this event"
        expected = csv_row(record, columns)
        if row != expected:
            index = next(
                index for index, (got, want) in enumerate(zip_longest(row, expected)) if got != want
            )
            column = columns[index] if index < len(columns) else f"column {index + 1}"
            return sequence, f"events.csv differs from events.jsonl in {column!r}"
    # A cut JSONL first: it names where the events stop, extra CSV rows only follow from it.
    problem = _check_end(walk, manifest)
    if problem is None and team_walk is not None:
        problem = team_walk.end()
    if problem is not None:
        return problem
    try:
        extra_row = next(rows, None)
    except (csv.Error, UnicodeDecodeError) as exc:
        return None, f"events.csv cannot be read after the last event: {exc}"
    if extra_row is not None:
        return None, "events.csv has rows after the last event of events.jsonl"
    return None


def _check_end(walk: _Walk, manifest: Mapping[str, Any]) -> tuple[int | None, str] | None:
    """Whether the events that verified are all the manifest promised (a cut tail otherwise)."""
    span = walk.span
    last = manifest["last_sequence"]
    if span.count != manifest["count"] or span.last_sequence != last:
        past = span.last_sequence is not None and last is not None and span.last_sequence > last
        return last + 1 if past else walk.expected(), (
            f"events.jsonl holds {span.count} events up to sequence {span.last_sequence}; "
            f"the manifest says {manifest['count']} up to sequence {last}"
        )
    if span.last_hash != manifest["last_hash"]:
        return span.last_sequence, "the last event's hash differs from the manifest's last_hash"
    if span.gaps == manifest["contiguous"]:
        return None, "the manifest's contiguous flag does not match the events"
    return None


class _Meter(io.RawIOBase):
    """A zip member read through this counts and hashes its bytes on the way, so one pass serves
    the event checks and the file digests."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view))
        view[: len(data)] = data
        self.digest.update(data)
        self.size += len(data)
        return len(data)
