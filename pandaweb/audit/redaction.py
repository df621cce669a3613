"""Keep secrets out of the audit trail (no Django imports).

The trail is append-only and exported to people who must not see credentials, so a secret that
reaches it can never be taken back. Redaction is by key name, applied to ``before``, ``after`` and
``extra`` before they are hashed and stored: a value under a key that looks secret becomes
``"[redacted]"``. Key names are split at camelCase humps and lower-cased first, so ``apiKey``,
``API_KEY`` and ``api-key`` all match. Matching errs on the side of hiding: ``access_token_expiry``
is hidden too.

``None`` and booleans are kept: they carry no secret, and they say whether a secret is set
(``{"totp_enabled": True}``, ``{"password": None}``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"

# Long names match anywhere ("userPassword", "accessToken"); short ones ("pass", "pin", "otp",
# "pwd") only as a whole word, so that "passenger", "compass" or "footprint" are not hidden.
SECRET_KEY = re.compile(
    r"password|passwd|passphrase|secret|token|seed|totp"
    r"|api[_-]?key|private[_-]?key|key[_-]?material|signing[_-]?key|encryption[_-]?key"
    r"|ciphertext|authorization|cookie"
    r"|(?<![a-z])(pass|pwd|pin|otp)(?![a-z])"
)
CAMEL_HUMP = re.compile(r"([a-z0-9])([A-Z])")

# Inside a credential, "value" is the secret itself ({"name": "bank login", "value": "…"}).
CREDENTIAL_KEY = re.compile(r"credential", re.IGNORECASE)
CREDENTIAL_VALUE_KEY = re.compile(r"^value$", re.IGNORECASE)


def is_secret_key(key: str, *, in_credential: bool = False) -> bool:
    words = CAMEL_HUMP.sub(r"\1_\2", key).lower()
    if SECRET_KEY.search(words):
        return True
    return in_credential and CREDENTIAL_VALUE_KEY.search(key) is not None


def redact(value: Any, *, credential: bool = False) -> Any:
    """A copy of ``value`` with the values of secret-looking keys replaced, at any depth.

    ``credential=True`` says ``value`` itself is a credential payload (its ``value`` key is the
    secret); nested mappings under a key containing "credential" are treated the same way.
    Leaves other values alone; never mutates its argument.
    """
    if isinstance(value, Mapping):
        result: dict[Any, Any] = {}
        for key, item in value.items():
            name = str(key)
            if is_secret_key(name, in_credential=credential):
                result[key] = _hide(item)
            else:
                nested = credential or CREDENTIAL_KEY.search(name) is not None
                result[key] = redact(item, credential=nested)
        return result
    if isinstance(value, list | tuple):
        return [redact(item, credential=credential) for item in value]
    return value


def _hide(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    return REDACTED
