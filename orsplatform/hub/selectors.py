"""Reads of the environment pages. Every read starts from the viewer: public environments are for
everyone, a private one only for members of its team, and anything else is indistinguishable from a
missing environment (the views answer 404)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.cache import cache
from django.core.paginator import Page, Paginator
from django.db.models import Avg, Count, Q, QuerySet
from django.utils import timezone
from django.utils.safestring import SafeString

from orsplatform.analytics.selectors import ENDED, pass_reward
from orsplatform.catalog import data
from orsplatform.catalog.models import Environment, EnvironmentVersion, Split, Task
from orsplatform.episodes.models import Session
from orsplatform.hub import files as package_files
from orsplatform.hub.markdown import render_markdown
from orsplatform.sandbox.bwrap import SANDBOX_DATA
from orsplatform.teams.models import Membership, Team

PUBLISHER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN, Membership.Role.MEMBER)
SORTS = {
    "name": ("team__slug", "slug"),
    "updated": ("-current_version__created_at", "team__slug", "slug"),
    "created": ("-created_at", "team__slug", "slug"),
}
README_NAMES = ("README.md", "readme.md", "README.markdown", "README.txt", "README")
MAX_README_BYTES = 512 * 1024


@dataclass(frozen=True)
class Viewer:
    team_ids: frozenset[int]
    everything: bool = False  # platform superusers

    def sessions_q(self) -> Q:
        """The sessions whose figures this viewer may see: its own teams' (never another team's)."""
        return Q() if self.everything else Q(team_id__in=self.team_ids)


def viewer_of(user) -> Viewer:
    if not user.is_authenticated:
        return Viewer(frozenset())
    ids = frozenset(Membership.objects.filter(user=user).values_list("team_id", flat=True))
    return Viewer(ids, everything=user.is_superuser)


def _visible(viewer: Viewer) -> Q:
    if viewer.everything:
        return Q(deleted_at__isnull=True)
    # Another team's environment shows only once a version of it is served: one whose first build
    # failed (or is still running) is its own team's business (console: its log, a delete button).
    return Q(deleted_at__isnull=True) & (
        Q(visibility=Environment.Visibility.PUBLIC, current_version__isnull=False) | Q(team_id__in=viewer.team_ids))


# --- the catalog -------------------------------------------------------------------------------------

def catalog_queryset(*, viewer: Viewer, query: str = "", team: str = "", visibility: str = "",
                     sort: str = "name") -> QuerySet[Environment]:
    qs = (Environment.objects.filter(_visible(viewer), current_version__isnull=False)
          .select_related("team", "current_version")
          .defer("current_version__tools", "current_version__splits", "current_version__manifest",
                 "current_version__error"))
    if query:
        qs = qs.filter(Q(slug__icontains=query) | Q(description__icontains=query) | Q(team__slug__icontains=query))
    if team:
        qs = qs.filter(team__slug=team)
    if visibility in Environment.Visibility.values:
        qs = qs.filter(visibility=visibility)
    return qs.order_by(*SORTS.get(sort, SORTS["name"]))


def catalog_page(*, user, query: str = "", team: str = "", visibility: str = "", sort: str = "name",
                 page: int | str = 1, per_page: int = 24) -> Page:
    qs = catalog_queryset(viewer=viewer_of(user), query=query, team=team, visibility=visibility, sort=sort)
    return Paginator(qs, per_page).get_page(page)


USAGE_DAYS = 7
USAGE_CACHE_SECONDS = 300


def catalog_usage(*, environment_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Sessions started in the last 7 days and their pass rate, per environment of a catalog page:
    platform-wide counts (every caller's sessions, as a usage figure, never who ran them), from one
    grouped query on the (environment, created_at) index, cached for a few minutes per environment
    so a busy catalog costs a cache read."""
    keys = {f"hub:usage:{i}": i for i in environment_ids}
    found = {keys[k]: v for k, v in cache.get_many(list(keys)).items()}
    missing = [i for i in environment_ids if i not in found]
    if missing:
        since = timezone.now() - timedelta(days=USAGE_DAYS)
        rows = {r["environment_id"]: r for r in (
            Session.objects.filter(environment_id__in=missing, created_at__gte=since)
            .values("environment_id").order_by()
            .annotate(sessions=Count("id"),
                      scored=Count("id", filter=Q(status__in=ENDED, total_reward__isnull=False)),
                      passed=Count("id", filter=Q(status__in=ENDED, total_reward__gte=pass_reward()))))}
        fresh = {}
        for i in missing:
            row = rows.get(i) or {"sessions": 0, "scored": 0, "passed": 0}
            fresh[i] = {"sessions": row["sessions"], "scored": row["scored"],
                        "pass_rate": row["passed"] / row["scored"] if row["scored"] else None}
        cache.set_many({f"hub:usage:{i}": v for i, v in fresh.items()}, USAGE_CACHE_SECONDS)
        found.update(fresh)
    return found


def catalog_teams(*, user) -> list[str]:
    """Team slugs to offer in the catalog's team filter."""
    return list(Team.objects.filter(environments__in=Environment.objects.filter(
        _visible(viewer_of(user)), current_version__isnull=False)).distinct().order_by("slug")
        .values_list("slug", flat=True))


# --- one environment ---------------------------------------------------------------------------------

def environment_for_viewer(*, viewer: Viewer, team_slug: str, slug: str) -> Environment | None:
    return (Environment.objects.select_related("team", "current_version__created_by")
            .filter(_visible(viewer), team__slug=team_slug, slug=slug).first())


def can_publish_to(*, user, environment: Environment) -> bool:
    if not user.is_authenticated:
        return False
    return user.is_superuser or Membership.objects.filter(
        user=user, team_id=environment.team_id, role__in=PUBLISHER_ROLES).exists()


def can_delete(*, user, environment: Environment) -> bool:
    """Owners and admins of its team (and platform superusers) delete an environment."""
    if not user.is_authenticated:
        return False
    return user.is_superuser or Membership.objects.filter(
        user=user, team_id=environment.team_id,
        role__in=(Membership.Role.OWNER, Membership.Role.ADMIN)).exists()


def readme_html(*, version: EnvironmentVersion | None) -> SafeString | None:
    """The package README rendered and sanitized; cached by content hash (a version never changes)."""
    if version is None:
        return None
    key = f"hub:readme:{version.content_hash}"
    cached = cache.get(key)
    if cached is not None:
        return cached or None
    html = ""
    root = Path(version.package_path)
    for name in README_NAMES:
        path = root / name
        if path.is_file():
            with path.open("rb") as fh:
                text = fh.read(MAX_README_BYTES).decode("utf-8", errors="replace")
            html = render_markdown(text)
            break
    cache.set(key, html, None)
    return html or None


def splits_of(*, environment: Environment) -> list[Split]:
    return list(Split.objects.filter(environment=environment).order_by("id"))


def split_of(*, environment: Environment, name: str) -> Split | None:
    return Split.objects.filter(environment=environment, name=name).first()


class _SplitTasks:
    """A split's tasks as the paginator's object list: the count is the split's stored num_tasks and a
    page is an index range, so page 20,000 of a million tasks costs what page 1 does (no COUNT(*),
    no OFFSET scan). Indices run 0..num_tasks-1 (ingest appends after the last one)."""

    def __init__(self, split: Split) -> None:
        self.split = split

    def count(self) -> int:
        return self.split.num_tasks

    def __len__(self) -> int:
        return self.split.num_tasks

    def __getitem__(self, item: slice) -> list[dict[str, Any]]:
        rows = (Task.objects.filter(split=self.split, index__gte=item.start, index__lt=item.stop)
                .order_by("index").values_list("index", "spec"))
        return [{"index": index, "spec": spec} for index, spec in rows]


def tasks_page(*, split: Split, page: int | str, per_page: int = 25) -> Page:
    return Paginator(_SplitTasks(split), per_page).get_page(page)


def task_of(*, split: Split, index: int) -> Task | None:
    return Task.objects.filter(split=split, index=index).first()


def task_stats(*, viewer: Viewer, environment: Environment, split: str, indices: list[int]) -> dict[int, dict]:
    """Attempts and pass rate per task index, over the sessions of the viewer's own teams."""
    if not indices or not (viewer.team_ids or viewer.everything):
        return {}
    rows = (Session.objects.filter(viewer.sessions_q(), environment=environment, split=split,
                                   task_index__in=indices, status__in=ENDED, total_reward__isnull=False)
            .values("task_index").annotate(attempts=Count("id"), passed=Count("id", filter=Q(
                total_reward__gte=pass_reward())), mean_reward=Avg("total_reward")).order_by())
    return {r["task_index"]: {**r, "pass_rate": r["passed"] / r["attempts"] if r["attempts"] else None}
            for r in rows}


def task_recorded_prompt(*, viewer: Viewer, environment: Environment, split: str, index: int) -> list | None:
    """The prompt blocks the latest of the viewer's sessions on this task was served (recorded on its
    first /prompt), so the page shows what an agent saw without running tenant code in the web process."""
    if not (viewer.team_ids or viewer.everything):
        return None
    return (Session.objects.filter(viewer.sessions_q(), environment=environment, split=split, task_index=index,
                                   prompt__isnull=False)
            .order_by("-created_at").values_list("prompt", flat=True).first())


def sessions_team(*, user, viewer: Viewer, environment: Environment) -> Team | None:
    """The team whose session explorer a "sessions" link opens: the environment's own team for its
    members, else the viewer's first team."""
    if not viewer.team_ids:
        return None
    team_id = environment.team_id if environment.team_id in viewer.team_ids else min(viewer.team_ids)
    return Team.objects.filter(id=team_id).first()


# --- versions ----------------------------------------------------------------------------------------

def versions_page(*, environment: Environment, page: int | str, per_page: int = 20) -> Page:
    qs = (environment.versions.select_related("created_by").defer("tools", "splits", "manifest")
          .order_by("-number"))
    return Paginator(qs, per_page).get_page(page)


def version_numbers(*, environment: Environment) -> list[int]:
    return list(environment.versions.order_by("-number").values_list("number", flat=True))


def version_of(*, environment: Environment, number: int) -> EnvironmentVersion | None:
    return environment.versions.filter(number=number).first()


def version_files(*, version: EnvironmentVersion | None) -> list[dict[str, Any]]:
    """A version's files with their sizes (the version comes from environment_for_viewer): the
    package, and the data mounted at /orwd_data (its data archive, else the package's data/)."""
    if version is None or not version.package_path:
        return []
    package = Path(version.package_path)
    found = []
    if package.is_dir():
        found.append(("package", "Package", "", data.listing(package, "package")))
    if version.data_hash and data.folder(version.data_hash).is_dir():
        found.append(("data", f"Data archive (sha256 {version.data_hash[:12]})", SANDBOX_DATA,
                      data.listing(data.folder(version.data_hash), "data archive")))
    elif (package / "data").is_dir():
        found.append(("data", "Data (the package's data/ folder)", SANDBOX_DATA,
                      data.listing(package / "data", "package data/")))
    return [{"key": key, "title": title, "mount": mount, "files": listing.files,
             "total_files": listing.total_files, "total_bytes": listing.total_bytes}
            for key, title, mount, listing in found]


def version_file(*, version: EnvironmentVersion, path: str) -> package_files.FileText | None:
    """One file of a version's package (the version comes from environment_for_viewer), as text,
    size-capped; None for a path that is not a regular file of it (links are never followed)."""
    if not version.package_path:
        return None
    return package_files.read_text(Path(version.package_path), path)


def card_facts(*, version: EnvironmentVersion | None) -> dict[str, Any]:
    """The manifest's licence and compute table, for the environment page (validated at publish:
    catalog.services._card_fields_validate)."""
    manifest = (version.manifest if version is not None else None) or {}
    compute = manifest.get("compute")
    if isinstance(compute, str):
        compute = {"notes": compute}
    return {"license": manifest.get("license") or manifest.get("licence") or "",
            "compute": sorted((str(k), v) for k, v in compute.items()) if isinstance(compute, dict) else []}
