"""Headers and deployment settings: the CSP on every page, check --deploy with the documented
production variables, the CSRF failure page, the size limit page, one-line 403 logs."""

from __future__ import annotations

import logging
import secrets
import sys

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from pytest_django.fixtures import Settings

from pandaweb.core.logfilters import OneLineForbidden
from pandaweb.core.roles import Role
from pandaweb.core.security import CONTENT_SECURITY_POLICY
from tests.core.test_settings import ROOT, run_manage
from tests.factories import user_with_role
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def readme_production_variables() -> dict[str, str]:
    """The variables the README's production checklist exports, with a fresh secret key."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Production checklist", 1)[1].split("\n## ", 1)[0]
    variables: dict[str, str] = {}
    for line in section.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("export "):
            for assignment in line.removeprefix("export ").split():
                name, _, value = assignment.partition("=")
                variables[name] = value
    assert variables.pop("PANDAWEB_SECRET_KEY") == "..."
    return {**variables, "PANDAWEB_SECRET_KEY": secrets.token_urlsafe(50)}


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(user_with_role(Role.ADMINS))
    return client


def test_check_deploy_is_clean_with_the_documented_production_variables() -> None:
    variables = readme_production_variables()
    assert {"PANDAWEB_HTTPS", "PANDAWEB_PROXY_SSL_HEADER", "PANDAWEB_ALLOWED_HOSTS"} <= set(
        variables
    )

    result = run_manage("check", "--deploy", "--fail-level", "WARNING", **variables)

    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_names_what_is_missing_without_them() -> None:
    result = run_manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        PANDAWEB_SECRET_KEY=secrets.token_urlsafe(50),
    )

    assert result.returncode != 0
    for check in ("W004", "W008", "W012", "W016"):
        assert f"security.{check}" in result.stderr


@pytest.mark.parametrize(
    "path", ["/", "/workflows/", "/runs/", "/approvals/", "/audit/", "/system/", "/no-such-page/"]
)
def test_every_html_page_carries_the_content_security_policy(
    admin_client: Client, path: str
) -> None:
    response = admin_client.get(path)

    assert response["Content-Type"].startswith("text/html")
    assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert b"<script>" not in response.content
    assert b" style=" not in response.content


def test_the_login_page_carries_it_too() -> None:
    response = Client().get("/login/")

    assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


def test_a_failed_csrf_check_gets_the_products_page_asking_to_reload() -> None:
    user = user_with_role(Role.OPERATORS)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post("/workflows/new/", {"name": "Sneaky"})

    assert response.status_code == 403
    assert b"Reload the page" in response.content
    assert b"pandaweb" in response.content
    assert not Workflow.objects.exists()


def test_a_body_over_the_limit_gets_the_size_page_and_nothing_is_saved(
    admin_client: Client, settings: Settings
) -> None:
    settings.MAX_REQUEST_BYTES = 1_100_000
    upload = SimpleUploadedFile("big.yaml", b"name: x\n" + b"#" * 1_200_000)

    response = admin_client.post("/workflows/import/", {"file": upload})

    assert response.status_code == 413
    assert b"at most 1100 kB" in response.content
    assert not Workflow.objects.exists()


def test_form_fields_over_djangos_own_limit_get_the_same_page(
    admin_client: Client, settings: Settings
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000

    response = admin_client.post("/workflows/new/", {"name": "x" * 5000})

    assert response.status_code == 413
    assert b"What you sent is too large" in response.content
    assert not Workflow.objects.exists()


def test_an_ordinary_403_is_logged_as_one_line(caplog: pytest.LogCaptureFixture) -> None:
    stranger: User = user_with_role(None)
    client = Client()
    client.force_login(stranger)

    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.get("/audit/")

    assert response.status_code == 403
    # The console handler's filter ran first: the record every handler sees has no traceback.
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.exc_info is None
    assert "Traceback" not in caplog.text
    assert record.getMessage() == "Forbidden (Permission denied): /audit/"


def test_the_filter_keeps_tracebacks_of_real_errors() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord(
            "django.request",
            logging.ERROR,
            __file__,
            1,
            "Internal Server Error",
            (),
            sys.exc_info(),
        )

    assert OneLineForbidden().filter(record)
    assert record.exc_info is not None


def test_the_console_handler_uses_the_one_line_filter() -> None:
    handlers = logging.getLogger().handlers
    assert any(isinstance(f, OneLineForbidden) for handler in handlers for f in handler.filters)


def test_https_behind_a_proxy_turns_on_what_tls_needs() -> None:
    show = (
        "from django.conf import settings as s; print(s.SECURE_PROXY_SSL_HEADER, "
        "s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE)"
    )

    on = run_manage(
        "shell", "-c", show, PANDAWEB_HTTPS="true", PANDAWEB_PROXY_SSL_HEADER="X-Forwarded-Proto"
    )
    off = run_manage("shell", "-c", show)

    assert "('HTTP_X_FORWARDED_PROTO', 'https') True 31536000 True True" in on.stdout
    assert "False 0 False False" in off.stdout


def test_a_proxy_header_that_is_not_a_header_name_is_refused() -> None:
    result = run_manage("check", PANDAWEB_PROXY_SSL_HEADER="X-Forwarded-Proto: https")

    assert result.returncode == 2
    assert "PANDAWEB_PROXY_SSL_HEADER='X-Forwarded-Proto: https' is not a header name" in (
        result.stderr
    )


def test_djangos_debug_pages_keep_their_inline_style_in_debug_mode_only(
    admin_client: Client, settings: Settings
) -> None:
    settings.DEBUG = True

    assert "Content-Security-Policy" not in admin_client.get("/no-such-page/")
    assert admin_client.get("/")["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
