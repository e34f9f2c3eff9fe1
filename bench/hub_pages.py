"""Server time of the web pages (environment pages, catalog, analytics) on a large catalog:
1,000 environments, 100 versions of one environment, 1,000,000 tasks in one split and 20,000 scored
sessions on it, in PostgreSQL. Budget: every page under 300 ms.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub .venv/bin/python bench/hub_pages.py [--requests 15]

The database is migrated and seeded once (tasks with COPY); later runs reuse the seed (--reseed drops
it). Each page is requested through Django's test client in this process: the first request (cold
caches) is reported apart, then --requests more give p50 and max. Times are the whole Django
request: middleware, auth, queries and template rendering.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")

TEAM, OTHER, BIG, SPLIT = "benchhub", "benchother", "big", "train"
ENVIRONMENTS, VERSIONS, TASKS, SESSIONS = 1000, 100, 1_000_000, 20_000


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _package(root: Path, n: int) -> Path:
    """A small package directory per version: env.py and a README that change a little each time."""
    path = root / f"v{n}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "env.py").write_text("".join(f"# line {i} of version {n if i % 10 == 0 else 0}\n" for i in range(300)))
    (path / "README.md").write_text(f"# Big\n\nVersion {n}.\n\n" + "A paragraph of **text**. " * 200
                                    + "\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    (path / "manifest.toml").write_text(f'name = "big"\ndescription = "version {n}"\n')
    return path


def seed(packages: Path) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from orsplatform.catalog.models import Environment, EnvironmentVersion, Split
    from orsplatform.episodes.models import Session
    from orsplatform.teams.models import Membership, Team

    started = time.perf_counter()
    with transaction.atomic():
        team = Team.objects.create(slug=TEAM, name="Bench hub")
        other = Team.objects.create(slug=OTHER, name="Bench other")
        user = get_user_model().objects.create(username="benchhub-owner")
        Membership.objects.create(user=user, team=team, role=Membership.Role.OWNER)
        shared = _package(packages, 0)
        words = ["maze", "chess", "math", "code", "wordle", "sokoban", "vision", "proof", "sql", "web"]
        envs = Environment.objects.bulk_create([
            Environment(team=team if i % 2 else other, slug=f"{words[i % 10]}-{i}",
                        description=f"A {words[i % 10]} environment number {i} for agents",
                        visibility="private" if i % 7 == 0 else "public")
            for i in range(ENVIRONMENTS - 1)] + [Environment(team=team, slug=BIG, description="The big one",
                                                              visibility="public")])
        big = envs[-1]
        versions = EnvironmentVersion.objects.bulk_create([
            EnvironmentVersion(environment=e, number=1, content_hash=_hash(e.slug),
                               package_path=str(shared), entrypoint="env:Env", status="ready", created_by=user,
                               tools=[{"name": "submit", "description": "Answer", "input_schema": {
                                   "type": "object", "properties": {"answer": {"type": "string"}}}}],
                               splits=[{"name": SPLIT, "type": "train"}])
            for e in envs[:-1]] + [
            EnvironmentVersion(environment=big, number=n, content_hash=_hash(f"big-{n}"),
                               package_path=str(_package(packages, n)), entrypoint="env:Env", status="ready",
                               created_by=user, tools=[{"name": "submit", "input_schema": {"type": "object"}}],
                               splits=[{"name": SPLIT, "type": "train"}])
            for n in range(1, VERSIONS + 1)])
        current = {v.environment_id: v for v in versions}  # the last of each environment's
        for e in envs:
            e.current_version = current[e.id]
        Environment.objects.bulk_update(envs, ["current_version"])
        split = Split.objects.create(environment=big, name=SPLIT, type="train", num_tasks=TASKS)
    print(f"catalog seeded in {time.perf_counter() - started:.1f} s", flush=True)

    started = time.perf_counter()
    with connection.cursor() as cursor:
        copy_sql = "COPY catalog_task (split_id, index, spec) FROM STDIN"
        with cursor.cursor.copy(copy_sql) as copy:
            for i in range(TASKS):
                copy.write(f'{split.id}\t{i}\t{{"question": "What is {i} + {i % 97}?", "answer": "{i + i % 97}"}}\n')
        cursor.execute("ANALYZE catalog_task")
    print(f"{TASKS:,} tasks copied in {time.perf_counter() - started:.1f} s", flush=True)

    started = time.perf_counter()
    now = timezone.now()
    rng = random.Random(7)
    big_version = current[big.id]
    Session.objects.bulk_create([
        Session(sid=f"bench-{i}", team=team, environment=big, version=big_version,
                task_spec={"question": f"What is {i % 500}?"}, split=SPLIT, task_index=i % 500,
                status="deleted", finished=rng.random() < 0.8, total_reward=float(rng.random() < 0.5), calls=3,
                created_at=now - __import__("datetime").timedelta(minutes=i % 5000),
                last_activity_at=now, ended_at=now, prompt=[{"type": "text", "text": f"What is {i % 500}?"}])
        for i in range(SESSIONS)], batch_size=2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE episodes_session")
    print(f"{SESSIONS:,} sessions in {time.perf_counter() - started:.1f} s", flush=True)


def pages() -> list[tuple[str, str]]:
    last_page = TASKS // 25
    return [
        ("home", "/"),
        ("catalog", "/environments/"),
        ("catalog search", "/environments/?q=chess&sort=updated"),
        ("catalog page 40", "/environments/?page=40"),
        ("environment", f"/environments/{TEAM}/{BIG}/"),
        ("tasks page 1", f"/environments/{TEAM}/{BIG}/tasks/?split={SPLIT}"),
        ("tasks last page", f"/environments/{TEAM}/{BIG}/tasks/?split={SPLIT}&page={last_page}"),
        ("task", f"/environments/{TEAM}/{BIG}/tasks/{SPLIT}/123/"),
        ("task 999,999", f"/environments/{TEAM}/{BIG}/tasks/{SPLIT}/999999/"),
        ("versions", f"/environments/{TEAM}/{BIG}/versions/"),
        ("versions page 5", f"/environments/{TEAM}/{BIG}/versions/?page=5"),
        ("diff @1..@100", f"/environments/{TEAM}/{BIG}/diff/?a=1&b=100"),
        ("analytics overview", f"/analytics/{TEAM}/?range=7d"),
        ("analytics environment", f"/analytics/{TEAM}/environments/{TEAM}/{BIG}/?range=7d"),
        ("explorer", f"/analytics/{TEAM}/sessions/?range=7d"),
        ("explorer sorted", f"/analytics/{TEAM}/sessions/?range=7d&sort=-reward"),
        ("explorer task search", f"/analytics/{TEAM}/sessions/?range=7d&q=What+is+42%3F"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--budget-ms", type=float, default=300.0)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("Set DATABASE_URL to a PostgreSQL database (e.g. postgres://postgres@127.0.0.1:5432/hub).")
        return 2
    os.environ.setdefault("ORS_DEV_LOGIN", "0")

    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    from orsplatform.teams.models import Team

    setup_test_environment()  # the test client's hooks, and ALLOWED_HOSTS for "testserver"
    call_command("migrate", verbosity=0)
    packages = settings.VAR_DIR / "bench-hub-packages"
    if args.reseed:
        from orsplatform.catalog.models import Environment
        from orsplatform.episodes.models import Session

        Session.objects.filter(team__slug=TEAM).delete()
        Environment.objects.filter(team__slug__in=[TEAM, OTHER]).delete()
        Team.objects.filter(slug__in=[TEAM, OTHER]).delete()
        get_user_model().objects.filter(username="benchhub-owner").delete()
    if not Team.objects.filter(slug=TEAM).exists():
        seed(packages)

    client = Client()
    client.force_login(get_user_model().objects.get(username="benchhub-owner"))
    client.get("/accounts/login/")  # the process's first request loads templates and URLconfs
    worst = 0.0
    print(f"\n{'page':24} {'status':>6} {'cold ms':>9} {'p50 ms':>8} {'max ms':>8}")
    for name, url in pages():
        started = time.perf_counter()
        response = client.get(url)
        cold = (time.perf_counter() - started) * 1000
        times = []
        for _ in range(args.requests):
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        p50, top = statistics.median(times), max(times)
        worst = max(worst, p50)
        print(f"{name:24} {response.status_code:>6} {cold:>9.1f} {p50:>8.1f} {top:>8.1f}", flush=True)
        if response.status_code != 200:
            print(f"  {url} answered {response.status_code}")
            return 1
    print(f"\nworst p50 {worst:.1f} ms (budget {args.budget_ms:.0f} ms)")
    return 0 if worst < args.budget_ms else 1


if __name__ == "__main__":
    sys.exit(main())
