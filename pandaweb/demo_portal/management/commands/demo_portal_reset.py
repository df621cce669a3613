"""``manage.py demo_portal_reset``: put a running demo portal back to its initial invoices."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from argparse import ArgumentParser
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Reset the running Acme Supplier Portal: forget payments and sessions."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--url", default="http://127.0.0.1:8001", help="base URL of the running portal"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        base_url: str = options["url"].rstrip("/")
        if urlsplit(base_url).scheme not in ("http", "https"):
            raise CommandError(f"{base_url} is not an http(s) URL.")
        url = f"{base_url}/api/reset"
        request = urllib.request.Request(url, data=b"", method="POST")  # noqa: S310 - http(s) only
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - http(s) only
                result = json.load(response)
        except urllib.error.HTTPError as error:
            raise CommandError(f"The portal at {base_url} answered HTTP {error.code}.") from error
        except (urllib.error.URLError, OSError) as error:
            raise CommandError(
                f"The demo portal is not running at {base_url} ({error}). "
                "Start it with: python manage.py demo_portal"
            ) from error
        except ValueError as error:
            raise CommandError(f"{base_url} did not answer like the demo portal.") from error
        if result != {"ok": True}:
            raise CommandError(f"The portal at {base_url} did not reset: {result!r}")
        self.stdout.write(self.style.SUCCESS(f"Demo portal at {base_url} reset."))
