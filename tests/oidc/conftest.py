"""A real OpenID provider (tests/oidc_provider) on a free loopback port, and pandaweb
configured to sign people in through it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from pandaweb.core.roles import Role
from pandaweb.sso.config import Grant, OidcSettings

CLIENT_ID = "pandaweb-dashboard"
CLIENT_SECRET = "a-client-secret-for-tests-only"
PASSWORD = "provider password 1"
ADMIN = {"username": "idp.admin", "password": "provider admin password"}
# People at the provider: the group names are the provider's, mapped in ``sso_settings``.
PEOPLE = [
    {"username": "olivia", "email": "olivia@example.test", "groups": ["pw-operators"]},
    {"username": "rory", "email": "rory@example.test", "groups": ["pw-reviewers"]},
    {"username": "visitor", "email": "visitor@example.test", "groups": ["staff"]},
]
ROLE_MAP = {
    "pw-operators": frozenset({Grant(Role.OPERATORS)}),
    "pw-reviewers": frozenset({Grant(Role.REVIEWERS)}),
}
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Provider:
    url: str  # the issuer
    database: Path
    private_key_pem: str

    def sql(self, statement: str, *params: object) -> None:
        """Changes the provider's own records, as its administrator would."""
        with sqlite3.connect(self.database) as connection:
            connection.execute(statement, params)

    def count(self, query: str, *params: object) -> int:
        with sqlite3.connect(self.database) as connection:
            return int(connection.execute(query, params).fetchone()[0])

    def move(self, username: str, group: str) -> None:
        self.sql(
            "DELETE FROM auth_user_groups "
            "WHERE user_id = (SELECT id FROM auth_user WHERE username = ?)",
            username,
        )
        self.sql("INSERT OR IGNORE INTO auth_group (name) VALUES (?)", group)
        self.sql(
            "INSERT INTO auth_user_groups (user_id, group_id) SELECT u.id, g.id "
            "FROM auth_user u, auth_group g WHERE u.username = ? AND g.name = ?",
            username,
            group,
        )

    def switch_off(self, username: str) -> None:
        self.sql("UPDATE auth_user SET is_active = 0 WHERE username = ?", username)


@pytest.fixture(scope="session")
def provider(
    live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Provider]:
    """The test provider, set up once per session: people, groups, and pandaweb registered as a
    confidential client with PKCE required and consent skipped."""
    directory = tmp_path_factory.mktemp("oidc-provider")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    spec = {
        "admin": ADMIN,
        "people": [{**person, "password": PASSWORD} for person in PEOPLE],
        "client": {
            "name": "pandaweb",
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "redirect_uri": f"{live_server.url}/sso/callback/",
            "post_logout_redirect_uri": f"{live_server.url}/login/",
        },
    }
    (directory / "spec.json").write_text(json.dumps(spec))
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "OIDC_PROVIDER_DATABASE": str(directory / "provider.sqlite3"),
        "OIDC_PROVIDER_RSA_KEY": pem,
        "PYTHONPATH": str(REPO),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider.serve", str(directory / "spec.json")],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY "):
        process.kill()
        raise RuntimeError(f"the test provider did not start: {line}{process.communicate()[1]}")
    try:
        yield Provider(
            url=line.split()[1] + "/o",
            database=directory / "provider.sqlite3",
            private_key_pem=pem,
        )
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def oidc(provider: Provider, settings: Settings) -> OidcSettings:
    """pandaweb signing people in through the test provider."""
    oidc = OidcSettings(
        issuer=provider.url,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        discovery_url=f"{provider.url}/.well-known/openid-configuration",
        scopes="openid profile email groups",
        label="Test IdP",
        role_map=ROLE_MAP,
    )
    settings.OIDC = oidc
    return oidc
