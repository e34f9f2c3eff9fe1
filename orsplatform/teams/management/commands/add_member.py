import getpass

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from orsplatform.teams.models import Membership, Team
from orsplatform.teams.services import membership_add, user_set_password


class Command(BaseCommand):
    help = "Add a user (created if missing) to a team with a role; optionally set the user's web password."

    def add_arguments(self, parser):
        parser.add_argument("team")
        parser.add_argument("username")
        parser.add_argument("--role", default=Membership.Role.MEMBER, choices=Membership.Role.values)
        password = parser.add_mutually_exclusive_group()
        password.add_argument("--password", help="the user's password for the web pages (visible in `ps`: "
                                                 "prefer --prompt-password on shared machines)")
        password.add_argument("--prompt-password", action="store_true", help="ask for the password on the terminal")

    def handle(self, *args, team: str, username: str, role: str, password: str | None = None,
               prompt_password: bool = False, **options):
        team_obj = Team.objects.filter(slug=team).first()
        if team_obj is None:
            raise CommandError(f"No team '{team}'.")
        if prompt_password:
            password = getpass.getpass(f"Password for {username}: ")
            if password != getpass.getpass("Again: "):
                raise CommandError("The two passwords differ.")
        try:
            membership_add(team=team_obj, username=username, role=role)
            if password is not None:
                user_set_password(username=username, password=password)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from exc
        self.stdout.write(f"{username} is {role} of {team}" + (" (password set)" if password is not None else ""))
