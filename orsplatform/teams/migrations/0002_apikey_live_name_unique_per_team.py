"""Two live keys of a team may no longer share a name (case-insensitively). Keys that already do are
renamed first, the oldest keeping its name and the others taking their prefix ("ci" -> "ci (3f9a02bc)"),
so the constraint applies to any existing database; no key stops working."""

from django.db import migrations, models
from django.db.models.functions import Lower


def rename_duplicates(apps, schema_editor) -> None:
    ApiKey = apps.get_model("teams", "ApiKey")
    seen: set[tuple[int, str]] = set()
    for key in ApiKey.objects.filter(revoked_at__isnull=True).order_by("team_id", "created_at", "id").iterator():
        marker = (key.team_id, key.name.lower())
        if marker in seen:
            suffix = f" ({key.prefix})"
            key.name = key.name[: 100 - len(suffix)] + suffix
            key.save(update_fields=["name"])
        seen.add((key.team_id, key.name.lower()))


class Migration(migrations.Migration):

    dependencies = [
        ("teams", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(rename_duplicates, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.UniqueConstraint(
                Lower("name"), models.F("team"), condition=models.Q(("revoked_at__isnull", True)),
                name="apikey_live_name_unique_per_team",
            ),
        ),
    ]
