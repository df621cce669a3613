from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pandaweb.core.models import Membership, Team
from pandaweb.teams import services


class Command(BaseCommand):
    help = (
        "Teams and who holds which role in them: list; create NAME [--slug S]; "
        "add TEAM USERNAME ROLE; remove TEAM USERNAME ROLE (roles: Operators, Reviewers, "
        "Compliance). Each change is audited as made by the system."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("list", help="every team and its people")
        create = actions.add_parser("create", help="make a team")
        create.add_argument("name")
        create.add_argument("--slug", default="")
        for name in ("add", "remove"):
            change = actions.add_parser(name, help=f"{name} a person's role in a team")
            change.add_argument("team", help="the team's short name")
            change.add_argument("username")
            change.add_argument("role", choices=Membership.TeamRole.values)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "create":
                team = services.team_create(name=options["name"], slug=options["slug"], user=None)
                self.stdout.write(f"made team {team.slug} ({team.name})")
            elif action == "list":
                self._list()
            else:
                self._change(action, options)
        except services.TeamError as exc:
            raise CommandError(str(exc)) from None

    def _list(self) -> None:
        for team in Team.objects.prefetch_related("memberships__user"):
            self.stdout.write(f"{team.slug}  {team.name}")
            for membership in team.memberships.all():
                self.stdout.write(f"  {membership.user.get_username():<24} {membership.role}")

    def _change(self, action: str, options: dict[str, Any]) -> None:
        team = Team.objects.filter(slug=options["team"]).first()
        if team is None:
            raise CommandError(f"no team called {options['team']!r} (see: manage.py team list)")
        member = User.objects.filter(username__iexact=options["username"]).first()
        if member is None:
            raise CommandError(f"nobody here is called {options['username']!r}")
        role = options["role"]
        if action == "add":
            services.membership_grant(team_id=team.pk, member=member, role=role, user=None)
            self.stdout.write(f"{member.get_username()} is {role} in {team.slug}")
        elif services.membership_revoke(team_id=team.pk, member=member, role=role, user=None):
            self.stdout.write(f"{member.get_username()} is no longer {role} in {team.slug}")
        else:
            self.stdout.write(f"{member.get_username()} was not {role} in {team.slug}")
