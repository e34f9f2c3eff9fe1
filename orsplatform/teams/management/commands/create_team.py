from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from orsplatform.teams.services import team_create


class Command(BaseCommand):
    help = "Create a team."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args, slug: str, name: str, **options):
        try:
            team = team_create(slug=slug, name=name)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from exc
        self.stdout.write(team.slug)
