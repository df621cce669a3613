from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from pandaweb.api.models import ServiceAccount
from pandaweb.api.services import TokenError, service_account_create, token_create


class Command(BaseCommand):
    help = (
        "Make an API token and print its secret (shown once). For a person: the token is theirs "
        "(--scope, repeatable). With --service: for a service account, made first if missing "
        "with --role (repeatable), both on behalf of the admin named by --by."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", required=True)
        parser.add_argument("--scope", action="append", default=[], dest="scopes")
        parser.add_argument("--expires-days", type=int, default=None)
        parser.add_argument("--service", action="store_true")
        parser.add_argument("--role", action="append", default=[], dest="roles")
        parser.add_argument("--by", default="", help="the admin who makes it (with --service)")
        parser.add_argument("--team", default=None, help="limit it to this team (a slug)")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        expires = (
            timezone.now() + timedelta(days=options["expires_days"])
            if options["expires_days"]
            else None
        )
        try:
            if options["service"]:
                admin = User.objects.filter(username=options["by"]).first()
                if admin is None:
                    raise CommandError("--service needs --by ADMIN_USERNAME")
                actor = admin
                account = ServiceAccount.objects.filter(user__username=username).first()
                if account is None:
                    account = service_account_create(
                        actor=actor, username=username, roles=options["roles"]
                    )
                owner = account.user
            else:
                person = User.objects.filter(username=username, is_active=True).first()
                if person is None:
                    raise CommandError(f"no active user {username!r}")
                owner = actor = person
            _, raw = token_create(
                actor=actor,
                owner=owner,
                name=options["name"],
                scopes=options["scopes"],
                expires_at=expires,
                team=options["team"],
            )
        except TokenError as exc:
            details = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.field_errors.items())
            raise CommandError(f"{exc}: {details}") from None
        except PermissionDenied as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
