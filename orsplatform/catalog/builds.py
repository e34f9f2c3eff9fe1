"""Versions that are built before they are inspected: a Python environment for a package with
requirements (catalog/pyenvs.py), an image for a package with a Dockerfile (orsplatform/containers/),
its log streamed to the version page, then the same inspection and publication as any version."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from orsplatform.catalog import data, pyenvs
from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.catalog.publishing import (
    DELETED_ERROR,
    PublishError,
    PublishResult,
    _environment_locked,
    _first_task,
    _inspect_copy,
    _store_package,
    _version_fill,
    _version_row,
    inspect_workdir,
    package_task_files,
)
from orsplatform.celery import task
from orsplatform.containers import images as container_images
from orsplatform.containers import services as container_services
from orsplatform.teams.models import Team

logger = logging.getLogger(__name__)
# _store_package copies a package beside its final place under this prefix, then renames it; what a
# killed process left so is removed by uploads_remove_stale.
STAGING_PREFIX = ".staging-"
IGNORED_NAMES = {"__pycache__", ".git", ".DS_Store"}
MAX_OPENENV_BYTES = 1024 * 1024  # an OpenEnv declaration (its JSON schemas) kept with the version




def _version_queue_build(*, team: Team, slug: str, manifest: dict, visibility: str | None, content_hash: str,
                         source_dir: Path, requirements: list[str], notes: list[str], author: dict,
                         wait: bool, data_hash: str | None = None) -> PublishResult:
    """A package with requirements: store it, record the version as ``building`` and build its
    Python environment, then inspect it there (version_build). ``wait``: build now, in this
    process (the CLI); else on the platform's Celery worker, while the console and the REST API
    show the build's log."""
    stored = _store_package(source_dir, content_hash, data_hash)
    if visibility is not None:
        manifest = {**manifest, "visibility": visibility}  # applied when the build succeeds
    with transaction.atomic():
        environment = _environment_locked(team=team, slug=slug, manifest=manifest, visibility=visibility)
        raced = environment.versions.filter(content_hash=content_hash).first()
        if raced is not None and raced.status != EnvironmentVersion.Status.FAILED:
            return PublishResult(version=raced, created=False)
        version = _version_row(environment=environment, reuse=raced, content_hash=content_hash, stored=stored,
                               manifest=manifest, author=author, requirements=requirements, notes=notes,
                               status=EnvironmentVersion.Status.BUILDING, data_hash=data_hash)
        pyenvs.log_path(version.id).unlink(missing_ok=True)
    if wait:
        version = version_build(version_id=version.id)
    else:
        _build_dispatch(version.id)
    return PublishResult(version=version, created=True, report={"building": not wait})


def _build_dispatch(version_id: int) -> None:
    task("catalog.build_version").delay(version_id)


def version_build(*, version_id: int) -> EnvironmentVersion:
    """Build a ``building`` version's Python environment, inspect the package in it and publish
    it (ready), or record why not (failed: nothing is published). Runs once per version: another
    call finds it no longer building and returns it."""
    version = EnvironmentVersion.objects.select_related("environment__team").get(id=version_id)
    if version.status != EnvironmentVersion.Status.BUILDING:
        if version.status == EnvironmentVersion.Status.FAILED and version.environment.deleted_at is not None:
            # Deleted before its build started (the worker took the task later): the delete left the
            # package to this build, which removes it as a failed build does.
            _package_release(version)
        return version
    log = pyenvs.BuildLog(pyenvs.log_path(version.id))
    stored = Path(version.package_path)
    try:
        if container_services.has_dockerfile(stored, version.manifest):
            return _container_build(version, stored, log)
        built = pyenvs.ensure(version.requirements, log)
        task_files = package_task_files(stored)
        with inspect_workdir() as work:
            log.write("[platform] inspecting the package in its environment")
            report = _inspect_copy(stored, version.manifest, task_files, work, runtime=str(built.path),
                                   data_hash=version.data_hash or None)
            pyenvs.record_runtime(version.package_path, built.path)
            version.pyenv = built.path.name
            _publish_built(version, report, work, task_files, log)
        return version
    except pyenvs.BuildFailed as exc:
        return _version_fail(version, "requirements", f"Installing the requirements failed: {exc}", log)
    except container_services.ContainerBuildFailed as exc:
        return _version_fail(version, exc.check, str(exc), log)
    except PublishError as exc:
        return _version_fail(version, exc.check or "inspect", str(exc), log, traceback=exc.traceback)
    except Exception as exc:  # the version must end as failed, never stay "building"
        logger.exception("building version %s failed", version.id)
        return _version_fail(version, "internal", f"Internal error ({type(exc).__name__}); nothing was published.",
                             log)


def _publish_built(version: EnvironmentVersion, report: dict, work: Path, task_files: dict,
                   log: pyenvs.BuildLog) -> None:
    """Publish a built version (ready, made current), unless its environment went meanwhile."""
    with transaction.atomic():
        # No select_related: PostgreSQL cannot lock the nullable side of an outer join.
        environment = Environment.objects.select_for_update().get(id=version.environment_id)
        if environment.deleted_at is not None:
            raise PublishError(DELETED_ERROR, check="deleted")
        version.refresh_from_db(fields=["status"])
        if version.status != EnvironmentVersion.Status.BUILDING:
            raise PublishError(DELETED_ERROR, check="deleted")
        _version_fill(environment=environment, version=version, report=report, work=work,
                      task_files=task_files, manifest=version.manifest,
                      visibility=version.manifest.get("visibility"))
        # Before the commit: whoever sees the version ready sees this line too.
        log.write(f"[platform] ready: {environment.full_name}@{version.number}")


def _container_build(version: EnvironmentVersion, stored: Path, log: pyenvs.BuildLog) -> EnvironmentVersion:
    """A package with a Dockerfile: its image built, started under gVisor and asked what it serves
    (orsplatform/containers/), then published as any version."""
    record = container_services.image_build(package_dir=stored, content_hash=version.content_hash, log=log.write)
    task_files = package_task_files(stored)
    sample = next((t for t in (_first_task(p, f) for p, f in task_files.values()) if t is not None), None)
    report, default_tasks = container_services.image_inspect(package_dir=stored, record=record, sample=sample,
                                                             task_names=sorted(task_files), log=log.write)
    with inspect_workdir() as work:
        if default_tasks is not None:
            (work / "tasks").mkdir()
            (work / "tasks" / "0.jsonl").write_text("".join(json.dumps(t) + "\n" for t in default_tasks))
        _publish_built(version, report, work, task_files, log)
    return version


def _version_fail(version: EnvironmentVersion, check: str, message: str, log: pyenvs.BuildLog,
                  traceback: str = "") -> EnvironmentVersion:
    log.write(f"[platform] failed ({check}): {message}")
    if traceback:
        log.write(traceback)
    version.status = EnvironmentVersion.Status.FAILED
    version.error = f"{check}: {message}"
    version.save(update_fields=["status", "error"])
    _package_release(version)
    return version


def _package_release(version: EnvironmentVersion) -> None:
    """Nothing published: the package goes unless another version serves the same content."""
    pyenvs.record_runtime(version.package_path, None)
    if not EnvironmentVersion.objects.filter(content_hash=version.content_hash).exclude(
            status=EnvironmentVersion.Status.FAILED).exists():
        shutil.rmtree(version.package_path, ignore_errors=True)
        data.record(version.package_path, None)
        container_images.record_write(version.package_path, None)  # its image goes with images_collect_unused
        container_images.archive_path(version.package_path).unlink(missing_ok=True)


def versions_fail_stalled_builds(*, older_than_seconds: float, limit: int | None = None) -> int:
    """Builds whose process died (a server restarted mid-build) end as failed, not building forever."""
    cutoff = timezone.now() - timezone.timedelta(seconds=older_than_seconds)
    stalled = EnvironmentVersion.objects.filter(status=EnvironmentVersion.Status.BUILDING,
                                                created_at__lte=cutoff).order_by("id")
    count = 0
    for version in stalled[:limit] if limit is not None else stalled:
        if pyenvs.log_age_seconds(version.id) >= older_than_seconds:
            _version_fail(version, "requirements", "The build stopped without finishing (its process ended); "
                          "publish the package again.", pyenvs.BuildLog(pyenvs.log_path(version.id)))
            count += 1
    return count


def pyenvs_collect_unused() -> list[str]:
    """Remove the built Python environments that no version uses any more."""
    keep = set(EnvironmentVersion.objects.exclude(pyenv="").exclude(status=EnvironmentVersion.Status.FAILED)
               .filter(environment__deleted_at__isnull=True).values_list("pyenv", flat=True))
    return pyenvs.collect(keep, grace_seconds=settings.ORS_PYENV_GRACE_SECONDS)


