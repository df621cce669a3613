from __future__ import annotations

from django.urls import path

from pandaweb.webhooks import views

app_name = "webhooks"
urlpatterns = [
    path("", views.subscription_index, name="index"),
    path("new/", views.subscription_create, name="create"),
    path("<int:subscription_id>/", views.subscription_detail, name="detail"),
    path("<int:subscription_id>/active/", views.subscription_active, name="active"),
    path("<int:subscription_id>/secret/", views.subscription_secret, name="secret"),
    path("deliveries/", views.delivery_index, name="deliveries"),
    path("deliveries/<int:message_id>/", views.delivery_detail, name="delivery"),
    path("deliveries/<int:message_id>/redeliver/", views.delivery_redeliver, name="redeliver"),
]
