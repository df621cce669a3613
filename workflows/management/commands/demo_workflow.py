from __future__ import annotations

import json
import re
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
from workflows.models import Credential, Workflow, WorkflowVersion

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
# A portal address the demo workflows may point at: the bundled portal runs on loopback.
LOOPBACK_PORTAL = re.compile(r"(127\.0\.0\.1|localhost|\[::1\]):\d+")
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
        "demo operator. Idempotent: a workflow that exists is left alone, or re-aimed with a new "
        "version when it points at another demo portal address."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        author = User.objects.filter(username=DEMO_USERS[Role.OPERATORS]).first()
        if author is None:
            raise CommandError("run 'manage.py setup_roles --demo-users' first")
        # The examples point at the portal's default address; follow the configured one.
        portal = urlsplit(settings.DEMO_PORTAL_URL).netloc
        for line in demo_workflows_aim(portal=portal):
            self.stdout.write(line)
        for slug, path in EXAMPLES.items():
            if Workflow.objects.filter(slug=slug).exists():
                continue
            with transaction.atomic():
                _ensure_credential(author)
                text = path.read_text().replace("127.0.0.1:8001", portal)
                workflow = services.workflow_import(user=author, text=text)
                version = services.workflow_publish(
                    workflow_id=workflow.pk, user=author, message="Demo workflow"
                )
            self.stdout.write(f"demo workflow '{workflow.name}' published as v{version.number}")


def demo_workflows_aim(*, portal: str) -> list[str]:
    """Point the loaded demo workflows at the demo portal on ``portal`` (host:port), saying what
    was done, one line per workflow.

    Versions are immutable, so a workflow aimed elsewhere gets a new version with every loopback
    portal address replaced (runs keep the version they started with). A workflow with a draft
    is left alone: re-aiming would replace someone's unpublished edits. Idempotent.
    """
    author = User.objects.filter(username=DEMO_USERS[Role.OPERATORS]).first()
    lines = []
    for workflow in Workflow.objects.filter(slug__in=EXAMPLES, archived=False).order_by("pk"):
        latest = (
            workflow.versions.filter(status=WorkflowVersion.Status.PUBLISHED)
            .order_by("-number")
            .first()
        )
        if latest is None or author is None:
            continue
        hosts = list((latest.document or {}).get("settings", {}).get("allowed_hosts", []))
        aimed = [h for h in hosts if LOOPBACK_PORTAL.fullmatch(h)]
        if not aimed or aimed == [portal]:
            lines.append(f"demo workflow '{workflow.slug}' aims at {portal}")
            continue
        if workflow.versions.filter(status=WorkflowVersion.Status.DRAFT).exists():
            lines.append(
                f"demo workflow '{workflow.slug}' left aimed at {', '.join(aimed)}: "
                "it has an unpublished draft"
            )
            continue
        text = LOOPBACK_PORTAL.sub(portal, json.dumps(latest.document))
        with transaction.atomic():
            services.workflow_import(user=author, text=text)
            version = services.workflow_publish(
                workflow_id=workflow.pk, user=author, message=f"Demo portal at {portal}"
            )
        lines.append(f"demo workflow '{workflow.slug}' aimed at {portal} as v{version.number}")
    return lines


def _ensure_credential(author: User) -> None:
    if not Credential.objects.filter(name="acme-portal").exists():
        services.credential_create(
            user=author,
            name="acme-portal",
            kind=Credential.Kind.USERNAME_PASSWORD,
            description="Login of the bundled Acme Supplier Portal",
            values={"username": DEMO_USERNAME, "password": DEMO_PASSWORD},
        )
