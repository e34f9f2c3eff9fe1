from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max

from orsplatform.catalog.models import Environment, EnvironmentVersion, Split, Task
from orsplatform.teams.models import Team
from orsplatform.teams.services import validate_slug

TASK_BATCH = 2000
IGNORED_NAMES = {"__pycache__", ".git", ".DS_Store"}


class PublishError(Exception):
    def __init__(self, message: str, *, check: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.check = check
        self.traceback = traceback


@dataclass(frozen=True)
class PublishResult:
    version: EnvironmentVersion
    created: bool


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
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def read_manifest(root: Path) -> dict:
    manifest_path = root / "manifest.toml"
    if not manifest_path.exists():
        return {}
    try:
        return tomllib.loads(manifest_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PublishError(f"manifest.toml is not valid TOML: {exc}", check="manifest") from exc


def _inspect(package_dir: Path, entrypoint: str, tasks_out: Path) -> dict:
    # A scrubbed environment: tenant code must not see the platform's settings or credentials.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tasks_out.parent), "LANG": "C.UTF-8",
           "PYTHONPATH": str(settings.BASE_DIR), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "orsplatform.runners.inspector", str(package_dir), entrypoint, str(tasks_out)],
            capture_output=True, text=True, env=env, cwd=str(package_dir),
            timeout=settings.ORS_INSPECT_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired as exc:
        raise PublishError(f"Validation timed out after {exc.timeout:.0f} s.", check="timeout") from exc
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise PublishError(f"Validation process died (exit {proc.returncode}).", check="process",
                           traceback=proc.stderr[-4000:]) from None
    if not report.get("ok"):
        raise PublishError(report.get("error", "validation failed"), check=report.get("check", ""),
                           traceback=report.get("traceback", ""))
    return report


def _read_task_lines(path: Path) -> Iterator[tuple[str, dict]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            yield row["split"], row["spec"]


def split_replace_tasks(*, environment: Environment, name: str, type: str, specs: Iterable) -> Split:
    """Replace a split's tasks atomically (callers hold a transaction), inserting in batches."""
    split, _ = Split.objects.update_or_create(environment=environment, name=name, defaults={"type": type})
    Task.objects.filter(split=split).delete()
    batch: list[Task] = []
    count = 0
    for spec in specs:
        batch.append(Task(split=split, index=count, spec=spec))
        count += 1
        if len(batch) >= TASK_BATCH:
            Task.objects.bulk_create(batch)
            batch = []
    if batch:
        Task.objects.bulk_create(batch)
    split.num_tasks = count
    split.revision += 1
    split.save(update_fields=["num_tasks", "revision"])
    return split


def environment_publish(
    *, team: Team, source_dir: Path, created_by=None, slug: str | None = None, visibility: str | None = None
) -> PublishResult:
    """Publish a package directory as a new immutable version (a no-op for identical content)."""
    source_dir = Path(source_dir).resolve()
    manifest = read_manifest(source_dir)
    slug = slug or manifest.get("name") or source_dir.name
    try:
        validate_slug(slug)
    except ValidationError as exc:
        raise PublishError(f"Invalid environment name '{slug}': {' '.join(exc.messages)}", check="manifest") from exc
    entrypoint = manifest.get("entrypoint", "env:Environment")
    visibility = visibility or manifest.get("visibility", Environment.Visibility.PRIVATE)
    if visibility not in Environment.Visibility.values:
        raise PublishError(f"Unknown visibility '{visibility}'.", check="manifest")
    content_hash = package_hash(source_dir)

    existing = EnvironmentVersion.objects.filter(
        environment__team=team, environment__slug=slug, content_hash=content_hash,
        status=EnvironmentVersion.Status.READY,
    ).first()
    if existing is not None:
        return PublishResult(version=existing, created=False)

    stored = settings.ORS_PACKAGE_DIR / content_hash
    if not stored.exists():
        settings.ORS_PACKAGE_DIR.mkdir(parents=True, exist_ok=True)
        # Copy beside the final place, then rename, so a half-copied package is never visible.
        tmp = Path(tempfile.mkdtemp(dir=settings.ORS_PACKAGE_DIR))
        shutil.copytree(source_dir, tmp / "pkg", ignore=shutil.ignore_patterns(*IGNORED_NAMES, "*.pyc"))
        (tmp / "pkg").rename(stored)
        tmp.rmdir()

    with tempfile.TemporaryDirectory() as work:
        tasks_file = Path(work) / "tasks.jsonl"
        report = _inspect(stored, entrypoint, tasks_file)
        by_split: dict[str, list] = {s["name"]: [] for s in report["splits"]}
        for split_name, spec in _read_task_lines(tasks_file):
            by_split[split_name].append(spec)

        with transaction.atomic():
            environment, _ = Environment.objects.select_for_update().get_or_create(
                team=team, slug=slug,
                defaults={"description": manifest.get("description", ""), "visibility": visibility},
            )
            number = (environment.versions.aggregate(n=Max("number"))["n"] or 0) + 1
            version = EnvironmentVersion.objects.create(
                environment=environment, number=number, content_hash=content_hash, package_path=str(stored),
                entrypoint=entrypoint, tools=report["tools"], splits=report["splits"], manifest=manifest,
                status=EnvironmentVersion.Status.READY, created_by=created_by,
            )
            for split in report["splits"]:
                split_replace_tasks(environment=environment, name=split["name"], type=split["type"],
                                    specs=by_split[split["name"]])
            environment.current_version = version
            environment.description = manifest.get("description", environment.description)
            environment.visibility = visibility
            environment.save(update_fields=["current_version", "description", "visibility"])
    return PublishResult(version=version, created=True)
