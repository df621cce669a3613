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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "acme-pay-invoice.yaml"


class Command(BaseCommand):
    help = (
        "Load the demo workflow (pay an Acme invoice) with its portal credential and publish it, "
        "as the demo operator. Idempotent: does nothing when the workflow exists."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        author = User.objects.filter(username=DEMO_USERS[Role.OPERATORS]).first()
        if author is None:
            raise CommandError("run 'manage.py setup_roles --demo-users' first")
        if Workflow.objects.filter(slug="acme-pay-invoice").exists():
            self.stdout.write("demo workflow already loaded")
            return
        with transaction.atomic():
            if not Credential.objects.filter(name="acme-portal").exists():
                services.credential_create(
                    user=author,
                    name="acme-portal",
                    kind=Credential.Kind.USERNAME_PASSWORD,
                    description="Login of the bundled Acme Supplier Portal",
                    values={"username": DEMO_USERNAME, "password": DEMO_PASSWORD},
                )
            # The example points at the portal's default address; follow the configured one.
            portal = urlsplit(settings.DEMO_PORTAL_URL).netloc
            text = EXAMPLE.read_text().replace("127.0.0.1:8001", portal)
            workflow = services.workflow_import(user=author, text=text)
            version = services.workflow_publish(
                workflow_id=workflow.pk, user=author, message="Demo workflow"
            )
        self.stdout.write(f"demo workflow '{workflow.name}' published as v{version.number}")
