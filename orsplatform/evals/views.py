"""Evaluation pages: a team's runs, its agents (add, ping /meta, remove), a run page with live
progress, and leaderboards. Thin: parse, call services and selectors, render.

Roles (teams/selectors.py): viewers only look; members also launch, cancel and resume runs and ping
agents; owners and admins also add and remove agents. A refused action answers 403, and the page
leaves out the buttons its reader may not use."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from orsplatform.analytics import charts, order
from orsplatform.catalog.models import Environment
from orsplatform.evals import selectors, services
from orsplatform.evals.forms import AgentForm, RunForm
from orsplatform.evals.models import EvalRun
from orsplatform.teams.models import Team
from orsplatform.teams.selectors import can_act, can_manage, team_for_user, teams_for_user


def _team(request: HttpRequest, slug: str, *, manage: bool = False, act: bool = False) -> Team:
    team, role = team_for_user(user=request.user, slug=slug)
    if manage and not can_manage(user=request.user, role=role):
        raise PermissionDenied("Only owners and admins manage agents.")
    if act and not can_act(user=request.user, role=role):
        raise PermissionDenied("Viewers cannot launch, cancel or resume runs or ping agents.")
    return team


def _abilities(request: HttpRequest, team: Team) -> dict[str, bool]:
    """What the page may offer its reader (the views refuse the rest with 403 anyway)."""
    _, role = team_for_user(user=request.user, slug=team.slug)
    return {"can_act": can_act(user=request.user, role=role), "can_manage": can_manage(user=request.user, role=role)}


def _run(team: Team, run_id: int) -> EvalRun:
    run = selectors.run_of_team(team=team, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    return run


@login_required
def index(request: HttpRequest) -> HttpResponse:
    teams = teams_for_user(user=request.user)
    if len(teams) == 1:
        return redirect("evals:runs", team=teams[0][0].slug)
    return render(request, "evals/team_list.html", {"teams": teams})


@login_required
def runs(request: HttpRequest, team: str) -> HttpResponse:
    team_obj = _team(request, team, act=request.method == "POST")
    agents = selectors.agents_of_team(team=team_obj)
    form = RunForm(agents=agents)
    if request.method == "POST":
        form = RunForm(request.POST, agents=agents)
        if form.is_valid():
            data = dict(form.cleaned_data)
            agent = selectors.agent_of_team(team=team_obj, agent_id=data.pop("agent"))
            try:
                if agent is None:
                    raise ValidationError("No such agent.")
                launched = services.eval_run_launch(team=team_obj, agent=agent, **data)
            except ValidationError as exc:
                form.add_error(None, exc)
            else:
                return redirect("evals:run", team=team_obj.slug, run_id=launched.id)
    rows = [{"run": r, **selectors.run_numbers(run=r)} for r in selectors.runs_of_team(team=team_obj)]
    return render(request, "evals/runs.html", {
        "team": team_obj, "rows": rows, "form": form, "agents": agents, **_abilities(request, team_obj),
        "boards": selectors.leaderboard_boards(team=team_obj)}, status=400 if form.errors else 200)


@login_required
def agents(request: HttpRequest, team: str) -> HttpResponse:
    team_obj = _team(request, team, manage=request.method == "POST")
    form = AgentForm()
    if request.method == "POST":
        form = AgentForm(request.POST)
        if form.is_valid():
            try:
                agent = services.agent_register(team=team_obj, **form.cleaned_data)
            except ValidationError as exc:
                form.add_error(None, exc)
            else:
                messages.success(request, f"Agent {agent.name} registered (AAP version "
                                          f"{agent.meta.get('protocol_version', 1)}).")
                return redirect("evals:agents", team=team_obj.slug)
    return render(request, "evals/agents.html", {"team": team_obj, "form": form, **_abilities(request, team_obj),
                                                 "agents": selectors.agents_of_team(team=team_obj)},
                  status=400 if form.errors else 200)


def _agent(team: Team, agent_id: int):
    agent = selectors.agent_of_team(team=team, agent_id=agent_id)
    if agent is None:
        raise Http404("No such agent.")
    return agent


@login_required
@require_POST
def agent_ping_view(request: HttpRequest, team: str, agent_id: int) -> HttpResponse:
    team_obj = _team(request, team, act=True)
    agent = _agent(team_obj, agent_id)
    try:
        meta = services.agent_ping(agent=agent)
    except ValidationError as exc:
        messages.error(request, f"Ping of {agent.name} failed: {' '.join(exc.messages)}")
    else:
        messages.success(request, f"{agent.name} answered /meta: version {meta.get('version', '?')}, "
                                  f"AAP version {meta.get('protocol_version', '?')}.")
    return redirect("evals:agents", team=team_obj.slug)


@login_required
@require_POST
def agent_remove_view(request: HttpRequest, team: str, agent_id: int) -> HttpResponse:
    team_obj = _team(request, team, manage=True)
    agent = _agent(team_obj, agent_id)
    services.agent_remove(agent=agent)
    messages.success(request, f"Agent {agent.name} removed.")
    return redirect("evals:agents", team=team_obj.slug)


def _progress_chart(run_obj: EvalRun):
    """Pass rate as the episodes end, so far and over the latest episodes (a window of at least 10,
    so a run of single-episode points does not zigzag between 0 and 100 %), drawn while the run goes
    on: the page's live region refetches it."""
    series = selectors.completion_series(run=run_obj)
    passed = [e["passed"] for e in series]
    groups = order.group_in_order([e["reward"] for e in series], passed=passed)
    labels = [order.order_label(g) for g in groups]
    per = max((g["episodes"] for g in groups), default=1)
    window = max(10, per)
    latest = [sum(passed[max(0, g["last"] - window):g["last"]]) / min(window, g["last"]) * 100 for g in groups]
    return charts.lines(
        labels, [f"episodes {label} (in the order they ended)" for label in labels],
        [("Pass rate so far", [g["cumulative_success_rate"] * 100 for g in groups]),
         (f"Pass rate of the latest {window} episodes", latest)],
        title="Pass rate as episodes end", x_label="Episodes, in the order they ended"
        + (f" (up to {per} per point)" if per > 1 else ""), y_label="Pass rate (%)", percent=True, y_max=100.0,
        note="No episode has ended yet.")


def _page_number(request: HttpRequest) -> int:
    raw = request.GET.get("page", "1")
    return int(raw) if raw.isdigit() and len(raw) < 9 else 1


@login_required
def run(request: HttpRequest, team: str, run_id: int) -> HttpResponse:
    team_obj = _team(request, team)
    run_obj = _run(team_obj, run_id)
    detail = selectors.run_detail(run=run_obj)
    histogram = charts.histogram(selectors.reward_histogram(run=run_obj), title="Reward per episode",
                                 x_label="Reward", y_label="Episodes (count)")
    outcome = request.GET.get("outcome", "")
    if outcome not in (*selectors.OUTCOMES, "unscored"):
        outcome = ""
    episodes = selectors.episodes_page(run=run_obj, page=_page_number(request), outcome=outcome,
                                       per_page=selectors.EPISODES_PER_PAGE)
    base = reverse("evals:run", args=[team_obj.slug, run_obj.id])
    keep = {"outcome": outcome} if outcome else {}
    return render(request, "evals/run.html", {
        "team": team_obj, "run": run_obj, "d": detail, "histogram": histogram, **_abilities(request, team_obj),
        "unscored": detail["total"] - detail["done"], "live": run_obj.is_active,
        "progress_chart": _progress_chart(run_obj), "episodes": episodes,
        "outcome_links": [{"key": key, "label": label, "url": base + ("?" + urlencode({"outcome": key}) if key else "") + "#episodes",
                           "active": key == outcome}
                          for key, label in (("", "all"), *selectors.OUTCOMES.items(), ("unscored", "not scored yet"))],
        "prev_url": base + "?" + urlencode({**keep, "page": episodes["page"] - 1}) + "#episodes"
        if episodes["page"] > 1 else None,
        "next_url": base + "?" + urlencode({**keep, "page": episodes["page"] + 1}) + "#episodes"
        if episodes["page"] < episodes["pages"] else None,
        "slowest": selectors.slowest_episodes(run=run_obj), "failed": selectors.failed_episodes(run=run_obj)})


@login_required
def run_progress(request: HttpRequest, team: str, run_id: int) -> JsonResponse:
    return JsonResponse(selectors.run_detail(run=_run(_team(request, team), run_id)))


@login_required
@require_POST
def run_cancel(request: HttpRequest, team: str, run_id: int) -> HttpResponse:
    team_obj = _team(request, team, act=True)
    try:
        services.eval_run_cancel(run=_run(team_obj, run_id))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    return redirect("evals:run", team=team_obj.slug, run_id=run_id)


@login_required
@require_POST
def run_resume(request: HttpRequest, team: str, run_id: int) -> HttpResponse:
    team_obj = _team(request, team, act=True)
    run_obj = _run(team_obj, run_id)
    # The run's secrets were not kept: the resume form asks for each of them again.
    secrets = {name: request.POST.get(f"secret:{name}", "") for name in run_obj.secret_names} or None
    try:
        services.eval_run_resume(run=run_obj, secrets=secrets)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    return redirect("evals:run", team=team_obj.slug, run_id=run_id)


@login_required
def leaderboard(request: HttpRequest, team: str, env_team: str, env_slug: str) -> HttpResponse:
    team_obj = _team(request, team)
    environment = (Environment.objects.filter(team__slug=env_team, slug=env_slug)
                   .filter(visibility=Environment.Visibility.PUBLIC).first()
                   or Environment.objects.filter(team=team_obj, team__slug=env_team, slug=env_slug).first())
    if environment is None:
        raise Http404("No such environment.")
    splits = sorted({b["split"] for b in selectors.leaderboard_boards(team=team_obj)
                     if b["environment_id"] == environment.id})
    split = (request.GET.get("split") or (splits[0] if splits else "test"))[:100]
    rows = selectors.leaderboard(team=team_obj, environment_id=environment.id, split=split)
    return render(request, "evals/leaderboard.html", {
        "team": team_obj, "environment": f"{env_team}/{env_slug}", "split": split, "splits": splits, "rows": rows,
        "sealed": selectors.split_is_sealed(environment_id=environment.id, split=split)})
