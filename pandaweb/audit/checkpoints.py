"""Signed checkpoints of the audit chain's head, kept where the database cannot reach.

The hash chain shows that no event was changed in place, but whoever can write the table can
also cut rows off its end, or edit an event and recompute every later hash: the table alone
then looks intact. A checkpoint is the head at one moment (sequence, hash, time) signed with the
audit key and written as a file into ``PANDAWEB_AUDIT_CHECKPOINT_DIR`` (and, when configured,
e-mailed to compliance). ``audit_verify --checkpoints DIR`` then requires the database chain to
still hold every checkpointed event, unchanged.

Written at a fixed interval (the embedded housekeeping thread, Celery beat in scale-out) and on
every export. One file per checkpoint, created exclusively and never rewritten; the directory
should live on storage the database's administrators cannot write (another mount, another
machine's share, an append-only bucket synced from it).
"""

from __future__ import annotations

import base64
import json
import logging
import os
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from django.conf import settings
from django.core.mail import send_mail
from django.utils import timezone

from pandaweb.audit import chain, signing
from pandaweb.audit.export import fingerprint, public_key_from_b64
from pandaweb.audit.models import AuditEvent

logger = logging.getLogger(__name__)

FORMAT = "pandaweb-audit-checkpoint/1"
SIGNED_FIELDS = ("format", "sequence", "hash", "time", "reason", "public_key")
# A checkpoint file is a few hundred bytes; anything much larger is not one.
_MAX_FILE_BYTES = 10_000


@dataclass(frozen=True)
class Checkpoint:
    sequence: int
    hash: str
    time: str
    reason: str
    public_key: str
    path: Path | None = None


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted (unreadable, unsigned, signed by another key)."""


def checkpoint_dir() -> Path:
    return Path(settings.AUDIT_CHECKPOINT_DIR)


def _signed_bytes(fields: dict[str, Any]) -> bytes:
    chosen = {name: fields[name] for name in SIGNED_FIELDS}
    return json.dumps(chosen, sort_keys=True, separators=(",", ":")).encode()


def audit_checkpoint_write(*, reason: str, directory: Path | None = None) -> Checkpoint | None:
    """Sign the current head and write it as a new file; None for an empty trail.

    ``reason`` is ``interval`` or ``export``. Idempotent for ``interval``: when the newest file
    already holds this head, nothing is written. Reads the head in one query and writes no
    database row, so it never waits on or blocks the trail's writers.
    """
    directory = directory or checkpoint_dir()
    head = AuditEvent.objects.order_by("-sequence").values("sequence", "hash").first()
    if head is None:
        return None
    if reason == "interval":
        newest = _newest(directory)
        if newest is not None and (newest.sequence, newest.hash) == (
            head["sequence"],
            head["hash"],
        ):
            return None
    key = signing.signing_key()
    fields: dict[str, Any] = {
        "format": FORMAT,
        "sequence": head["sequence"],
        "hash": head["hash"],
        "time": chain.format_datetime(timezone.now()),
        "reason": reason,
        "public_key": signing.public_key_b64(),
    }
    signature = base64.b64encode(key.sign(_signed_bytes(fields))).decode("ascii")
    document = json.dumps({**fields, "signature": signature}, indent=2, sort_keys=True) + "\n"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S%f")
    path = directory / f"checkpoint-{head['sequence']:012d}-{stamp}-{os.getpid()}.json"
    # O_EXCL: a checkpoint is never overwritten, not even by another process's.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(document)
        handle.flush()
        os.fsync(handle.fileno())
    checkpoint = Checkpoint(
        sequence=fields["sequence"],
        hash=fields["hash"],
        time=fields["time"],
        reason=reason,
        public_key=fields["public_key"],
        path=path,
    )
    _mail(checkpoint, document)
    return checkpoint


def _mail(checkpoint: Checkpoint, document: str) -> None:
    recipients = settings.AUDIT_CHECKPOINT_EMAILS
    if not recipients:
        return
    try:
        send_mail(
            subject=f"pandaweb audit checkpoint: sequence {checkpoint.sequence}",
            message=(
                "The audit trail's head, signed with the installation's audit key. Keep this "
                "message: `manage.py audit_verify --checkpoints DIR` checks the trail against "
                "saved checkpoints.\n\n" + document
            ),
            from_email=None,
            recipient_list=recipients,
        )
    except Exception:  # the file is written; a mail server that is down must not stop that
        logger.exception("could not e-mail audit checkpoint %s", checkpoint.sequence)


def read_checkpoint(path: Path, *, pinned_fingerprint: str) -> Checkpoint:
    """The checkpoint in ``path``, its signature checked and its key the pinned one."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"{path.name} cannot be read: {exc.strerror}") from None
    if len(raw) > _MAX_FILE_BYTES:
        raise CheckpointError(f"{path.name} is too large to be a checkpoint")
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a checkpoint")
        for name in SIGNED_FIELDS:
            if name not in data:
                raise ValueError(f"lacks {name}")
        sequence = data["sequence"]
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
            raise ValueError("has no valid sequence")
        key = public_key_from_b64(data["public_key"])
        signature = base64.b64decode(str(data.get("signature", "")), validate=True)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path.name} is not a {FORMAT} file ({exc})") from None
    signer = fingerprint(data["public_key"])
    if _plain(signer) != _plain(pinned_fingerprint):
        raise CheckpointError(
            f"{path.name} is signed by key {signer}, not by the expected key {pinned_fingerprint}"
        )
    try:
        key.verify(signature, _signed_bytes(data))
    except InvalidSignature:
        raise CheckpointError(f"{path.name}: the signature does not match its content") from None
    return Checkpoint(
        sequence=sequence,
        hash=str(data["hash"]),
        time=str(data["time"]),
        reason=str(data["reason"]),
        public_key=data["public_key"],
        path=path,
    )


def _plain(fingerprint_text: str) -> str:
    return "".join(fingerprint_text.split()).lower()


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("checkpoint-*.json")) if directory.is_dir() else []


def _newest(directory: Path) -> Checkpoint | None:
    """The newest readable checkpoint this installation wrote (for the interval's dedup only)."""
    for path in reversed(_files(directory)):
        try:
            return read_checkpoint(path, pinned_fingerprint=signing.public_key_fingerprint())
        except CheckpointError:
            continue
    return None


def pinned_fingerprint() -> str:
    """The fingerprint exports and checkpoints must be signed with: the configured one
    (``PANDAWEB_AUDIT_PUBLIC_KEY_FINGERPRINT``), else this installation's own key's."""
    return settings.AUDIT_PUBLIC_KEY_FINGERPRINT or signing.public_key_fingerprint()


def audit_verify_checkpoints(
    result: chain.VerifyResult, directory: Path, *, pinned: str | None = None
) -> tuple[chain.VerifyResult, int]:
    """``result`` (a verification of the whole database chain) unless a checkpoint in
    ``directory`` shows the chain was cut short or rewritten; with the number of checkpoints
    checked. A checkpoint that is not validly signed by the pinned key is itself a failure:
    a forged one must not pass silently, and a missing signature proves nothing.
    """
    pinned = pinned or pinned_fingerprint()
    if not result.ok:
        return result, 0  # the chain itself is broken: that is the first problem to report
    paths = _files(directory)
    if not paths and result.count:
        reason = f"no checkpoint in {directory}: nothing to compare the chain's end with"
        return replace(result, ok=False, reason=reason), 0
    checked = 0
    for path in paths:
        try:
            checkpoint = read_checkpoint(path, pinned_fingerprint=pinned)
        except CheckpointError as exc:
            return replace(result, ok=False, reason=str(exc)), checked
        checked += 1
        seen = result.last_sequence or 0
        if seen < checkpoint.sequence:
            return replace(
                result,
                ok=False,
                first_bad_sequence=seen + 1,
                reason=f"the chain ends at sequence {seen}, but the checkpoint of "
                f"{checkpoint.time} ({path.name}) signed sequence {checkpoint.sequence} "
                "(truncated)",
            ), checked
        stored = (
            AuditEvent.objects.filter(sequence=checkpoint.sequence)
            .values_list("hash", flat=True)
            .first()
        )
        if stored != checkpoint.hash:
            return replace(
                result,
                ok=False,
                first_bad_sequence=checkpoint.sequence,
                reason=f"event {checkpoint.sequence} differs from the checkpoint of "
                f"{checkpoint.time} ({path.name}): the chain was rewritten up to it",
            ), checked
    return result, checked
