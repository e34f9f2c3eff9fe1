"""Catalog reads. Everything that resolves an environment takes the caller, so a private
environment of another team is indistinguishable from a missing one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q

from orsplatform.catalog.models import Environment, EnvironmentVersion, Split, Task
from orsplatform.episodes.models import Session
from orsplatform.teams.auth import Caller
from orsplatform.teams.models import ApiKey


@dataclass(frozen=True)
class SplitInfo:
    id: int
    name: str
    type: str
    num_tasks: int
    revision: int
    # docs/hidden-tasks.md: the fields clients never get, and whether specs are sealed.
    hidden: frozenset[str] = frozenset()
    sealed: bool = False


@dataclass(frozen=True)
class EnvHandle:
    """What the ORS hot path needs to know about one environment version (immutable)."""

    environment_id: int
    team_id: int
    team_slug: str
    slug: str
    visibility: str
    version_id: int
    version_number: int
    package_path: str
    entrypoint: str
    tools: list
    tool_timeout: float
    splits: dict[str, SplitInfo]
    split_order: tuple[str, ...]
    # The secret names its manifest declares: all another team's caller may send it.
    required_secrets: frozenset[str] = frozenset()
    # An OpenEnv-SDK environment's declaration (EnvironmentVersion.openenv); empty for the others.
    openenv: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def full_name(self) -> str:
        return f"{self.team_slug}/{self.slug}"

    @property
    def hides(self) -> bool:
        """Whether any split hides fields (then a task object sent to /create must match a task)."""
        return any(s.hidden for s in self.splits.values())


def parse_env_ref(ref: str) -> tuple[str | None, str, int | None] | None:
    """``team/slug[@N]`` or ``slug[@N]`` → (team, slug, version); None when malformed."""
    version: int | None = None
    if "@" in ref:
        ref, _, number = ref.rpartition("@")
        if not number.isdigit() or len(number) > 9:
            return None
        version = int(number)
    parts = ref.split("/")
    if len(parts) == 1 and parts[0]:
        return None, parts[0], version
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1], version
    return None


def _visible(caller: Caller) -> Q:
    visible = Q(visibility=Environment.Visibility.PUBLIC)
    if caller.team_id is not None:
        visible |= Q(team_id=caller.team_id)
    # A deleted environment keeps its row for the audit log (services.environment_delete) and is
    # resolved by no one: every face and the catalog read through here.
    return visible & Q(deleted_at__isnull=True)


def environments_visible(*, caller: Caller) -> list[Environment]:
    return list(
        Environment.objects.select_related("team").filter(_visible(caller), current_version__isnull=False)
        .order_by("team__slug", "slug")
    )


def environment_names_visible(*, caller: Caller, limit: int = 10_000) -> list[str]:
    """`team/slug` of the environments the caller may use (a bound key: its own only), for the
    "did you mean" of an unknown name; never a name the caller could not list itself."""
    envs = Environment.objects.filter(_visible(caller), current_version__isnull=False)
    if caller.environment_id is not None:
        envs = envs.filter(id=caller.environment_id)
    return [f"{team}/{slug}" for team, slug in envs.order_by("team__slug", "slug")
            .values_list("team__slug", "slug")[:limit]]


def _handle(environment: Environment, version: EnvironmentVersion) -> EnvHandle:
    infos = {s.name: SplitInfo(s.id, s.name, s.type, s.num_tasks, s.revision, frozenset(s.hidden_fields or ()),
                               s.sealed)
             for s in Split.objects.filter(environment=environment).order_by("id")}
    declared = [s["name"] for s in version.splits if s["name"] in infos]
    order = tuple(declared) + tuple(n for n in infos if n not in declared)
    timeout = version.manifest.get("tool_timeout_seconds") or settings.ORS_DEFAULT_TOOL_TIMEOUT_SECONDS
    return EnvHandle(
        environment_id=environment.id, team_id=environment.team_id, team_slug=environment.team.slug,
        slug=environment.slug, visibility=environment.visibility, version_id=version.id,
        version_number=version.number, package_path=version.package_path, entrypoint=version.entrypoint,
        tools=version.tools, tool_timeout=float(timeout), splits=infos, split_order=order,
        required_secrets=frozenset(n for n in version.manifest.get("required_secrets") or () if isinstance(n, str)),
        openenv=version.openenv or {},
    )


def environment_resolve(*, caller: Caller, ref: str) -> EnvHandle | None:
    parsed = parse_env_ref(ref)
    if parsed is None:
        return None
    team_slug, slug, number = parsed
    candidates = Environment.objects.select_related("team", "current_version").filter(_visible(caller), slug=slug)
    if team_slug is not None:
        environment = candidates.filter(team__slug=team_slug).first()
    else:
        # A bare slug means the caller's own environment first, then an unambiguous public one.
        environment = candidates.filter(team_id=caller.team_id).first() if caller.team_id is not None else None
        if environment is None:
            public = list(candidates.filter(visibility=Environment.Visibility.PUBLIC)[:2])
            environment = public[0] if len(public) == 1 else None
    if environment is None:
        return None
    version = environment.current_version if number is None else environment.versions.filter(number=number).first()
    if version is None or version.status != EnvironmentVersion.Status.READY:
        return None
    return _handle(environment, version)


def environment_resolve_id(*, caller: Caller, environment_id: int) -> EnvHandle | None:
    environment = (Environment.objects.select_related("team", "current_version")
                   .filter(_visible(caller), id=environment_id).first())
    if environment is None or environment.current_version is None:
        return None
    return _handle(environment, environment.current_version)


def version_handle(*, version_id: int) -> EnvHandle | None:
    """A session's own version, for sessions the caller already owns (checked by the caller)."""
    version = EnvironmentVersion.objects.select_related("environment__team").filter(id=version_id).first()
    return None if version is None else _handle(version.environment, version)


# The same read in SQL, for the hot path's async connection (orsplatform/ors/pg_writer.py).
TASK_SPEC_BLOCK_SQL = "SELECT index, spec FROM catalog_task WHERE split_id = %s AND index >= %s AND index < %s"


def task_spec_block(*, split_id: int, start: int, stop: int) -> list[tuple[int, Any]]:
    """(index, spec) of the tasks in [start, stop): the gateway reads tasks a block at a time."""
    return list(Task.objects.filter(split_id=split_id, index__gte=start, index__lt=stop)
                .values_list("index", "spec"))


def task_digest_match(*, pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(split_id, digest, index) of the tasks whose redacted digest is one of `pairs` (split_id,
    digest): one lookup on the (split, digest) index, lowest index first."""
    from orsplatform.catalog.models import TaskDigest

    match = Q()
    for split_id, value in pairs:
        match |= Q(split_id=split_id, digest=value)
    return list(TaskDigest.objects.filter(match).order_by("index").values_list("split_id", "digest", "index")[:50])


def task_specs_range(*, split_id: int, start: int, stop: int) -> list:
    return list(Task.objects.filter(split_id=split_id, index__gte=start, index__lt=stop)
                .order_by("index").values_list("spec", flat=True))


def environment_get_visible(*, caller: Caller, team_slug: str, slug: str) -> Environment | None:
    # Another team sees an environment only once a version of it is served (a failed first build
    # is its own team's business, whatever visibility it asked for).
    served = Q(current_version__isnull=False)
    if caller.team_id is not None:
        served |= Q(team_id=caller.team_id)
    return (Environment.objects.select_related("team", "current_version")
            .filter(_visible(caller), served, team__slug=team_slug, slug=slug).first())


# --- publishing: reads for the REST API and the console ----------------------------------------------

def environment_of_team(*, team_id: int, slug: str) -> Environment | None:
    """The caller's own environment (for writes): another team's is indistinguishable from none."""
    return (Environment.objects.select_related("team", "current_version")
            .filter(team_id=team_id, slug=slug, deleted_at__isnull=True).first())


def environments_of_team_page(*, team, page: int | str, per_page: int = 20):
    """One page of the team's environments; versions and splits are fetched for that page only."""
    from django.core.paginator import Paginator

    qs = (Environment.objects.filter(team=team, deleted_at__isnull=True).select_related("team", "current_version")
          .prefetch_related("versions", "task_splits").order_by("slug"))
    return Paginator(qs, per_page).get_page(page)


def rollback_undo(*, team_id: int, ref: str) -> dict | None:
    """The undo a page offers after a rollback: ``ref`` is "<slug>@<number>" (the version served
    before it), of the caller's own team, still ready and no longer current; else None (an undo
    already done, or a link that was edited, offers nothing)."""
    slug, at, raw = ref.partition("@")
    if not at or not raw.isdigit() or len(raw) > 9:
        return None
    version = (EnvironmentVersion.objects.select_related("environment__team", "environment__current_version")
               .filter(environment__team_id=team_id, environment__slug=slug, number=int(raw),
                       status=EnvironmentVersion.Status.READY).first())
    if version is None or version.environment.current_version_id == version.id:
        return None
    return {"environment": version.environment, "number": version.number,
            "current": getattr(version.environment.current_version, "number", None)}
@dataclass(frozen=True)
class DeletePreview:
    """What deleting an environment touches, for its confirmation page."""

    sessions: int
    open_sessions: int
    splits: int
    tasks: int
    bound_keys: int


def environment_delete_preview(*, environment: Environment) -> DeletePreview:
    sessions = Session.objects.filter(environment=environment)
    splits = Split.objects.filter(environment=environment)
    return DeletePreview(
        sessions=sessions.count(),
        open_sessions=sessions.filter(ended_at__isnull=True,
                                      status__in=(Session.Status.CREATING, Session.Status.READY)).count(),
        splits=splits.count(), tasks=sum(splits.values_list("num_tasks", flat=True)),
        bound_keys=ApiKey.objects.filter(environment=environment, revoked_at__isnull=True).count(),
    )


def versions_of(*, environment: Environment) -> list[EnvironmentVersion]:
    return list(environment.versions.select_related("created_by").order_by("-number"))


def version_of(*, environment: Environment, number: int) -> EnvironmentVersion | None:
    return environment.versions.filter(number=number).first()


def version_build_log(*, version: EnvironmentVersion, lines: int = 40) -> str:
    """The tail of a version's build (the installer's output; empty for a version without
    requirements). Kept after the build so a ready version still shows what was installed."""
    from orsplatform.catalog.pyenvs import log_tail

    return log_tail(version.id, lines) if version.requirements else ""


def splits_of(*, environment: Environment) -> list[Split]:
    return list(Split.objects.filter(environment=environment).order_by("id"))


def split_of(*, environment: Environment, name: str) -> Split | None:
    return Split.objects.filter(environment=environment, name=name).first()


def tasks_page(*, split: Split, offset: int, limit: int) -> list[dict]:
    return [{"index": index, "spec": spec} for index, spec in
            Task.objects.filter(split=split, index__gte=offset, index__lt=offset + limit)
            .order_by("index").values_list("index", "spec")]


def ingest_job_of_team(*, team_id: int, job_id: int):
    """An ingest job of the team, with live progress while it runs (see services._JobProgress)."""
    from django.core.cache import cache

    from orsplatform.catalog.ingest import progress_key
    from orsplatform.catalog.models import IngestJob

    job = IngestJob.objects.select_related("environment__team").filter(team_id=team_id, id=job_id).first()
    if job is not None and job.status == IngestJob.Status.RUNNING:
        live = cache.get(progress_key(job.id))
        if live and live["rows_done"] > job.rows_done:
            job.rows_done, job.bytes_done = live["rows_done"], live["bytes_done"]
    return job


def ingest_jobs_of_team(*, team, limit: int = 20) -> list:
    from orsplatform.catalog.models import IngestJob

    return list(IngestJob.objects.filter(team=team).select_related("environment").order_by("-created_at")[:limit])


# --- how a task reads to a person (environment pages, analytics) ---------------------------------------

TASK_TEXT_KEYS = ("prompt", "question", "problem", "instruction", "instructions", "task", "text", "goal",
                  "description", "input", "query")


def task_text(spec: Any, *, limit: int = 160) -> str:
    """A task's human text: its first prose-like field (prompt, question, …), else its compact JSON."""
    text = ""
    if isinstance(spec, dict):
        for key in TASK_TEXT_KEYS:
            value = spec.get(key)
            if isinstance(value, str) and value.strip():
                text = value.strip()
                break
    elif isinstance(spec, str):
        text = spec.strip()
    if not text:
        import json

        text = json.dumps(spec, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
