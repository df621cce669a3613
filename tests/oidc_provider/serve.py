"""Starts the test provider: ``python -m tests.oidc_provider.serve SPEC.json``.

Migrates its database, creates the people, groups and the registered client the spec names,
then serves on a free 127.0.0.1 port and prints ``READY <base url>`` once it listens.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"

import django

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.contrib.staticfiles.handlers import StaticFilesHandler  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def populate(spec: dict) -> None:
    call_command("migrate", verbosity=0)
    User.objects.create_superuser(spec["admin"]["username"], "", spec["admin"]["password"])
    for person in spec["people"]:
        user = User.objects.create_user(
            person["username"], person.get("email", ""), person["password"]
        )
        for name in person["groups"]:
            user.groups.add(Group.objects.get_or_create(name=name)[0])
    client = spec["client"]
    Application.objects.create(
        name=client["name"],
        client_id=client["client_id"],
        client_secret=client["client_secret"],
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=client["redirect_uri"],
        post_logout_redirect_uris=client["post_logout_redirect_uri"],
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    populate(spec)
    server = ThreadedWSGIServer(("127.0.0.1", spec.get("port", 0)), QuietHandler)
    server.set_app(StaticFilesHandler(get_wsgi_application()))
    port = server.server_address[1]
    print(f"READY http://127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
