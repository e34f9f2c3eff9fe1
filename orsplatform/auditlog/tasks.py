"""Celery tasks of the audit log: thin adapters over its services."""

from __future__ import annotations

from orsplatform.celery import app


@app.task(name="auditlog.maintain", ignore_result=True)
def maintain() -> None:
    """The partitions of the days ahead, then the days past retention archived and dropped (beat,
    hourly by default); an archive falling behind is logged by archive_run."""
    from django.conf import settings

    from orsplatform.auditlog import archive, partitions

    partitions.partitions_ensure_ahead(ahead_days=settings.ORS_AUDIT_PARTITIONS_AHEAD_DAYS)
    archive.archive_run()
