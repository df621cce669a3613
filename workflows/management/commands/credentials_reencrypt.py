from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from sessions.services import template_states_reencrypt
from workflows import services
from workflows.vault import VaultError


class Command(BaseCommand):
    help = (
        "Re-encrypt every credential and every session template's saved login with the newest "
        "key (the first of PANDAWEB_CREDENTIAL_KEYS), so that older keys can be removed. All or "
        "nothing; safe to run again."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with transaction.atomic():
                count = services.credentials_reencrypt()
                templates = template_states_reencrypt()
        except VaultError as exc:
            raise CommandError(f"nothing was changed: {exc}") from None
        self.stdout.write(
            f"re-encrypted {count} credential(s) and {templates} session template state(s) with "
            f"the newest of {len(settings.CREDENTIAL_KEYS)} configured key(s)"
        )
