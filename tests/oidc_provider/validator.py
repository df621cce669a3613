from __future__ import annotations

from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """Puts the person's groups in ID tokens and userinfo (scope ``groups``), and refuses to
    refresh the tokens of a person switched off, as production providers do."""

    oidc_claim_scope = {
        **OAuth2Validator.oidc_claim_scope,
        "groups": "groups",
    }

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": sorted(group.name for group in user.groups.all()),
        }

    def validate_refresh_token(
        self, refresh_token: Any, client: Any, request: Any, *args: Any, **kwargs: Any
    ) -> bool:
        valid = super().validate_refresh_token(refresh_token, client, request, *args, **kwargs)
        return bool(valid and request.user.is_active)
