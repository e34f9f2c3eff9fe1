"""A team's retention of its tool calls, and the archive run (docs/audit-log.md).

    manage.py audit_retention show TEAM
    manage.py audit_retention set TEAM DAYS       # DAYS or "default" (the platform's)
    manage.py audit_retention archive             # archive and drop what is past retention now
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from orsplatform.auditlog import archive, selectors, services
from orsplatform.teams.models import Team


class Command(BaseCommand):
    help = "Show or set a team's retention of tool calls, or run the archive now."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["show", "set", "archive"])
        parser.add_argument("team", nargs="?")
        parser.add_argument("days", nargs="?")

    def handle(self, *args, action: str, team: str | None, days: str | None, **options) -> None:
        if action == "archive":
            report = archive.archive_run()
            self.stdout.write(f"archived {len(report.archived)} period(s), dropped {len(report.dropped_partitions)} "
                              f"partition(s), deleted {sum(n for _, _, n in report.deleted)} row(s) of "
                              f"{len(report.deleted)} period(s); behind: {len(report.behind)}; "
                              f"failed: {len(report.failed)}")
            return
        if not team:
            raise CommandError("Name the team (its slug).")
        found = Team.objects.filter(slug=team).first()
        if found is None:
            raise CommandError(f"No team {team!r}.")
        if action == "set":
            if days is None:
                raise CommandError("Give the days, or 'default'.")
            try:
                services.retention_set(team=found, hot_days=None if days == "default" else int(days))
            except (ValueError, services.InvalidRetention) as exc:
                raise CommandError(str(exc)) from None
        r = selectors.retention_of(team=found)
        source = "the platform's default" if r.platform_default else "its own policy"
        self.stdout.write(f"{found.slug}: {r.hot_days} days in the database ({source}); archived: "
                          f"{r.archived_days} day(s), {r.archived_rows} row(s), {r.archived_bytes} bytes")
