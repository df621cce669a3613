from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from oauth2_provider.settings import oauth2_settings

from pandaweb.core.models import Team


class ServiceAccount(models.Model):
    """Marks a user as a machine (an ERP, a ticket system) rather than a person.

    The user has no usable password and cannot sign in to the dashboard; its role groups bound
    what its tokens may do, exactly as for a person.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="service_account"
    )
    description = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user__username"]

    def __str__(self) -> str:
        return f"service account {self.user.get_username()}"


class ApiToken(models.Model):
    """A bearer token for the HTTP API (and the MCP server). Only the SHA-256 of the secret is
    stored: the secret is shown once, when the token is made."""

    class Kind(models.TextChoices):
        PERSONAL = "personal", "Personal"
        SERVICE = "service", "Service"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="api_tokens"
    )
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=100)
    # The first characters of the secret ("pw_AbCd1234"): enough to recognise it in a list or a
    # leaked log line, far too few to use.
    prefix = models.CharField(max_length=16)
    secret_sha256 = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    # A token limited to one of its owner's teams reaches that team's objects only; without
    # one it reaches all the owner's teams.
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=Q(revoked_at__isnull=True),
                name="api_token_name_unique_per_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class OAuthClient(models.Model):
    """A machine identity that gets short-lived access tokens with the OAuth 2.0 client
    credentials grant (``/oauth/token/``), alongside ``ApiToken``.

    The django-oauth-toolkit application holds the client id, the hashed secret and the owner
    (``application.user``); this row holds what the library has no field for: the scopes the
    client may ask for (bounded by the owner's role, as a token's are) and its revocation.
    """

    application = models.OneToOneField(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.PROTECT, related_name="pandaweb_client"
    )
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"OAuth client {self.application.name}"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
