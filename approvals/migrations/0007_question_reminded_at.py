from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0006_question"),
    ]

    operations = [
        migrations.AddField(
            model_name="question",
            name="reminded_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
