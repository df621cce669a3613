from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from pandaweb.core.roles import DEMO_USERS, Role
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from workflows import services
from workflows.models import Credential, Workflow

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
# slug → file; all log in with the portal credential, the second through a session template;
# the third asks its launcher for the code the portal sends by SMS.
EXAMPLES = {
    "acme-pay-invoice": EXAMPLES_DIR / "acme-pay-invoice.yaml",
    "acme-download-invoices": EXAMPLES_DIR / "acme-download-invoices.yaml",
    "acme-change-payout": EXAMPLES_DIR / "acme-change-payout.yaml",
}


class Command(BaseCommand):
    help = (
        "Load the demo workflows (pay an Acme invoice; download this month's invoices, which logs "
        "in through a session template; change the payout account, which asks for an SMS code) "
        "with their portal credential and publish them, as the "
        "demo operator. Idempotent: a workflow that exists is left alone."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        author = User.objects.filter(username=DEMO_USERS[Role.OPERATORS]).first()
        if author is None:
            raise CommandError("run 'manage.py setup_roles --demo-users' first")
        # The examples point at the portal's default address; follow the configured one.
        portal = urlsplit(settings.DEMO_PORTAL_URL).netloc
        for slug, path in EXAMPLES.items():
            if Workflow.objects.filter(slug=slug).exists():
                self.stdout.write(f"demo workflow '{slug}' already loaded")
                continue
            with transaction.atomic():
                _ensure_credential(author)
                text = path.read_text().replace("127.0.0.1:8001", portal)
                workflow = services.workflow_import(user=author, text=text)
                version = services.workflow_publish(
                    workflow_id=workflow.pk, user=author, message="Demo workflow"
                )
            self.stdout.write(f"demo workflow '{workflow.name}' published as v{version.number}")


def _ensure_credential(author: User) -> None:
    if not Credential.objects.filter(name="acme-portal").exists():
        services.credential_create(
            user=author,
            name="acme-portal",
            kind=Credential.Kind.USERNAME_PASSWORD,
            description="Login of the bundled Acme Supplier Portal",
            values={"username": DEMO_USERNAME, "password": DEMO_PASSWORD},
        )
