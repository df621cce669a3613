from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from pandaweb.audit.signing import public_key_b64, public_key_fingerprint


class Command(BaseCommand):
    help = (
        "Print the public key that checks this installation's audit exports (base64, then its "
        "fingerprint); generates the signing key on first use when none is configured."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            key, short = public_key_b64(), public_key_fingerprint()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(key)
        self.stdout.write(f"fingerprint {short}")
