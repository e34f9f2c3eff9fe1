"""Reads for the run pages that several runs share, so overlaying runs costs a constant number of
queries per page plus the runs' series (runs.selectors.run_series), not a handful per run.

A run's series is read once, unfiltered: the filter controls offer what it holds (its facets) and
the environment / version / split filters are applied to its points here. Every function takes the
caller's team."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Exists, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Greatest

from orsplatform.analytics import session_rollup
from orsplatform.episodes.models import Session
from orsplatform.runs.models import Run
from orsplatform.runs.selectors import RunPoint, RunSummary
from orsplatform.teams.models import Team


def run_summaries(*, team: Team, names: Sequence[str]) -> dict[str, RunSummary]:
    """The team's runs among `names` (two queries whatever their number), as runs.selectors'
    run_summary reads each: a run with at least one rollout or session; a session-only run counts
    even before its row exists. Unknown and empty names are absent."""
    runs = {r.name: r for r in Run.objects.filter(team=team, name__in=list(names))}
    # The runs' session counts from the session rollups plus their sessions not rolled up yet: a
    # run of a million episodes costs its rollup rows, not a million sessions.
    with session_rollup.one_snapshot():
        sessions = session_rollup.run_rows(team=team, names=list(names))
    out = {}
    for name in names:
        s = sessions.get(name, {})
        run = runs.get(name)
        if run is None and s.get("n"):
            run = Run(team=team, name=name, first_seen_at=s["first"], last_seen_at=s["last"])
        if run is None or (not run.rollouts and not s.get("n")):
            continue
        scored = run.rewarded + (s.get("scored") or 0)
        out[name] = RunSummary(
            name=name, rollouts=run.rollouts, episodes=s.get("n") or 0, messages=run.messages,
            mean_reward=(run.reward_sum + (s.get("reward_sum") or 0.0)) / scored if scored else None,
            first_seen=min(t for t in (run.first_seen_at, s.get("first")) if t is not None),
            last_seen=max(t for t in (run.last_seen_at, s.get("last")) if t is not None),
            model_name=run.model_name, info=run.info)
    return out


def runs_page(*, team: Team, page: int, per_page: int) -> tuple[int, list[RunSummary]]:
    """(how many runs, one page of them), most recently seen first, in the database: a team with
    thousands of runs costs a page of rows, not all of them. A run is listed when it has a rollout
    or a session; its last activity is the later of its row's and its newest session's (an index
    probe of (team, run_name, created_at) per run). Runs whose row was never written (the gateway
    writes it with the run's first session) are left to runs.selectors.runs_for_team."""
    sessions = Session.objects.filter(team=team, run_name=OuterRef("name"))
    newest = Subquery(sessions.order_by("-created_at").values("created_at")[:1])
    listed = (Run.objects.filter(team=team).filter(Q(rollouts__gt=0) | Exists(sessions))
              .annotate(active=Greatest(F("last_seen_at"), Coalesce(newest, F("last_seen_at")))))
    total = listed.count()
    rows = list(listed.order_by("-active", "name").values_list("name", flat=True)
                [(page - 1) * per_page: page * per_page])
    found = run_summaries(team=team, names=rows)
    return total, [found[name] for name in rows if name in found]


def facets_of(points: Iterable[RunPoint]) -> dict[str, list[Any]]:
    """The environments, versions and splits some points used (the filter controls' choices)."""
    envs, versions, splits = set(), set(), set()
    for p in points:
        if p.environment:
            envs.add(p.environment)
        if p.version is not None:
            versions.add(p.version)
        if p.split:
            splits.add(p.split)
    return {"environments": sorted(envs), "versions": sorted(versions), "splits": sorted(splits)}


def filter_points(points: Iterable[RunPoint], *, environment: str | None, version: int | None,
                  split: str | None) -> list[RunPoint]:
    """The points of one environment ("team/slug"), version number and split; None matches any."""
    return [p for p in points
            if (environment is None or p.environment == environment)
            and (version is None or p.version == version)
            and (split is None or p.split == split)]
