"""Run pages: the team's training runs, one or several runs overlaid (reward, pass rate, episode
length and error rate against step, smoothed, per run or per run and split / version /
environment), the episodes behind a point, and a rollout's trajectory (the model's messages beside
the linked session's tool calls). Thin: parse, call runs.selectors, draw (run_curves, charts)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import quote, urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse

from orsplatform.analytics import charts, run_selectors
from orsplatform.analytics.explorer import call_row
from orsplatform.analytics.run_curves import METRICS, PER_CHOICES, SMOOTHING_CHOICES, build_curves, x_label
from orsplatform.flags.selectors import flags_for_team
from orsplatform.runs import selectors as runs
from orsplatform.runs.naming import RUN_NAME_MAX
from orsplatform.teams.models import Team
from orsplatform.teams.selectors import team_for_user

MAX_OVERLAID = 8
RUNS_PER_PAGE = 100
EPISODES_LISTED = 500
CHARTS = {
    "mean_reward": ("Mean reward", "Reward (mean per episode)", False),
    "pass_rate": ("Pass rate", "Pass rate (%)", True),
    "mean_length": ("Episode length", "Length (messages or tool calls)", False),
    "error_rate": ("Error rate", "Episodes with an error (%)", True),
}


def _team(request: HttpRequest, slug: str) -> Team:
    team, _role = team_for_user(user=request.user, slug=slug)
    return team


@dataclass(frozen=True)
class RunParams:
    names: list[str]
    environment: str | None
    version: int | None
    split: str | None
    per: str
    smooth: float

    def query(self, **override: Any) -> str:
        values: dict[str, Any] = {"run": self.names, "environment": self.environment or "",
                                  "version": "" if self.version is None else self.version, "split": self.split or "",
                                  "per": self.per, "smooth": self.smooth, **override}
        return urlencode({k: v for k, v in values.items() if v not in ("", None, [])}, doseq=True)


def parse_run_params(query: QueryDict) -> RunParams:
    """The run page's query string; every problem is collected into one ValidationError (a 400)."""
    errors = []
    names = list(dict.fromkeys(n for n in query.getlist("run") if n))
    if not names:
        errors.append("Choose at least one run (run=NAME).")
    if len(names) > MAX_OVERLAID:
        errors.append(f"At most {MAX_OVERLAID} runs can be overlaid; {len(names)} were given.")
    if any(len(n) > RUN_NAME_MAX for n in names):
        errors.append(f"A run name is at most {RUN_NAME_MAX} characters.")
    version_raw = query.get("version", "").strip()
    version = None
    if version_raw:
        if not version_raw.isdigit() or len(version_raw) > 9:
            errors.append(f"Version must be a version number, not {version_raw[:20]!r}.")
        else:
            version = int(version_raw)
    per = query.get("per", "run") or "run"
    if per not in PER_CHOICES:
        errors.append(f"Curves per must be one of {', '.join(PER_CHOICES)}.")
        per = "run"
    smooth_raw = query.get("smooth", "0") or "0"
    try:
        smooth = float(smooth_raw)
        if not 0 <= smooth < 1:
            raise ValueError
    except ValueError:
        errors.append(f"Smoothing is a number from 0 up to (not including) 1, not {smooth_raw[:20]!r}.")
        smooth = 0.0
    environment = query.get("environment", "").strip()[:200] or None
    split = query.get("split", "").strip()[:100] or None
    if errors:
        raise ValidationError(errors)
    return RunParams(names=names, environment=environment, version=version, split=split, per=per, smooth=smooth)


@login_required
def runs_list(request: HttpRequest, team: str) -> HttpResponse:
    team_obj = _team(request, team)
    raw_page = request.GET.get("page", "1")
    page = max(1, int(raw_page)) if raw_page.isdigit() and len(raw_page) < 9 else 1
    total, shown = run_selectors.runs_page(team=team_obj, page=page, per_page=RUNS_PER_PAGE)
    pages = max(1, -(-total // RUNS_PER_PAGE))
    if page > pages:  # past the end: the last page
        page = pages
        total, shown = run_selectors.runs_page(team=team_obj, page=page, per_page=RUNS_PER_PAGE)
    base = reverse("analytics:run", args=[team_obj.slug])
    return render(request, "analytics/runs.html", {
        "team": team_obj, "tab": "runs", "runs": [{"r": r, "url": base + "?" + urlencode({"run": r.name})}
                                                  for r in shown],
        "total": total, "page": page, "pages": pages,
        "prev_url": f"?page={page - 1}" if page > 1 else None, "next_url": f"?page={page + 1}" if page < pages else None,
        "compare_action": base,
    })


def _trajectory_url(team: Team, point: Any) -> str:
    # One reverse() per kind and page, not per point: a chart has thousands of points.
    bases = _trajectory_bases(team.slug)
    return bases[point.kind].replace("~ref~", quote(point.ref, safe=""))


@lru_cache(maxsize=256)
def _trajectory_bases(team_slug: str) -> dict[str, str]:
    return {"session": reverse("analytics:session", args=[team_slug, "~ref~"]),
            "rollout": reverse("analytics:rollout", args=[team_slug, "~ref~"])}


def _facet_filters(curve, params: RunParams) -> dict[str, Any]:
    """The page's filters narrowed to one curve (a curve per split / version / environment)."""
    narrowed: dict[str, Any] = {"run": [curve.run]}
    if curve.facet is None:
        return narrowed
    if params.per == "split":
        narrowed["split"] = "" if curve.facet == "(none)" else curve.facet
    elif params.per == "environment":
        narrowed["environment"] = curve.facet
    elif params.per == "version":
        env, _, number = curve.facet.rpartition("@")
        narrowed["environment"] = env
        narrowed["version"] = number if number.isdigit() else ""
    return narrowed


@login_required
def run_page(request: HttpRequest, team: str) -> HttpResponse:
    team_obj = _team(request, team)
    context: dict[str, Any] = {"team": team_obj, "tab": "runs", "per_choices": PER_CHOICES,
                               "smoothing_choices": SMOOTHING_CHOICES,
                               "runs_url": reverse("analytics:runs", args=[team_obj.slug])}
    try:
        params = parse_run_params(request.GET)
    except ValidationError as exc:
        return render(request, "analytics/run.html", {**context, "errors": exc.messages}, status=400)
    found = run_selectors.run_summaries(team=team_obj, names=params.names)
    if len(found) < len(params.names):
        raise Http404("No such run.")
    summaries = [found[name] for name in params.names]
    # Each run's series is read once, unfiltered: its facets fill the filter controls, and the
    # filters are applied to the points (no second pass over the database).
    everything = [(name, runs.run_series(team=team_obj, name=name)) for name in params.names]
    facets = run_selectors.facets_of(p for _, points in everything for p in points)
    series = [(name, run_selectors.filter_points(points, environment=params.environment, version=params.version,
                                                 split=params.split)) for name, points in everything]
    curves = build_curves(series, per=params.per)
    episodes_url = reverse("analytics:run_episodes", args=[team_obj.slug])
    drawn = {}
    for metric in METRICS:
        title, y_label, percent = CHARTS[metric]
        lines = []
        for curve in curves:
            curve_query = episodes_url + "?" + params.query(**_facet_filters(curve, params))
            points = []
            for p in curve.series(metric, params.smooth):
                if p["single"] is not None:
                    href = _trajectory_url(team_obj, p["single"])
                else:
                    href = f"{curve_query}&from={p['lo']}&to={p['hi']}"
                span = f"{p['lo']}" if p["lo"] == p["hi"] else f"{p['lo']}–{p['hi']}"
                value = "–" if p["y"] is None else charts.fmt(p["y"]) + ("%" if percent else "")
                p.update(href=href, label=f"{curve.label} · step {span}: {value} ({p['episodes']} "
                                          f"episode{'s' if p['episodes'] != 1 else ''}; click for the trajectories)")
                points.append(p)
            lines.append((curve.label, points))
        drawn[metric] = charts.xy_lines(lines, title=f"{title} by step", x_label=x_label(series), y_label=y_label,
                                        percent=percent, y_min=None if metric == "mean_reward" else 0,
                                        note="No episodes match these filters.")
    selected = params.query()
    context.update({
        # Reward-hacking and anomaly flags of the runs shown (orsplatform/flags, refreshed by beat).
        "flags": [f for name in params.names for f in flags_for_team(team=team_obj, run=name, limit=50)],
        "params": params, "summaries": summaries, "charts": drawn,
        "legend": [{"label": c.label, "color": charts.color_of(i), "episodes": c.episodes}
                   for i, c in enumerate(curves)],
        "environments": facets["environments"], "versions": facets["versions"], "splits": facets["splits"],
        "episodes_total": sum(len(points) for _, points in series),
        "all_episodes_url": episodes_url + "?" + selected,
        "api_urls": [f"/api/v1/runs/{quote(name, safe='')}" for name in params.names],
    })
    return render(request, "analytics/run.html", context)


@login_required
def run_episodes(request: HttpRequest, team: str) -> HttpResponse:
    """The episodes behind a point of a run chart (a step range of one run, with the page's
    filters), each linked to its trajectory."""
    team_obj = _team(request, team)
    context: dict[str, Any] = {"team": team_obj, "tab": "runs",
                               "runs_url": reverse("analytics:runs", args=[team_obj.slug])}
    try:
        params = parse_run_params(request.GET)
        lo, hi = (_bound(request.GET.get(k, "")) for k in ("from", "to"))
    except ValidationError as exc:
        return render(request, "analytics/run_episodes.html", {**context, "errors": exc.messages}, status=400)
    if len(run_selectors.run_summaries(team=team_obj, names=params.names)) < len(params.names):
        raise Http404("No such run.")
    rows = []
    for name in params.names:
        for p in runs.run_series(team=team_obj, name=name, environment=params.environment, version=params.version,
                                 split=params.split):
            if (lo is None or p.x >= lo) and (hi is None or p.x <= hi):
                rows.append({"run": name, "p": p, "url": _trajectory_url(team_obj, p),
                             "session_url": reverse("analytics:session", args=[team_obj.slug, p.session_sid])
                             if p.session_sid else None})
    context.update({"params": params, "lo": lo, "hi": hi, "total": len(rows), "rows": rows[:EPISODES_LISTED],
                    "back_url": reverse("analytics:run", args=[team_obj.slug]) + "?" + params.query()})
    return render(request, "analytics/run_episodes.html", context)


def _bound(raw: str) -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError(f"A step bound is a whole number, not {raw[:20]!r}.") from None
    if abs(value) > 2**31:
        raise ValidationError("A step bound is out of range.")
    return value


@login_required
def rollout_detail(request: HttpRequest, team: str, ref: str) -> HttpResponse:
    """A rollout's trajectory: the model's messages and, when the rollout is linked to a session of
    the same key and task, that session's tool calls. A bare session goes to its own page."""
    team_obj = _team(request, team)
    trajectory = runs.rollout_trajectory(team=team_obj, ref=ref[:128])
    if trajectory is None:
        raise Http404("No such rollout.")
    if trajectory.rollout is None:
        return redirect("analytics:session", team=team_obj.slug, sid=trajectory.session.sid)
    rollout = trajectory.rollout
    session = trajectory.session
    return render(request, "analytics/rollout.html", {
        "team": team_obj, "tab": "runs", "rollout": rollout, "messages": trajectory.messages,
        "session": session, "calls": [call_row(c, i + 1) for i, c in enumerate(trajectory.tool_calls)],
        "run_url": reverse("analytics:run", args=[team_obj.slug]) + "?" + urlencode({"run": rollout.run.name}),
        "session_url": reverse("analytics:session", args=[team_obj.slug, session.sid]) if session else None,
        "runs_url": reverse("analytics:runs", args=[team_obj.slug]),
    })
