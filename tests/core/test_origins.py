"""Websocket origins are checked exactly: scheme, host and port, on every websocket route."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import URLPattern

from pandaweb.asgi import application
from pandaweb.core.origins import ExactOriginValidator, normalize_origin
from pandaweb.core.roles import Role
from pandaweb.routing import websocket_urlpatterns
from tests.core.test_settings import run_manage
from tests.factories import user_with_role, waiting_run

pytestmark = pytest.mark.django_db(transaction=True)

FOREIGN_ORIGINS = [
    "http://127.0.0.1:9999",  # another port of the same host
    "http://127.0.0.1:8301",
    "https://127.0.0.1",  # another scheme
    "https://127.0.0.1:8000",
    "http://127.0.0.1",  # the scheme's default port is another port
    "http://[::1]:1234",
    "http://localhost:8001",  # the demo portal
    "http://evil.example.test:8000",
    "null",
    "http://127.0.0.1:8000.evil.example.test",
    "http://user@127.0.0.1:8000",
]
OWN_ORIGINS = ["http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"]


@database_sync_to_async
def admin_cookie_and_run() -> tuple[str, int]:
    client = Client()
    client.force_login(user_with_role(Role.ADMINS))
    return f"sessionid={client.cookies['sessionid'].value}", waiting_run().pk


def route_paths(run_id: int) -> list[str]:
    """Every websocket route, with a real run for the ones that take one."""
    paths = []
    for pattern in websocket_urlpatterns:
        assert isinstance(pattern, URLPattern)
        paths.append("/" + str(pattern.pattern).replace("<int:run_id>", str(run_id)))
    return paths


async def opens(path: str, cookie: str, origin: str | None) -> bool:
    headers = [(b"host", b"127.0.0.1:8000"), (b"cookie", cookie.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    await communicator.disconnect()
    return connected


async def test_every_route_refuses_foreign_ports_and_schemes_even_with_a_session() -> None:
    cookie, run_id = await admin_cookie_and_run()
    paths = route_paths(run_id)
    # Every route the dashboard serves, whatever it adds later.
    assert {"/ws/nav/", "/ws/runs/", f"/ws/runs/{run_id}/"} <= set(paths)

    for path in paths:
        for origin in [*FOREIGN_ORIGINS, None]:
            assert not await opens(path, cookie, origin), (path, origin)


async def test_every_route_opens_from_the_dashboards_own_origins() -> None:
    cookie, run_id = await admin_cookie_and_run()

    for path in route_paths(run_id):
        for origin in OWN_ORIGINS:
            assert await opens(path, cookie, origin), (path, origin)


def test_origins_compare_scheme_host_and_port_with_default_ports_filled_in() -> None:
    assert normalize_origin("HTTPS://Pandaweb.Example.com") == (
        "https",
        "pandaweb.example.com",
        443,
    )
    assert normalize_origin("http://[::1]:8000/") == ("http", "::1", 8000)
    assert normalize_origin("http://127.0.0.1:99999") is None
    assert normalize_origin("ws://127.0.0.1:8000") is None
    validator = ExactOriginValidator(None, ["https://pandaweb.example.com"])
    assert validator.allows("https://pandaweb.example.com:443")
    assert not validator.allows("http://pandaweb.example.com")
    assert not validator.allows("https://pandaweb.example.com:8443")


def test_a_bad_configured_origin_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="is not an origin"):
        ExactOriginValidator(None, ["pandaweb.example.com"])


def test_the_default_origins_follow_the_port_and_the_public_origin() -> None:
    show = "from django.conf import settings; print(settings.PUBLIC_ORIGINS)"
    result = run_manage(
        "shell",
        "-c",
        show,
        PANDAWEB_PORT="8080",
        PANDAWEB_CSRF_TRUSTED_ORIGINS="https://pandaweb.example.com",
    )

    assert result.stdout.strip().splitlines()[-1] == str(
        [
            "http://127.0.0.1:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
            "https://pandaweb.example.com",
        ]
    )


def test_a_configured_origin_that_is_not_one_stops_start_up() -> None:
    result = run_manage("check", PANDAWEB_PUBLIC_ORIGINS="pandaweb.example.com")

    assert result.returncode == 2
    assert "PANDAWEB_PUBLIC_ORIGINS: 'pandaweb.example.com' is not an origin" in result.stderr
