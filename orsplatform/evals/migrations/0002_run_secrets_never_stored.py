"""Run secrets are no longer kept in the database: their names replace the encrypted column, which
is dropped with its data. The names of a live run's secrets are read from the old column (when it
still decrypts) so that a resume can ask for them again."""

import base64
import hashlib
import json

from django.conf import settings
from django.db import migrations, models


def _names(token: str) -> list[str]:
    from cryptography.fernet import Fernet, InvalidToken

    digest = hashlib.sha256(b"orsplatform.evals:" + settings.ORS_AGENT_KEY_SECRET.encode()).digest()
    try:
        return sorted(json.loads(Fernet(base64.urlsafe_b64encode(digest)).decrypt(token.encode())))
    except (InvalidToken, ValueError, TypeError):
        return []  # ORS_AGENT_KEY_SECRET changed: the names are lost with the values


def keep_names(apps, schema_editor) -> None:
    EvalRun = apps.get_model("evals", "EvalRun")
    for run in EvalRun.objects.exclude(secrets_encrypted="").only("id", "secrets_encrypted"):
        EvalRun.objects.filter(id=run.id).update(secret_names=_names(run.secrets_encrypted), secrets_encrypted="")


class Migration(migrations.Migration):
    dependencies = [("evals", "0001_initial")]

    operations = [
        migrations.AddField(model_name="evalrun", name="secret_names",
                            field=models.JSONField(blank=True, default=list)),
        migrations.AddField(model_name="evalrun", name="generation", field=models.PositiveIntegerField(default=0)),
        migrations.AddField(model_name="evalrun", name="lease_generation",
                            field=models.PositiveIntegerField(default=0)),
        migrations.RunPython(keep_names, migrations.RunPython.noop),
        migrations.RemoveField(model_name="evalrun", name="secrets_encrypted"),
    ]
