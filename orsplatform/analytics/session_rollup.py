"""Session-level reads of the analytics pages from the session rollups (models.SessionRollup,
SessionBucketRollup, TaskRollup) plus the sessions not in them, read live.

A window is cut in two. Whole UTC hours inside it come from the rollups, plus the team's sessions
of those hours that are not rolled up yet (open, failed, just ended: the partial index
session_unrolled_team_created holds only those). The window's partial first and last hours, and
a whole window drawn per minute (at most three hours of data), are read from the Session table,
as before. Every measure is a sum, minimum or maximum, so adding the parts gives the figures a
scan of the whole window gave. Every function takes the caller's team.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, DateTimeField, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import Trunc

from orsplatform.analytics import session_buckets
from orsplatform.analytics.models import SessionBucketRollup, SessionRollup, TaskRollup
from orsplatform.episodes.models import Session
from orsplatform.teams.models import Team

ENDED = (Session.Status.DELETED, Session.Status.EXPIRED, Session.Status.LOST)
HOUR = timedelta(hours=1)


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Read the rollups and the unrolled sessions in one snapshot: a fold that commits between the
    two reads would otherwise count its sessions twice (or not at all). PostgreSQL only, outside a
    transaction (the first statement of one must set its level); SQLite has one writer at a time
    and the fold's transactions are short."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


@dataclass(frozen=True)
class Cut:
    """Rollup hours [hours_start, hours_end) (none when equal) and the span around them."""

    start: datetime
    end: datetime
    hours_start: datetime
    hours_end: datetime

    @property
    def has_hours(self) -> bool:
        return self.hours_start < self.hours_end


def cut(start: datetime, end: datetime, granularity: str) -> Cut:
    start, end = _utc(start), _utc(end)
    if granularity == "minute":  # per-minute points cannot come from hourly rows
        return Cut(start, end, start, start)
    first = start.replace(minute=0, second=0, microsecond=0)
    if first < start:
        first += HOUR
    last = end.replace(minute=0, second=0, microsecond=0)
    if last <= first:
        return Cut(start, end, start, start)
    return Cut(start, end, first, last)


def live(team: Team, c: Cut) -> list[QuerySet[Session]]:
    """The sessions a rollup read misses, as one query (PostgreSQL ORs the partial index's range with
    the (team, created_at) index's edge ranges): a list, for callers that add parts up."""
    base = Session.objects.filter(team=team)
    if not c.has_hours:
        return [base.filter(created_at__gte=c.start, created_at__lt=c.end)]
    missed = Q(rolled_up=False, created_at__gte=c.hours_start, created_at__lt=c.hours_end)
    if c.start < c.hours_start:
        missed |= Q(created_at__gte=c.start, created_at__lt=c.hours_start)
    if c.hours_end < c.end:
        missed |= Q(created_at__gte=c.hours_end, created_at__lt=c.end)
    return [base.filter(missed)]


def rolled(model, team: Team, c: Cut) -> QuerySet:
    if not c.has_hours:
        return model.objects.none()
    return model.objects.filter(team=team, hour__gte=c.hours_start, hour__lt=c.hours_end)


def _trunc(field: str, granularity: str) -> Trunc:
    return Trunc(field, granularity, output_field=DateTimeField(), tzinfo=UTC)


def _scored_q() -> Q:
    return Q(status__in=ENDED, total_reward__isnull=False)


def live_aggregates(pass_reward: float) -> dict[str, Any]:
    """The per-group measures of live sessions (as the pages computed them over every session)."""
    scored = _scored_q()
    return {
        "n": Count("id"),
        "ended": Count("id", filter=Q(status__in=ENDED)),
        "scored": Count("id", filter=scored),
        "passed": Count("id", filter=scored & Q(total_reward__gte=pass_reward)),
        "reward_sum": Sum("total_reward", filter=scored),
    }


# The same measures from rollup rows (every rolled-up session has ended).
ROLLED_AGGREGATES = {"n": Sum("episodes"), "ended": Sum("episodes"), "scored": Sum("scored"),
                     "passed": Sum("passed"), "reward_sum": Sum("reward_sum")}


def overview_rows(*, team: Team, c: Cut, granularity: str, pass_reward: float) -> Iterator[dict[str, Any]]:
    """Session measures per (t, environment_id, key) — key the API key id, 0 for none — from the
    rollups and the live parts; a group may appear once per part (callers add them up)."""
    for r in (rolled(SessionRollup, team, c).annotate(t=_trunc("hour", granularity))
              .values("t", "environment_id", "api_key_ref").annotate(**ROLLED_AGGREGATES).order_by()):
        r["key"] = r.pop("api_key_ref")
        yield r
    for part in live(team, c):
        for r in (part.annotate(t=_trunc("created_at", granularity)).values("t", "environment_id", "api_key_id")
                  .annotate(**live_aggregates(pass_reward)).order_by()):
            r["key"] = r.pop("api_key_id") or 0
            yield r


def _lesser(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _greater(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


SUMMED = ("n", "ended", "scored", "passed", "reward_sum")


def environment_period_rows(*, team: Team, c: Cut, target: Q, granularity: str,
                            pass_reward: float) -> list[dict[str, Any]]:
    """Per t: the SUMMED measures, reward_min / reward_max (scored) and calls_max (ended)."""
    extremes = {"reward_min": Min("reward_min"), "reward_max": Max("reward_max"), "calls_max": Max("calls_max")}
    rows = list(rolled(SessionRollup, team, c).filter(target).annotate(t=_trunc("hour", granularity))
                .values("t").annotate(**ROLLED_AGGREGATES, **extremes).order_by())
    scored_q = _scored_q()
    for part in live(team, c):
        rows += part.filter(target).annotate(t=_trunc("created_at", granularity)).values("t").annotate(
            **live_aggregates(pass_reward), reward_min=Min("total_reward", filter=scored_q),
            reward_max=Max("total_reward", filter=scored_q),
            calls_max=Max("calls", filter=Q(status__in=ENDED))).order_by()
    return rows


def merge_period_rows(rows: list[dict[str, Any]], key: Any) -> dict[Any, dict[str, Any]]:
    """Rows of the same period (one per part) added into one."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        k = key(r["t"])
        m = out.get(k)
        if m is None:
            out[k] = {**r, **{f: r.get(f) or 0 for f in SUMMED}}
            continue
        for f in SUMMED:
            m[f] += r.get(f) or 0
        m["reward_min"] = _lesser(m["reward_min"], r["reward_min"])
        m["reward_max"] = _greater(m["reward_max"], r["reward_max"])
        m["calls_max"] = _greater(m["calls_max"], r["calls_max"])
    return out


def histograms(*, team: Team, c: Cut, target: Q, scored: int, ended: int, lo: float | None, hi: float | None,
               longest: int | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The reward and episode-length histograms (session_buckets) of the window."""
    counts: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for kind, bucket, n in (rolled(SessionBucketRollup, team, c).filter(target).values("kind", "bucket")
                            .annotate(n=Sum("count")).values_list("kind", "bucket", "n").order_by()):
        counts[kind][bucket] += n
    for part in live(team, c):
        for reward, n in (part.filter(target).filter(_scored_q()).values("total_reward")
                          .annotate(n=Count("id")).values_list("total_reward", "n").order_by()):
            counts[session_buckets.REWARD_WIDE][session_buckets.reward_wide_bucket(reward)] += n
            unit = session_buckets.reward_unit_bucket(reward)
            if unit is not None:
                counts[session_buckets.REWARD_UNIT][unit] += n
        for calls, n in (part.filter(target).filter(status__in=ENDED).values("calls")
                         .annotate(n=Count("id")).values_list("calls", "n").order_by()):
            counts[session_buckets.LENGTH][calls] += n
    return (session_buckets.reward_histogram(counts[session_buckets.REWARD_UNIT],
                                             counts[session_buckets.REWARD_WIDE], count=scored, lo=lo, hi=hi),
            session_buckets.length_histogram(counts[session_buckets.LENGTH], count=ended, longest=longest))


def splits(*, team: Team, c: Cut, target: Q, pass_reward: float) -> list[dict[str, Any]]:
    """Scored episodes per split: episodes, passed, pass rate and mean reward, by split name."""
    sums: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for split, n, passed, reward in (rolled(SessionRollup, team, c).filter(target, scored__gt=0).values("split")
                                     .annotate(n=Sum("scored"), p=Sum("passed"), r=Sum("reward_sum"))
                                     .values_list("split", "n", "p", "r").order_by()):
        s = sums[split]
        s[0], s[1], s[2] = s[0] + n, s[1] + passed, s[2] + reward
    for part in live(team, c):
        for split, n, passed, reward in (part.filter(target).filter(_scored_q()).values("split").annotate(
                n=Count("id"), p=Count("id", filter=Q(total_reward__gte=pass_reward)), r=Sum("total_reward"))
                .values_list("split", "n", "p", "r").order_by()):
            s = sums[split]
            s[0], s[1], s[2] = s[0] + n, s[1] + passed, s[2] + reward
    return [{"split": split, "episodes": n, "passed": passed, "pass_rate": passed / n, "mean_reward": reward / n}
            for split, (n, passed, reward) in sorted(sums.items()) if n]


def tasks(*, team: Team, c: Cut, target: Q, pass_reward: float, listed: int) -> tuple[int, list, list]:
    """(tasks scored, hardest, easiest): per task attempts, passes, mean reward and pass rate. With
    few tasks the two lists split them (the harder half, the easier half); the easiest order is
    the exact reverse of the hardest, so the halves never share a task."""
    sums: dict[tuple[str, int], list] = defaultdict(lambda: [0, 0, 0.0])
    for split, index, n, passed, reward in (
            rolled(TaskRollup, team, c).filter(target).values("split", "task_index")
            .annotate(n=Sum("attempts"), p=Sum("passed"), r=Sum("reward_sum"))
            .values_list("split", "task_index", "n", "p", "r").order_by()):
        s = sums[(split, index)]
        s[0], s[1], s[2] = s[0] + n, s[1] + passed, s[2] + reward
    for part in live(team, c):
        for split, index, n, passed, reward in (
                part.filter(target).filter(_scored_q(), task_index__isnull=False).values("split", "task_index")
                .annotate(n=Count("id"), p=Count("id", filter=Q(total_reward__gte=pass_reward)),
                          r=Sum("total_reward")).values_list("split", "task_index", "n", "p", "r").order_by()):
            s = sums[(split, index)]
            s[0], s[1], s[2] = s[0] + n, s[1] + passed, s[2] + reward
    # Rounded for the order only: a mean summed in another order may differ in its last bit, and
    # must still tie with its equal.
    ordered = sorted(((passed / n, reward / n, n, passed, split, index)
                      for (split, index), (n, passed, reward) in sums.items()),
                     key=lambda t: (t[0], round(t[1], 12), -t[2], t[4], t[5]))
    rows = [{"split": split, "task_index": index, "attempts": n, "passed": passed, "mean_reward": mean,
             "pass_rate": rate} for rate, mean, n, passed, split, index in ordered]
    count = len(rows)
    hardest = rows[:min(listed, math.ceil(count / 2))]
    easiest = rows[::-1][:min(listed, count // 2)]
    return count, hardest, easiest


def run_rows(*, team: Team, names: list[str] | None) -> dict[str, dict[str, Any]]:
    """Per run name (`names`, or every named run when None): sessions (n), scored, reward_sum, first
    and last creation time, over all time."""
    out: dict[str, dict[str, Any]] = {}
    rolled_rows, live_rows = SessionRollup.objects.filter(team=team), Session.objects.filter(team=team, rolled_up=False)
    if names is None:
        rolled_rows, live_rows = rolled_rows.exclude(run_name=""), live_rows.exclude(run_name="")
    else:
        rolled_rows, live_rows = rolled_rows.filter(run_name__in=names), live_rows.filter(run_name__in=names)

    def add(name: str, n: int, scored: int, reward: float | None, first: datetime, last: datetime) -> None:
        r = out.get(name)
        if r is None:
            out[name] = {"n": n, "scored": scored, "reward_sum": reward or 0.0, "first": first, "last": last}
            return
        r["n"] += n
        r["scored"] += scored
        r["reward_sum"] += reward or 0.0
        r["first"], r["last"] = min(r["first"], first), max(r["last"], last)

    for row in (rolled_rows.values("run_name")
                .annotate(n=Sum("episodes"), s=Sum("scored"), r=Sum("reward_sum"), f=Min("first_created_at"),
                          la=Max("last_created_at"))
                .values_list("run_name", "n", "s", "r", "f", "la").order_by()):
        add(*row)
    for row in (live_rows.values("run_name")
                .annotate(n=Count("id"), s=Count("id", filter=Q(total_reward__isnull=False)),
                          r=Sum("total_reward"), f=Min("created_at"), la=Max("created_at"))
                .values_list("run_name", "n", "s", "r", "f", "la").order_by()):
        add(*row)
    return out
