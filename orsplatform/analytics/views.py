"""Team analytics pages: overview, one environment, the session explorer and a trajectory, plus the
explorer's exports. Thin: parse filters, call selectors, turn numbers into charts."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse

from orsplatform.analytics import charts, explorer, export, order, selectors
from orsplatform.analytics.filters import (
    OUTCOMES,
    RANGE_LABELS,
    SESSION_PARAMS,
    SORTS,
    WINDOW_PARAMS,
    parse_explorer_params,
    parse_report_params,
    parse_session_filters,
)
from orsplatform.analytics.services import rollup_nudge
from orsplatform.episodes.models import Session
from orsplatform.flags.selectors import flags_for_team
from orsplatform.hub.selectors import PUBLISHER_ROLES
from orsplatform.teams.models import Team
from orsplatform.teams.selectors import team_for_user, teams_for_user


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def _range_context(request: HttpRequest, window, *, action: str = "") -> dict[str, Any]:
    """The time-range selector: quick ranges as links that keep the page's other filters, and a
    from/to form for custom dates. `action` sends the choice to another page (a trajectory has no
    time range of its own, so its selector opens the explorer)."""
    keep = {k: v for k, v in request.GET.items() if k not in (*WINDOW_PARAMS, "page") and v} if not action else {}
    links = [{"label": label, "url": action + "?" + urlencode({**keep, "range": key}),
              "active": window is not None and window.preset == key} for key, label in RANGE_LABELS.items()]
    return {
        "range_links": links,
        "range_keep": keep,
        "range_start": request.GET.get("start", "")[:40],
        "range_end": request.GET.get("end", "")[:40],
        "window": window,
        "window_qs": urlencode(window.query()) if window is not None else "",
        "range_action": action,
    }


def _task_page(env, split: str, index: int) -> str | None:
    """The task's environment page; None for a split name no URL can carry (sessions may name any)."""
    try:
        return reverse("hub:task", args=[env.team.slug, env.slug, split, index])
    except NoReverseMatch:
        return None


def _team(request: HttpRequest, slug: str) -> Team:
    team, _role = team_for_user(user=request.user, slug=slug)
    return team


def _team_and_reader(request: HttpRequest, slug: str) -> tuple[Team, int | None]:
    """The team, and the team whose sealed splits' specs the user reads (catalog/hidden.py): its
    own for its publishers, as on the hub's task pages; None for its viewers."""
    team, role = team_for_user(user=request.user, slug=slug)
    return team, team.id if request.user.is_superuser or role in PUBLISHER_ROLES else None


def _fail(request: HttpRequest, template: str, context: dict[str, Any], exc: ValidationError) -> HttpResponse:
    """Bad filters: the page again with the problems spelled out and no numbers (400, not 500)."""
    return render(request, template, {**context, "errors": exc.messages}, status=400)


@login_required
def index(request: HttpRequest) -> HttpResponse:
    teams = teams_for_user(user=request.user)
    # The site navigation's "Runs" comes here too (?to=runs): team slugs own the next path segment.
    target = "analytics:runs" if request.GET.get("to") == "runs" else "analytics:overview"
    if len(teams) == 1:
        return redirect(target, team=teams[0][0].slug)
    return render(request, "analytics/team_list.html", {"teams": teams, "target": target})


@login_required
def overview(request: HttpRequest, team: str) -> HttpResponse:
    team_obj = _team(request, team)
    context: dict[str, Any] = {"team": team_obj, "tab": "overview"}
    try:
        window = parse_report_params(request.GET).window
    except ValidationError as exc:
        return _fail(request, "analytics/overview.html", {**context, **_range_context(request, None)}, exc)
    rollup_nudge()
    data = selectors.overview(team=team_obj, window=window)
    times = [p["t"] for p in data["per_period"]]
    gran = data["span"]["granularity"]
    query = urlencode(window.query())
    for env in data["top_environments"]:
        env_team, _, env_slug = env["environment"].partition("/")
        env["url"] = reverse("analytics:environment", args=[team_obj.slug, env_team, env_slug]) + "?" + query
        env["page_url"] = reverse("hub:environment", args=[env_team, env_slug])
    context.update(_range_context(request, window))
    # Per-environment and per-key numbers are tables only: a bar chart beside them would repeat them.
    context.update({
        "data": data,
        "live": data["totals"]["open_now"] > 0,
        "totals": data["totals"],
        "error_rate_pct": _pct(data["totals"]["error_rate"]),
        "success_rate_pct": _pct(data["totals"]["success_rate"]),
        "charts": {
            "sessions": charts.time_series(
                times, [("Sessions", [p["sessions"] for p in data["per_period"]])],
                title="Sessions started", y_label="Sessions (count)", granularity=gran, counts=True),
            "calls": charts.time_series(
                [p["t"] for p in data["calls_per_period"]],
                [("Tool calls", [p["tool_calls"] for p in data["calls_per_period"]]),
                 ("Errors", [p["errors"] for p in data["calls_per_period"]])],
                title="Tool calls and errors", y_label="Tool calls (count)", granularity=data["calls_granularity"],
                counts=True),
        },
    })
    return render(request, "analytics/overview.html", context)


@login_required
def environment(request: HttpRequest, team: str, env_team: str, env_slug: str) -> HttpResponse:
    team_obj, reader = _team_and_reader(request, team)
    env = selectors.environment_for_report(team=team_obj, env_team=env_team, env_slug=env_slug)
    if env is None:
        raise Http404("No such environment.")
    context: dict[str, Any] = {"team": team_obj, "tab": "environment", "environment": env,
                               "page_url": reverse("hub:environment", args=[env.team.slug, env.slug])}
    context["versions"] = list(env.versions.order_by("-number").values_list("number", flat=True))
    try:
        params = parse_report_params(request.GET, environment=env)
    except ValidationError as exc:
        context.update(_range_context(request, None))
        return _fail(request, "analytics/environment.html", context, exc)
    window, version = params.window, params.version
    context.update(_range_context(request, window))
    rollup_nudge()
    data = selectors.environment_report(team=team_obj, environment=env, version=version, window=window,
                                        sealed_reader=reader)
    gran = data["span"]["granularity"]
    times = [p["t"] for p in data["per_period"]]
    lat_times = [p["t"] for p in data["latency_per_period"]]
    explore = {"environment": env.full_name, **window.query()}
    if version is not None:
        explore["version"] = str(version.number)
    explorer = reverse("analytics:sessions", args=[team_obj.slug])
    for row in (*data["hardest_tasks"], *data["easiest_tasks"]):
        row["sessions_url"] = explorer + "?" + urlencode({**explore, "split": row["split"], "task": row["task_index"]})
        row["task_url"] = _task_page(env, row["split"], row["task_index"])
    # Tools and splits are tables only: a bar chart beside them would repeat the same numbers.
    context.update({
        "data": data,
        "live": selectors.open_sessions_exist(team=team_obj, environment=env),
        "flags": flags_for_team(team=team_obj, environment=env, limit=50),
        "version": version,
        "totals": data["totals"],
        "success_rate_pct": _pct(data["totals"]["success_rate"]),
        "error_rate_pct": _pct(data["totals"]["error_rate"]),
        "explore_url": explorer + "?" + urlencode(explore),
        "version_links": [{"number": n, "url": "?" + urlencode({**window.query(), "version": n}),
                           "active": version is not None and version.number == n} for n in context["versions"]],
        "all_versions_url": "?" + urlencode(window.query()),
        "charts": {
            "rewards": charts.histogram(
                data["reward_histogram"], title="Reward distribution",
                x_label="Total reward per episode (reward units)", y_label="Episodes (count)"),
            **_reward_charts(data, times, gran),
            "lengths": charts.histogram(
                data["episode_length_histogram"], title="Episode length distribution",
                x_label="Episode length (tool calls per episode)", y_label="Episodes (count)", integer_edges=True),
            "latency": charts.time_series(
                lat_times, [(name, [p[key] for p in data["latency_per_period"]])
                            for name, key in (("p50", "p50"), ("p95", "p95"), ("p99", "p99"))],
                title="Tool-call latency percentiles", y_label="Latency (ms)", granularity=data["latency_granularity"]),
        },
    })
    for row in (*data["hardest_tasks"], *data["easiest_tasks"], *data["splits"]):
        row["pass_rate_pct"] = _pct(row["pass_rate"])
    return render(request, "analytics/environment.html", context)


def _reward_charts(data: dict[str, Any], times: list, gran: str) -> dict[str, Any]:
    """Mean reward and success rate over time, or over episode order when the episodes crowd into
    too few time buckets to draw a line (the selector then fills per_episode)."""
    groups = data["per_episode"]
    if not groups:
        return {
            "mean_reward": charts.time_series(
                times, [("Mean reward", [p["mean_reward"] for p in data["per_period"]])], title="Mean reward over time",
                y_label="Mean reward (per episode)", granularity=gran),
            "success": charts.time_series(
                times, [("Success rate", [_pct(p["success_rate"]) for p in data["per_period"]])],
                title="Success rate over time", y_label="Success rate (%)", granularity=gran, percent=True),
        }
    labels = [order.order_label(g) for g in groups]
    names = [f"episode {label}" if g["episodes"] == 1 else f"episodes {label}" for g, label in zip(groups, labels,
                                                                                                      strict=True)]
    per = max(g["episodes"] for g in groups)
    x_label = "Episode (in the order started)" + (f", up to {per} per point" if per > 1 else "")
    return {
        "mean_reward": charts.lines(
            labels, names, [("Mean reward", [g["mean_reward"] for g in groups])], title="Mean reward by episode order",
            x_label=x_label, y_label="Mean reward (per episode)"),
        "success": charts.lines(
            labels, names, [("Success rate", [_pct(g["success_rate"]) for g in groups])],
            title="Success rate by episode order", x_label=x_label, y_label="Success rate (%)", percent=True,
            y_max=100.0),
    }


def _sort_links(request: HttpRequest, query: dict[str, str], sort: str) -> dict[str, dict[str, str]]:
    """Per column: the URL that sorts by it (again: the other way) and the arrow of the current sort."""
    links = {}
    for column in SORTS:
        current = sort.lstrip("-") == column
        descending = sort.startswith("-")
        wanted = (column if descending else "-" + column) if current else (
            column if column in ("session", "environment", "task", "api_key", "outcome") else "-" + column)
        links[column] = {"url": "?" + urlencode({**query, "sort": wanted}),
                         "arrow": ("↓" if descending else "↑") if current else ""}
    return links


@login_required
def sessions(request: HttpRequest, team: str) -> HttpResponse:
    team_obj, reader = _team_and_reader(request, team)
    context: dict[str, Any] = {
        "team": team_obj, "tab": "sessions", "outcomes": list(OUTCOMES), "protocols": Session.Protocol.values,
        "environments": selectors.environments_for_team(team=team_obj),
        "api_keys": list(team_obj.api_keys.order_by("name")),
        "form": {name: request.GET.get(name, "")[:200] for name in SESSION_PARAMS},
    }
    try:
        params = parse_explorer_params(request.GET, team=team_obj)
    except ValidationError as exc:
        try:  # keep the time-range selector usable when only another filter is wrong
            window = parse_report_params(request.GET).window
        except ValidationError:
            window = None
        return _fail(request, "analytics/sessions.html", {**context, **_range_context(request, window)}, exc)
    filters = params.filters
    context.update(_range_context(request, filters.window))
    try:
        page = explorer.sessions_page(team=team_obj, filters=filters, page=params.page, sort=params.sort,
                                       sealed_reader=reader)
    except ValidationError as exc:
        return _fail(request, "analytics/sessions.html", context, exc)
    query = filters.query()
    sorted_query = {**query, "sort": params.sort} if params.sort != "-started" else query
    context.update({
        "page": page,
        "live": any(s["open"] for s in page["sessions"]),
        "query": urlencode(sorted_query),
        "sort_links": _sort_links(request, query, params.sort),
        "prev_url": "?" + urlencode({**sorted_query, "page": page["page"] - 1}) if page["page"] > 1 else None,
        "next_url": "?" + urlencode({**sorted_query, "page": page["page"] + 1}) if page["page"] < page["pages"] else None,
        "export_jsonl": reverse("analytics:export_jsonl", args=[team_obj.slug]) + "?" + urlencode(query),
        "export_parquet": reverse("analytics:export_parquet", args=[team_obj.slug]) + "?" + urlencode(query),
    })
    return render(request, "analytics/sessions.html", context)


@login_required
def session_detail(request: HttpRequest, team: str, sid: str) -> HttpResponse:
    team_obj, reader = _team_and_reader(request, team)
    trajectory = explorer.session_trajectory(team=team_obj, sid=sid, sealed_reader=reader)
    if trajectory is None:
        raise Http404("No such session.")
    cumulative, total = [], 0.0
    for call in trajectory["tool_calls"]:
        total += call["reward"] or 0.0
        cumulative.append(total)
    steps = [str(c["step"]) for c in trajectory["tool_calls"]]
    reward_chart = charts.lines(
        steps, [f"step {s}" for s in steps], [("Cumulative reward", cumulative)], title="Reward by step",
        x_label="Step (tool call number)", y_label="Cumulative reward",
        note="This session made no tool calls.")
    env_team, _, env_slug = trajectory["environment"].partition("/")
    return render(request, "analytics/session_detail.html", {
        **_range_context(request, None, action=reverse("analytics:sessions", args=[team_obj.slug])),
        "team": team_obj, "tab": "sessions", "s": trajectory, "reward_chart": reward_chart,
        "environment_url": reverse("analytics:environment", args=[team_obj.slug, env_team, env_slug]),
        "page_url": reverse("hub:environment", args=[env_team, env_slug]), "live": trajectory["open"],
    })


def _export(request: HttpRequest, team: str, writer) -> HttpResponse:
    team_obj, reader = _team_and_reader(request, team)
    try:
        filters = parse_session_filters(request.GET, team=team_obj)
    except ValidationError as exc:
        return HttpResponse("Cannot export: " + " ".join(exc.messages) + "\n", status=400,
                            content_type="text/plain; charset=utf-8")
    return writer(request, team=team_obj, filters=filters, sealed_reader=reader)


@login_required
def export_jsonl(request: HttpRequest, team: str) -> HttpResponse:
    return _export(request, team, export.jsonl_response)


@login_required
def export_parquet(request: HttpRequest, team: str) -> HttpResponse:
    return _export(request, team, export.parquet_response)
