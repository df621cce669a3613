from __future__ import annotations

from django.urls import path

from sessions import console_views, scratch_views, views

app_name = "runs"
urlpatterns = [
    path("", console_views.run_index, name="index"),
    path("workflow/<slug:slug>/", console_views.workflow_runs, name="workflow_runs"),
    path("export.csv", console_views.run_export, name="export"),
    path("views/", console_views.saved_view_create, name="view_create"),
    path("views/<int:view_id>/delete/", console_views.saved_view_delete, name="view_delete"),
    path("failures/", console_views.triage, name="triage"),
    path("failures/compare/", console_views.triage_compare, name="compare"),
    path("<int:run_id>/again/", console_views.run_rerun, name="rerun"),
    path("launch/<slug:slug>/", views.run_launch, name="launch"),
    path("<int:run_id>/", views.run_detail, name="detail"),
    path("<int:run_id>/cancel/", views.run_cancel, name="cancel"),
    path("<int:run_id>/dismiss/", console_views.run_dismiss, name="dismiss"),
    path("<int:run_id>/reconcile/", views.run_reconcile, name="reconcile"),
    path("<int:run_id>/steps/<int:index>/", views.step_detail, name="step"),
    path("<int:run_id>/steps/<int:index>/heal/", views.step_heal, name="heal"),
    path(
        "<int:run_id>/steps/<int:index>/heal/<int:number>.png",
        views.step_heal_picture,
        name="heal_picture",
    ),
    path("<int:run_id>/files/<path:path>", views.run_file, name="file"),
    path("scratch/open/<slug:slug>/", scratch_views.scratch_open, name="scratch_open"),
    path("scratch/<int:scratch_id>/", scratch_views.scratch_page, name="scratch"),
    path("scratch/<int:scratch_id>/ask/", scratch_views.scratch_ask, name="scratch_ask"),
    path("scratch/<int:scratch_id>/use/", scratch_views.scratch_use, name="scratch_use"),
    path("scratch/<int:scratch_id>/record/", scratch_views.scratch_record, name="scratch_record"),
    path(
        "scratch/<int:scratch_id>/ask-model/",
        scratch_views.scratch_assist_ask,
        name="scratch_assist",
    ),
    path(
        "scratch/<int:scratch_id>/add-drafted/",
        scratch_views.scratch_assist_add,
        name="scratch_assist_add",
    ),
    path("scratch/<int:scratch_id>/close/", scratch_views.scratch_close, name="scratch_close"),
    path(
        "scratch/<int:scratch_id>/pictures/<str:name>",
        scratch_views.scratch_picture,
        name="scratch_picture",
    ),
    path("session-templates/<slug:slug>/", views.session_template, name="session_template"),
    path(
        "session-templates/<slug:slug>/bake/",
        views.session_template_bake,
        name="session_template_bake",
    ),
]
