"""`make run` on the embedded default (no Redis, no broker configured): a Celery worker with beat
runs beside the server on the filesystem broker, so scheduled jobs run there too (docs/runner-nodes.md).
Real processes: the worker is started with the Makefile's own command."""

from __future__ import annotations

import datetime

from orsplatform.catalog.models import Environment, EnvironmentVersion
from tests.fixtures.celery import make_command, wait_until
from tests.fixtures.server import ROOT


def test_make_run_starts_the_makefiles_worker_with_beat_unless_a_broker_is_configured():
    recipe = (ROOT / "Makefile").read_text().partition("\nrun:")[2].partition("\n\n")[0]
    assert "$(WORKER_CMD)" in recipe and "$(SERVER_CMD)" in recipe
    assert "$$REDIS_URL$$CELERY_BROKER_URL" in recipe  # with a broker, the worker runs on its own
    assert "--beat" in make_command("WORKER_CMD")


def test_beat_on_the_embedded_worker_fails_a_stalled_build(embedded_worker, acme):
    environment = Environment.objects.create(team=acme, slug="stalled")
    version = EnvironmentVersion.objects.create(environment=environment, number=1, content_hash="d" * 64,
                                                package_path="/nonexistent", entrypoint="", requirements=["six"],
                                                status=EnvironmentVersion.Status.BUILDING)
    # Its process died two hours ago: no build log, created long before the build timeout.
    EnvironmentVersion.objects.filter(id=version.id).update(
        created_at=version.created_at - datetime.timedelta(hours=2))
    embedded_worker.start(ORS_CLEANUP_EVERY_SECONDS="1")
    assert "transport:   filesystem://" in embedded_worker.log.read_text()  # Celery's banner: no server
    failed = wait_until(lambda: EnvironmentVersion.objects.filter(
        id=version.id, status=EnvironmentVersion.Status.FAILED).first(), 120, "beat to fail the stalled build")
    assert "stopped without finishing" in failed.error
    assert "catalog.cleanup_staged" in embedded_worker.log.read_text()  # sent by beat, run by the worker
