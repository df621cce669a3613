from __future__ import annotations

from typing import Any

from django.db import migrations


def fill(apps: Any, schema_editor: Any) -> None:
    from sessions.models import run_search_text

    Run = apps.get_model("runs", "Run")
    batch = []
    for run in Run.objects.only("pk", "inputs", "outputs").iterator(chunk_size=500):
        run.search_text = run_search_text(run.inputs, run.outputs)
        batch.append(run)
        if len(batch) >= 500:
            Run.objects.bulk_update(batch, ["search_text"])
            batch = []
    if batch:
        Run.objects.bulk_update(batch, ["search_text"])


class Migration(migrations.Migration):
    dependencies = [("runs", "0004_console_search_rerun_saved_views")]

    operations = [migrations.RunPython(fill, migrations.RunPython.noop)]
