"""The Web Push (VAPID) key pair: the private key from settings, the public one for browsers."""

from __future__ import annotations

from functools import cache

from cryptography.hazmat.primitives import serialization
from django.conf import settings
from py_vapid import Vapid02, b64urlencode


@cache
def vapid() -> Vapid02:
    return Vapid02.from_pem(settings.VAPID_PRIVATE_KEY.encode())


def application_server_key() -> str:
    """The public key as browsers want it for ``pushManager.subscribe`` (base64url, raw point)."""
    raw = vapid().public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return str(b64urlencode(raw))
