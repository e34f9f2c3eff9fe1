"""Celery tasks of the catalog. Thin: they take ids and call a service."""

from __future__ import annotations

# The project's app, not shared_task: orsplatform/__init__.py does not load the Celery app, and a
# shared task would be bound to Celery's default app, not configured from the settings.
from orsplatform.celery import app


@app.task(name="catalog.ingest_tasks", acks_late=True)
def ingest_tasks(job_id: int) -> None:
    from orsplatform.catalog.services import ingest_job_run

    ingest_job_run(job_id=job_id)


@app.task(name="catalog.build_version", acks_late=True)
def build_version(version_id: int) -> None:
    from orsplatform.catalog.services import version_build

    version_build(version_id=version_id)


@app.task(name="catalog.collect_pyenvs")
def collect_pyenvs() -> None:
    from django.conf import settings

    from orsplatform.catalog.services import pyenvs_collect_unused, versions_fail_stalled_builds
    from orsplatform.containers.services import images_collect_unused

    versions_fail_stalled_builds(older_than_seconds=settings.ORS_BUILD_TIMEOUT_SECONDS + 60)
    pyenvs_collect_unused()
    images_collect_unused()  # container versions' images, collected with their versions


@app.task(name="catalog.cleanup_staged")
def cleanup_staged() -> None:
    """Staged uploads, ingest jobs and builds left by killed processes, a bounded batch at a time; a
    full batch queues the next at once."""
    from django.conf import settings

    from orsplatform.catalog.services import staging_cleanup

    report = staging_cleanup()
    if report.more(settings.ORS_CLEANUP_BATCH):
        cleanup_staged.delay()
