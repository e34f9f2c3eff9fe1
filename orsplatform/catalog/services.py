from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.utils import timezone

from orsplatform.catalog import data, ingest, packages, pyenvs
from orsplatform.catalog import requirements as package_requirements
from orsplatform.catalog.builds import (  # noqa: F401 - re-exported: callers import them from here
    _version_queue_build,
    pyenvs_collect_unused,
    version_build,
    versions_fail_stalled_builds,
)
from orsplatform.catalog.ingest import IngestError, UploadTooLarge
from orsplatform.catalog.models import Environment, EnvironmentVersion, IngestJob, Split
from orsplatform.catalog.publishing import (  # noqa: F401 - re-exported: callers import them from here
    DELETED_ERROR,
    INSPECT_HELD,
    INSPECT_PREFIX,
    MAX_MESSAGE_CHARS,
    STAGING_PREFIX,
    PublishError,
    PublishResult,
    _card_fields_validate,
    _environment_locked,
    _inspect_copy,
    _store_package,
    _version_fill,
    _version_row,
    inspect_workdir,
    manifest_validate,
    package_hash,
    package_task_files,
    publisher_label,
    read_manifest,
)
from orsplatform.catalog.task_ingest import (  # noqa: F401 - re-exported: callers import them from here
    IngestResult,
    _check_declared_rows,
    _tasks_quota,
    tasks_ingest,
)
from orsplatform.celery import task
from orsplatform.containers import services as container_services
from orsplatform.episodes.models import Session
from orsplatform.teams.models import ApiKey, Team
from orsplatform.teams.services import validate_slug
from orsplatform.verify import config as verify_config

logger = logging.getLogger(__name__)




def _publish_target(source_dir: Path, manifest: dict, *, slug: str | None, default_slug: str | None,
                    visibility: str | None) -> tuple[str, str | None]:
    """The environment a package publishes into and its visibility, checked (with the package's
    [verify] section) before anything runs or is written."""
    try:  # [verify] and verify/solutions.jsonl (verified versions, orsplatform/verify/)
        verify_config.package_verify_check(source_dir, manifest)
    except verify_config.VerifyConfigError as exc:
        raise PublishError(str(exc), check="verify") from exc
    slug = slug or manifest.get("name") or default_slug or source_dir.name
    try:
        validate_slug(slug)
    except ValidationError as exc:
        raise PublishError(f"Invalid environment name '{slug}': {' '.join(exc.messages)}", check="manifest") from exc
    visibility = visibility or manifest.get("visibility")
    if visibility is not None and visibility not in Environment.Visibility.values:
        raise PublishError(f"Unknown visibility '{visibility}'.", check="manifest")
    return slug, visibility


def environment_publish(
    *, team: Team, source_dir: Path, created_by=None, slug: str | None = None, visibility: str | None = None,
    default_slug: str | None = None, wait: bool = False, data_hash: str | None = None,
    message: str = "", created_by_key=None, published_by: str = "",
) -> PublishResult:
    """Publish a package directory as a new immutable version (a no-op for identical content).
    ``data_hash``: a data archive stored by data.archive_store, mounted at /orwd_data.

    ``message``: the publisher's note on the version; ``published_by``: who published, as shown
    (default: publisher_label of ``created_by_key`` or ``created_by``).

    Validation runs on a throwaway copy, so what tenant code does during validation never reaches the
    stored package; nothing is written to the database until validation has passed, and the version,
    its splits and all its tasks are then written in one transaction.
    """
    message = (message or "").strip()
    if len(message) > MAX_MESSAGE_CHARS:
        raise PublishError(f"The message is {len(message)} characters; the limit is {MAX_MESSAGE_CHARS}.",
                           check="message")
    published_by = (published_by or publisher_label(user=created_by, key=created_by_key))[:200]
    author = {"created_by": created_by, "created_by_key": created_by_key, "published_by": published_by,
              "message": message}
    source_dir = Path(source_dir).resolve()
    manifest = manifest_validate(read_manifest(source_dir))
    slug, visibility = _publish_target(source_dir, manifest, slug=slug, default_slug=default_slug,
                                       visibility=visibility)
    task_files = package_task_files(source_dir)
    content_hash = package_hash(source_dir)
    if data_hash:  # the same package with other data is another version
        content_hash = hashlib.sha256(f"{content_hash}+data:{data_hash}".encode()).hexdigest()

    existing = EnvironmentVersion.objects.filter(
        environment__team=team, environment__slug=slug, content_hash=content_hash,
        status__in=(EnvironmentVersion.Status.READY, EnvironmentVersion.Status.BUILDING),
    ).first()
    if existing is not None:
        return PublishResult(version=existing, created=False)
    if container_services.has_dockerfile(source_dir, manifest):
        # Built into an image by the build service and run as the author ships it (docs/containers.md).
        return _version_queue_build(team=team, slug=slug, manifest=manifest, visibility=visibility,
                                    content_hash=content_hash, source_dir=source_dir, requirements=[], notes=[],
                                    author=author, wait=wait, data_hash=data_hash)
    try:
        requirements = package_requirements.collect(source_dir, manifest)
    except package_requirements.RequirementsError as exc:
        raise PublishError(str(exc), check="requirements") from exc
    notes = package_requirements.notes(source_dir)
    if requirements:
        return _version_queue_build(team=team, slug=slug, manifest=manifest, visibility=visibility,
                                    content_hash=content_hash, source_dir=source_dir, requirements=requirements,
                                    notes=notes, author=author, wait=wait, data_hash=data_hash)

    with inspect_workdir() as work:
        report = _inspect_copy(source_dir, manifest, task_files, work, data_hash=data_hash)
        fresh = not (settings.ORS_PACKAGE_DIR / content_hash).exists()
        stored = _store_package(source_dir, content_hash, data_hash)
        try:
            with transaction.atomic():
                environment = _environment_locked(team=team, slug=slug, manifest=manifest, visibility=visibility)
                raced = environment.versions.filter(content_hash=content_hash).first()
                if raced is not None and raced.status == EnvironmentVersion.Status.READY:
                    # an identical upload finished while this one was validating
                    return PublishResult(version=raced, created=False, report=report)
                version = _version_row(environment=environment, reuse=raced, content_hash=content_hash,
                                       stored=stored, manifest=manifest, author=author, requirements=[],
                                       notes=notes, status=EnvironmentVersion.Status.READY, data_hash=data_hash)
                _version_fill(environment=environment, version=version, report=report, work=work,
                              task_files=task_files, manifest=manifest, visibility=visibility)
            return PublishResult(version=version, created=True, report=report)
        except BaseException:
            # Nothing half-published: a package stored for this attempt alone goes with it.
            if fresh and not EnvironmentVersion.objects.filter(content_hash=content_hash).exists():
                shutil.rmtree(stored, ignore_errors=True)
            raise


def environment_publish_path(
    *, team: Team, path: Path, filename: str | None = None, slug: str | None = None,
    visibility: str | None = None, created_by=None, wait: bool = False, data_path: Path | None = None,
    data_filename: str | None = None, message: str = "", created_by_key=None, published_by: str = "",
) -> PublishResult:
    """Publish a folder, a zip, a tar.gz or a single .py (``filename`` is the uploader's name for it),
    with a data archive (``data_path``, named ``data_filename``) mounted at /orwd_data."""
    data_hash = None
    if data_path is not None:
        try:
            data_hash = data.archive_store(path=Path(data_path), filename=data_filename or Path(data_path).name)
        except data.DataError as exc:
            raise PublishError(str(exc), check=exc.check) from exc
    try:
        with packages.unpacked(Path(path), filename=filename) as package:
            return environment_publish(team=team, source_dir=package.root, created_by=created_by, slug=slug,
                                       visibility=visibility, default_slug=package.name_hint or None, wait=wait,
                                       data_hash=data_hash, message=message, created_by_key=created_by_key,
                                       published_by=published_by)
    except packages.PackageError as exc:
        raise PublishError(str(exc), check=exc.check) from exc


class VersionNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Rollback:
    version: EnvironmentVersion  # served now
    previous: int | None  # the number served before (what an undo serves again); None: none was


def environment_rollback(*, environment: Environment, number: int) -> Rollback:
    """Point the environment at one of its ready versions (older or newer): discovery and new
    sessions follow within ORS_CATALOG_CACHE_SECONDS; running sessions keep their version."""
    with transaction.atomic():
        locked = Environment.objects.select_for_update().get(pk=environment.pk)
        version = locked.versions.filter(number=number, status=EnvironmentVersion.Status.READY).first()
        if version is None:
            raise VersionNotFound(f"Version {number} of {environment.full_name} does not exist.")
        # Read under the lock, so the undo offered is the version this rollback replaced.
        previous = (EnvironmentVersion.objects.filter(id=locked.current_version_id)
                    .values_list("number", flat=True).first() if locked.current_version_id else None)
        locked.current_version = version
        locked.save(update_fields=["current_version"])
    environment.current_version = version
    return Rollback(version=version, previous=previous)


class EnvironmentGone(LookupError):
    """The environment was deleted meanwhile (a second delete, a build finishing after it)."""




@dataclass(frozen=True)
class DeleteReport:
    name: str  # team/slug as it was
    sessions_kept: int
    open_sessions: int  # not cut: they run to their end on the workers that hold them
    keys_revoked: int
    packages_removed: int
    packages_kept: int  # still read by open sessions, or by another environment's version


def _deleted_slug(environment: Environment) -> str:
    """A slug that frees the name for a new environment and still says what it was."""
    suffix = f"-deleted-{environment.id}"
    return environment.slug[: 63 - len(suffix)] + suffix


def environment_delete(*, environment: Environment, deleted_by=None) -> DeleteReport:
    """Delete an environment for its team. What the platform recorded of it is kept: its row
    (renamed, so its name is free again), its versions and every session, tool call and
    analytics figure that names it (the audit log); it simply is no longer served, listed or
    resolved. Its tasks and splits go, keys bound to it are revoked, a build still running ends as
    failed, and its stored packages are removed unless an open session or another environment's
    version still reads them. Open sessions are not cut: the gateway that holds each one lets it
    finish (new sessions are refused within ORS_CATALOG_CACHE_SECONDS); pooled workers retire
    when idle, and Python environments are collected by pyenvs_collect_unused."""
    with transaction.atomic():
        locked = (Environment.objects.select_for_update().select_related("team")
                  .filter(pk=environment.pk, deleted_at__isnull=True).first())
        if locked is None:
            raise EnvironmentGone(f"{environment.full_name} was already deleted.")
        name = locked.full_name
        building = list(locked.versions.filter(status__in=(EnvironmentVersion.Status.BUILDING,
                                                            EnvironmentVersion.Status.VALIDATING)))
        locked.versions.filter(id__in=[v.id for v in building]).update(
            status=EnvironmentVersion.Status.FAILED, error=f"deleted: {DELETED_ERROR}")
        Split.objects.filter(environment=locked).delete()  # their tasks and digests with them
        keys = list(ApiKey.objects.filter(environment=locked, revoked_at__isnull=True).values_list("id", flat=True))
        ApiKey.objects.filter(id__in=keys).update(revoked_at=timezone.now())
        locked.slug, locked.current_version = _deleted_slug(locked), None
        locked.visibility = Environment.Visibility.PRIVATE
        locked.deleted_at, locked.deleted_by = timezone.now(), deleted_by
        locked.save(update_fields=["slug", "current_version", "visibility", "deleted_at", "deleted_by"])
    for version in building:
        pyenvs.BuildLog(pyenvs.log_path(version.id)).write(f"[platform] failed (deleted): {DELETED_ERROR}")
    sessions = Session.objects.filter(environment=locked)
    open_sessions = sessions.filter(ended_at__isnull=True, status__in=(Session.Status.CREATING,
                                                                        Session.Status.READY)).count()
    removed = kept = 0
    # A build still running reads its package until it ends; it removes the package itself then
    # (_version_fail: no version serves that content).
    building_ids = {v.id for v in building}
    for version in locked.versions.exclude(id__in=building_ids):
        shared = EnvironmentVersion.objects.filter(content_hash=version.content_hash,
                                                   environment__deleted_at__isnull=True).exclude(
            status=EnvironmentVersion.Status.FAILED).exists()
        if not Path(version.package_path).exists():
            continue
        if shared or open_sessions:
            kept += 1
            continue
        pyenvs.record_runtime(version.package_path, None)
        data.record(version.package_path, None)
        shutil.rmtree(version.package_path, ignore_errors=True)
        removed += 1
    logger.info("environment %s deleted (now %s)", name, locked.slug)
    return DeleteReport(name=name, sessions_kept=sessions.count(), open_sessions=open_sessions,
                        keys_revoked=len(keys), packages_removed=removed, packages_kept=kept)


class _JobProgress:
    """Publishes an ingest's progress while its transaction is still open: to the cache, and on
    PostgreSQL to the job row through a second, autocommit connection. (SQLite allows one writer at a
    time, so there the row is only updated at the end; the cache serves progress in between.)"""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self._conn = connections.create_connection(DEFAULT_DB_ALIAS) if connection.vendor != "sqlite" else None

    def __call__(self, rows_done: int, bytes_done: int) -> None:
        cache.set(ingest.progress_key(self.job_id), {"rows_done": rows_done, "bytes_done": bytes_done}, 3600)
        if self._conn is not None:
            with self._conn.cursor() as cursor:
                cursor.execute(f"UPDATE {IngestJob._meta.db_table} SET rows_done = %s, bytes_done = %s "
                               "WHERE id = %s", [rows_done, bytes_done, self.job_id])

    def close(self) -> None:
        cache.delete(ingest.progress_key(self.job_id))
        if self._conn is not None:
            self._conn.close()


def ingest_job_create(
    *, environment: Environment, split_name: str, mode: str, upload, fmt: str | None = None,
    split_type: str | None = None, created_by=None, accept_failing_rows: bool = False,
) -> IngestJob:
    """Save an uploaded task file and queue its ingest (run by a Celery worker, or at once when eager).
    ``accept_failing_rows``: rows failing the row check are kept as warnings, not a refusal."""
    ingest.validate_split_name(split_name)
    if mode not in IngestJob.Mode.values:
        raise IngestError(f"Unknown mode {mode!r}: use append or replace.")
    if split_type and split_type not in Split.Type.values:
        raise IngestError(f"Unknown split type {split_type!r}: use train, validation or test.")
    fmt = ingest.format_for(upload.name or "", fmt)
    if upload.size > settings.ORS_MAX_TASK_FILE_BYTES:
        raise UploadTooLarge(f"The file is {upload.size} bytes; the limit is {settings.ORS_MAX_TASK_FILE_BYTES}.")
    path = packages.save_upload(upload)
    try:
        ingest.sniff(path, fmt)
        # Refused at once when the file says it is over a quota (the ingest checks again, exactly).
        split = Split.objects.filter(environment=environment, name=split_name).first()
        _check_declared_rows(path, fmt, _tasks_quota(environment=environment, split_name=split_name,
                                                     held=split.num_tasks if split else 0, mode=mode))
    except IngestError:
        packages.remove_quietly(path)
        raise
    job = IngestJob.objects.create(
        team=environment.team, environment=environment, split_name=split_name, split_type=split_type or "",
        mode=mode, format=fmt, file_name=(upload.name or "")[:255], source_path=str(path),
        bytes_total=path.stat().st_size, created_by=created_by, accept_failing_rows=accept_failing_rows,
    )
    transaction.on_commit(lambda: task("catalog.ingest_tasks").delay(job.id))
    return job


# PostgreSQL advisory locks (space, job id) held by the process running an ingest job, from before
# its claim to its end: a `running` job whose lock is free has lost its process (killed, its node
# gone), and the cleanup may fail it.
INGEST_LOCK_SPACE = 0x4F5253


def _lock_key(job_id: int) -> int:
    return job_id & 0x7FFFFFFF


@contextlib.contextmanager
def _ingest_job_held(job_id: int) -> Iterator[bool]:
    """Holds the job's liveness lock for the block; False when another process holds it."""
    if connection.vendor != "postgresql":
        yield True  # the embedded default runs ingests in its one server process (see staging_cleanup)
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [INGEST_LOCK_SPACE, _lock_key(job_id)])
        held = cursor.fetchone()[0]
    try:
        yield held
    finally:
        if held:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [INGEST_LOCK_SPACE, _lock_key(job_id)])
            except DatabaseError:
                pass  # the connection is gone, and its locks with it


def ingest_job_run(*, job_id: int) -> IngestJob:
    """Run a queued ingest job once (a redelivered task finds it claimed and does nothing). The tasks
    and the job's success are one transaction: a job left `running` by a killed process wrote nothing."""
    with _ingest_job_held(job_id) as held:
        claimed = held and IngestJob.objects.filter(id=job_id, status=IngestJob.Status.QUEUED).update(
            status=IngestJob.Status.RUNNING, started_at=timezone.now())
        job = IngestJob.objects.select_related("environment__team").get(id=job_id)
        if not claimed:
            return job
        progress = _JobProgress(job.id)
        source = job.source_path
        fields = ["status", "error_report", "rows_done", "bytes_done", "num_tasks", "finished_at", "source_path",
                  "row_check"]
        try:
            if Environment.objects.filter(id=job.environment_id, deleted_at__isnull=False).exists():
                raise IngestError("The environment was deleted; no task was written.")
            with transaction.atomic():
                result = tasks_ingest(environment=job.environment, split_name=job.split_name, mode=job.mode,
                                      path=Path(source), fmt=job.format, split_type=job.split_type or None,
                                      progress=progress, check_rows=settings.ORS_TASK_CHECK_ROWS,
                                      accept_failing_rows=job.accept_failing_rows)
                job.status, job.rows_done, job.bytes_done = IngestJob.Status.SUCCEEDED, result.rows, job.bytes_total
                job.num_tasks, job.row_check = result.split.num_tasks, result.row_check
                job.finished_at, job.source_path = timezone.now(), ""
                job.save(update_fields=fields)
            return job
        except IngestError as exc:
            job.status, job.error_report = IngestJob.Status.FAILED, exc.report()
        except Exception as exc:  # the job must end as failed, never stay "running"
            logger.exception("ingest job %s failed", job.id)
            job.status = IngestJob.Status.FAILED
            job.error_report = {"detail": f"Internal error ({type(exc).__name__}); no task was written.",
                                "errors": []}
        finally:
            progress.close()
            packages.remove_quietly(source)
        job.num_tasks, job.finished_at, job.source_path = None, timezone.now(), ""
        job.save(update_fields=fields)
        return job


# --- cleanup: what a killed process leaves behind -------------------------------------------------------

ABANDONED_INGEST = ("The ingest stopped without finishing (its process ended); no task was written. "
                    "Upload the file again.")


@dataclass(frozen=True)
class CleanupReport:
    uploads_removed: int
    ingest_jobs_failed: int
    builds_failed: int
    inspect_dirs_removed: int = 0

    def more(self, limit: int) -> bool:
        """A batch came back full: more may be waiting."""
        return max(self.uploads_removed, self.ingest_jobs_failed, self.builds_failed,
                   self.inspect_dirs_removed) >= limit


def _aged_entries(root: Path, cutoff: float, prefix: str = "") -> Iterator[Path]:
    if not root.is_dir():
        return
    with os.scandir(root) as entries:
        for entry in entries:
            if not entry.name.startswith(prefix):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime <= cutoff:
                    yield Path(entry.path)
            except FileNotFoundError:
                continue  # removed meanwhile


def uploads_remove_stale(*, older_than_seconds: float, limit: int) -> int:
    """Remove staged uploads and unpacked packages (ORS_UPLOAD_DIR) and half-stored packages
    (ORS_PACKAGE_DIR/.staging-*) older than ``older_than_seconds``; a queued or running ingest
    job's file stays (its job removes it, or ingest_jobs_fail_abandoned does)."""
    cutoff = time.time() - older_than_seconds
    held = set(IngestJob.objects.filter(status__in=(IngestJob.Status.QUEUED, IngestJob.Status.RUNNING))
               .exclude(source_path="").values_list("source_path", flat=True))
    removed = 0
    for root, prefix in ((Path(settings.ORS_UPLOAD_DIR), ""), (Path(settings.ORS_PACKAGE_DIR), STAGING_PREFIX)):
        for path in _aged_entries(root, cutoff, prefix):
            if removed >= limit:
                return removed
            if str(path) in held:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
    return removed


def _inspect_dir_abandoned(path: Path, older_than_seconds: float) -> int | None:
    """An open, locked descriptor of an inspection folder whose process is gone (publishing.
    inspect_workdir), else None. One without the mark (an older release's, or one not yet
    locked by its process) counts as gone only when older than ``older_than_seconds``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live process: BlockingIOError
        if not (path / INSPECT_HELD).exists() and os.fstat(fd).st_mtime > time.time() - older_than_seconds:
            raise BlockingIOError
    except OSError:
        os.close(fd)
        return None
    return fd


# An unmarked inspection folder is never taken younger than this, whatever the settings: its process
# may be between making and locking it.
UNMARKED_MIN_AGE_SECONDS = 60.0


def inspect_dirs_remove_abandoned(*, unmarked_older_than_seconds: float, limit: int) -> int:
    """Remove the inspection folders (tempfile's folder, orsinspect-*) of publishes whose process
    was killed. Exact whatever else runs on this host: a live publish holds its folder's lock, so
    one server process may sweep at its start while others publish."""
    root = Path(tempfile.gettempdir())
    unmarked_age = max(unmarked_older_than_seconds, UNMARKED_MIN_AGE_SECONDS)
    removed = 0
    for path in _aged_entries(root, time.time(), INSPECT_PREFIX):
        if removed >= limit:
            break
        fd = _inspect_dir_abandoned(path, unmarked_age)
        if fd is None:
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)  # under the lock: no process can take it meanwhile
        finally:
            os.close(fd)
        removed += 1
    return removed


def ingest_jobs_fail_abandoned(*, started_before, limit: int) -> int:
    """Fail `running` ingest jobs whose process died, and remove their staged files. On PostgreSQL
    a job is abandoned when its liveness lock is free (exact, whatever ``started_before``); on SQLite
    (one server process) when it started before ``started_before``."""
    postgres = connection.vendor == "postgresql"
    candidates = IngestJob.objects.filter(status=IngestJob.Status.RUNNING)
    if not postgres:
        candidates = candidates.filter(started_at__lt=started_before)
    failed = 0
    for job_id in candidates.order_by("id").values_list("id", flat=True)[:limit]:
        with transaction.atomic():
            job = (IngestJob.objects.select_for_update(skip_locked=True)
                   .filter(id=job_id, status=IngestJob.Status.RUNNING).first())
            if job is None:
                continue
            if postgres:
                with connection.cursor() as cursor:
                    # Held until this transaction ends: the job cannot come back to life meanwhile.
                    cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [INGEST_LOCK_SPACE, _lock_key(job_id)])
                    if not cursor.fetchone()[0]:
                        continue  # its process is alive
            source = job.source_path
            job.status, job.finished_at, job.source_path = IngestJob.Status.FAILED, timezone.now(), ""
            job.error_report = {"detail": ABANDONED_INGEST, "errors": []}
            job.save(update_fields=["status", "finished_at", "source_path", "error_report"])
        packages.remove_quietly(source)
        cache.delete(ingest.progress_key(job_id))
        failed += 1
    return failed


def staging_cleanup(*, at_startup: bool = False) -> CleanupReport:
    """One bounded pass over what killed processes leave: staged uploads, `running` ingest jobs,
    `building` versions, inspection folders (those by their locks, at any time). ``at_startup``: before the server serves; on the embedded default (the
    filesystem broker, whose only worker `make run` starts after this pass) nothing can be in flight
    then, so everything staged and every running job or build is abandoned. With a broker, workers
    elsewhere may be busy, so start-up sweeps like the scheduled task does."""
    limit = settings.ORS_CLEANUP_BATCH
    embedded = at_startup and settings.CELERY_BROKER_URL.startswith("filesystem://")
    age = 0.0 if embedded else settings.ORS_STAGED_MAX_AGE_SECONDS
    now = timezone.now()
    jobs = ingest_jobs_fail_abandoned(started_before=now - timezone.timedelta(seconds=age), limit=limit)
    uploads = uploads_remove_stale(older_than_seconds=age, limit=limit)
    build_age = 0.0 if embedded else settings.ORS_BUILD_TIMEOUT_SECONDS + 60
    builds = versions_fail_stalled_builds(older_than_seconds=build_age, limit=limit)
    inspections = inspect_dirs_remove_abandoned(unmarked_older_than_seconds=settings.ORS_STAGED_MAX_AGE_SECONDS,
                                                limit=limit)
    return CleanupReport(uploads_removed=uploads, ingest_jobs_failed=jobs, builds_failed=builds,
                         inspect_dirs_removed=inspections)

