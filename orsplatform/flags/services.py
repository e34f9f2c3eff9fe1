"""The scheduled check behind the flags (beat: flags.compute, every ORS_FLAGS_EVERY_SECONDS).

One pass reads the episodes started within ORS_FLAGS_WINDOW_DAYS (at most ORS_FLAGS_MAX_SESSIONS,
newest first, so a pass stays bounded however busy the platform is) and, per team:
- fast_pass: a task's passes that took at most ORS_FLAGS_FAST_PASS_RATIO of its typical (median)
  pass's calls, once it has ORS_FLAGS_MIN_EPISODES passes (a shortcut to the reward, often a hack);
- version_jump / run_jump: a task's pass rate moving by ORS_FLAGS_JUMP or more between consecutive
  versions, or between runs (in the order they started), each side with ORS_FLAGS_MIN_EPISODES,
  and unlikely by chance (a two-proportion z-test, z >= 3);
- reward_range: tool rewards outside the version's manifest `reward_range = [lo, hi]`;
- error_burst: the newest version's tool-error rate at least twice the previous version's (and at
  least ORS_FLAGS_ERROR_RATE) over ORS_FLAGS_MIN_CALLS calls.
Flags are upserted by (team, kind, key): a flag found again keeps its first_seen_at; one not found
again stays as history.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from orsplatform.analytics.selectors import pass_reward
from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.flags.models import Flag

MAX_LINKED = 50  # sessions kept per flag (its evidence; the page and the API link each)
MAX_FLAGS = 2000  # per pass


@dataclass
class Found:
    team_id: int
    kind: str
    key: str
    environment_id: int
    summary: str
    version_id: int | None = None
    run_name: str = ""
    split: str = ""
    task_index: int | None = None
    details: dict = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)


@dataclass
class _Episode:
    sid: str
    team_id: int
    environment_id: int
    version_id: int
    version: int
    split: str
    task_index: int | None
    calls: int
    passed: bool
    run_name: str
    created_at: datetime


def _episodes(since: datetime) -> list[_Episode]:
    threshold = pass_reward()
    rows = (Session.objects.filter(created_at__gte=since, team__isnull=False)
            .exclude(status__in=[Session.Status.CREATING, Session.Status.FAILED])
            .order_by("-created_at")
            .values_list("sid", "team_id", "environment_id", "version_id", "version__number", "split", "task_index",
                         "calls", "total_reward", "run_name", "created_at")[:settings.ORS_FLAGS_MAX_SESSIONS])
    return [_Episode(sid, team, env, vid, number, split, index, calls or 0,
                     reward is not None and reward >= threshold, run or "", created)
            for sid, team, env, vid, number, split, index, calls, reward, run, created in rows]


def _rate(episodes: list[_Episode]) -> float:
    return sum(e.passed for e in episodes) / len(episodes)


def _significant(old: list[_Episode], new: list[_Episode]) -> bool:
    """A two-proportion z-test at z >= 3: a jump on a handful of episodes is chance more often than a
    change (measured: with only the size rule, 12 of 1,600 steady tasks were flagged at 12 episodes)."""
    pooled = (sum(e.passed for e in old) + sum(e.passed for e in new)) / (len(old) + len(new))
    spread = (pooled * (1 - pooled) * (1 / len(old) + 1 / len(new))) ** 0.5
    return spread == 0 or abs(_rate(new) - _rate(old)) / spread >= 3


def _fast_passes(episodes: list[_Episode]) -> list[Found]:
    by_task: dict[tuple, list[_Episode]] = defaultdict(list)
    for e in episodes:
        if e.passed and e.task_index is not None:
            by_task[(e.team_id, e.environment_id, e.version_id, e.split, e.task_index)].append(e)
    found = []
    for (team, env, version, split, index), passes in by_task.items():
        if len(passes) < settings.ORS_FLAGS_MIN_EPISODES:
            continue
        typical = statistics.median(e.calls for e in passes)
        fast = [e for e in passes if e.calls <= typical * settings.ORS_FLAGS_FAST_PASS_RATIO]
        if not fast or typical < 2:
            continue
        fewest = min(e.calls for e in fast)
        found.append(Found(
            team_id=team, kind=Flag.Kind.FAST_PASS, key=f"{version}:{split}:{index}", environment_id=env,
            version_id=version, split=split, task_index=index,
            summary=(f"{len(fast)} of {len(passes)} passes of task {split}#{index} (v{passes[0].version}) took "
                     f"{fewest} call(s); its typical pass takes {typical:g}."),
            details={"passes": len(passes), "fast": len(fast), "typical_calls": typical, "fewest_calls": fewest},
            sessions=[e.sid for e in sorted(fast, key=lambda e: e.calls)[:MAX_LINKED]]))
    return found


def _jumps(episodes: list[_Episode], *, by_run: bool) -> list[Found]:
    """A task's pass rate between consecutive versions (or runs, within one version)."""
    groups: dict[tuple, dict[object, list[_Episode]]] = defaultdict(lambda: defaultdict(list))
    for e in episodes:
        if e.task_index is None or (by_run and not e.run_name):
            continue
        task = (e.team_id, e.environment_id, e.version_id if by_run else None, e.split, e.task_index)
        groups[task][e.run_name if by_run else e.version].append(e)
    found = []
    least = settings.ORS_FLAGS_MIN_EPISODES
    for (team, env, _, split, index), sides in groups.items():
        if len(sides) < 2:
            continue
        # Runs in the order they started; versions by number.
        order = sorted(sides, key=lambda s: min(e.created_at for e in sides[s]) if by_run else s)
        for before, after in zip(order, order[1:], strict=False):
            old, new = sides[before], sides[after]
            if len(old) < least or len(new) < least:
                continue
            rate_old, rate_new = _rate(old), _rate(new)
            if abs(rate_new - rate_old) < settings.ORS_FLAGS_JUMP or not _significant(old, new):
                continue
            what = "run" if by_run else "version"
            label_old, label_new = (f"{before!r}", f"{after!r}") if by_run else (f"v{before}", f"v{after}")
            found.append(Found(
                team_id=team, kind=Flag.Kind.RUN_JUMP if by_run else Flag.Kind.VERSION_JUMP,
                key=f"{new[0].version_id if by_run else env}:{split}:{index}:{before}->{after}",
                environment_id=env, version_id=new[0].version_id, run_name=str(after) if by_run else "",
                split=split, task_index=index,
                summary=(f"Task {split}#{index}: pass rate {rate_old:.0%} in {what} {label_old} "
                         f"({len(old)} episodes), {rate_new:.0%} in {label_new} ({len(new)} episodes)."),
                details={"from": before, "to": after, "rate_from": rate_old, "rate_to": rate_new,
                         "episodes_from": len(old), "episodes_to": len(new)},
                sessions=[e.sid for e in new[:MAX_LINKED // 2]] + [e.sid for e in old[:MAX_LINKED // 2]]))
    return found


def _reward_ranges(since: datetime) -> list[Found]:
    found = []
    versions = (EnvironmentVersion.objects.filter(manifest__has_key="reward_range", sessions__created_at__gte=since)
                .distinct().values_list("id", "environment_id", "number", "manifest"))
    for version_id, env, number, manifest in versions:
        lo, hi = manifest["reward_range"]
        calls = (ToolCall.objects.filter(session__version_id=version_id, session__created_at__gte=since,
                                         session__team__isnull=False)
                 .filter(Q(reward__lt=lo) | Q(reward__gt=hi))
                 .values_list("session__team_id", "session__sid", "reward")[:10_000])
        by_team: dict[int, list[tuple[str, float]]] = defaultdict(list)
        for team, sid, reward in calls:
            by_team[team].append((sid, reward))
        for team, hits in by_team.items():
            rewards = [r for _, r in hits]
            found.append(Found(
                team_id=team, kind=Flag.Kind.REWARD_RANGE, key=str(version_id), environment_id=env,
                version_id=version_id,
                summary=(f"{len(hits)} tool reward(s) outside the declared range [{lo:g}, {hi:g}] of v{number} "
                         f"(from {min(rewards):g} to {max(rewards):g})."),
                details={"range": [lo, hi], "calls": len(hits), "lowest": min(rewards), "highest": max(rewards)},
                sessions=list(dict.fromkeys(sid for sid, _ in hits))[:MAX_LINKED]))
    return found


def _error_bursts(since: datetime) -> list[Found]:
    rows = (ToolCall.objects.filter(session__created_at__gte=since, session__team__isnull=False)
            .values_list("session__team_id", "session__environment_id", "session__version_id",
                         "session__version__number")
            .annotate(calls=Count("id"), errors=Count("id", filter=Q(status=ToolCall.Status.ERROR))))
    per_env: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for team, env, version_id, number, calls, errors in rows:
        per_env[(team, env)].append((number, version_id, calls, errors))
    found = []
    for (team, env), versions in per_env.items():
        if len(versions) < 2:
            continue
        versions.sort()
        (old_n, _, old_calls, old_errors), (new_n, new_id, new_calls, new_errors) = versions[-2], versions[-1]
        if old_calls < settings.ORS_FLAGS_MIN_CALLS or new_calls < settings.ORS_FLAGS_MIN_CALLS:
            continue
        rate_old, rate_new = old_errors / old_calls, new_errors / new_calls
        if rate_new < settings.ORS_FLAGS_ERROR_RATE or rate_new < 2 * rate_old:
            continue
        sids = (ToolCall.objects.filter(session__version_id=new_id, session__team_id=team, session__created_at__gte=since,
                                        status=ToolCall.Status.ERROR)
                .order_by("session__created_at").values_list("session__sid", flat=True)[:MAX_LINKED * 4])
        found.append(Found(
            team_id=team, kind=Flag.Kind.ERROR_BURST, key=f"{env}:{new_n}", environment_id=env, version_id=new_id,
            summary=(f"Tool errors rose to {rate_new:.0%} of {new_calls} calls on v{new_n}, "
                     f"from {rate_old:.0%} of {old_calls} on v{old_n}."),
            details={"from_version": old_n, "to_version": new_n, "rate_from": rate_old, "rate_to": rate_new,
                     "calls_from": old_calls, "calls_to": new_calls},
            sessions=list(dict.fromkeys(sids))[:MAX_LINKED]))
    return found


def flags_compute(*, now: datetime | None = None) -> list[Flag]:
    """One pass of the check; returns the flags it found (created or refreshed)."""
    now = now or timezone.now()
    since = now - timedelta(days=settings.ORS_FLAGS_WINDOW_DAYS)
    episodes = _episodes(since)
    found = [*_fast_passes(episodes), *_jumps(episodes, by_run=False), *_jumps(episodes, by_run=True),
             *_reward_ranges(since), *_error_bursts(since)][:MAX_FLAGS]
    return [_flag_upsert(f, now=now) for f in found]


def _flag_upsert(found: Found, *, now: datetime) -> Flag:
    values = {"environment_id": found.environment_id, "version_id": found.version_id, "run_name": found.run_name,
              "split": found.split, "task_index": found.task_index, "summary": found.summary,
              "details": found.details, "sessions": found.sessions, "last_seen_at": now}
    with transaction.atomic():
        flag, _ = Flag.objects.update_or_create(team_id=found.team_id, kind=found.kind, key=found.key[:300],
                                                defaults=values, create_defaults={**values, "first_seen_at": now})
    return flag
