"""`manage.py cleanup_staged [--startup]`: remove what killed publishes and ingests left behind.

`make run` runs it with --startup before the server starts: the one moment at which, on the
embedded default, nothing can be in flight, and before any request can stage something new. (Not the
ASGI lifespan: it runs in every server process, test servers included, inside the event loop, while
requests may already arrive; not AppConfig.ready: every manage.py command and worker runs that.)
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from orsplatform.catalog.services import staging_cleanup


class Command(BaseCommand):
    help = ("Remove stale staged uploads and the inspection folders of killed publishes; fail ingest jobs "
            "and builds whose process died.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--startup", action="store_true",
                            help="Run before the server starts (embedded default: nothing is in flight).")

    def handle(self, *args, startup: bool = False, **options) -> None:
        total = {"uploads": 0, "jobs": 0, "builds": 0, "inspections": 0}
        while True:  # bounded batches until one comes back short
            report = staging_cleanup(at_startup=startup)
            total["uploads"] += report.uploads_removed
            total["jobs"] += report.ingest_jobs_failed
            total["builds"] += report.builds_failed
            total["inspections"] += report.inspect_dirs_removed
            if not report.more(settings.ORS_CLEANUP_BATCH):
                break
        self.stdout.write(f"cleanup: {total['uploads']} staged uploads removed, {total['jobs']} ingest jobs and "
                          f"{total['builds']} builds whose process ended marked failed, "
                          f"{total['inspections']} inspection folders of killed publishes removed")
