"""The key that signs audit exports.

``PANDAWEB_AUDIT_SIGNING_KEY`` is base64 of a raw 32-byte Ed25519 private key. Without it, a key
is generated once into ``DATA_DIR/audit_signing_key`` (same format, mode 0600), as the settings do
for the credential keys, so an embedded installation signs from day one. Whoever holds the public
key (the audit page, ``manage.py audit_public_key``) can check an export offline; keep the private
key as safe as the database, since it can sign a forged export.

Read on every use rather than at start-up: the server starts without it, and a bad value surfaces
as one ImproperlyConfigured line when something is signed or the key is shown.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from pandaweb.audit import export

ENV_NAME = "PANDAWEB_AUDIT_SIGNING_KEY"


def signing_key() -> Ed25519PrivateKey:
    """The installation's export signing key (generated on first use when not configured)."""
    configured = os.environ.get(ENV_NAME, "").strip()
    if configured:
        try:
            return export.private_key_from_b64(configured)
        except ValueError as exc:
            # Never the value itself: messages end up in logs.
            raise ImproperlyConfigured(f"{ENV_NAME} is {exc}") from None
    path = key_file()
    if not path.exists():
        _generate(path)
    try:
        return export.private_key_from_b64(path.read_text())
    except ValueError as exc:
        raise ImproperlyConfigured(f"{path} is {exc}") from None


def key_file() -> Path:
    return Path(settings.DATA_DIR) / "audit_signing_key"


def public_key_b64() -> str:
    """base64 of the raw 32-byte public key, as manifests carry it."""
    return export.public_key_b64(signing_key().public_key())


def public_key_fingerprint() -> str:
    """``3f2a 9c01 77be 0d4e``: the first 16 hex digits of the sha256 of the raw public key."""
    return export.fingerprint(public_key_b64())


def _generate(path: Path) -> None:
    raw = Ed25519PrivateKey.generate().private_bytes(
        Encoding.Raw, PrivateFormat.Raw, NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target with mode 0600 from the start, then linked into place: link
    # refuses an existing name, so two processes starting at once keep one key (the loser reads
    # the winner's), and nobody ever reads a half-written file.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(base64.b64encode(raw).decode("ascii") + "\n")
        os.link(partial, path)
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)
