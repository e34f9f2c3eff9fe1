"""Reads of the analytics app. Every function takes the caller's team, and every query starts from
it, so no page, API endpoint or export can reach another team's sessions.

Session-level numbers (sessions, rewards, pass rates, episode lengths, splits, tasks) come from the
hourly session rollups plus the sessions not rolled up yet (session_rollup.py); tool-call numbers
from the hourly/daily call rollups (models.py). No page aggregates the Session or ToolCall table
over its window.

Results are plain dicts and lists (datetimes left as datetimes) so the pages and the REST API
serve the same numbers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import DateTimeField, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from orsplatform.analytics import latency, session_rollup
from orsplatform.analytics import order as episode_order
from orsplatform.analytics.filters import Window, environment_q
from orsplatform.analytics.models import (
    TOOL_CALLS_CURSOR,
    CallRollup,
    LatencyRollup,
    RollupCursor,
    SessionRollup,
)
from orsplatform.catalog.hidden import redact
from orsplatform.catalog.models import Environment, EnvironmentVersion, Split, Task
from orsplatform.catalog.selectors import task_text
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import ApiKey, Team

ENDED = (Session.Status.DELETED, Session.Status.EXPIRED, Session.Status.LOST)
OPEN = (Session.Status.CREATING, Session.Status.READY)
TOP_ENVIRONMENTS = 10
TASKS_LISTED = 10


def pass_reward() -> float:
    """An episode passes when its total reward reaches this (ORS_ANALYTICS_PASS_REWARD, default 1)."""
    return float(getattr(settings, "ORS_ANALYTICS_PASS_REWARD", 1.0))


# --- time buckets -----------------------------------------------------------------------------------

def granularity_for(start: datetime, end: datetime) -> str:
    span = end - start
    if span <= timedelta(hours=3):
        return "minute"
    if span <= timedelta(days=3):
        return "hour"
    if span <= timedelta(days=400):
        return "day"
    return "week"


def floor_to(moment: datetime, granularity: str) -> datetime:
    moment = moment.astimezone(UTC)
    if granularity == "minute":
        return moment.replace(second=0, microsecond=0)
    if granularity == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if granularity == "week":  # ISO weeks start on Monday, like the databases' week truncation
        return day - timedelta(days=day.weekday())
    return day


def step_of(granularity: str) -> timedelta:
    return {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1),
            "week": timedelta(days=7)}[granularity]


_step = step_of


GRANULARITIES = ("minute", "hour", "day", "week")


def rollup_granularity(span: Span, finest: str) -> str:
    """The granularity of a series read from rollups: fitted to the counted range (which can be far
    longer than the sessions' span), never finer than the rollup itself (`finest`)."""
    fitted = granularity_for(span.count_start, span.count_end)
    return max(fitted, finest, key=GRANULARITIES.index)


def periods(start: datetime, end: datetime, granularity: str) -> list[datetime]:
    out, moment, step = [], floor_to(start, granularity), _step(granularity)
    while moment < end:
        out.append(moment)
        moment += step
    return out


def _trunc(field: str, granularity: str) -> Trunc:
    return Trunc(field, granularity, output_field=DateTimeField(), tzinfo=UTC)


def _key(moment: datetime | None) -> datetime | None:
    # SQLite hands truncated datetimes back naive or in another zone object; normalise for lookups.
    if moment is None:
        return None
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


@dataclass(frozen=True)
class Span:
    """What a report draws (start, end, granularity: fitted to the sessions) and what it counts
    (count_start, count_end: the window, from its first session on, up to now). Tool calls are
    counted over the latter: they go on after the last session of a window started."""

    start: datetime
    end: datetime
    granularity: str
    count_start: datetime
    count_end: datetime
    window_start: datetime | None = None

    @property
    def periods(self) -> list[datetime]:
        return periods(self.start, self.end, self.granularity)

    def rollup_periods(self, granularity: str) -> list[datetime]:
        """Periods of a series read from rollups (hourly calls, daily latency): the whole counted range,
        widened to at least MIN_POINTS periods where the window allows."""
        step = step_of(granularity)
        last = floor_to(self.count_end, granularity)
        start = min(floor_to(self.count_start, granularity), last - step * (MIN_POINTS - 1))
        if self.window_start is not None:
            start = max(start, floor_to(self.window_start, granularity))
        return periods(start, self.count_end, granularity)

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "granularity": self.granularity}


MIN_POINTS = 12


def resolve_span(*, team: Team, window: Window) -> Span:
    """The part of a window that holds data: from the window's first session to its last (or now,
    while sessions are open), so the time axis fits the data — minutes when the data spans an hour,
    weeks when it spans years — and "all time" or a window of 1970–2999 draws only the time that has
    sessions. A short run is widened to at least MIN_POINTS periods so a chart is never a single dot."""
    now = timezone.now()
    end = min(window.end, now)
    sessions = Session.objects.filter(team=team, created_at__lt=end)
    if window.start is not None:
        sessions = sessions.filter(created_at__gte=window.start)
    bounds = sessions.aggregate(first=Min("created_at"), last=Max("created_at"))
    first, last = _key(bounds["first"]), _key(bounds["last"])
    if first is None:  # no sessions in the window: a day, or the window when it is shorter
        start = window.start if window.start is not None and end - timedelta(days=1) < window.start < end else (
            end - timedelta(days=1))
        return Span(start=start, end=end, granularity=granularity_for(start, end), count_start=start, count_end=end,
                    window_start=window.start)
    # Counted: the window from the day of the team's first session on (a window of 1970–2999 counts,
    # and draws rollups over, the time that has data, not a thousand years).
    ever = floor_to(_key(Session.objects.filter(team=team).aggregate(m=Min("created_at"))["m"]), "day")
    count_start = ever if window.start is None else max(window.start, ever)
    if Session.objects.filter(team=team, status__in=OPEN).exists():
        last = end  # a run in progress: the axis reaches the present
    gran = granularity_for(first, last)
    step = step_of(gran)
    start, stop = floor_to(first, gran), floor_to(last, gran) + step
    missing = MIN_POINTS - round((stop - start) / step)
    if missing > 0:  # widen into the past first (the future has no data), within the window
        start -= step * missing
        if window.start is not None and start < floor_to(window.start, gran):
            start = floor_to(window.start, gran)
    return Span(start=start, end=min(stop, end), granularity=gran, count_start=count_start, count_end=end,
                window_start=window.start)


def _ratio(part: int | None, whole: int | None) -> float | None:
    return (part or 0) / whole if whole else None


# --- rollup freshness ------------------------------------------------------------------------------

def rollup_status() -> dict[str, Any]:
    """How current the tool-call figures are: when the rollup last ran, and whether newer calls wait.
    Deliberately no count: the backlog is the whole platform's, and its size would tell one team how
    busy the others are."""
    cursor = RollupCursor.objects.filter(name=TOOL_CALLS_CURSOR).values("last_id", "last_run_at").first()
    last_id = cursor["last_id"] if cursor else 0
    newest = ToolCall.objects.order_by("-id").values_list("id", flat=True).first() or 0
    return {"last_run_at": cursor["last_run_at"] if cursor else None, "behind": newest > last_id}


# --- building blocks -------------------------------------------------------------------------------

def _sessions(team: Team, span: Span) -> QuerySet[Session]:
    return Session.objects.filter(team=team, created_at__gte=span.start, created_at__lt=span.end)


def _call_rollups(team: Team, span: Span) -> QuerySet[CallRollup]:
    # A rollup hour is counted when it starts inside the window (the window's first partial hour too).
    return CallRollup.objects.filter(team=team, hour__gte=floor_to(span.count_start, "hour"), hour__lt=span.count_end)


class _Tally(dict):
    """Adds up grouped rows; missing measures count as zero."""

    def add(self, row: dict[str, Any], fields: tuple[str, ...]) -> None:
        for f in fields:
            self[f] = self.get(f, 0) + (row.get(f) or 0)

    def summary(self) -> dict[str, Any]:
        scored, calls = self.get("scored", 0), self.get("calls", 0)
        return {
            "sessions": self.get("n", 0), "scored_episodes": scored,
            "mean_reward": self.get("reward_sum", 0) / scored if scored else None,
            "success_rate": _ratio(self.get("passed", 0), scored),
            "tool_calls": calls, "errors": self.get("errors", 0), "error_rate": _ratio(self.get("errors", 0), calls),
        }


SESSION_FIELDS = ("n", "ended", "scored", "passed", "reward_sum")
CALL_FIELDS = ("calls", "errors")


def _environment_names(ids: set[int]) -> dict[int, str]:
    return {e.id: e.full_name for e in Environment.objects.filter(id__in=ids).select_related("team")}


# --- overview --------------------------------------------------------------------------------------

def overview(*, team: Team, window: Window) -> dict[str, Any]:
    with session_rollup.one_snapshot():
        return _overview(team=team, window=window)


def _overview(*, team: Team, window: Window) -> dict[str, Any]:
    span = resolve_span(team=team, window=window)
    gran = span.granularity
    # Two reads in all: the window's session measures (rollups plus the sessions not rolled up)
    # and its tool-call rollups, each grouped by time bucket, environment and API key; every table
    # and chart is a sum over those groups.
    session_rows = session_rollup.overview_rows(team=team, c=session_rollup.cut(span.start, span.end, gran),
                                                granularity=gran, pass_reward=pass_reward())
    call_gran = rollup_granularity(span, "hour")
    call_rows = _call_rollups(team, span).annotate(t=_trunc("hour", call_gran)).values(
        "t", "environment_id", "api_key_ref").annotate(calls=Sum("calls"), errors=Sum("errors")).order_by()

    total, by_t, by_env, by_key = _Tally(), defaultdict(_Tally), defaultdict(_Tally), defaultdict(_Tally)
    calls_t: dict[datetime, _Tally] = defaultdict(_Tally)
    for row in session_rows:
        for tally in (total, by_t[_key(row["t"])], by_env[row["environment_id"]], by_key[row["key"]]):
            tally.add(row, SESSION_FIELDS)
    for row in call_rows:
        for tally in (total, calls_t[_key(row["t"])], by_env[row["environment_id"]], by_key[row["api_key_ref"]]):
            tally.add(row, CALL_FIELDS)

    fine = call_gran == gran
    per_period = [{"t": moment, "sessions": by_t[moment].get("n", 0),
                   "tool_calls": calls_t[moment].get("calls", 0) if fine else None,
                   "errors": calls_t[moment].get("errors", 0) if fine else None} for moment in span.periods]
    calls_per_period = [{"t": moment, "tool_calls": calls_t[moment].get("calls", 0),
                         "errors": calls_t[moment].get("errors", 0)}
                        for moment in span.rollup_periods(call_gran)]
    totals = {**total.summary(), "open_now": Session.objects.filter(team=team, status__in=OPEN).count()}

    top = sorted(by_env.items(), key=lambda kv: (-kv[1].get("n", 0), -kv[1].get("calls", 0), kv[0]))[:TOP_ENVIRONMENTS]
    names = _environment_names({env_id for env_id, _ in top})
    top_environments = [{"environment": names.get(env_id, "?"), **tally.summary()} for env_id, tally in top]

    api_keys = []
    for key in ApiKey.objects.filter(team=team).order_by("-created_at"):
        tally = by_key.pop(key.id, _Tally())
        api_keys.append({"name": key.name, "prefix": key.prefix, "revoked": key.revoked_at is not None,
                         "last_used_at": key.last_used_at, **_key_usage(tally)})
    leftover = _Tally()
    for tally in by_key.values():  # sessions without a key, or of keys deleted since
        leftover.add(tally, SESSION_FIELDS + CALL_FIELDS)
    if leftover:
        api_keys.append({"name": "(no key or deleted key)", "prefix": None, "revoked": True, "last_used_at": None,
                         **_key_usage(leftover)})
    api_keys.sort(key=lambda k: (-k["tool_calls"], -k["sessions"], k["name"]))

    return {"window": window.as_dict(), "span": span.as_dict(), "totals": totals, "per_period": per_period,
            "calls_granularity": call_gran, "calls_per_period": calls_per_period,
            "top_environments": top_environments, "api_keys": api_keys, "rollup": rollup_status()}


def _key_usage(tally: _Tally) -> dict[str, int]:
    return {"sessions": tally.get("n", 0), "tool_calls": tally.get("calls", 0), "errors": tally.get("errors", 0)}


# --- one environment -------------------------------------------------------------------------------

def environment_report(*, team: Team, environment: Environment, version: EnvironmentVersion | None,
                       window: Window, sealed_reader: int | None = None) -> dict[str, Any]:
    """The environment's numbers from the team's sessions. `sealed_reader`: the team whose sealed
    splits' specs the viewer reads (catalog/hidden.py: a publish key's team, a publisher's on the
    web), for the listed tasks' text."""
    with session_rollup.one_snapshot():
        return _environment_report(team=team, environment=environment, version=version, window=window,
                                   sealed_reader=sealed_reader)


def _environment_report(*, team: Team, environment: Environment, version: EnvironmentVersion | None,
                        window: Window, sealed_reader: int | None) -> dict[str, Any]:
    span = resolve_span(team=team, window=window)
    gran = span.granularity
    target = environment_q(environment, version)
    scored = _sessions(team, span).filter(target).filter(status__in=ENDED, total_reward__isnull=False)
    threshold = pass_reward()
    cut = session_rollup.cut(span.start, span.end, gran)

    # One grouped read (rollups plus the sessions not in them) for the time series, the totals and
    # the histograms' ranges.
    per_t = session_rollup.merge_period_rows(session_rollup.environment_period_rows(
        team=team, c=cut, target=target, granularity=gran, pass_reward=threshold), key=_key)
    total = _Tally()
    for row in per_t.values():
        total.add(row, SESSION_FIELDS)
    lows = [r["reward_min"] for r in per_t.values() if r["reward_min"] is not None]
    highs = [r["reward_max"] for r in per_t.values() if r["reward_max"] is not None]
    longest = max((r["calls_max"] for r in per_t.values() if r["calls_max"] is not None), default=None)
    per_period = []
    for moment in span.periods:
        r = per_t.get(moment)
        n = r["scored"] if r else 0
        per_period.append({"t": moment, "episodes": n, "mean_reward": (r["reward_sum"] or 0) / n if n else None,
                           "success_rate": _ratio(r["passed"], n) if n else None})

    # 200 episodes inside a minute fill one time bucket: the reward and pass-rate charts then go by
    # episode order instead, so they still draw a line (analytics/order.py). Only then are the
    # episodes read one by one: fewer than three buckets hold them all.
    per_episode: list[dict[str, Any]] = []
    if episode_order.wants_episode_order(buckets_with_data=sum(1 for p in per_period if p["episodes"]),
                                 episodes=total.get("scored", 0)):
        per_episode = episode_order.group_in_order(
            scored.order_by("created_at", "id").values_list("total_reward", flat=True).iterator(chunk_size=5000),
            pass_reward=threshold)
    reward_histogram, length_histogram = session_rollup.histograms(
        team=team, c=cut, target=target, scored=total.get("scored", 0), ended=total.get("ended", 0),
        lo=min(lows, default=None), hi=max(highs, default=None), longest=longest)

    calls = _tool_figures(team, span, target)
    splits = session_rollup.splits(team=team, c=cut, target=target, pass_reward=threshold)
    task_count, hardest, easiest = session_rollup.tasks(team=team, c=cut, target=target, pass_reward=threshold,
                                                        listed=TASKS_LISTED)
    _add_task_text(environment, scored, hardest + easiest, sealed_reader=sealed_reader)

    summary = total.summary()
    return {
        "environment": environment.full_name,
        "version": version.number if version else None,
        "versions": list(EnvironmentVersion.objects.filter(environment=environment).order_by("-number")
                         .values_list("number", flat=True)),
        "window": window.as_dict(), "span": span.as_dict(), "pass_reward": threshold,
        "totals": {
            "sessions": summary["sessions"], "ended_episodes": total.get("ended", 0),
            "scored_episodes": summary["scored_episodes"], "mean_reward": summary["mean_reward"],
            "success_rate": summary["success_rate"],
            "tool_calls": calls["calls"], "errors": calls["errors"], "error_rate": _ratio(calls["errors"], calls["calls"]),
            "latency": calls["latency"],
        },
        "reward_histogram": reward_histogram,
        "episode_length_histogram": length_histogram,
        "per_period": per_period,
        "per_episode": per_episode,
        "latency_granularity": calls["latency_granularity"],
        "latency_per_period": calls["latency_per_period"],
        "tools": calls["tools"],
        "splits": splits,
        "tasks_scored": task_count,
        "hardest_tasks": hardest,
        "easiest_tasks": easiest,
        "rollup": rollup_status(),
    }


def _tool_figures(team: Team, span: Span, target: Q) -> dict[str, Any]:
    """Tool calls: counts from the hourly rollup, latency from the daily bucket counts."""
    tools = {r["name"]: r for r in _call_rollups(team, span).filter(target).values("name").annotate(
        calls=Sum("calls"), errors=Sum("errors"), timed=Sum("timed_calls"), latency_sum=Sum("latency_ms_sum")).order_by()}
    lat_gran = rollup_granularity(span, "day")
    lat = LatencyRollup.objects.filter(team=team, day__gte=floor_to(span.count_start, "day"),
                                       day__lt=span.count_end).filter(target)
    lat_t = lat.values("day") if lat_gran == "day" else lat.annotate(day=_trunc("day", lat_gran)).values("day")
    by_period: dict[datetime, dict[int, int]] = defaultdict(dict)
    for row in lat_t.values("day", "bucket").annotate(n=Sum("count")).order_by():
        by_period[floor_to(_key(row["day"]), lat_gran)][row["bucket"]] = row["n"]
    by_tool: dict[str, dict[int, int]] = defaultdict(dict)
    overall: dict[int, int] = {}
    for row in lat.values("name", "bucket").annotate(n=Sum("count")).order_by():
        by_tool[row["name"]][row["bucket"]] = row["n"]
        overall[row["bucket"]] = overall.get(row["bucket"], 0) + row["n"]
    latency_per_period = []
    for moment in span.rollup_periods(lat_gran):
        hist = by_period.get(moment, {})
        latency_per_period.append({"t": moment, "calls": sum(hist.values()), **latency.percentiles(hist)})
    tool_rows = []
    for name, r in sorted(tools.items(), key=lambda kv: (-kv[1]["calls"], kv[0])):
        tool_rows.append({
            "name": name, "calls": r["calls"], "errors": r["errors"], "error_rate": _ratio(r["errors"], r["calls"]),
            "mean_latency_ms": (r["latency_sum"] / r["timed"]) if r["timed"] else None,
            **latency.percentiles(by_tool.get(name, {})),
        })
    return {"tools": tool_rows, "calls": sum(r["calls"] for r in tools.values()),
            "errors": sum(r["errors"] for r in tools.values()), "latency": latency.percentiles(overall),
            "latency_granularity": lat_gran, "latency_per_period": latency_per_period}


def _add_task_text(environment: Environment, sessions: QuerySet[Session], rows: list[dict[str, Any]],
                   sealed_reader: int | None = None) -> None:
    """Each listed task's text: from the catalog's task row, else from a session that ran it (a split
    replaced since keeps its old sessions' specs)."""
    if not rows:
        return
    # Per split an index list, so each lookup is a probe of the (split, index) unique index; an OR of
    # (name, index) pairs across a join makes PostgreSQL scan the split's million tasks.
    split_rows = list(Split.objects.filter(environment=environment, name__in={r["split"] for r in rows})
                      .values_list("name", "id", "hidden_fields", "sealed"))
    split_ids = {name: split_id for name, split_id, _, _ in split_rows}
    # docs/hidden-tasks.md: hidden fields are dropped for every viewer (the owning team's keys and
    # pages too: the hub's task pages are where its publishers read them), and a sealed split's tasks
    # are told only to a reader of the owning team's sealed specs. The sessions' own copies are
    # stored without the hidden fields already, and say whether their split was sealed.
    reads_sealed = sealed_reader is not None and sealed_reader == environment.team_id
    hiding = {name: frozenset(fields or ()) for name, _, fields, _ in split_rows}
    sealed = set() if reads_sealed else {name for name, _, _, is_sealed in split_rows if is_sealed}
    wanted = Q(pk__in=[])
    for name, split_id in split_ids.items():
        wanted |= Q(split_id=split_id, index__in=[r["task_index"] for r in rows if r["split"] == name])
    names = {split_id: name for name, split_id in split_ids.items()}
    specs = {(names[split_id], index): spec for split_id, index, spec in Task.objects.filter(wanted)
             .values_list("split_id", "index", "spec")}
    for r in rows:
        spec = specs.get((r["split"], r["task_index"]))
        withheld = r["split"] in sealed
        if spec is None:
            spec, was_sealed = (sessions.filter(split=r["split"], task_index=r["task_index"])
                                .values_list("task_spec", "sealed").first()) or (None, False)
            withheld = withheld or (was_sealed and not reads_sealed)
        if withheld:
            r["task_text"] = "(sealed split)"
            continue
        r["task_text"] = task_text(redact(spec, hiding.get(r["split"], frozenset()))) if spec is not None else ""


def environment_for_report(*, team: Team, env_team: str, env_slug: str) -> Environment | None:
    from orsplatform.analytics.filters import environment_visible_to

    return environment_visible_to(team=team, full_name=f"{env_team}/{env_slug}")


def open_sessions_exist(*, team: Team, environment: Environment) -> bool:
    return Session.objects.filter(team=team, environment=environment, status__in=OPEN).exists()


def environments_for_team(*, team: Team) -> list[Environment]:
    """Environments to offer in filters: the team's own and those its sessions ran on."""
    # Every session is in the session rollup or not rolled up (the partial index's few rows): two
    # small reads instead of a pass over the team's sessions.
    used = {*SessionRollup.objects.filter(team=team).values_list("environment_id", flat=True).distinct().order_by(),
            *Session.objects.filter(team=team, rolled_up=False).values_list("environment_id", flat=True)
            .distinct().order_by()}
    return list(Environment.objects.filter(Q(team=team) | Q(id__in=used)).select_related("team")
                .order_by("team__slug", "slug"))


# --- session explorer ------------------------------------------------------------------------------
