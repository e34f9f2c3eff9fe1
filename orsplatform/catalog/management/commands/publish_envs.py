from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from orsplatform.catalog.management.commands.publish_env import command_line_publisher
from orsplatform.catalog.services import PublishError, environment_publish_path
from orsplatform.teams.services import team_get_or_create_builtin


class Command(BaseCommand):
    help = "Publish the bundled environments (envs/*) into the built-in team. Idempotent."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", help="Only these folders of envs/ (default: all).")
        parser.add_argument("--dir", default=str(settings.ORS_ENVS_DIR))
        parser.add_argument("-m", "--message", default="", help="What changed (shown in each new version's history).")

    def handle(self, *args, names: list[str], dir: str, message: str = "", **options):
        team = team_get_or_create_builtin(slug=settings.ORS_BUILTIN_TEAM)
        root = Path(dir)
        folders = sorted(p for p in root.iterdir() if (p / "manifest.toml").exists())
        if names:
            folders = [p for p in folders if p.name in names]
        if not folders:
            raise CommandError(f"No environment folders with a manifest.toml under {root}.")
        for folder in folders:
            try:
                result = environment_publish_path(team=team, path=folder, message=message,
                                                  published_by=f"publish_envs, {command_line_publisher()}")
            except PublishError as exc:
                if exc.traceback and options.get("verbosity", 1) >= 2:
                    self.stderr.write(exc.traceback.rstrip())
                raise CommandError(f"publishing {folder.name} failed: {exc.summary()}") from None
            version = result.version
            verb = "published" if result.created else "unchanged"
            self.stdout.write(f"{verb} {version.environment.full_name}@{version.number}")
