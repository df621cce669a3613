from __future__ import annotations

from django.urls import path

from sessions import views

app_name = "runs"
urlpatterns = [
    path("", views.run_index, name="index"),
    path("launch/<slug:slug>/", views.run_launch, name="launch"),
    path("<int:run_id>/", views.run_detail, name="detail"),
    path("<int:run_id>/cancel/", views.run_cancel, name="cancel"),
    path("<int:run_id>/reconcile/", views.run_reconcile, name="reconcile"),
    path("<int:run_id>/steps/<int:index>/", views.step_detail, name="step"),
    path("<int:run_id>/files/<path:path>", views.run_file, name="file"),
    path("session-templates/<slug:slug>/", views.session_template, name="session_template"),
    path(
        "session-templates/<slug:slug>/bake/",
        views.session_template_bake,
        name="session_template_bake",
    ),
]
