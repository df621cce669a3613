from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from pandaweb.demo_portal.server import safe_next
from tests.demo_portal.conftest import fetch_json


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def status_and_location(url: str, *, method: str = "GET") -> tuple[int, str]:
    opener = urllib.request.build_opener(_NoRedirect)
    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - test URL
    try:
        with opener.open(request, timeout=5) as response:
            return response.status, response.headers.get("Location", "")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location", "")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/invoices?page=2", "/invoices?page=2"),
        ("", "/"),
        ("https://elsewhere.invalid/", "/"),
        ("//elsewhere.invalid/", "/"),
        ("/\\elsewhere.invalid", "/"),
    ],
)
def test_it_only_returns_to_local_paths_after_login(value: str, expected: str) -> None:
    assert safe_next(value) == expected


@pytest.mark.parametrize(
    "path", ["/", "/invoices", "/invoices/INV-1001", "/invoices/INV-1001.csv", "/lab/modal"]
)
def test_pages_need_a_session(portal: str, path: str) -> None:
    status, location = status_and_location(f"{portal}{path}")
    assert status == 303
    assert location.startswith("/login?next=")


def test_the_api_needs_no_session(portal: str) -> None:
    assert fetch_json(f"{portal}/api/payments") == []
    assert fetch_json(f"{portal}/api/reset", method="POST") == {"ok": True}


def test_it_answers_a_wrong_method_with_405(portal: str) -> None:
    assert status_and_location(f"{portal}/api/reset")[0] == 405
    assert status_and_location(f"{portal}/api/payments", method="POST")[0] == 405
