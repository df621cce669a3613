from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models


def drop_requests_without_a_run(apps: Any, schema_editor: Any) -> None:
    # Before the approvals feature a request could exist without its run (badge tests did that);
    # such a request gates nothing and can never be decided.
    ApprovalRequest = apps.get_model("approvals", "ApprovalRequest")
    ApprovalRequest.objects.filter(run__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0002_evidence_decisions"),
        ("runs", "0002_needs_reconciliation"),
    ]

    operations = [
        migrations.RunPython(drop_requests_without_a_run, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="approvalrequest",
            name="run",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="approvals",
                to="runs.run",
            ),
        ),
    ]
