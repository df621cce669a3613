"""Request-level protections: a Content-Security-Policy on every HTML page, a size limit on request
bodies with a page that says so, and the CSRF failure page."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

# No inline script and no inline style anywhere (htmx's own indicator style is in app.css, see
# the htmx-config meta tag in base.html), so the policy needs no nonce. 'self' in connect-src
# covers the dashboard's own websockets (ws:/wss: on the same host and port). blob: in img-src:
# the live view shows each frame, received as bytes, through an object URL of its own.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "font-src 'self'",
        "connect-src 'self'",
        "frame-src 'none'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


# The API's interactive docs page (Swagger UI, from our own static files) styles its widgets
# inline; scripts stay 'self' only.
DOCS_CONTENT_SECURITY_POLICY = CONTENT_SECURITY_POLICY.replace(
    "style-src 'self'", "style-src 'self' 'unsafe-inline'"
)


def with_docs_policy(
    view: Callable[..., HttpResponse],
) -> Callable[..., HttpResponse]:
    """The docs page's own policy, which the middleware then leaves alone."""

    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response["Content-Security-Policy"] = DOCS_CONTENT_SECURITY_POLICY
        return response

    return wrapped


class ContentSecurityPolicyMiddleware:
    """Adds the policy to every HTML response that does not set its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        content_type = response.get("Content-Type", "")
        if settings.DEBUG and response.status_code in (404, 500):
            return response  # Django's debug pages style themselves inline; never in production
        if content_type.startswith("text/html") and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = page_policy()
        return response


def page_policy() -> str:
    """The policy of dashboard pages. With single sign-on, the sign-out form's redirect goes on
    to the identity provider (to end its session too), which form-action must allow."""
    oidc = settings.OIDC
    if oidc is None:
        return CONTENT_SECURITY_POLICY
    parts = urlsplit(oidc.issuer)
    return CONTENT_SECURITY_POLICY.replace(
        "form-action 'self'", f"form-action 'self' {parts.scheme}://{parts.netloc}"
    )


class RequestSizeLimitMiddleware:
    """Refuses a request whose declared body is larger than PANDAWEB_MAX_REQUEST_BYTES before it
    is read, with a page that says what the limit is (Django's own limits only cover form
    fields, not uploaded files, and answer with a bare 400)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > settings.MAX_REQUEST_BYTES:
            return too_large(request)
        return self.get_response(request)


def too_large(request: HttpRequest) -> HttpResponse:
    _at_least_anonymous(request)
    limit_kb = settings.MAX_REQUEST_BYTES // 1000
    response = render(request, "413.html", {"limit_kb": limit_kb}, status=413)
    # The body was not read: the connection cannot carry another request.
    response["Connection"] = "close"
    return response


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: a body over Django's own limits gets the size page, anything else the 400 one."""
    if isinstance(exception, RequestDataTooBig | TooManyFieldsSent):
        return too_large(request)
    _at_least_anonymous(request)
    return render(request, "400.html", status=400)


def _at_least_anonymous(request: HttpRequest) -> None:
    """The page templates read ``request.user``; a request refused before the authentication
    middleware ran has none, and is shown as anonymous."""
    if not hasattr(request, "user"):
        request.user = AnonymousUser()


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: in the product's style, telling the person what to do."""
    return render(request, "403_csrf.html", status=403)
