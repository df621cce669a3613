from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workflows import services
from workflows.vault import VaultError


class Command(BaseCommand):
    help = (
        "Re-encrypt every credential with the newest key (the first of PANDAWEB_CREDENTIAL_KEYS), "
        "so that older keys can be removed. All or nothing; safe to run again."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = services.credentials_reencrypt()
        except VaultError as exc:
            raise CommandError(f"nothing was changed: {exc}") from None
        self.stdout.write(
            f"re-encrypted {count} credential(s) with the newest of "
            f"{len(settings.CREDENTIAL_KEYS)} configured key(s)"
        )
