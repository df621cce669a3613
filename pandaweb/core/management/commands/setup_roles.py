from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from pandaweb.core import services


class Command(BaseCommand):
    help = (
        "Create the role groups (Operators, Reviewers, Compliance, Admins) with their "
        "permissions. Idempotent. With --demo-users, also one demo user per role."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--demo-users", action="store_true", help="create one demo user per role"
        )
        parser.add_argument(
            "--password-file",
            type=Path,
            default=None,
            help="where demo passwords are kept (default: PANDAWEB_DATA_DIR/demo-logins.json)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        granted = services.roles_sync()
        for role, capabilities in granted.items():
            self.stdout.write(f"{role.value:<11} {', '.join(capabilities)}")
        if not options["demo_users"]:
            return
        password_file = options["password_file"] or settings.DATA_DIR / "demo-logins.json"
        logins = services.demo_users_ensure(password_file=password_file)
        self.stdout.write("")
        self.stdout.write(self.style.SUCCESS("Demo logins (role · username · password):"))
        for login in logins:
            self.stdout.write(f"  {login.role.value:<11} {login.username:<18} {login.password}")
