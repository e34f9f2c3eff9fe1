from __future__ import annotations

import getpass
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from orsplatform.catalog.models import Environment
from orsplatform.catalog.services import MAX_MESSAGE_CHARS, PublishError, environment_publish_path
from orsplatform.teams.models import Membership, Team

PUBLISHER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN, Membership.Role.MEMBER)


def command_line_publisher() -> str:
    """Who a command-line publish without --user is recorded as: the account that ran it."""
    try:
        who = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's bare uid)
        who = "unknown user"
    return f"command line ({who})"


class Command(BaseCommand):
    help = "Publish one environment package (a folder, .zip, .tar.gz or a single .py) into a team."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--team", required=True, help="The team's slug.")
        parser.add_argument("--slug", default=None, help="Environment slug (default: manifest name, else the file name).")
        parser.add_argument("--visibility", choices=Environment.Visibility.values, default=None)
        parser.add_argument("--data", default=None, help="A data archive (.zip, .tar.gz) mounted at /orwd_data.")
        parser.add_argument("-m", "--message", default="", help="What changed in this version (shown in its history).")
        parser.add_argument("--user", default=None, help="Publish as this user (an owner, admin or member of the "
                                                         "team); default: recorded as the command line's account.")

    def handle(self, *args, path: str, team: str, slug: str | None, visibility: str | None,
               data: str | None = None, message: str = "", user: str | None = None, **options):
        team_obj = Team.objects.filter(slug=team).first()
        if team_obj is None:
            raise CommandError(f"No team '{team}'.")
        if len(message) > MAX_MESSAGE_CHARS:
            raise CommandError(f"The message is {len(message)} characters; the limit is {MAX_MESSAGE_CHARS}.")
        publisher = None
        if user is not None:
            publisher = get_user_model().objects.filter(username=user).first()
            if publisher is None or not (publisher.is_superuser or Membership.objects.filter(
                    user=publisher, team=team_obj, role__in=PUBLISHER_ROLES).exists()):
                raise CommandError(f"No user '{user}' who may publish into team '{team}'.")
        source = Path(path)
        if not source.exists():
            raise CommandError(f"No such file or folder: {path}")
        if data is not None and not Path(data).is_file():
            raise CommandError(f"No such data archive: {data}")
        try:
            # wait: a package with requirements is built here, its installer's output shown as it goes.
            result = environment_publish_path(team=team_obj, path=source, slug=slug, visibility=visibility,
                                              wait=True, data_path=Path(data) if data else None, message=message,
                                              created_by=publisher,
                                              published_by="" if publisher else command_line_publisher())
        except PublishError as exc:
            # One line; the package's own traceback (never the platform's) with -v 2.
            if exc.traceback and options.get("verbosity", 1) >= 2:
                self.stderr.write(exc.traceback.rstrip())
            raise CommandError(f"publishing {source.name} failed: {exc.summary()}") from None
        version = result.version
        if version.status == version.Status.FAILED:
            raise CommandError(f"publishing failed ({version.error})")
        verb = "published" if result.created else "unchanged"
        self.stdout.write(f"{verb} {version.environment.full_name}@{version.number}")
