"""Reads of the flags; every one takes the caller's team."""

from __future__ import annotations

from orsplatform.catalog.models import Environment
from orsplatform.flags.models import Flag
from orsplatform.teams.models import Team


def flag_get(*, team: Team, flag_id: int) -> Flag | None:
    return Flag.objects.filter(team=team, id=flag_id).select_related("environment__team", "version").first()


def flags_for_team(*, team: Team, environment: Environment | None = None, run: str | None = None,
                   kind: str | None = None, limit: int = 200) -> list[Flag]:
    """The team's flags, most recently seen first; narrowed to an environment, a run or a kind.
    (The include templates/flags/list.html shows them; run and environment pages pass these.)"""
    flags = Flag.objects.filter(team=team).select_related("environment__team", "version")
    if environment is not None:
        flags = flags.filter(environment=environment)
    if run is not None:
        flags = flags.filter(run_name=run)
    if kind is not None:
        flags = flags.filter(kind=kind)
    return list(flags.order_by("-last_seen_at", "-id")[:limit])
