"""Passkey step-up for approvals: when a workflow asks for it, a verdict needs a fresh WebAuthn
assertion whose challenge is bound to this request's evidence.

The challenge is sha256(evidence hash || server nonce). The nonce is single-use, short-lived and
issued to one reviewer for one request, so an assertion made for another request, for changed
evidence, by another person or replayed from an earlier attempt never verifies.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.models import User
from django.utils import timezone
from webauthn import (
    generate_authentication_options,
    options_to_json,
    verify_authentication_response,
)
from webauthn.helpers import base64url_to_bytes
from webauthn.helpers.exceptions import InvalidAuthenticationResponse
from webauthn.helpers.structs import PublicKeyCredentialDescriptor, UserVerificationRequirement

from approvals.facts import approval_amount, approval_amounts
from approvals.models import ApprovalRequest
from approvals.policy import approval_refusal
from pandaweb.reviewers.models import Passkey, StepUpChallenge
from pandaweb.reviewers.passkeys import expected_origin, rp_id
from workflows.schema import ApprovalPolicy

CHALLENGE_LIFETIME = timedelta(minutes=3)


class StepUpRefused(Exception):
    """No valid assertion for this request; the message is for people."""


def approval_policy(approval: ApprovalRequest) -> ApprovalPolicy:
    """The approval settings of the (immutable) version the run executes."""
    return approval.run.version.settings_model.approval


def passkey_required(approval: ApprovalRequest) -> bool:
    """Whether a verdict on ``approval`` needs a passkey. Fails closed: with ``above``, a request
    with no amount, or one amount it cannot read, needs one; with several (the page's, the one
    read earlier, the money parameter's) the largest decides."""
    policy = approval_policy(approval)
    mode = policy.passkey
    if mode == "always":
        return True
    if mode != "above":
        return False
    amounts = approval_amounts(approval)
    if not amounts or any(amount is None for amount in amounts):
        return True
    return max(a for a in amounts if a is not None) > (policy.passkey_above_amount or Decimal(0))


def passkey_reason(approval: ApprovalRequest) -> str:
    """Why a verdict on ``approval`` needs a passkey, in words for the reviewer ("" when it
    needs none): said before they tap, never discovered after."""
    if not passkey_required(approval):
        return ""
    policy = approval_policy(approval)
    if policy.passkey == "always":
        return "this workflow asks for one with every verdict"
    amounts = approval_amounts(approval)
    if not amounts or any(amount is None for amount in amounts):
        return "the amount could not be read, and this workflow asks for one above an amount"
    value = max(a for a in amounts if a is not None)
    shown = approval_amount(approval)
    currency = shown[1] if shown else ""
    limit = policy.passkey_above_amount or Decimal("0")
    return f"the amount, {f'{value:,.2f} {currency}'.strip()}, is above {limit:,.2f}"


def _challenge(evidence_sha256: str, nonce: str) -> str:
    return hashlib.sha256(bytes.fromhex(evidence_sha256) + bytes.fromhex(nonce)).hexdigest()


def step_up_options(*, approval: ApprovalRequest, user: User) -> str:
    """Options for ``navigator.credentials.get`` for ``user`` deciding ``approval``: a new
    single-use nonce each call. Refused when the user has no passkey, or may not decide it
    (another team's request, for one)."""
    refusal = approval_refusal(user, approval)
    if refusal:
        raise StepUpRefused(refusal)
    passkeys = list(user.passkeys.all())
    if not passkeys:
        raise StepUpRefused("register a passkey on your profile page first")
    nonce = secrets.token_hex(32)
    challenge = _challenge(approval.evidence_sha256, nonce)
    StepUpChallenge.objects.create(
        approval=approval,
        user=user,
        nonce=nonce,
        challenge=challenge,
        expires_at=timezone.now() + CHALLENGE_LIFETIME,
    )
    options = generate_authentication_options(
        rp_id=rp_id(),
        challenge=bytes.fromhex(challenge),
        allow_credentials=[
            PublicKeyCredentialDescriptor(id=base64url_to_bytes(p.credential_id)) for p in passkeys
        ],
        user_verification=UserVerificationRequirement.REQUIRED,
        timeout=int(CHALLENGE_LIFETIME.total_seconds() * 1000),
    )
    return options_to_json(options)


def step_up_verify(*, approval: ApprovalRequest, user: User, assertion: str) -> Passkey:
    """Check ``assertion`` for ``user``'s verdict on ``approval`` and spend its nonce. Call inside
    the decision's transaction, with the request locked: the nonce is spent with the verdict.

    Not idempotent: a second call with the same assertion is refused (replay).
    """
    if not assertion:
        raise StepUpRefused("this request needs your passkey: decide on the approval page")
    try:
        credential = json.loads(assertion)
        client_data = json.loads(
            base64url_to_bytes(credential["response"]["clientDataJSON"]).decode()
        )
        challenge = base64url_to_bytes(client_data["challenge"]).hex()
        credential_id = str(credential["rawId"])
    except (ValueError, KeyError, TypeError):
        raise StepUpRefused("the passkey answer is malformed") from None
    issued = (
        StepUpChallenge.objects.select_for_update()
        .filter(challenge=challenge, approval=approval, user=user)
        .first()
    )
    if issued is None or _challenge(approval.evidence_sha256, issued.nonce) != challenge:
        raise StepUpRefused("the passkey answer was made for another request or other evidence")
    if issued.used_at is not None:
        raise StepUpRefused("this passkey answer was already used: confirm again")
    if issued.expires_at <= timezone.now():
        raise StepUpRefused("the passkey prompt expired: confirm again")
    passkey = (
        Passkey.objects.select_for_update().filter(user=user, credential_id=credential_id).first()
    )
    if passkey is None:
        raise StepUpRefused("that passkey is not one of yours")
    try:
        verified = verify_authentication_response(
            credential=credential,
            expected_challenge=bytes.fromhex(challenge),
            expected_rp_id=rp_id(),
            expected_origin=expected_origin(),
            credential_public_key=bytes(passkey.public_key),
            credential_current_sign_count=passkey.sign_count,
            require_user_verification=True,
        )
    except (InvalidAuthenticationResponse, ValueError, KeyError, TypeError) as exc:
        raise StepUpRefused(f"the passkey answer did not verify: {exc}") from None
    now = timezone.now()
    issued.used_at = now
    issued.save(update_fields=["used_at"])
    passkey.sign_count = verified.new_sign_count
    passkey.last_used_at = now
    passkey.save(update_fields=["sign_count", "last_used_at"])
    return passkey
