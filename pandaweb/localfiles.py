"""The per-installation files of the embedded default: Django's secret key, the credential keys
and the Web Push signing key, kept beside the data so that sessions and stored credentials survive
restarts without anyone having to invent a secret on day one.

The entry points create them (manage.py, the ASGI application, the test run); importing the
settings only reads them, so tools that import the settings (type checkers, linters, a read-only
container) write nothing. An installation that sets PANDAWEB_SECRET_KEY and
PANDAWEB_CREDENTIAL_KEYS (and PANDAWEB_VAPID_PRIVATE_KEY) needs none of these files.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY_FILE = "secret_key"  # noqa: S105 (a file name, not a secret)
CREDENTIAL_KEYS_FILE = "credential_keys"
VAPID_KEY_FILE = "vapid_private_key.pem"


def data_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get("PANDAWEB_DATA_DIR") or BASE_DIR / "var")


def ensure_local_files(environ: Mapping[str, str] = os.environ) -> None:
    """Create the data directory and whichever keys the environment does not give (mode 0600).
    Idempotent; never replaces a file that exists."""
    directory = data_dir(environ)
    directory.mkdir(parents=True, exist_ok=True)
    if not environ.get("PANDAWEB_SECRET_KEY"):
        _create(directory / SECRET_KEY_FILE, secrets.token_urlsafe(50))
    if not environ.get("PANDAWEB_CREDENTIAL_KEYS"):
        _create(directory / CREDENTIAL_KEYS_FILE, Fernet.generate_key().decode() + "\n")
    if not environ.get("PANDAWEB_VAPID_PRIVATE_KEY"):
        _create(directory / VAPID_KEY_FILE, _vapid_private_pem())


def _vapid_private_pem() -> str:
    """A Web Push (VAPID, RFC 8292) signing key: P-256, PKCS#8 PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _create(path: Path, content: str) -> None:
    # O_EXCL: two processes starting at once keep the first one's key, never half of each.
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(descriptor, "w") as file:
        file.write(content)
