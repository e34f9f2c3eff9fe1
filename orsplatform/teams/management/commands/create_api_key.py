from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from orsplatform.catalog.models import Environment
from orsplatform.teams.models import Team
from orsplatform.teams.services import ALL_SCOPES, api_key_create


class Command(BaseCommand):
    help = "Create an API key. The key is printed once, alone on the last line of stdout."

    def add_arguments(self, parser):
        parser.add_argument("team")
        parser.add_argument("name")
        parser.add_argument("--scopes", default="sessions", help=f"Comma-separated: {','.join(ALL_SCOPES)}")
        parser.add_argument("--environment", default=None, help="Bind the key to team/slug.")

    def handle(self, *args, team: str, name: str, scopes: str, environment: str | None, **options):
        team_obj = Team.objects.filter(slug=team).first()
        if team_obj is None:
            raise CommandError(f"No team '{team}'.")
        env_obj = None
        if environment:
            env_team, _, env_slug = environment.partition("/")
            env_obj = Environment.objects.filter(team__slug=env_team, slug=env_slug).first()
            if env_obj is None:
                raise CommandError(f"No environment '{environment}'.")
        try:
            new = api_key_create(team=team_obj, name=name, environment=env_obj,
                                 scopes=[s.strip() for s in scopes.split(",") if s.strip()])
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from exc
        self.stdout.write(f"created key {new.api_key.prefix} for {team_obj.slug}")
        self.stdout.write(new.token)
