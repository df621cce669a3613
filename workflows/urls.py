from __future__ import annotations

from django.urls import path

from workflows import views

app_name = "workflows"
urlpatterns = [
    path("", views.workflow_index, name="index"),
    path("new/", views.workflow_create, name="create"),
    path("import/", views.workflow_import, name="import"),
    path("credentials/", views.credential_index, name="credentials"),
    path("credentials/new/", views.credential_create, name="credential_create"),
    path("credentials/<int:pk>/replace/", views.credential_replace, name="credential_replace"),
    path("<slug:slug>/", views.workflow_detail, name="detail"),
    path("<slug:slug>/settings/", views.workflow_settings, name="settings"),
    path("<slug:slug>/steps/add/", views.step_edit, name="step_add"),
    path("<slug:slug>/steps/<int:index>/edit/", views.step_edit, name="step_edit"),
    path("<slug:slug>/steps/<int:index>/<str:action>/", views.step_action, name="step_action"),
    path("<slug:slug>/session/", views.session_edit, name="session"),
    path("<slug:slug>/session/remove/", views.session_remove, name="session_remove"),
    path(
        "<slug:slug>/session/steps/add/",
        views.step_edit,
        {"session": True},
        name="session_step_add",
    ),
    path(
        "<slug:slug>/session/steps/<int:index>/edit/",
        views.step_edit,
        {"session": True},
        name="session_step_edit",
    ),
    path(
        "<slug:slug>/session/steps/<int:index>/<str:action>/",
        views.step_action,
        {"session": True},
        name="session_step_action",
    ),
    path("<slug:slug>/parameters/add/", views.parameter_edit, name="parameter_add"),
    path("<slug:slug>/parameters/<int:index>/edit/", views.parameter_edit, name="parameter_edit"),
    path(
        "<slug:slug>/parameters/<int:index>/delete/",
        views.parameter_delete,
        name="parameter_delete",
    ),
    path("<slug:slug>/publish/", views.workflow_publish, name="publish"),
    path("<slug:slug>/archive/", views.workflow_archive, name="archive"),
    path("<slug:slug>/diff/", views.version_diff, name="diff"),
    path("<slug:slug>/versions/<int:number>/", views.version_detail, name="version"),
    path("<slug:slug>/versions/<int:number>/export.<str:fmt>", views.version_export, name="export"),
]
