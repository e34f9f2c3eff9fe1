"""Publishing a package: its manifest, its inspection in the sandbox, and the version row it becomes
(split out of services.py, which keeps the public entry points and re-exports these names)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db.models import Max

from orsplatform import bounded_json
from orsplatform.catalog import data, ingest, protection
from orsplatform.catalog.errors import one_line, tenant_output
from orsplatform.catalog.ingest import IngestError, TaskQuotaExceeded
from orsplatform.catalog.models import Environment, EnvironmentVersion, IngestJob, Split
from orsplatform.catalog.task_ingest import tasks_ingest
from orsplatform.executors.inspection import Results, run_child
from orsplatform.teams.models import Team
from orsplatform.verify.services import verification_plan

# _store_package copies a package beside its final place under this prefix, then renames it; what a
# killed process left so is removed by uploads_remove_stale.
STAGING_PREFIX = ".staging-"
IGNORED_NAMES = {"__pycache__", ".git", ".DS_Store"}
MAX_OPENENV_BYTES = 1024 * 1024  # an OpenEnv declaration (its JSON schemas) kept with the version
# Inspection's throwaway folders, in tempfile's folder. Each is held (flock) by its process while in
# use and marked once held, so that a sweep run by another server process (at its start, or the
# scheduled one: services.inspect_dirs_remove_abandoned) takes only those whose process is gone.
INSPECT_PREFIX = "orsinspect-"
INSPECT_HELD = ".held"


DELETED_ERROR = "The environment was deleted while this version was being built; nothing was published."


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
    if "runtime" in manifest and manifest["runtime"] not in ("python", "container"):
        raise fail(f"unknown runtime {manifest['runtime']!r} (python, or container for a package with a Dockerfile).")
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



@contextlib.contextmanager
def inspect_workdir() -> Iterator[Path]:
    """A throwaway folder for one inspection, removed after (or by the sweep, if this process is
    killed). The lock goes with this process whatever way it ends; the mark is made only once the
    lock is held, so the sweep never takes a folder between its making and its locking."""
    tmp = tempfile.mkdtemp(prefix=INSPECT_PREFIX)
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)  # not inherited: no child keeps the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        Path(tmp, INSPECT_HELD).touch()
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # before the lock goes: a sweep never races this
        os.close(fd)


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


