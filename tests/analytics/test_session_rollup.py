"""The session rollups: the overview, environment and runs pages read the same figures from them as
from the sessions themselves, whenever sessions end (before or after a fold), across rebuilds and
batch sizes, and one team's rollups never reach another team's pages."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from orsplatform.analytics import run_selectors, selectors, services
from orsplatform.analytics.filters import Window
from orsplatform.analytics.models import SessionBucketRollup, SessionRollup, TaskRollup
from orsplatform.catalog.models import Environment
from orsplatform.catalog.selectors import version_handle
from orsplatform.episodes import services as episodes
from orsplatform.episodes.models import Session
from orsplatform.teams.auth import Caller
from orsplatform.teams.models import ApiKey
from tests.analytics.conftest import login
from tests.analytics.seed import make_environment

ENDED = ("deleted", "expired", "lost")
RUN_NAMES = ("run-a", "run-b", "", "g", "trainer")
REWARDS = [0.0, 0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 1.0, 1.0, None]


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


class Episodes:
    """Sessions opened and ended through the platform's own services (episodes.services), as the
    gateway writes them. The services stamp the present; created_at is moved back afterwards so
    the episodes spread over days (an UPDATE of the one column, as if they had started then)."""

    def __init__(self, seed: int, end: datetime, prefix: str = "") -> None:
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.end = end
        self.count = 0

    def open(self, *, key: ApiKey, version, created_at: datetime, run: str, split: str | None = None) -> int:
        self.count += 1
        split = split or self.rng.choice(["train", "test"])
        caller = Caller(team_id=key.team_id, team_slug=key.team.slug, api_key_id=key.id, api_key_name=key.name)
        pk = episodes.sessions_create(rows=[{
            "sid": f"{self.prefix}{key.team.slug}-{self.count}", "caller": caller, "env": version_handle(version_id=version.id),
            "task_spec": {"question": f"q{self.count}"}, "split": split, "index": self.rng.randrange(6),
            "runner": "", "run_name": run}])[0]
        Session.objects.filter(pk=pk).update(created_at=created_at)
        episodes.session_mark_ready(pk=pk, ready_at=timezone.now())
        return pk

    def end_one(self, pk: int, *, reward: float | None = None, calls: int | None = None, status: str = "deleted") -> None:
        reward = self.rng.choice(REWARDS) if reward is None and calls is None else reward
        calls = self.rng.randrange(1, 45) if calls is None else calls
        episodes.session_end(pk=pk, status=status, totals=episodes.SessionTotals(
            calls=calls, total_reward=reward, finished=reward is not None))

    def many(self, *, keys: list[ApiKey], versions: list, start: datetime, n: int, runs: list[str]) -> list[int]:
        """n episodes between start and self.end: most ended (deleted, expired, lost), some failed,
        some still open; returns the open ones."""
        still_open = []
        span = (self.end - start).total_seconds()
        for _ in range(n):
            created = start + timedelta(seconds=self.rng.uniform(0, span - 60))
            pk = self.open(key=self.rng.choice(keys), version=self.rng.choice(versions), created_at=created,
                           run=self.rng.choice(runs))
            fate = self.rng.random()
            if fate < 0.75:
                self.end_one(pk, status=self.rng.choice(ENDED))
            elif fate < 0.85:
                episodes.session_mark_failed(pk=pk, error="setup failed")
            else:
                still_open.append(pk)
        return still_open


@pytest.fixture
def world(owner, member, outsider):
    """acme (owner and member keys) and globex on acme/puzzle v1 and v2 and builtin/math, over
    three days up to a moment inside an hour (so windows end in a partial hour)."""
    end = _minute(timezone.now()) - timedelta(minutes=1)
    puzzle, (v1, v2) = make_environment(owner.team, "puzzle")
    math_env = Environment.objects.get(team__slug="builtin", slug="math")
    acme_keys = list(ApiKey.objects.filter(team=owner.team))
    globex_keys = list(ApiKey.objects.filter(team=outsider.team))
    eps = Episodes(38, end)
    start = end - timedelta(days=3)
    open_acme = eps.many(keys=acme_keys, versions=[v1, v2, math_env.current_version], start=start, n=160,
                         runs=["run-a", "run-b", ""])
    open_globex = eps.many(keys=globex_keys, versions=[math_env.current_version], start=start, n=40,
                           runs=["run-a", "g"])
    return {"eps": eps, "end": end, "start": start, "puzzle": puzzle, "v1": v1, "v2": v2, "math": math_env,
            "open": open_acme, "open_globex": open_globex, "acme": owner.team, "globex": outsider.team}


def windows(world) -> list[Window]:
    end = world["end"]
    return [
        Window(start=world["start"] - timedelta(minutes=7), end=end, preset=None),  # per hour, partial edges
        Window(start=end - timedelta(days=2, minutes=33), end=end - timedelta(hours=5, minutes=21), preset=None),
        Window(start=end - timedelta(hours=2, minutes=10), end=end, preset=None),  # per minute: read live
        Window(start=None, end=end, preset=None),
    ]


def figures(team, world) -> list:
    """Everything the overview, environment and runs pages show about sessions, per window."""
    out = []
    for window in windows(world):
        page = selectors.overview(team=team, window=window)
        page.pop("rollup")
        out.append(page)
        for env, version in ((world["puzzle"], None), (world["puzzle"], world["v1"]), (world["math"], None)):
            report = selectors.environment_report(team=team, environment=env, version=version, window=window)
            report.pop("rollup")
            out.append(report)
    out.append({name: dataclasses.asdict(summary) for name, summary in run_selectors.run_summaries(
        team=team, names=["run-a", "run-b", "", "g", "nope"]).items()})
    return out


def differences(a, b, path: str = "") -> list[str]:
    """Where two page dicts differ (for a readable failure); floats equal to 1e-9."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        # Sums of floats added in another order (per hour, then together) may differ in the last bit.
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def exact(team, window: Window, environment=None) -> dict:
    """The figures computed here, one session at a time, from the definitions (docs/analytics.md),
    over the sessions of the part of the window the page draws (its span)."""
    span = selectors.resolve_span(team=team, window=window)
    sessions = Session.objects.filter(team=team, created_at__gte=span.start, created_at__lt=span.end)
    if environment is not None:
        sessions = sessions.filter(environment=environment)
    rows = list(sessions.values_list("status", "total_reward", "calls", "split", "task_index"))
    scored = [r for r in rows if r[0] in ENDED and r[1] is not None]
    rewards = [r[1] for r in scored]
    bins = Counter(min(9, math.floor(r / 0.1 + 1e-9)) for r in rewards)
    ended = [r for r in rows if r[0] in ENDED]
    longest = max((r[2] for r in ended), default=0)
    width = 1 if longest <= 30 else math.ceil((longest + 1) / 20)
    lengths = Counter(min(int(longest // width), r[2] // width) for r in ended)
    by_split: dict[str, list] = defaultdict(list)
    for r in scored:
        by_split[r[3]].append(r[1])
    return {
        "sessions": len(rows), "scored": len(scored),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "success_rate": sum(1 for r in rewards if r >= 1) / len(rewards) if rewards else None,
        "reward_bins": [bins.get(i, 0) for i in range(10)] if rewards else [],
        "length_bins": [lengths.get(i, 0) for i in range(int(longest // width) + 1)] if ended else [],
        "splits": {s: (len(v), sum(1 for r in v if r >= 1), sum(v) / len(v)) for s, v in by_split.items()},
        "tasks": len({(r[3], r[4]) for r in scored if r[4] is not None}),
    }


def assert_exact(team, world) -> None:
    for window in windows(world):
        page = selectors.overview(team=team, window=window)
        truth = exact(team, window)
        assert page["totals"]["sessions"] == truth["sessions"]
        assert page["totals"]["scored_episodes"] == truth["scored"]
        assert page["totals"]["mean_reward"] == pytest.approx(truth["mean_reward"])
        assert page["totals"]["success_rate"] == pytest.approx(truth["success_rate"])
        assert sum(p["sessions"] for p in page["per_period"]) == truth["sessions"]
        report = selectors.environment_report(team=team, environment=world["puzzle"], version=None, window=window)
        truth = exact(team, window, world["puzzle"])
        assert report["totals"]["sessions"] == truth["sessions"]
        assert report["totals"]["scored_episodes"] == truth["scored"]
        assert report["totals"]["mean_reward"] == pytest.approx(truth["mean_reward"])
        assert [b["count"] for b in report["reward_histogram"]] == truth["reward_bins"]
        assert [b["count"] for b in report["episode_length_histogram"]] == truth["length_bins"]
        assert {s["split"]: (s["episodes"], s["passed"], pytest.approx(s["mean_reward"]))
                for s in report["splits"]} == truth["splits"]
        assert report["tasks_scored"] == truth["tasks"]


def exact_runs(team) -> dict:
    out = {}
    for name in RUN_NAMES:
        rows = list(Session.objects.filter(team=team, run_name=name).values_list("total_reward", "created_at"))
        if rows:
            rewards = [r for r, _ in rows if r is not None]
            out[name] = (len(rows), sum(rewards) / len(rewards) if rewards else None,
                         min(c for _, c in rows), max(c for _, c in rows))
    return out


def runs_seen(team) -> dict:
    found = run_selectors.run_summaries(team=team, names=list(RUN_NAMES))
    return {name: (s.episodes, s.mean_reward, s.first_seen, s.last_seen) for name, s in found.items()}


def test_the_pages_show_the_same_figures_from_the_rollups_as_from_the_sessions(world):
    acme, globex = world["acme"], world["globex"]
    live = figures(acme, world), figures(globex, world)
    assert SessionRollup.objects.count() == 0
    folded = services.session_rollup_run(batch_size=17)
    assert folded == Session.objects.filter(status__in=ENDED).count() > 100
    assert SessionRollup.objects.exists() and TaskRollup.objects.exists()
    # Only sessions still open or failed are left to read live.
    assert set(Session.objects.filter(rolled_up=False).values_list("status", flat=True)) <= {"ready", "failed"}
    assert differences((figures(acme, world), figures(globex, world)), live) == []
    assert_exact(acme, world)
    assert_exact(globex, world)
    assert differences(runs_seen(acme), exact_runs(acme)) == []
    assert differences(runs_seen(globex), exact_runs(globex)) == []


def test_sessions_that_end_after_a_fold_are_counted_once_before_and_after_the_next(world):
    services.session_rollup_run()
    eps, acme = world["eps"], world["acme"]
    # Sessions created days ago end only now, some with a reward recorded at their end.
    for i, pk in enumerate(world["open"]):
        eps.end_one(pk, reward=[1.0, 0.5, None, 0.0][i % 4], calls=3 + i, status=ENDED[i % 3])
    late_id = eps.open(key=ApiKey.objects.filter(team=acme).first(), version=world["v1"],
                       created_at=world["start"] + timedelta(hours=1), run="run-a", split="train")
    before = figures(acme, world)
    assert_exact(acme, world)
    assert differences(runs_seen(acme), exact_runs(acme)) == []
    assert services.session_rollup_run() == len(world["open"])
    assert differences(figures(acme, world), before) == []
    eps.end_one(late_id, reward=0.25, calls=9)
    assert_exact(acme, world)
    assert services.session_rollup_run() == 1 and services.session_rollup_run() == 0
    assert_exact(acme, world)
    assert differences(runs_seen(acme), exact_runs(acme)) == []


def _snapshot() -> tuple:
    return (sorted(SessionRollup.objects.values_list(
                "team_id", "environment_id", "version_id", "split", "run_name", "api_key_ref", "hour", "episodes",
                "scored", "passed", "reward_min", "reward_max", "calls_sum", "calls_max", "first_created_at",
                "last_created_at")),
            sorted(SessionBucketRollup.objects.values_list("team_id", "version_id", "hour", "kind", "bucket", "count")),
            sorted(TaskRollup.objects.values_list("team_id", "version_id", "split", "task_index", "hour", "attempts",
                                                  "passed")))


def test_a_rebuild_and_any_batch_size_give_the_same_rollups(world):
    services.session_rollup_run(batch_size=5)
    small = _snapshot()
    before = figures(world["acme"], world)
    services.session_rollup_rebuild()
    assert SessionRollup.objects.count() == 0 and not Session.objects.filter(rolled_up=True).exists()
    # Until the rebuild's fold has run, the pages read every session live, with the same figures.
    assert differences(figures(world["acme"], world), before) == []
    call_command("analytics_rollup", "--rebuild", "--settle", "0", stdout=open("/dev/null", "w"))
    assert _snapshot() == small
    assert differences(figures(world["acme"], world), before) == []


def test_a_session_moved_to_another_run_after_its_fold_moves_in_the_rollup(world):
    services.session_rollup_run()
    acme = world["acme"]
    ended = list(Session.objects.filter(team=acme, run_name="run-a", status__in=ENDED).order_by("created_at")
                 .values_list("pk", flat=True))
    # A rollout logged later claims these sessions for its run (runs.services links it): rolled-up
    # ones, one of them the run's first, and one still open.
    moved = [*ended[:5], ended[-1], world["open"][0]]
    for pk in moved:
        services.session_run_rename(pk=pk, run_name="trainer")
    assert Session.objects.filter(run_name="trainer").count() == len(moved)
    assert differences(runs_seen(acme), exact_runs(acme)) == []
    assert_exact(acme, world)
    services.session_rollup_run()
    moved_rollup = _snapshot()
    services.session_rollup_rebuild()
    services.session_rollup_run()
    assert _snapshot() == moved_rollup


def test_a_session_is_folded_into_its_own_teams_rollup_only(world):
    services.session_rollup_run()
    acme_sessions = Session.objects.filter(team=world["acme"])
    globex_sessions = Session.objects.filter(team=world["globex"])
    for team, sessions in ((world["acme"], acme_sessions), (world["globex"], globex_sessions)):
        rolled = SessionRollup.objects.filter(team=team)
        assert sum(rolled.values_list("episodes", flat=True)) == sessions.filter(status__in=ENDED).count()
        assert set(rolled.values_list("api_key_ref", flat=True)) <= set(
            ApiKey.objects.filter(team=team).values_list("id", flat=True))
    # Both teams ran builtin/math in the same hours: each page counts its own team's sessions only.
    window = windows(world)[0]
    for team, sessions in ((world["acme"], acme_sessions), (world["globex"], globex_sessions)):
        report = selectors.environment_report(team=team, environment=world["math"], version=None, window=window)
        assert report["totals"]["sessions"] == sessions.filter(environment=world["math"]).count()


def test_owner_and_member_see_their_teams_rolled_up_figures_and_an_outsider_sees_none(world, owner, member, outsider):
    services.session_rollup_run()
    acme_math = Session.objects.filter(team=world["acme"], environment=world["math"]).count()
    globex_math = Session.objects.filter(team=world["globex"], environment=world["math"]).count()
    assert acme_math != globex_math
    query = "?range=all"
    for person in (owner, member):
        page = login(person).get(f"/analytics/acme/environments/builtin/math/{query}")
        assert page.status_code == 200
        assert page.context["data"]["totals"]["sessions"] == acme_math
        api = login(person).get(f"/api/v1/analytics/environments/builtin/math{query}",
                                HTTP_X_API_KEY=person.token)
        assert api.status_code == 200 and api.json()["totals"]["sessions"] == acme_math
        overview = login(person).get(f"/api/v1/analytics/overview{query}", HTTP_X_API_KEY=person.token).json()
        assert overview["totals"]["sessions"] == Session.objects.filter(team=world["acme"]).count()
    assert login(outsider).get(f"/analytics/acme/environments/builtin/math/{query}").status_code == 404
    assert login(outsider).get(f"/analytics/acme/{query}").status_code == 404
    theirs = login(outsider).get(f"/api/v1/analytics/environments/builtin/math{query}",
                                 HTTP_X_API_KEY=outsider.token).json()
    assert theirs["totals"]["sessions"] == globex_math
    runs = login(outsider).get("/analytics/globex/runs/")
    assert runs.status_code == 200 and "run-b" not in runs.content.decode()


def test_rewards_outside_zero_to_one_are_binned_by_their_hundredth(owner, world):
    eps = Episodes(7, world["end"], prefix="scores-")
    env, (v1,) = make_environment(owner.team, "scores", versions=1)
    key = ApiKey.objects.filter(team=owner.team).first()
    rewards = [-3.5, -1.0, 0.0, 2.25, 2.25, 7.0, 10.0, 12.5, 4.0, 4.0, 6.5]
    start = world["end"] - timedelta(hours=30)
    for i, reward in enumerate(rewards):
        pk = eps.open(key=key, version=v1, created_at=start + timedelta(hours=i * 2, minutes=13), run="s")
        eps.end_one(pk, reward=reward, calls=i + 1)
    window = Window(start=start - timedelta(hours=1), end=world["end"], preset=None)
    live = selectors.environment_report(team=owner.team, environment=env, version=None, window=window)
    services.session_rollup_run()
    rolled = selectors.environment_report(team=owner.team, environment=env, version=None, window=window)
    lo, hi, width = -3.5, 12.5, 1.6
    expected = Counter(min(9, math.floor((r - lo) / width + 1e-9)) for r in rewards)
    for report in (live, rolled):
        assert [b["count"] for b in report["reward_histogram"]] == [expected.get(i, 0) for i in range(10)]
        assert report["reward_histogram"][0]["lo"] == lo and report["reward_histogram"][-1]["hi"] == hi
    live.pop("rollup"), rolled.pop("rollup")
    assert differences(rolled, live) == []


def test_the_beat_task_folds_ended_sessions_in_bounded_batches(world, monkeypatch, settings):
    from orsplatform.analytics.tasks import rollup_sessions
    from orsplatform.celery import app

    monkeypatch.setitem(app.conf, "task_always_eager", True)
    monkeypatch.setattr(services, "DEFAULT_SESSION_BATCH", 10)
    ended = Session.objects.filter(status__in=ENDED).count()
    # One batch of the default size per advance: a short run leaves the rest for its re-queue.
    assert rollup_sessions(max_batches=2, requeue=False) == 20
    assert Session.objects.filter(rolled_up=True).count() == 20
    assert rollup_sessions(max_batches=1000, requeue=False) == ended - 20
    entry = settings.CELERY_BEAT_SCHEDULE["analytics-session-rollup"]
    assert entry["task"] == rollup_sessions.name and entry["schedule"] <= 60


def test_hours_are_utc_and_a_session_counts_in_the_hour_it_was_created(owner, world):
    services.session_rollup_run()
    for row in SessionRollup.objects.filter(team=owner.team):
        hour = row.hour.astimezone(UTC)
        assert hour.minute == 0 and hour.second == 0
        assert hour <= row.first_created_at <= row.last_created_at < hour + timedelta(hours=1)
