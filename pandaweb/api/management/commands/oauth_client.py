from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pandaweb.api.models import OAuthClient
from pandaweb.api.services import TokenError, oauth_client_create, oauth_client_revoke


class Command(BaseCommand):
    help = (
        "OAuth clients (client credentials grant) for machine identities, made and revoked on "
        "behalf of the admin named by --by. `create USERNAME --name N --scope S…` prints the "
        "client id and its secret (shown once); `revoke CLIENT_ID` stops the client and its "
        "access tokens at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="a client acting as USERNAME")
        create.add_argument("username", help="the service account or person it acts as")
        create.add_argument("--name", required=True)
        create.add_argument("--scope", action="append", default=[], dest="scopes")
        create.add_argument("--by", required=True, help="the admin who makes it")
        revoke = actions.add_parser("revoke", help="revoke a client by its client id")
        revoke.add_argument("client_id")
        revoke.add_argument("--by", required=True, help="the admin who revokes it")

    def handle(self, *args: Any, **options: Any) -> None:
        admin = User.objects.filter(username=options["by"], is_active=True).first()
        if admin is None:
            raise CommandError(f"no active user {options['by']!r} (--by)")
        try:
            if options["action"] == "create":
                self._create(admin, options)
            else:
                self._revoke(admin, options["client_id"])
        except TokenError as exc:
            details = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.field_errors.items())
            raise CommandError(f"{exc}: {details}") from None
        except PermissionDenied as exc:
            raise CommandError(str(exc)) from None

    def _create(self, admin: User, options: dict[str, Any]) -> None:
        owner = User.objects.filter(username=options["username"]).first()
        if owner is None:
            raise CommandError(f"no user {options['username']!r}")
        client, secret = oauth_client_create(
            actor=admin, owner=owner, name=options["name"], scopes=options["scopes"]
        )
        self.stdout.write(f"client_id: {client.application.client_id}")
        self.stdout.write(f"client_secret: {secret}")

    def _revoke(self, admin: User, client_id: str) -> None:
        client = OAuthClient.objects.filter(application__client_id=client_id).first()
        if client is None:
            raise CommandError(f"no OAuth client {client_id!r}")
        oauth_client_revoke(client_pk=client.pk, actor=admin)
        self.stdout.write(f"revoked {client.application.name} ({client_id})")
