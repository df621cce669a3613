"""Passkey registration on the profile page (WebAuthn through the ``webauthn`` library).

The relying party is the dashboard's own host: ``PANDAWEB_PASSKEY_RP_ID`` or the host of
``PANDAWEB_BASE_URL``; the origin an assertion must come from is ``PANDAWEB_BASE_URL``'s.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from webauthn import (
    generate_registration_options,
    options_to_json,
    verify_registration_response,
)
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url
from webauthn.helpers.exceptions import InvalidRegistrationResponse
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from pandaweb.audit.services import audit_record
from pandaweb.reviewers.models import Passkey

SESSION_KEY = "passkey_registration_challenge"


class PasskeyError(Exception):
    """A passkey could not be registered or did not verify; the message is for people."""


def rp_id() -> str:
    return settings.PASSKEY_RP_ID or (urlsplit(settings.PANDAWEB_BASE_URL).hostname or "localhost")


def expected_origin() -> str:
    parts = urlsplit(settings.PANDAWEB_BASE_URL)
    return f"{parts.scheme}://{parts.netloc}"


def passkey_registration_options(*, user: User, session: Any) -> str:
    """Options for ``navigator.credentials.create``; the challenge waits in the session."""
    options = generate_registration_options(
        rp_id=rp_id(),
        rp_name=settings.PASSKEY_RP_NAME,
        user_id=f"pandaweb-user-{user.pk}".encode(),
        user_name=user.get_username(),
        exclude_credentials=[
            PublicKeyCredentialDescriptor(id=base64url_to_bytes(p.credential_id))
            for p in user.passkeys.all()
        ],
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED,
            user_verification=UserVerificationRequirement.REQUIRED,
        ),
    )
    session[SESSION_KEY] = bytes_to_base64url(options.challenge)
    return options_to_json(options)


def passkey_register(*, user: User, session: Any, credential: str, name: str = "") -> Passkey:
    """Verify the browser's attestation against the session's challenge (single use) and keep
    the credential's public key."""
    challenge = session.pop(SESSION_KEY, None)
    if not challenge:
        raise PasskeyError("start the registration again: its challenge is gone")
    try:
        verified = verify_registration_response(
            credential=json.loads(credential),
            expected_challenge=base64url_to_bytes(challenge),
            expected_origin=expected_origin(),
            expected_rp_id=rp_id(),
            require_user_verification=True,
        )
    except (InvalidRegistrationResponse, ValueError, KeyError, TypeError) as exc:
        raise PasskeyError(f"the passkey did not verify: {exc}") from None
    with transaction.atomic():
        passkey = Passkey.objects.create(
            user=user,
            name=name.strip()[:80] or f"Passkey {user.passkeys.count() + 1}",
            credential_id=bytes_to_base64url(verified.credential_id),
            public_key=verified.credential_public_key,
            sign_count=verified.sign_count,
        )
        audit_record(
            action="passkey.registered",
            object_type="passkey",
            object_id=passkey.pk,
            actor=user,
            after={"name": passkey.name, "credential_id": passkey.credential_id[:16]},
        )
    return passkey


def passkey_delete(*, user: User, passkey_id: int) -> None:
    with transaction.atomic():
        passkey = Passkey.objects.select_for_update().get(pk=passkey_id, user=user)
        audit_record(
            action="passkey.deleted",
            object_type="passkey",
            object_id=passkey.pk,
            actor=user,
            before={"name": passkey.name},
        )
        passkey.delete()
