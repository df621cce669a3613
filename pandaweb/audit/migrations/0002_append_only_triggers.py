from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from pandaweb.audit.triggers import drop_append_only_triggers, install_append_only_triggers


# RunPython rather than RunSQL: the SQL differs per database vendor, and RunSQL would run the same
# text everywhere.
def install(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    install_append_only_triggers(schema_editor.connection)


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    drop_append_only_triggers(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0001_audit_event"),
    ]

    operations = [
        migrations.RunPython(install, drop, elidable=False),
    ]
