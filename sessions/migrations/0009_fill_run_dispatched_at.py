from __future__ import annotations

from typing import Any

from django.db import migrations
from django.db.models import F


def fill(apps: Any, schema_editor: Any) -> None:
    # Before the queue every run was handed to a worker as it was launched.
    Run = apps.get_model("runs", "Run")
    Run.objects.filter(dispatched_at=None).update(dispatched_at=F("created_at"))


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_run_queue_priority")]

    operations = [migrations.RunPython(fill, migrations.RunPython.noop)]
