from __future__ import annotations

from pathlib import Path

from django.core.files import File
from django.core.management.base import BaseCommand, CommandError

from orsplatform.catalog.ingest import IngestError
from orsplatform.catalog.models import IngestJob, Split
from orsplatform.catalog.row_check import describe
from orsplatform.catalog.selectors import environment_of_team
from orsplatform.catalog.services import ingest_job_create, ingest_job_run
from orsplatform.teams.models import Team


class Command(BaseCommand):
    help = ("Upload a task file (.jsonl, .csv, .parquet) into a split of an environment, as the console and "
            "the REST API do: a sample of its rows runs through the environment first (ORS_TASK_CHECK_ROWS).")

    def add_arguments(self, parser):
        parser.add_argument("environment", help="team/slug")
        parser.add_argument("split")
        parser.add_argument("path")
        parser.add_argument("--mode", choices=IngestJob.Mode.values, default=IngestJob.Mode.APPEND)
        parser.add_argument("--format", choices=["jsonl", "csv", "parquet"], default=None)
        parser.add_argument("--type", choices=Split.Type.values, default=None, dest="split_type")
        parser.add_argument("--accept-failing-rows", action="store_true",
                            help="Keep rows that fail the row check (reported as warnings) instead of refusing "
                                 "the file.")

    def handle(self, *args, environment: str, split: str, path: str, mode: str, format: str | None,
               split_type: str | None, accept_failing_rows: bool, **options):
        team_slug, _, slug = environment.partition("/")
        team = Team.objects.filter(slug=team_slug).first()
        env = environment_of_team(team_id=team.id, slug=slug) if team is not None and slug else None
        if env is None:
            raise CommandError(f"No environment '{environment}' (give it as team/slug).")
        source = Path(path)
        if not source.is_file():
            raise CommandError(f"No such file: {path}")
        try:
            with source.open("rb") as fh:
                job = ingest_job_create(environment=env, split_name=split, mode=mode, upload=File(fh, name=source.name),
                                        fmt=format, split_type=split_type, accept_failing_rows=accept_failing_rows)
        except IngestError as exc:
            raise CommandError(f"uploading {source.name} failed: {exc}") from None
        # Here, now: a broker's worker that picks the queued job up first finds it claimed.
        job = ingest_job_run(job_id=job.id)
        while not job.finished:  # claimed by a worker elsewhere: its result is awaited, not redone
            job = _wait(job.id)
        report = job.error_report or {}
        if job.status == IngestJob.Status.FAILED:
            for failure in report.get("errors", [])[:20] if report.get("check") == "rows" else []:
                self.stderr.write(describe(failure))
                if failure.get("traceback") and options.get("verbosity", 1) >= 2:
                    self.stderr.write(failure["traceback"].rstrip())
            raise CommandError(f"uploading {source.name} failed: {report.get('detail', 'unknown error')}")
        for failure in (job.row_check or {}).get("failures", []):
            self.stderr.write(f"warning: {describe(failure)}")
        self.stdout.write(f"{env.full_name} split {split}: {job.rows_done} task(s) added, {job.num_tasks} in all")


def _wait(job_id: int) -> IngestJob:
    import time

    time.sleep(0.5)  # polling a job another process runs, until it has finished
    return IngestJob.objects.get(id=job_id)
