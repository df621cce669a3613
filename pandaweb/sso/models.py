from __future__ import annotations

from django.conf import settings
from django.db import models


class SsoIdentity(models.Model):
    """The person an identity provider knows as ``subject``, linked to one account here.

    Accounts are found by this link, never by username or email: a provider account that happens
    to carry a local administrator's name must not become that administrator.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["issuer", "subject"], name="sso_identity_unique_subject"
            )
        ]
        verbose_name = "single sign-on identity"
        verbose_name_plural = "single sign-on identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
