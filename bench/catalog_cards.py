"""The catalog page with usage on its cards: server time of /environments/ on the hub_pages seed
(1,000 environments) plus --sessions more sessions of the last 7 days spread over the first catalog
page's environments, with the usage figures cached (the usual case) and with every cache cleared
before each request (the worst case: one grouped query over a week of sessions).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub .venv/bin/python bench/catalog_cards.py

ORS_BENCH_CHECKOUT=/path/to/another/checkout times that checkout's catalog on the same database
(a before/after comparison). CPU time of this process is reported beside wall time (the database's is not in it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(os.environ.get("ORS_BENCH_CHECKOUT", ROOT))))  # the code timed (another checkout's)
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")


def spread_sessions(count: int) -> None:
    import random
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from orsplatform.catalog.models import Environment
    from orsplatform.episodes.models import Session

    if Session.objects.filter(sid__startswith="cards-").exists():
        return
    envs = list(Environment.objects.filter(team__slug__in=["benchhub", "benchother"])
                .order_by("team__slug", "slug").values_list("id", "team_id", "current_version_id")[:24])
    now = timezone.now()
    rng = random.Random(3)
    Session.objects.bulk_create([
        Session(sid=f"cards-{i}", team_id=envs[i % len(envs)][1], environment_id=envs[i % len(envs)][0],
                version_id=envs[i % len(envs)][2], task_spec={}, split="train", task_index=i % 100,
                status="deleted", finished=True, total_reward=float(rng.random() < 0.4), calls=2,
                created_at=now - timedelta(minutes=i % (7 * 24 * 60)), last_activity_at=now, ended_at=now)
        for i in range(count)], batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE episodes_session")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--sessions", type=int, default=200_000)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("Set DATABASE_URL to a PostgreSQL database.")
        return 2
    import django

    django.setup()
    import hub_pages
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    from orsplatform.teams.models import Team

    setup_test_environment()
    call_command("migrate", verbosity=0)
    if not Team.objects.filter(slug=hub_pages.TEAM).exists():
        hub_pages.TASKS = 10_000  # the catalog never reads tasks: a small split seeds faster
        hub_pages.seed(settings.VAR_DIR / "bench-hub-packages")
    spread_sessions(args.sessions)

    client = Client()
    client.force_login(get_user_model().objects.get(username="benchhub-owner"))
    client.get("/accounts/login/")
    print(f"{'page':30} {'p50 ms':>8} {'max ms':>8} {'p50 cpu ms':>11}")
    for name, url, clear in [("catalog", "/environments/", False), ("catalog, caches cleared", "/environments/", True),
                             ("catalog search", "/environments/?q=chess&sort=updated", False),
                             ("catalog search, caches cleared", "/environments/?q=chess&sort=updated", True)]:
        client.get(url)
        wall, cpu = [], []
        for _ in range(args.requests):
            if clear:
                cache.clear()
            w0, c0 = time.perf_counter(), time.process_time()
            response = client.get(url)
            wall.append((time.perf_counter() - w0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        print(f"{name:30} {statistics.median(wall):>8.1f} {max(wall):>8.1f} {statistics.median(cpu):>11.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
