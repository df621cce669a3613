from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from oauth2_provider import views as oauth_views

from approvals.views import reviewer_profile
from pandaweb.api.urls import api_urls
from pandaweb.sso import views as sso_views

urlpatterns = [
    path("login/", sso_views.SignInView.as_view(), name="login"),
    path("logout/", sso_views.sign_out, name="logout"),
    path("sso/", include("pandaweb.sso.urls")),
    path("workflows/", include("workflows.urls")),
    path("runs/", include("sessions.urls")),
    path("approvals/", include("approvals.urls")),
    path("audit/", include("pandaweb.audit.urls")),
    path("webhooks/", include("pandaweb.webhooks.urls")),
    path("", include("pandaweb.schedules.urls")),
    path("api/v1/", api_urls()),
    path("account/", include("pandaweb.api.urls")),
    path("teams/", include("pandaweb.teams.urls")),
    # Machine identities get access tokens here (client credentials grant; docs/api.md). Only
    # the token endpoint: no sign-in page, no other grant.
    path("oauth/token/", oauth_views.TokenView.as_view(), name="oauth_token"),
    path("profile/", reviewer_profile, name="profile"),
    path("profile/", include("pandaweb.reviewers.urls")),
    path("integrations/slack/", include("approvals.slack_urls")),
    path("admin/", admin.site.urls),
    path("", include("pandaweb.core.urls")),
]

handler400 = "pandaweb.core.security.bad_request"
