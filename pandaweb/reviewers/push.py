"""Web Push: the VAPID key pair (the private key from settings, the public one for browsers)
and which endpoints pandaweb posts to."""

from __future__ import annotations

import ipaddress
from functools import cache
from urllib.parse import urlsplit

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


def push_endpoint_refusal(endpoint: str) -> str | None:
    """Why pandaweb will not post to ``endpoint`` (None when it will). Push services are public
    HTTPS hosts; an address in a private range is never one."""
    parts = urlsplit(endpoint)
    if parts.scheme != "https" and not (parts.scheme == "http" and settings.WEB_PUSH_ALLOW_HTTP):
        return "a push endpoint must be an https URL"
    host = parts.hostname or ""
    if not host:
        return "a push endpoint needs a host"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if settings.WEB_PUSH_ALLOW_HTTP and address.is_loopback:
        return None  # a loopback fake push service, allowed together with plain http
    if not address.is_global:
        return "a push endpoint may not be a private, loopback or link-local address"
    return None
