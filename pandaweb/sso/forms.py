from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from pandaweb.sso.backends import password_sign_in_allowed


class PasswordSignInForm(AuthenticationForm):
    """The login form, saying so when passwords are switched off instead of calling a right
    password wrong."""

    def clean(self) -> dict[str, Any]:
        if not password_sign_in_allowed(self.cleaned_data.get("username")):
            raise forms.ValidationError(
                "Password sign-in is switched off here: sign in through your organisation's "
                "single sign-on.",
                code="passwords_off",
            )
        return super().clean()
