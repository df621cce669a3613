"""Encryption of credential values at rest (no Django imports).

MultiFernet over keys from the environment: the first key encrypts, every key decrypts, so a new
key can be put in front, everything re-encrypted with it (``rotate``), and the old key removed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cryptography.fernet import Fernet, InvalidToken, MultiFernet


class VaultError(Exception):
    pass


def generate_key() -> str:
    return Fernet.generate_key().decode()


def check_key(key: str) -> None:
    """Raise ValueError if ``key`` is not a Fernet key (32 url-safe base64-encoded bytes)."""
    try:
        Fernet(key.encode())
    except (ValueError, TypeError):
        raise ValueError("not a Fernet key (32 url-safe base64-encoded bytes)") from None


class Vault:
    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise VaultError("the vault needs at least one key")
        self._fernet = MultiFernet([Fernet(key.encode()) for key in keys])

    def seal(self, payload: dict[str, str]) -> str:
        return self._fernet.encrypt(json.dumps(payload, sort_keys=True).encode()).decode()

    def open(self, token: str) -> dict[str, str]:
        try:
            data = json.loads(self._fernet.decrypt(token.encode()))
        except InvalidToken:
            # Never include the token or any key material: messages end up in logs and the UI.
            raise VaultError(
                "a credential could not be decrypted with any configured key"
            ) from None
        if not isinstance(data, dict):
            raise VaultError("a credential's decrypted value is not a mapping")
        return {str(k): str(v) for k, v in data.items()}

    def rotate(self, token: str) -> str:
        try:
            return self._fernet.rotate(token.encode()).decode()
        except InvalidToken:
            raise VaultError(
                "a credential could not be decrypted with any configured key"
            ) from None
