"""Team analytics pages: overview, one environment, the session explorer and a trajectory, plus the
explorer's exports. Thin: parse filters, call selectors, turn numbers into charts."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from orsplatform.analytics import charts, export, selectors
from orsplatform.analytics.filters import (
    RANGE_LABELS,
    SESSION_PARAMS,
    WINDOW_PARAMS,
    parse_page,
    parse_session_filters,
    parse_version,
    parse_window,
)
from orsplatform.analytics.services import rollup_nudge
from orsplatform.episodes.models import Session
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


def _team(request: HttpRequest, slug: str) -> Team:
    team, _role = team_for_user(user=request.user, slug=slug)
    return team


def _fail(request: HttpRequest, template: str, context: dict[str, Any], exc: ValidationError) -> HttpResponse:
    """Bad filters: the page again with the problems spelled out and no numbers (400, not 500)."""
    return render(request, template, {**context, "errors": exc.messages}, status=400)


@login_required
def index(request: HttpRequest) -> HttpResponse:
    teams = teams_for_user(user=request.user)
    if len(teams) == 1:
        return redirect("analytics:overview", team=teams[0][0].slug)
    return render(request, "analytics/team_list.html", {"teams": teams})


@login_required
def overview(request: HttpRequest, team: str) -> HttpResponse:
    team_obj = _team(request, team)
    context: dict[str, Any] = {"team": team_obj, "tab": "overview"}
    try:
        window = parse_window(request.GET)
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
    context.update(_range_context(request, window))
    context.update({
        "data": data,
        "totals": data["totals"],
        "error_rate_pct": _pct(data["totals"]["error_rate"]),
        "success_rate_pct": _pct(data["totals"]["success_rate"]),
        "charts": {
            "sessions": charts.time_series(
                times, [("Sessions", [p["sessions"] for p in data["per_period"]])],
                title="Sessions started", y_label="Sessions (count)", granularity=gran, counts=True),
            "calls": charts.time_series(
                times, [("Tool calls", [p["tool_calls"] for p in data["per_period"]]),
                        ("Errors", [p["errors"] for p in data["per_period"]])],
                title="Tool calls and errors", y_label="Tool calls (count)", granularity=gran, counts=True),
            "environments": charts.bars(
                [(e["environment"], e["sessions"]) for e in data["top_environments"]],
                title="Sessions per environment", x_label="Sessions (count)"),
            "keys": charts.bars(
                [(k["name"], k["tool_calls"]) for k in data["api_keys"] if k["tool_calls"] or k["sessions"]],
                title="Tool calls per API key", x_label="Tool calls (count)"),
        },
    })
    return render(request, "analytics/overview.html", context)


@login_required
def environment(request: HttpRequest, team: str, env_team: str, env_slug: str) -> HttpResponse:
    team_obj = _team(request, team)
    env = selectors.environment_for_report(team=team_obj, env_team=env_team, env_slug=env_slug)
    if env is None:
        raise Http404("No such environment.")
    context: dict[str, Any] = {"team": team_obj, "tab": "environment", "environment": env}
    errors: list[str] = []
    window = None
    try:
        window = parse_window(request.GET)
    except ValidationError as exc:
        errors.extend(exc.messages)
    version = parse_version((request.GET.get("version") or "").strip()[:20], environment=env, errors=errors)
    context.update(_range_context(request, window))
    context["versions"] = list(env.versions.order_by("-number").values_list("number", flat=True))
    if errors:
        return _fail(request, "analytics/environment.html", context, ValidationError(errors))
    rollup_nudge()
    data = selectors.environment_report(team=team_obj, environment=env, version=version, window=window)
    gran = data["span"]["granularity"]
    times = [p["t"] for p in data["per_period"]]
    lat_times = [p["t"] for p in data["latency_per_period"]]
    explore = {"environment": env.full_name, **window.query()}
    if version is not None:
        explore["version"] = str(version.number)
    context.update({
        "data": data,
        "version": version,
        "totals": data["totals"],
        "success_rate_pct": _pct(data["totals"]["success_rate"]),
        "error_rate_pct": _pct(data["totals"]["error_rate"]),
        "explore_url": reverse("analytics:sessions", args=[team_obj.slug]) + "?" + urlencode(explore),
        "version_links": [{"number": n, "url": "?" + urlencode({**window.query(), "version": n}),
                           "active": version is not None and version.number == n} for n in context["versions"]],
        "all_versions_url": "?" + urlencode(window.query()),
        "charts": {
            "rewards": charts.histogram(
                data["reward_histogram"], title="Reward distribution",
                x_label="Total reward per episode (reward units)", y_label="Episodes (count)"),
            "mean_reward": charts.time_series(
                times, [("Mean reward", [p["mean_reward"] for p in data["per_period"]])], title="Mean reward over time",
                y_label="Mean reward (per episode)", granularity=gran),
            "success": charts.time_series(
                times, [("Success rate", [_pct(p["success_rate"]) for p in data["per_period"]])],
                title="Success rate over time", y_label="Success rate (%)", granularity=gran, percent=True),
            "lengths": charts.histogram(
                data["episode_length_histogram"], title="Episode length distribution",
                x_label="Episode length (tool calls per episode)", y_label="Episodes (count)", integer_edges=True),
            "tools": charts.bars([(t["name"], t["calls"]) for t in data["tools"]], title="Tool usage",
                                 x_label="Tool calls (count)"),
            "latency": charts.time_series(
                lat_times, [(name, [p[key] for p in data["latency_per_period"]])
                            for name, key in (("p50", "p50"), ("p95", "p95"), ("p99", "p99"))],
                title="Tool-call latency percentiles", y_label="Latency (ms)", granularity=data["latency_granularity"]),
            "splits": charts.bars([(s["split"] or "(none)", _pct(s["pass_rate"])) for s in data["splits"]],
                                  title="Pass rate per split", x_label="Pass rate (% of scored episodes)", percent=True),
        },
    })
    for row in (*data["hardest_tasks"], *data["easiest_tasks"], *data["splits"]):
        row["pass_rate_pct"] = _pct(row["pass_rate"])
    return render(request, "analytics/environment.html", context)


@login_required
def sessions(request: HttpRequest, team: str) -> HttpResponse:
    team_obj = _team(request, team)
    context: dict[str, Any] = {
        "team": team_obj, "tab": "sessions", "statuses": Session.Status.values,
        "environments": selectors.environments_for_team(team=team_obj),
        "api_keys": list(team_obj.api_keys.order_by("name")),
        "form": {name: request.GET.get(name, "")[:200] for name in SESSION_PARAMS},
    }
    try:
        filters = parse_session_filters(request.GET, team=team_obj)
    except ValidationError as exc:
        return _fail(request, "analytics/sessions.html", {**context, **_range_context(request, None)}, exc)
    context.update(_range_context(request, filters.window))
    try:
        page = selectors.sessions_page(team=team_obj, filters=filters, page=parse_page(request.GET))
    except ValidationError as exc:
        return _fail(request, "analytics/sessions.html", context, exc)
    query = filters.query()
    context.update({
        "page": page,
        "query": urlencode(query),
        "prev_url": "?" + urlencode({**query, "page": page["page"] - 1}) if page["page"] > 1 else None,
        "next_url": "?" + urlencode({**query, "page": page["page"] + 1}) if page["page"] < page["pages"] else None,
        "export_jsonl": reverse("analytics:export_jsonl", args=[team_obj.slug]) + "?" + urlencode(query),
        "export_parquet": reverse("analytics:export_parquet", args=[team_obj.slug]) + "?" + urlencode(query),
    })
    return render(request, "analytics/sessions.html", context)


@login_required
def session_detail(request: HttpRequest, team: str, sid: str) -> HttpResponse:
    team_obj = _team(request, team)
    trajectory = selectors.session_trajectory(team=team_obj, sid=sid)
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
    })


def _export(request: HttpRequest, team: str, writer) -> HttpResponse:
    team_obj = _team(request, team)
    try:
        filters = parse_session_filters(request.GET, team=team_obj)
    except ValidationError as exc:
        return HttpResponse("Cannot export: " + " ".join(exc.messages) + "\n", status=400,
                            content_type="text/plain; charset=utf-8")
    return writer(request, team=team_obj, filters=filters)


@login_required
def export_jsonl(request: HttpRequest, team: str) -> HttpResponse:
    return _export(request, team, export.jsonl_response)


@login_required
def export_parquet(request: HttpRequest, team: str) -> HttpResponse:
    return _export(request, team, export.parquet_response)
