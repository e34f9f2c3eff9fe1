from django.conf import settings
from django.core.management.base import BaseCommand

from orsplatform.teams.services import api_key_create, team_get_or_create_builtin


class Command(BaseCommand):
    help = "Create and print a development API key for the built-in team (used by `make run`)."

    def handle(self, *args, **options):
        team = team_get_or_create_builtin(slug=settings.ORS_BUILTIN_TEAM)
        new = api_key_create(team=team, name="make run", scopes=["sessions", "publish", "manage"])
        self.stdout.write(f"Development API key for team '{team.slug}' (shown once):")
        self.stdout.write(new.token)
