"""Evaluation reads. Everything tenant-owned takes `team=`: another team's agent or run is the
same as a missing one."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, F, Q, Sum

from orsplatform.catalog.models import Split
from orsplatform.evals.models import Agent, EvalEpisode, EvalRun
from orsplatform.evals.stats import mean_interval, wilson
from orsplatform.teams.models import Team

HISTOGRAM_BINS = 10


def agents_of_team(*, team: Team) -> list[Agent]:
    return list(Agent.objects.filter(team=team, deleted_at__isnull=True).order_by("name"))


def agent_of_team(*, team: Team, agent_id: int) -> Agent | None:
    return Agent.objects.filter(team=team, id=agent_id, deleted_at__isnull=True).first()


def agent_by_name(*, team: Team, name: str) -> Agent | None:
    agent = Agent.objects.filter(team=team, name=name, deleted_at__isnull=True).first()
    if agent is None and name.isdigit():
        agent = agent_of_team(team=team, agent_id=int(name))
    return agent


def run_of_team(*, team: Team, run_id: int) -> EvalRun | None:
    return (EvalRun.objects.filter(team=team, id=run_id)
            .select_related("agent", "environment__team", "version").first())


def runs_of_team(*, team: Team, limit: int = 50) -> list[EvalRun]:
    return list(EvalRun.objects.filter(team=team).select_related("agent", "environment__team", "version")
                .order_by("-created_at")[:limit])


def _interval(pair: tuple[float, float] | None) -> list[float] | None:
    return None if pair is None else [round(pair[0], 6), round(pair[1], 6)]


# How a scored episode ended, in the words of the run page. A fault (the agent, the environment or
# the protocol broke the episode) is not a low score: an agent that answered wrongly scored nothing,
# it did not fail. The four are disjoint and add up to the scored episodes.
OUTCOMES = {
    "passed": "passed",
    "partial": "scored below the pass threshold",
    "zero": "scored nothing",
    "fault": "ended by a fault (agent, environment or protocol)",
}


def _outcome_q(outcome: str) -> Q:
    clean = Q(error="")
    nothing = Q(reward__isnull=True) | Q(reward__lte=0)
    return {
        "passed": Q(passed=True),
        "partial": Q(passed=False) & clean & ~nothing,
        "zero": Q(passed=False) & clean & nothing,
        "fault": Q(passed=False) & ~clean,
    }[outcome]


def episode_outcome(e: EvalEpisode) -> str | None:
    if e.status != EvalEpisode.Status.SCORED:
        return None
    if e.passed:
        return "passed"
    if e.error:
        return "fault"
    return "zero" if e.reward is None or e.reward <= 0 else "partial"


def run_numbers(*, run: EvalRun) -> dict[str, Any]:
    """Progress and scores of a run, in one aggregate over its episodes. A scored episode without a
    reward (the agent failed before any) counts as reward 0."""
    scored = Q(status=EvalEpisode.Status.SCORED)
    agg = EvalEpisode.objects.filter(run=run).aggregate(
        done=Count("id", filter=scored),
        running=Count("id", filter=Q(status=EvalEpisode.Status.RUNNING)),
        # Aliases differ from the fields they count: an alias named like a field shadows it in the
        # other aggregates' filters.
        passes=Count("id", filter=scored & Q(passed=True)),
        failed=Count("id", filter=scored & ~Q(error="")),
        **{f"outcome_{name}": Count("id", filter=scored & _outcome_q(name)) for name in OUTCOMES if name != "passed"},
        reward_sum=Sum("reward", filter=scored),
        reward_sq=Sum(F("reward") * F("reward"), filter=scored),
        turns=Sum("turns", filter=scored),
        tool_calls=Sum("tool_calls", filter=scored),
        input_tokens=Sum("input_tokens", filter=scored),
        output_tokens=Sum("output_tokens", filter=scored),
    )
    done = agg["done"]
    mean, interval = mean_interval(done, agg["reward_sum"] or 0.0, agg["reward_sq"] or 0.0)
    return {
        "total": run.total,
        "done": done,
        "running": agg["running"],
        "passed": agg["passes"],
        "errors": agg["failed"],
        # Disjoint with passed: scored below the threshold, scored nothing, ended by a fault.
        "partial": agg["outcome_partial"],
        "zero_reward": agg["outcome_zero"],
        "faults": agg["outcome_fault"],
        "pass_rate": agg["passes"] / done if done else None,
        "pass_rate_interval": _interval(wilson(agg["passes"], done)),
        "mean_reward": round(mean, 6) if mean is not None else None,
        "mean_reward_interval": _interval(interval),
        "turns": agg["turns"] or 0,
        "tool_calls": agg["tool_calls"] or 0,
        "input_tokens": agg["input_tokens"],
        "output_tokens": agg["output_tokens"],
    }


def episode_row(e: EvalEpisode) -> dict[str, Any]:
    return {"task_index": e.task_index, "status": e.status, "outcome": episode_outcome(e), "sid": e.sid or None,
            "reward": e.reward,
            "passed": e.passed, "finished": e.finished, "stop_reason": e.stop_reason or None,
            "error": e.error or None, "turns": e.turns, "tool_calls": e.tool_calls,
            "input_tokens": e.input_tokens, "output_tokens": e.output_tokens, "duration_s": e.duration_s}


def run_episodes(*, run: EvalRun, offset: int = 0, limit: int = 1000) -> list[EvalEpisode]:
    return list(EvalEpisode.objects.filter(run=run).order_by("task_index")[offset:offset + limit])


def run_detail(*, run: EvalRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "status": run.status,
        "error": run.error or None,
        "agent": {"id": run.agent_id, "name": run.agent.name},
        "environment": f"{run.environment.team.slug}/{run.environment.slug}",
        "version": run.version.number,
        "split": run.split,
        "start": run.start,
        "stop": run.stop,
        "concurrency": run.concurrency,
        "max_turns": run.max_turns,
        "pass_threshold": run.pass_threshold,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        **run_numbers(run=run),
    }


def reward_histogram(*, run: EvalRun) -> list[dict]:
    """Scored rewards in HISTOGRAM_BINS equal bins over their range (one bin per value when the
    rewards take few distinct values, as pass/fail environments do)."""
    rewards = [r or 0.0 for r in EvalEpisode.objects.filter(run=run, status=EvalEpisode.Status.SCORED)
               .values_list("reward", flat=True)]
    if not rewards:
        return []
    lo, hi = min(rewards), max(rewards)
    if hi == lo:
        return [{"lo": lo, "hi": lo + 1, "count": len(rewards)}]
    width = (hi - lo) / HISTOGRAM_BINS
    counts = [0] * HISTOGRAM_BINS
    for r in rewards:
        counts[min(HISTOGRAM_BINS - 1, int((r - lo) / width))] += 1
    return [{"lo": lo + i * width, "hi": lo + (i + 1) * width, "count": c} for i, c in enumerate(counts)]


EPISODES_PER_PAGE = 200


def episodes_page(*, run: EvalRun, page: int = 1, outcome: str = "",
                  per_page: int = EPISODES_PER_PAGE) -> dict[str, Any]:
    """Every episode of a run, a page at a time, in task order; `outcome` (a key of OUTCOMES, or
    "unscored") narrows it. Pages past the end are empty, never an error."""
    qs = EvalEpisode.objects.filter(run=run).defer("transcript")
    if outcome == "unscored":
        qs = qs.exclude(status=EvalEpisode.Status.SCORED)
    elif outcome in OUTCOMES:
        qs = qs.filter(status=EvalEpisode.Status.SCORED).filter(_outcome_q(outcome))
    total = qs.count()
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    rows = list(qs.order_by("task_index")[(page - 1) * per_page: page * per_page])
    return {"total": total, "page": page, "pages": pages, "outcome": outcome,
            "episodes": [{**episode_row(e), "label": OUTCOMES.get(episode_outcome(e) or "", e.status)} for e in rows]}


def completion_series(*, run: EvalRun) -> list[dict[str, Any]]:
    """Scored episodes in the order they ended (reward, passed), for the run's live chart."""
    return [{"reward": r or 0.0, "passed": p} for r, p in EvalEpisode.objects.filter(
        run=run, status=EvalEpisode.Status.SCORED).order_by("ended_at", "id").values_list("reward", "passed")]


def slowest_episodes(*, run: EvalRun, limit: int = 10) -> list[EvalEpisode]:
    return list(EvalEpisode.objects.filter(run=run, status=EvalEpisode.Status.SCORED, duration_s__isnull=False)
                .order_by("-duration_s")[:limit])


def failed_episodes(*, run: EvalRun, limit: int = 50) -> list[EvalEpisode]:
    return list(EvalEpisode.objects.filter(run=run, status=EvalEpisode.Status.SCORED)
                .exclude(error="").order_by("task_index")[:limit])


def leaderboard(*, team: Team, environment_id: int, split: str) -> list[dict[str, Any]]:
    """The team's runs on one environment and split with at least one scored episode, best pass rate
    first (then mean reward). One row per run: agents and versions are compared run by run."""
    runs = (EvalRun.objects.filter(team=team, environment_id=environment_id, split=split)
            .select_related("agent", "version").order_by("-created_at")[:200])
    rows = []
    for run in runs:
        numbers = run_numbers(run=run)
        if not numbers["done"]:
            continue
        rows.append({"run": run, "agent": run.agent.name, "version": run.version.number, **numbers})
    rows.sort(key=lambda r: (-(r["pass_rate"] or 0), -(r["mean_reward"] or 0), -r["done"]))
    return rows


def leaderboard_boards(*, team: Team) -> list[dict[str, Any]]:
    """The (environment, split) pairs the team has runs on, for the leaderboard index; each says
    whether its split is sealed (results on held-out tasks nobody outside the owners can read)."""
    boards = list(EvalRun.objects.filter(team=team).values("environment_id", "environment__team__slug",
                                                            "environment__slug", "split")
                  .annotate(runs=Count("id")).order_by("environment__team__slug", "environment__slug", "split"))
    sealed = set(Split.objects.filter(environment_id__in={b["environment_id"] for b in boards}, sealed=True)
                 .values_list("environment_id", "name"))
    for board in boards:
        board["sealed"] = (board["environment_id"], board["split"]) in sealed
    return boards


def split_is_sealed(*, environment_id: int, split: str) -> bool:
    return Split.objects.filter(environment_id=environment_id, name=split, sealed=True).exists()


def episode_for_session(*, team: Team, sid: str) -> EvalEpisode | None:
    """The evaluation episode that drove one of the team's sessions, for its trajectory page."""
    return (EvalEpisode.objects.filter(run__team=team, sid=sid).select_related("run__agent").first())
