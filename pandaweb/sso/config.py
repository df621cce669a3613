"""Single sign-on settings, read once from the environment (no Django imports).

The identity provider's groups are mapped to pandaweb's roles, in every team or in one, by
configuration, never by name matching: a group called "Admins" at the provider grants nothing
unless the mapping says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pandaweb.core.roles import Role

_ROLES_BY_NAME = {role.value.lower(): role for role in Role}
# A team's slug (pandaweb.core.models.Team.slug).
_TEAM_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,63}")


@dataclass(frozen=True, order=True)
class Grant:
    """A role, in one team (its slug) or, with no team, in every team."""

    role: Role
    team: str = ""


def parse_role_map(text: str) -> dict[str, frozenset[Grant]]:
    """``"idp-ops=operators@payables,idp-leads=reviewers@payables,idp-audit=compliance"`` as
    {group: grants}.

    ``role@team`` grants the role in that team only (the team's short name); a bare role grants
    it in every team. A group may appear more than once to grant several. Role names are those
    of ``setup_roles`` in any case. Raises ValueError naming the entry that cannot be read.
    """
    mapping: dict[str, set[Grant]] = {}
    for entry in (item.strip() for item in text.split(",")):
        if not entry:
            continue
        group, separator, granted = (part.strip() for part in entry.partition("="))
        if not separator or not group or not granted:
            raise ValueError(f"{entry!r} is not group=role or group=role@team")
        role_name, _, team = (part.strip() for part in granted.partition("@"))
        role = _ROLES_BY_NAME.get(role_name.lower())
        if role is None:
            known = ", ".join(role.value.lower() for role in Role)
            raise ValueError(f"{entry!r}: {role_name!r} is not a role (one of: {known})")
        if team and role == Role.ADMINS:
            raise ValueError(f"{entry!r}: admins hold the whole installation, not one team")
        if "@" in granted and not _TEAM_SLUG.fullmatch(team):
            raise ValueError(f"{entry!r}: {team!r} is not a team's short name")
        mapping.setdefault(group, set()).add(Grant(role=role, team=team.lower()))
    return {group: frozenset(grants) for group, grants in mapping.items()}


@dataclass(frozen=True)
class Memberships:
    """What a person's groups at the provider grant here: roles in every team, and roles in
    named teams. Everything that applies memberships takes this object."""

    roles: frozenset[Role] = frozenset()
    team_roles: frozenset[Grant] = frozenset()

    @property
    def grants_access(self) -> bool:
        return bool(self.roles or self.team_roles)


@dataclass(frozen=True)
class OidcSettings:
    issuer: str
    client_id: str
    client_secret: str
    discovery_url: str
    scopes: str = "openid email profile"
    groups_claim: str = "groups"
    username_claim: str = "preferred_username"
    label: str = "single sign-on"
    # How long a session lives on the provider's word before it is asked again.
    recheck_seconds: int = 900
    role_map: Mapping[str, frozenset[Grant]] = field(default_factory=dict)

    def memberships(self, groups: Iterable[str]) -> Memberships:
        grants: set[Grant] = set()
        for group in groups:
            grants |= self.role_map.get(group, frozenset())
        return Memberships(
            roles=frozenset(grant.role for grant in grants if not grant.team),
            team_roles=frozenset(grant for grant in grants if grant.team),
        )
