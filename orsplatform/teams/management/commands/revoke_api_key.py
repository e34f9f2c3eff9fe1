from django.core.management.base import BaseCommand, CommandError

from orsplatform.teams.auth import TOKEN_RE
from orsplatform.teams.models import ApiKey
from orsplatform.teams.services import api_key_revoke


class Command(BaseCommand):
    help = "Revoke an API key, given its prefix or the whole key."

    def add_arguments(self, parser):
        parser.add_argument("key", help="The key's prefix (8 hex characters) or the whole key.")

    def handle(self, *args, key: str, **options):
        match = TOKEN_RE.match(key)
        prefix = match.group(1) if match else key
        api_key = ApiKey.objects.filter(prefix=prefix).first()
        if api_key is None:
            raise CommandError("No such key.")
        api_key_revoke(api_key=api_key)
        self.stdout.write(f"revoked {api_key.prefix}")
