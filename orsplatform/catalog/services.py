from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.db.models import Max, Sum
from django.utils import timezone

from orsplatform import bounded_json
from orsplatform.catalog import data, ingest, packages, protection, pyenvs, row_check
from orsplatform.catalog import requirements as package_requirements
from orsplatform.catalog.errors import one_line, tenant_output
from orsplatform.catalog.ingest import IngestError, RowsFailed, TaskQuotaExceeded, UploadTooLarge
from orsplatform.catalog.models import Environment, EnvironmentVersion, IngestJob, Split, Task
from orsplatform.celery import task
from orsplatform.episodes.models import Session
from orsplatform.executors.inspection import Results, run_child
from orsplatform.teams.models import ApiKey, Team
from orsplatform.teams.services import validate_slug
from orsplatform.verify import config as verify_config
from orsplatform.verify.services import verification_plan

TASK_BATCH = 2000
# _store_package copies a package beside its final place under this prefix, then renames it; what a
# killed process left so is removed by uploads_remove_stale.
STAGING_PREFIX = ".staging-"
IGNORED_NAMES = {"__pycache__", ".git", ".DS_Store"}
MAX_OPENENV_BYTES = 1024 * 1024  # an OpenEnv declaration (its JSON schemas) kept with the version


class PublishError(Exception):
    """``traceback`` holds the package's own frames only (catalog/errors.py): it is shown to the
    environment's author, never the platform's paths."""

    def __init__(self, message: str, *, check: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.check = check
        self.traceback = traceback

    def summary(self) -> str:
        """What failed, in one line, with the check's name."""
        return f"the '{self.check or 'package'}' check failed: {one_line(str(self))}"


@dataclass(frozen=True)
class PublishResult:
    version: EnvironmentVersion
    created: bool
    # What validation found (tools, splits, task counts, whether a prompt was rendered).
    report: dict = field(default_factory=dict)


def _package_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        if any(part in IGNORED_NAMES for part in path.relative_to(root).parts) or path.suffix == ".pyc":
            continue
        if path.is_file():
            files.append(path)
    return files


def package_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in _package_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as fh:  # streamed: a package may carry large task files
            digest.update(hashlib.file_digest(fh, "sha256").digest())
    return digest.hexdigest()


def read_manifest(root: Path) -> dict:
    manifest_path = root / "manifest.toml"
    if not manifest_path.exists():
        return {}
    try:
        return tomllib.loads(manifest_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PublishError(f"manifest.toml is not valid TOML: {exc}", check="manifest") from exc


logger = logging.getLogger(__name__)

# tasks/<split>.<ext> inside a package.
TASK_FILE_FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}
MANIFEST_LIST_FIELDS = ("required_secrets", "requirements", "hidden_task_fields", "sealed_splits")
MAX_TOOL_TIMEOUT_SECONDS = 24 * 3600
# Catalog cards show the tags; the environment page the licence and the compute table.
MAX_TAGS, MAX_TAG_CHARS = 20, 40
MAX_LICENSE_CHARS = 100
MAX_COMPUTE_FIELDS, MAX_COMPUTE_CHARS = 20, 200
MAX_MESSAGE_CHARS = 2000  # a version's message (console, CLI --message, REST message)
ENTRYPOINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def manifest_validate(manifest: dict) -> dict:
    """Checks the manifest's known fields; unknown fields are kept for forward compatibility."""
    def fail(message: str) -> PublishError:
        return PublishError(f"manifest.toml: {message}", check="manifest")

    for key in ("name", "description", "entrypoint", "visibility"):
        if key in manifest and not isinstance(manifest[key], str):
            raise fail(f"'{key}' must be a string.")
    entrypoint = manifest.get("entrypoint")
    if entrypoint is not None and not ENTRYPOINT.fullmatch(entrypoint):
        raise fail(f"entrypoint {entrypoint!r} must look like 'module:Class'.")
    if "visibility" in manifest and manifest["visibility"] not in Environment.Visibility.values:
        raise fail(f"unknown visibility {manifest['visibility']!r} (public or private).")
    timeout = manifest.get("tool_timeout_seconds")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout <= MAX_TOOL_TIMEOUT_SECONDS):
        raise fail(f"tool_timeout_seconds must be a number of seconds in (0, {MAX_TOOL_TIMEOUT_SECONDS}].")
    reward_range = manifest.get("reward_range")
    if reward_range is not None and not (
            isinstance(reward_range, list) and len(reward_range) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in reward_range)
            and reward_range[0] <= reward_range[1]):
        # Declared so the anomaly flags can tell a reward no task should give (orsplatform/flags).
        raise fail("reward_range must be [lowest, highest], two numbers with lowest <= highest.")
    for key in MANIFEST_LIST_FIELDS:
        value = manifest.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise fail(f"'{key}' must be a list of strings.")
    _card_fields_validate(manifest, fail)
    return manifest


def _card_fields_validate(manifest: dict, fail) -> None:
    """``tags`` (catalog cards), ``license`` (or ``licence``) and a ``[compute]`` table (the
    environment page): shown to every viewer, so bounded here."""
    tags = manifest.get("tags", [])
    if (not isinstance(tags, list) or len(tags) > MAX_TAGS
            or not all(isinstance(t, str) and t.strip() and len(t) <= MAX_TAG_CHARS for t in tags)):
        raise fail(f"'tags' must be a list of at most {MAX_TAGS} strings of at most {MAX_TAG_CHARS} characters.")
    if "licence" in manifest and "license" in manifest:
        raise fail("give 'license' or 'licence', not both.")
    licence = manifest.get("license", manifest.get("licence"))
    if licence is not None and not (isinstance(licence, str) and 0 < len(licence.strip()) <= MAX_LICENSE_CHARS):
        raise fail(f"'license' must be a string of at most {MAX_LICENSE_CHARS} characters (an SPDX id such as MIT).")
    compute = manifest.get("compute")
    if compute is None:
        return
    if isinstance(compute, str):
        compute = {"notes": compute}
    if (not isinstance(compute, dict) or len(compute) > MAX_COMPUTE_FIELDS
            or not all(isinstance(v, (str, int, float, bool)) and len(str(k)) <= 60
                       and len(str(v)) <= MAX_COMPUTE_CHARS for k, v in compute.items())):
        raise fail(f"'compute' must be a table of at most {MAX_COMPUTE_FIELDS} plain values "
                   "(such as cpus = 2, memory = \"4 GiB\", gpu = false), or a string.")


def manifest_tags(manifest: dict) -> list[str]:
    """The manifest's tags as stored on the version: stripped, without repeats, in their order."""
    seen: dict[str, None] = {}
    for tag in manifest.get("tags", []):
        seen.setdefault(tag.strip(), None)
    return list(seen)


def publisher_label(*, user=None, key=None) -> str:
    """Who published, as the versions list shows it: the user, or the API key and the user who
    made it ("key ci-bot (alice)"). Stored with the version, so it outlives the key and the user."""
    if key is not None:
        maker = getattr(key.created_by, "username", "") if key.created_by_id else ""
        return f"key {key.name} ({maker})"[:200] if maker else f"key {key.name}"[:200]
    return getattr(user, "username", "") or ""


def _inspect(package_dir: Path, entrypoint: str, work: Path, sample: dict | None = None,
             runtime: str | None = None) -> dict:
    """The inspector's report on ``package_dir`` (sandbox/inspector.py, run as a contained child by
    executors/inspection.py: the workers' sandbox, a wall-clock limit, memory and file-size rlimits,
    its whole process group killed at the end), or PublishError. The child sees neither ``work``
    nor any other host folder it could write: its results come back over its pipe, and the tasks
    its class lists are written by the platform to ``work/tasks/<n>.jsonl``."""
    timeout = settings.ORS_INSPECT_TIMEOUT_SECONDS
    results = Results(max_bytes=settings.ORS_INSPECT_RESULT_BYTES, tasks_dir=work / "tasks")
    run = run_child(module="inspector", package_dir=package_dir, args=[entrypoint], timeout=timeout,
                    feed=json.dumps({"sample": sample}).encode(), results=results, runtime=runtime)
    report = results.report() or {}
    stage = str(report.get("check", "start"))[:40]
    if run.refused:
        raise PublishError(f"Validation stopped during the '{stage}' check: the validation process {run.refused}.",
                           check="output", traceback=tenant_output(run.output, package_dir))
    if not run.exited:
        raise PublishError(f"Validation timed out after {timeout:g} s during the '{stage}' check; "
                           "the validation process and its children were killed.", check="timeout",
                           traceback=tenant_output(run.output, package_dir))
    if report.get("ok") is True:
        return _report_checked(report, results)
    if "error" in report:
        raise PublishError(str(report["error"])[:4000], check=stage, traceback=str(report.get("traceback", ""))[-20000:])
    raise PublishError(f"The validation process ended ({run.how()}) during the '{stage}' check without a report.",
                       check="process", traceback=tenant_output(run.output, package_dir))


def _report_checked(report: dict, results: Results) -> dict:
    """The report as the rest of publishing uses it, or PublishError: tenant code runs in the
    process that writes it and could have written anything. Task counts are the platform's own
    (the lines it wrote), for the splits whose class lists tasks."""
    def bad(what: str) -> PublishError:
        return PublishError(f"The validation process handed back a malformed report ({what}).", check="report")

    entrypoint, tools, splits = report.get("entrypoint"), report.get("tools"), report.get("splits")
    if not isinstance(entrypoint, str) or not ENTRYPOINT.fullmatch(entrypoint) or len(entrypoint) > 200:
        raise bad("entrypoint")
    if not isinstance(tools, list) or not tools or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                          for t in tools):
        raise bad("tools")
    if not isinstance(splits, list) or not splits or not all(isinstance(s, dict) for s in splits):
        raise bad("splits")
    for split in splits:
        if split.get("type") not in Split.Type.values or not isinstance(split.get("name"), str):
            raise bad("splits")
        try:
            ingest.validate_split_name(split["name"])
        except IngestError as exc:
            raise PublishError(f"list_splits(): {exc}", check="splits") from exc
    names = [s["name"] for s in splits]
    if len(set(names)) != len(names):
        raise bad("splits")
    openenv = report.get("openenv")
    if openenv is not None and not (isinstance(openenv, dict) and openenv.get("kind") in ("mcp", "step")
                                    and isinstance(openenv.get("schema"), dict)
                                    and isinstance(openenv.get("env_name"), str)
                                    and len(json.dumps(openenv)) <= MAX_OPENENV_BYTES):
        raise bad("openenv")
    claimed = report.get("task_counts")
    claimed = claimed if isinstance(claimed, dict) else {}
    report["task_counts"] = {name: None if claimed.get(name) is None else results.counts.get(position, 0)
                             for position, name in enumerate(names)}
    return report


def package_task_files(root: Path) -> dict[str, tuple[Path, str]]:
    """``tasks/<split>.jsonl|csv|parquet`` of a package, by split name."""
    found: dict[str, tuple[Path, str]] = {}
    folder = root / "tasks"
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        # Not path.suffix: for "tasks/.jsonl" (a file missing its split name) that is empty.
        suffix = next((s for s in TASK_FILE_FORMATS if path.name.lower().endswith(s)), None)
        if suffix is None or not path.is_file():
            continue
        fmt, name = TASK_FILE_FORMATS[suffix], path.name[: -len(suffix)]
        try:
            ingest.validate_split_name(name)
        except IngestError as exc:
            raise PublishError(f"tasks/{path.name}: {exc}", check="tasks") from exc
        if name in found:
            raise PublishError(f"Two task files for split '{name}' ({found[name][0].name}, {path.name}).",
                               check="tasks")
        found[name] = (path, fmt)
    return found


def _first_task(path: Path, fmt: str) -> dict | None:
    errors = ingest.Errors()
    try:
        ingest.sniff(path, fmt)
        for _, text in ingest.READERS[fmt](path, errors, [0]):
            return bounded_json.loads(text)
    except (IngestError, bounded_json.JsonRefused):
        return None  # reported properly when the file is ingested
    return None


def _store_package(source: Path, content_hash: str, data_hash: str | None = None) -> Path:
    stored = settings.ORS_PACKAGE_DIR / content_hash
    data.record(stored, data_hash)  # the content hash covers the data too: the same for every version
    if not stored.exists():
        settings.ORS_PACKAGE_DIR.mkdir(parents=True, exist_ok=True)
        # Copy beside the final place, then rename, so a half-copied package is never visible.
        tmp = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=settings.ORS_PACKAGE_DIR))
        shutil.copytree(source, tmp / "pkg", ignore=shutil.ignore_patterns(*IGNORED_NAMES, "*.pyc"))
        try:
            (tmp / "pkg").rename(stored)
        except OSError:
            if not stored.exists():  # not a concurrent publish of the same content: a real failure
                raise
        shutil.rmtree(tmp, ignore_errors=True)
    return stored


def _ingest_into(environment: Environment, name: str, type: str, path: Path, fmt: str, where: str) -> None:
    try:
        tasks_ingest(environment=environment, split_name=name, split_type=type, mode=IngestJob.Mode.REPLACE,
                     path=path, fmt=fmt, allow_empty=True)
    except TaskQuotaExceeded as exc:
        raise PublishError(f"{where}: {exc}", check="quota") from exc
    except IngestError as exc:
        lines = "\n".join(f"line {e['line']}: {e['error']}" if e["line"] else e["error"] for e in exc.errors)
        raise PublishError(f"{where}: {exc}", check="tasks", traceback=lines) from exc


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
    try:
        requirements = package_requirements.collect(source_dir, manifest)
    except package_requirements.RequirementsError as exc:
        raise PublishError(str(exc), check="requirements") from exc
    notes = package_requirements.notes(source_dir)
    if requirements:
        return _version_queue_build(team=team, slug=slug, manifest=manifest, visibility=visibility,
                                    content_hash=content_hash, source_dir=source_dir, requirements=requirements,
                                    notes=notes, author=author, wait=wait, data_hash=data_hash)

    with tempfile.TemporaryDirectory(prefix="orsinspect-") as tmp:
        work = Path(tmp)
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


def _inspect_copy(package_dir: Path, manifest: dict, task_files: dict, work: Path,
                  runtime: str | None = None, data_hash: str | None = None) -> dict:
    """Inspect a throwaway copy of the package (what tenant code does while being inspected never
    reaches the stored package); task files must name declared splits."""
    shutil.copytree(package_dir, work / "pkg", ignore=shutil.ignore_patterns(*IGNORED_NAMES, "*.pyc"))
    data.record(work / "pkg", data_hash)  # /orwd_data while inspected too
    sample = next((t for t in (_first_task(p, f) for p, f in task_files.values()) if t is not None), None)
    report = _inspect(work / "pkg", manifest.get("entrypoint", ""), work, sample, runtime=runtime)
    declared = {s["name"] for s in report["splits"]}
    undeclared = sorted(set(task_files) - declared)
    if undeclared:
        raise PublishError(f"Task files for splits that list_splits() does not declare: {', '.join(undeclared)}.",
                           check="tasks")
    return report


def _environment_locked(*, team: Team, slug: str, manifest: dict, visibility: str | None) -> Environment:
    environment, _ = Environment.objects.select_for_update().get_or_create(
        team=team, slug=slug,
        defaults={"description": manifest.get("description", ""),
                  "visibility": visibility or Environment.Visibility.PRIVATE},
    )
    return environment


def _version_row(*, environment: Environment, reuse: EnvironmentVersion | None, content_hash: str, stored: Path,
                 manifest: dict, author: dict, requirements: list[str], notes: list[str],
                 status: str, data_hash: str | None = None) -> EnvironmentVersion:
    """A new numbered version, or the failed attempt at the same content taken up again (its number
    kept: the content hash is unique per environment). ``author``: created_by, created_by_key,
    published_by and message (environment_publish)."""
    fields = {"package_path": str(stored), "manifest": manifest, "requirements": requirements, "notes": notes,
              "status": status, "error": "", "data_hash": data_hash or "", "tags": manifest_tags(manifest),
              **author}
    if reuse is not None:
        for name, value in fields.items():
            setattr(reuse, name, value)
        reuse.save()
        return reuse
    number = (environment.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    return EnvironmentVersion.objects.create(environment=environment, number=number, content_hash=content_hash,
                                             entrypoint="", **fields)


def _version_fill(*, environment: Environment, version: EnvironmentVersion, report: dict, work: Path,
                  task_files: dict, manifest: dict, visibility: str | None) -> None:
    """Write what inspection found (tools, splits, tasks) and make the version current, unless a
    newer version became current meanwhile. Callers hold a transaction and the environment's lock."""
    version.entrypoint, version.tools, version.splits = report["entrypoint"], report["tools"], report["splits"]
    version.openenv = report.get("openenv") or {}
    version.status = EnvironmentVersion.Status.READY
    version.save(update_fields=["entrypoint", "tools", "splits", "openenv", "status", "pyenv"])
    for position, split in enumerate(report["splits"]):
        name, type_ = split["name"], split["type"]
        # A split's tasks are replaced only by tasks the package brings (a task file wins over
        # the class's list); otherwise the tasks uploaded earlier stay.
        if name in task_files:
            path, fmt = task_files[name]
            _ingest_into(environment, name, type_, path, fmt, f"tasks/{path.name}")
        elif report["task_counts"].get(name):
            _ingest_into(environment, name, type_, work / "tasks" / f"{position}.jsonl", "jsonl",
                         f"tasks listed by the class for split '{name}'")
        else:
            Split.objects.update_or_create(environment=environment, name=name, defaults={"type": type_})
    try:
        protection.manifest_protection_apply(environment=environment, manifest=manifest,
                                             split_names=[s["name"] for s in report["splits"]])
    except protection.ProtectionError as exc:
        raise PublishError(f"manifest.toml: {exc}", check="manifest") from exc
    current = environment.current_version
    # A version that must pass its verification first (a threshold, reference solutions) is
    # published but made current by the replay, or by its author's confirmation.
    held = verification_plan(environment=environment, version=version, manifest=manifest, baseline=current)
    if not held and (current is None or current.number < version.number):
        environment.current_version = version
    environment.description = manifest.get("description", environment.description)
    update = ["current_version", "description"]
    if visibility is not None:
        environment.visibility = visibility
        update.append("visibility")
    environment.save(update_fields=update)


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
        built = pyenvs.ensure(version.requirements, log)
        task_files = package_task_files(stored)
        with tempfile.TemporaryDirectory(prefix="orsinspect-") as tmp:
            work = Path(tmp)
            log.write("[platform] inspecting the package in its environment")
            report = _inspect_copy(stored, version.manifest, task_files, work, runtime=str(built.path),
                                   data_hash=version.data_hash or None)
            pyenvs.record_runtime(version.package_path, built.path)
            with transaction.atomic():
                # No select_related: PostgreSQL cannot lock the nullable side of an outer join.
                environment = Environment.objects.select_for_update().get(id=version.environment_id)
                if environment.deleted_at is not None:
                    raise PublishError(DELETED_ERROR, check="deleted")
                version.refresh_from_db(fields=["status"])
                if version.status != EnvironmentVersion.Status.BUILDING:
                    raise PublishError(DELETED_ERROR, check="deleted")
                version.pyenv = built.path.name
                _version_fill(environment=environment, version=version, report=report, work=work,
                              task_files=task_files, manifest=version.manifest,
                              visibility=version.manifest.get("visibility"))
                # Before the commit: whoever sees the version ready sees this line too.
                log.write(f"[platform] ready: {environment.full_name}@{version.number}")
        return version
    except pyenvs.BuildFailed as exc:
        return _version_fail(version, "requirements", f"Installing the requirements failed: {exc}", log)
    except PublishError as exc:
        return _version_fail(version, exc.check or "inspect", str(exc), log, traceback=exc.traceback)
    except Exception as exc:  # the version must end as failed, never stay "building"
        logger.exception("building version %s failed", version.id)
        return _version_fail(version, "internal", f"Internal error ({type(exc).__name__}); nothing was published.",
                             log)


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


DELETED_ERROR = "The environment was deleted while this version was being built; nothing was published."


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


@dataclass(frozen=True)
class IngestResult:
    split: Split
    rows: int
    # The row check's report ({} when it did not run): sampled rows and the failures accepted.
    row_check: dict = field(default_factory=dict)


def _infer_split_type(name: str) -> str:
    return name if name in Split.Type.values else Split.Type.VALIDATION


def _tasks_quota(*, environment: Environment, split_name: str, held: int, mode: str) -> ingest.Quota:
    """Room left under both task quotas for an ingest into a split now holding ``held`` tasks (a
    replace frees them first). The per-split figure is exact (callers lock the split); the team's is
    read from committed rows, so ingests running at once in one team may pass it by one file."""
    per_split, per_team = settings.ORS_MAX_TASKS_PER_SPLIT, settings.ORS_MAX_TASKS_PER_TEAM
    start = held if mode == IngestJob.Mode.APPEND else 0
    team_total = (Split.objects.filter(environment__team_id=environment.team_id)
                  .aggregate(n=Sum("num_tasks"))["n"] or 0)
    in_team = team_total - held + start
    split_room, team_room = per_split - start, per_team - in_team
    if split_room <= team_room:
        kept = f" and keeps its {start}" if start else ""
        return ingest.Quota(room=split_room, message=(
            f"Too many tasks: a split holds at most {per_split}; split '{split_name}'{kept} would pass it "
            "with this file. Nothing was written."))
    return ingest.Quota(room=team_room, message=(
        f"Too many tasks: a team holds at most {per_team} in all its splits, and this team holds {in_team} "
        "besides this file. Nothing was written."))


def _check_declared_rows(path: Path, fmt: str, quota: ingest.Quota) -> None:
    declared = ingest.declared_rows(path, fmt)
    if declared is not None and declared > quota.room:
        raise TaskQuotaExceeded(f"{quota.message} (The file declares {declared} rows.)")


def tasks_ingest(
    *, environment: Environment, split_name: str, mode: str, path: Path, fmt: str,
    split_type: str | None = None, progress: ingest.Progress | None = None, allow_empty: bool = False,
    check_rows: int = 0, accept_failing_rows: bool = False,
) -> IngestResult:
    """Stream a task file into a split, all or nothing: ``replace`` swaps the split's tasks, ``append``
    adds after the last one. The whole ingest is one transaction, so readers see the old tasks until
    it commits, and a bad row (reported with its line) leaves the split exactly as it was.

    ``check_rows``: that many rows (the first, the others at random) are run through the served
    version's setup() and get_prompt() before the commit (catalog/row_check.py); rows that fail
    refuse the file (RowsFailed) unless ``accept_failing_rows``, which keeps them as warnings."""
    ingest.validate_split_name(split_name)
    if mode not in IngestJob.Mode.values:
        raise IngestError(f"Unknown mode {mode!r}: use append or replace.")
    if split_type and split_type not in Split.Type.values:
        raise IngestError(f"Unknown split type {split_type!r}: use train, validation or test.")
    if fmt not in ingest.FORMATS:
        raise IngestError(f"Unknown task file format {fmt!r}.")
    ingest.sniff(path, fmt)
    with transaction.atomic():
        split, _ = Split.objects.select_for_update().get_or_create(
            environment=environment, name=split_name,
            defaults={"type": split_type or _infer_split_type(split_name)},
        )
        quota = _tasks_quota(environment=environment, split_name=split_name, held=split.num_tasks, mode=mode)
        _check_declared_rows(path, fmt, quota)
        if mode == IngestJob.Mode.REPLACE:
            Task.objects.filter(split=split).delete()
            start = 0
        else:
            start = split.num_tasks
        sampler = row_check.Sampler(size=check_rows)
        with ingest.TaskWriter(split.id, start) as writer:
            rows = ingest.stream_into(path=path, fmt=fmt, writer=writer, progress=progress, quota=quota,
                                      sample=sampler if check_rows > 0 else None)
        if rows == 0 and not allow_empty:
            raise IngestError("The file holds no tasks.")
        checked = {}
        if check_rows > 0:
            # Task indexes as the rows will have them; the split's protection as it stands.
            sampled = [(start + position, line, text) for position, line, text in sampler.rows()]
            outcome = row_check.rows_check(version=environment.current_version, split=split, rows=sampled)
            if outcome.failures and not accept_failing_rows:
                raise RowsFailed(
                    f"{len(outcome.failures)} of the {outcome.sampled} rows run through the environment failed "
                    f"(setup() and get_prompt(), as a session starts); no task was written. Fix the rows or "
                    f"the code, or upload again accepting failing rows.",
                    outcome.failures, sampled=outcome.sampled)
            checked = outcome.as_report()
        split.num_tasks = start + rows
        split.revision += 1
        if split_type:
            split.type = split_type
        split.save(update_fields=["num_tasks", "revision", "type"])
        if split.hidden_fields or mode == IngestJob.Mode.REPLACE:
            protection.split_digests_refresh(split=split, start=start)
    return IngestResult(split=split, rows=rows, row_check=checked)


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

    def more(self, limit: int) -> bool:
        """A batch came back full: more may be waiting."""
        return max(self.uploads_removed, self.ingest_jobs_failed, self.builds_failed) >= limit


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
    `building` versions. ``at_startup``: before the server serves; on the embedded default (the
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
    return CleanupReport(uploads_removed=uploads, ingest_jobs_failed=jobs, builds_failed=builds)
