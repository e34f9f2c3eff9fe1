from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from orsplatform.teams.models import Membership, Team
from orsplatform.teams.services import membership_add


class Command(BaseCommand):
    help = "Add a user (created if missing) to a team with a role."

    def add_arguments(self, parser):
        parser.add_argument("team")
        parser.add_argument("username")
        parser.add_argument("--role", default=Membership.Role.MEMBER, choices=Membership.Role.values)

    def handle(self, *args, team: str, username: str, role: str, **options):
        team_obj = Team.objects.filter(slug=team).first()
        if team_obj is None:
            raise CommandError(f"No team '{team}'.")
        try:
            membership_add(team=team_obj, username=username, role=role)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from exc
        self.stdout.write(f"{username} is {role} of {team}")
