from __future__ import annotations

from django.db import migrations

from workflows.triggers import drop_immutability_triggers, install_immutability_triggers


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    install_immutability_triggers(schema_editor.connection)


def remove(apps, schema_editor):  # type: ignore[no-untyped-def]
    drop_immutability_triggers(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("workflows", "0001_workflows_versions_credentials")]

    operations = [migrations.RunPython(install, remove)]
