from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("workflows/", include("workflows.urls")),
    path("runs/", include("sessions.urls")),
    path("approvals/", include("approvals.urls")),
    path("audit/", include("pandaweb.audit.urls")),
    path("admin/", admin.site.urls),
    path("", include("pandaweb.core.urls")),
]
