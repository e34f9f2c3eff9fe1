"""Reads of runs, their series and trajectories. Every selector takes the caller's team."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from orsplatform.analytics import session_rollup
from orsplatform.analytics.selectors import pass_reward
from orsplatform.auditlog.selectors import calls_of_sessions
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.runs.models import Rollout, RolloutMessage, Run
from orsplatform.teams.models import Team

MAX_SERIES_POINTS = 100_000
MAX_TRAJECTORY_MESSAGES = 2_000


@dataclass(frozen=True)
class RunSummary:
    name: str
    rollouts: int
    episodes: int  # ORS/OpenEnv sessions with this run_name
    messages: int
    mean_reward: float | None  # over rollouts and scored sessions together
    first_seen: datetime
    last_seen: datetime
    model_name: str
    info: dict[str, Any]


@dataclass(frozen=True)
class RunPoint:
    """One episode of a run. `x` is the step when the trainer sent one, else `order`."""

    kind: str  # "rollout" | "session"
    id: int  # Rollout.pk or Session.pk
    ref: str  # Rollout.event_id or Session.sid: what a trajectory link names
    order: int  # 1-based position in the run by start time (rollouts and sessions merged)
    step: int | None
    x: int
    reward: float | None
    passed: bool | None  # None when unscored
    length: int  # messages for a rollout, tool calls for a session
    error: bool
    split: str
    environment: str  # "team/slug", or as the rollout named it
    version: int | None
    started_at: datetime
    session_sid: str | None  # a rollout's linked session
    rollout_ref: str | None = None  # a session's linked rollout (event_id)


@dataclass(frozen=True)
class Trajectory:
    rollout: Rollout | None
    session: Session | None
    messages: list[RolloutMessage] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)


def _session_scored_mean(team: Team, names: list[str] | None = None) -> dict[str, tuple[int, float, int, datetime, datetime]]:
    """Per run: sessions, reward sum, scored sessions, first and last start, from the session
    rollups plus the sessions not rolled up yet (analytics/session_rollup.py), not a scan of the
    team's sessions."""
    with session_rollup.one_snapshot():
        rows = session_rollup.run_rows(team=team, names=names)
    return {name: (r["n"], r["reward_sum"], r["scored"], r["first"], r["last"]) for name, r in rows.items()}


def runs_for_team(*, team: Team, limit: int = 1000) -> list[RunSummary]:
    """The team's runs with at least one episode, most recently seen first. (A run whose sessions
    all moved to their rollouts' run, as a key's default run does, has none and is left out.)"""
    sessions = _session_scored_mean(team)
    out = []
    runs = list(Run.objects.filter(team=team).order_by("-last_seen_at", "name")[:limit])
    known = {run.name for run in runs}
    # A session-only run whose row is missing still shows (run rows are written once per process).
    for name, (_, _, _, first, last) in sessions.items():
        if name not in known:
            runs.append(Run(team=team, name=name, first_seen_at=first, last_seen_at=last))
    for run in runs:
        n, s_sum, s_scored, s_first, s_last = sessions.get(run.name, (0, 0.0, 0, None, None))
        if not n and not run.rollouts:
            continue
        scored = run.rewarded + s_scored
        first = min(t for t in (run.first_seen_at, s_first) if t is not None)
        last = max(t for t in (run.last_seen_at, s_last) if t is not None)
        out.append(RunSummary(
            name=run.name, rollouts=run.rollouts, episodes=n, messages=run.messages,
            mean_reward=(run.reward_sum + s_sum) / scored if scored else None,
            first_seen=first, last_seen=last, model_name=run.model_name, info=run.info))
    out.sort(key=lambda r: (r.last_seen, r.name), reverse=True)
    return out[:limit]


def run_get(*, team: Team, name: str) -> Run | None:
    return Run.objects.filter(team=team, name=name).first()


def run_summary(*, team: Team, name: str) -> RunSummary | None:
    """A run with at least one episode (else None, like an unknown one)."""
    run = run_get(team=team, name=name)
    n, reward_sum, scored, first, last = _session_scored_mean(team, [name]).get(name, (0, 0.0, 0, None, None))
    agg = {"n": n, "reward_sum": reward_sum, "scored": scored, "first": first, "last": last}
    if run is None and agg["n"]:
        run = Run(team=team, name=name, first_seen_at=agg["first"], last_seen_at=agg["last"])
    if run is None or (not run.rollouts and not agg["n"]):
        return None
    scored = run.rewarded + agg["scored"]
    return RunSummary(
        name=run.name, rollouts=run.rollouts, episodes=agg["n"], messages=run.messages,
        mean_reward=(run.reward_sum + agg["reward_sum"]) / scored if scored else None,
        first_seen=min(t for t in (run.first_seen_at, agg["first"]) if t is not None),
        last_seen=max(t for t in (run.last_seen_at, agg["last"]) if t is not None),
        model_name=run.model_name, info=run.info)


def run_series(*, team: Team, name: str, environment: str | None = None, version: int | None = None,
               split: str | None = None, limit: int = MAX_SERIES_POINTS) -> list[RunPoint]:
    """Every episode of the run as a point, in start order: its rollouts, and its sessions that no
    rollout is linked to (a linked pair is one episode, drawn once, as the rollout).
    `environment` is "team/slug"; `version` a version number; filters combine."""
    threshold = pass_reward()
    rollouts = Rollout.objects.filter(team=team, run__name=name)
    sessions = Session.objects.filter(team=team, run_name=name).filter(rollouts__isnull=True)
    if environment:
        env_team, _, env_slug = environment.partition("/")
        rollouts = rollouts.filter(Q(environment__team__slug=env_team, environment__slug=env_slug)
                                   | Q(environment__isnull=True, environment_name=environment))
        sessions = sessions.filter(environment__team__slug=env_team, environment__slug=env_slug)
    if version is not None:
        rollouts = rollouts.filter(version__number=version)
        sessions = sessions.filter(version__number=version)
    if split:
        rollouts = rollouts.filter(split=split)
        sessions = sessions.filter(split=split)
    raw: list[tuple] = []
    for r in rollouts.order_by("started_at", "seq").values_list(
            "pk", "event_id", "step", "reward", "messages", "error", "split", "environment_name",
            "environment__team__slug", "environment__slug", "version__number", "started_at",
            "session__sid", "session__status")[:limit]:
        (pk, ref, step, reward, length, error, r_split, env_name, e_team, e_slug, v_num, started,
         sid, s_status) = r
        env = f"{e_team}/{e_slug}" if e_slug else env_name
        failed = bool(error) or s_status in (Session.Status.FAILED, Session.Status.LOST)
        raw.append(("rollout", pk, ref, step, reward, length, failed, r_split, env, v_num, started, sid, None))
    for s in sessions.order_by("created_at", "pk").values_list(
            "pk", "sid", "total_reward", "calls", "error", "status", "split", "environment__team__slug",
            "environment__slug", "version__number", "created_at")[:limit]:
        pk, sid, reward, calls, error, status, s_split, e_team, e_slug, v_num, created = s
        failed = bool(error) or status in (Session.Status.FAILED, Session.Status.LOST)
        raw.append(("session", pk, sid, None, reward, calls, failed, s_split, f"{e_team}/{e_slug}", v_num,
                    created, None, None))
    raw.sort(key=lambda p: (p[10], p[0] != "rollout", p[1]))
    points = []
    for order, (kind, pk, ref, step, reward, length, failed, p_split, env, v_num, started, sid, rref) in enumerate(
            raw[:limit], start=1):
        points.append(RunPoint(
            kind=kind, id=pk, ref=ref, order=order, step=step, x=step if step is not None else order,
            reward=reward, passed=None if reward is None else reward >= threshold, length=length, error=failed,
            split=p_split, environment=env, version=v_num, started_at=started, session_sid=sid, rollout_ref=rref))
    return points


def run_facets(*, team: Team, name: str) -> dict[str, list]:
    """The environments, versions and splits a run's episodes used (for filter controls)."""
    envs: set[str] = set()
    versions: set[int] = set()
    splits: set[str] = set()
    for e_team, e_slug, env_name, v_num, r_split in Rollout.objects.filter(team=team, run__name=name).values_list(
            "environment__team__slug", "environment__slug", "environment_name", "version__number",
            "split").distinct():
        envs.add(f"{e_team}/{e_slug}" if e_slug else env_name)
        if v_num is not None:
            versions.add(v_num)
        splits.add(r_split)
    for e_team, e_slug, v_num, s_split in Session.objects.filter(team=team, run_name=name).values_list(
            "environment__team__slug", "environment__slug", "version__number", "split").distinct():
        envs.add(f"{e_team}/{e_slug}")
        versions.add(v_num)
        splits.add(s_split)
    return {"environments": sorted(e for e in envs if e), "versions": sorted(versions),
            "splits": sorted(s for s in splits if s)}


def rollout_trajectory(*, team: Team, ref: str) -> Trajectory | None:
    """A rollout (by event_id) or a session (by sid) of the team, with the model's messages and the
    linked session's tool calls. None for an unknown ref and for another team's alike."""
    rollout = (Rollout.objects.filter(team=team, event_id=ref)
               .select_related("run", "environment__team", "version", "session").first())
    session = rollout.session if rollout is not None else (
        Session.objects.filter(team=team, sid=ref).select_related("environment__team", "version").first())
    if rollout is None and session is None:
        return None
    if rollout is None and session is not None:
        rollout = Rollout.objects.filter(team=team, session=session).select_related("run").first()
    messages = list(rollout.message_set.order_by("index")[:MAX_TRAJECTORY_MESSAGES]) if rollout else []
    calls = (calls_of_sessions([session], limit=MAX_TRAJECTORY_MESSAGES).get(session.pk, [])
             if session else [])
    return Trajectory(rollout=rollout, session=session, messages=messages, tool_calls=calls)
