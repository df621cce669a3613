"""Single sign-on settings, read once from the environment (no Django imports).

The identity provider's groups are mapped to pandaweb's roles by configuration, never by name
matching: a group called "Admins" at the provider grants nothing unless the mapping says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pandaweb.core.roles import Role

_ROLES_BY_NAME = {role.value.lower(): role for role in Role}


def parse_role_map(text: str) -> dict[str, frozenset[Role]]:
    """``"idp-group=operators,idp-leads=reviewers"`` as {group: roles}.

    A group may appear more than once to grant several roles; role names are those of
    ``setup_roles`` in any case. Raises ValueError naming the entry that cannot be read.
    """
    mapping: dict[str, set[Role]] = {}
    for entry in (item.strip() for item in text.split(",")):
        if not entry:
            continue
        group, separator, role_name = (part.strip() for part in entry.partition("="))
        if not separator or not group or not role_name:
            raise ValueError(f"{entry!r} is not group=role")
        role = _ROLES_BY_NAME.get(role_name.lower())
        if role is None:
            known = ", ".join(role.value.lower() for role in Role)
            raise ValueError(f"{entry!r}: {role_name!r} is not a role (one of: {known})")
        mapping.setdefault(group, set()).add(role)
    return {group: frozenset(roles) for group, roles in mapping.items()}


@dataclass(frozen=True)
class Memberships:
    """What a person's groups at the provider grant here.

    Teams will be a second field mapped the same way; everything that applies memberships takes
    this object, so adding them changes the mapping and the sync, not the sign-in flow.
    """

    roles: frozenset[Role] = frozenset()

    @property
    def grants_access(self) -> bool:
        return bool(self.roles)


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
    role_map: Mapping[str, frozenset[Role]] = field(default_factory=dict)

    def memberships(self, groups: Iterable[str]) -> Memberships:
        roles: set[Role] = set()
        for group in groups:
            roles |= self.role_map.get(group, frozenset())
        return Memberships(roles=frozenset(roles))
