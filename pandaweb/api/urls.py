from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path, re_path

from pandaweb.api import views
from pandaweb.api.api import api
from pandaweb.api.events_stream import events_response
from pandaweb.api.problems import Problem, render

app_name = "account"
urlpatterns = [
    path("tokens/", views.token_index, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
    path("service-accounts/", views.service_account_index, name="service_accounts"),
    path(
        "oauth-clients/<int:client_pk>/revoke/",
        views.oauth_client_revoke,
        name="oauth_client_revoke",
    ),
]


def api_urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URL patterns, exempt from the dashboard's sign-in redirect: a token, not a
    session, authenticates them (and an unauthenticated call gets a 401 problem, not a login
    page). The docs page and the OpenAPI document need no token."""
    patterns, app, namespace = api.urls

    def exempt(items: list[Any]) -> None:
        for item in items:
            if isinstance(item, URLResolver):
                exempt(item.url_patterns)
            else:
                item.callback.login_required = False

    patterns = [
        *patterns,
        # A stream, which ninja's operations cannot answer with (docs/api.md, "Events").
        path("events", events_response, name="events"),
        re_path(r"^.*$", _no_such_endpoint),
    ]
    exempt(patterns)
    return patterns, app, namespace


def _no_such_endpoint(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Any other path under /api/v1/: a problem document, not the dashboard's HTML 404 page."""
    return render(request, Problem(404, "no such endpoint; see /api/v1/docs"))
