"""Reads of container versions (the caller has already been admitted to the version, or is the
platform itself choosing which versions to keep warm)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.containers.images import record_path, record_read
from orsplatform.episodes.models import Session

# How far back the newest sessions are read to see which versions were used lately: a fixed number,
# read by primary key (an index scan), so the look costs the same however large the table grows.
RECENT_SESSIONS = 2000


@dataclass(frozen=True)
class ImageView:
    image: str
    size_mb: float
    command: str
    layers: list[dict]  # {"size", "created_by"}, oldest first, as a Dockerfile reads


def version_image(*, version: EnvironmentVersion) -> ImageView | None:
    """The version's image as its page shows it: id, size, the command it runs and its layers."""
    record = record_read(version.package_path) if version.package_path else None
    if record is None:
        return None
    layers = [{"size": layer.get("size", ""), "created_by": layer.get("created_by", "")}
              for layer in reversed(record.layers)]
    return ImageView(image=record.image, size_mb=round(record.size / 1e6, 1), command=" ".join(record.command),
                     layers=layers)


def versions_to_keep_warm(*, versions: int, per_team: int, idle_seconds: float) -> dict[str, str]:
    """The container versions that keep a started container ahead of their first session (package
    dir -> ``team/slug@N``): ready, built or used within ``idle_seconds``, the most recently built or
    used first, at most ``per_team`` of one team's and ``versions`` in all. A team publishing many
    versions holds no more spares than that, and a version nobody uses loses its spare."""
    if versions <= 0 or per_team <= 0:
        return {}
    cutoff = timezone.now() - timedelta(seconds=idle_seconds)
    used: dict[int, datetime] = {}
    for version_id, created in Session.objects.order_by("-pk").values_list("version_id", "created_at")[
            :RECENT_SESSIONS]:
        if created >= cutoff and (version_id not in used or created > used[version_id]):
            used[version_id] = created
    candidates = (EnvironmentVersion.objects.filter(status=EnvironmentVersion.Status.READY,
                                                    environment__deleted_at__isnull=True)
                  .filter(Q(created_at__gte=cutoff) | Q(id__in=list(used)))
                  .select_related("environment__team").order_by("-created_at")[:10 * versions])
    ranked = sorted(candidates, key=lambda v: max(v.created_at, used.get(v.id, v.created_at)), reverse=True)
    wanted: dict[str, str] = {}
    held: dict[int, int] = {}
    for version in ranked:
        team = version.environment.team_id
        if (len(wanted) >= versions or held.get(team, 0) >= per_team or version.package_path in wanted
                or not version.package_path or not record_path(version.package_path).is_file()):
            continue
        held[team] = held.get(team, 0) + 1
        wanted[version.package_path] = f"{version.environment.full_name}@{version.number}"
    return wanted
