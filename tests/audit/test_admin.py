from __future__ import annotations

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse

from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_record
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_the_admin_shows_events_but_offers_no_way_to_change_them(client: Client) -> None:
    admin = UserFactory.create(is_staff=True, is_superuser=True)
    with transaction.atomic():
        event = audit_record(action="workflow.published", object_type="workflow", object_id=1)
    client.force_login(admin)  # itself an event (auth.logged_in)
    events_before = AuditEvent.objects.count()

    listing = client.get(reverse("admin:audit_auditevent_changelist"))
    detail = client.get(reverse("admin:audit_auditevent_change", args=[event.pk]))
    add = client.get(reverse("admin:audit_auditevent_add"))
    delete = client.post(reverse("admin:audit_auditevent_delete", args=[event.pk]), {"post": "yes"})

    assert listing.status_code == 200
    assert b"workflow.published" in listing.content
    assert b"delete_selected" not in listing.content
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content
    assert add.status_code == 403
    assert delete.status_code == 403
    assert AuditEvent.objects.count() == events_before
    assert AuditEvent.objects.filter(pk=event.pk).exists()
