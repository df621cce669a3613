from __future__ import annotations

from django.urls import path

from pandaweb.audit import views

app_name = "audit"
urlpatterns = [
    path("", views.audit_index, name="index"),
    path("verify/", views.audit_verify, name="verify"),
    path("export/", views.audit_export, name="export"),
    path("runs/<int:run_id>/", views.audit_run, name="run"),
    path("runs/<int:run_id>/bundle.zip", views.audit_run_bundle, name="run_bundle"),
]
