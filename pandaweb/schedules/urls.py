from __future__ import annotations

from django.urls import path

from pandaweb.schedules import views

app_name = "schedules"
urlpatterns = [
    path("schedules/new/<slug:slug>/", views.schedule_create, name="create"),
    path("schedules/preview/", views.schedule_preview, name="preview"),
    path("schedules/<int:schedule_id>/", views.schedule_detail, name="detail"),
    path("schedules/<int:schedule_id>/pause/", views.schedule_pause, name="pause"),
    path("batches/new/<slug:slug>/", views.batch_create, name="batch_create"),
    path("batches/new/<slug:slug>/template.csv", views.batch_template, name="batch_template"),
    path("batches/<int:batch_id>/", views.batch_detail, name="batch"),
    path("batches/<int:batch_id>/outputs.csv", views.batch_outputs, name="batch_outputs"),
]
