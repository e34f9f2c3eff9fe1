from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from orsplatform.catalog.models import Environment
from orsplatform.catalog.services import PublishError, environment_publish_path
from orsplatform.teams.models import Team


class Command(BaseCommand):
    help = "Publish one environment package (a folder, .zip, .tar.gz or a single .py) into a team."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--team", required=True, help="The team's slug.")
        parser.add_argument("--slug", default=None, help="Environment slug (default: manifest name, else the file name).")
        parser.add_argument("--visibility", choices=Environment.Visibility.values, default=None)
        parser.add_argument("--data", default=None, help="A data archive (.zip, .tar.gz) mounted at /orwd_data.")

    def handle(self, *args, path: str, team: str, slug: str | None, visibility: str | None,
               data: str | None = None, **options):
        team_obj = Team.objects.filter(slug=team).first()
        if team_obj is None:
            raise CommandError(f"No team '{team}'.")
        source = Path(path)
        if not source.exists():
            raise CommandError(f"No such file or folder: {path}")
        if data is not None and not Path(data).is_file():
            raise CommandError(f"No such data archive: {data}")
        try:
            # wait: a package with requirements is built here, its installer's output shown as it goes.
            result = environment_publish_path(team=team_obj, path=source, slug=slug, visibility=visibility,
                                              wait=True, data_path=Path(data) if data else None)
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
