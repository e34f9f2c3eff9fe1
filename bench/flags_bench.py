"""The scheduled flags check on a busy week: one pass of flags_compute() over N recent sessions.

On a fresh PostgreSQL database (created here, dropped afterwards): migrate, seed one team's sessions
on two versions of four environments (200 tasks each, runs of 500 episodes) with three tool calls
each (bulk_create), plant one anomaly of each kind, then time the pass (the beat task's whole work)
and report the flags it found.

    .venv/bin/python bench/flags_bench.py                     # 200,000 sessions (ORS_FLAGS_MAX_SESSIONS)
    .venv/bin/python bench/flags_bench.py --sessions 20000    # a quick run
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--port", default=os.environ.get("PGPORT", "5432"))
    p.add_argument("--user", default=os.environ.get("PGUSER", "postgres"))
    return p.parse_args()


def pg(args, *cmd: str) -> None:
    subprocess.run([*cmd, "-h", args.host, "-p", str(args.port), "-U", args.user], check=True)


def seed(n: int) -> None:
    from orsplatform.catalog.models import Environment, EnvironmentVersion
    from orsplatform.episodes.models import Session, ToolCall
    from orsplatform.teams.models import Team

    rng = random.Random(7)
    team = Team.objects.create(slug="acme", name="Acme")
    versions = []
    for name in ("maze", "code", "math", "web"):
        env = Environment.objects.create(team=team, slug=name, visibility="private")
        pair = [EnvironmentVersion.objects.create(
            environment=env, number=v, content_hash=f"{name}{v}".ljust(64, "0"), package_path="", entrypoint="env:E",
            status="ready", manifest={"reward_range": [0, 1]}) for v in (1, 2)]
        env.current_version = pair[-1]
        env.save(update_fields=["current_version"])
        versions.append((env, pair))
    now = datetime.now(UTC)
    batch: list[Session] = []
    calls: list[tuple[int, float, bool]] = []

    def flush() -> None:
        made = Session.objects.bulk_create(batch)
        rows = []
        for s, (count, reward, broken) in zip(made, calls, strict=True):
            for i in range(count):
                last = i == count - 1
                rows.append(ToolCall(session=s, task_id=uuid.uuid4().hex, name="act", status="error" if broken and last
                                     else "ok", reward=reward if last else 0.0, finished=last,
                                     started_at=s.created_at, finished_at=s.created_at))
        ToolCall.objects.bulk_create(rows, batch_size=5000)
        batch.clear()
        calls.clear()

    for i in range(n):
        env, pair = versions[i % 4]
        version = pair[(i // 4) % 2]
        index = rng.randrange(200)
        count = 3
        passed = rng.random() < 0.5
        reward = 1.0 if passed else 0.0
        if i == 0:  # planted: a pass in 1 call where the task's passes take 3
            count, reward = 1, 1.0
        if i == 4:
            reward = 5.0  # planted: outside reward_range
        broken = env.slug == "web" and version.number == 2 and rng.random() < 0.6  # planted: an error burst
        created = now - timedelta(seconds=(n - i) * 2)
        batch.append(Session(sid=str(uuid.uuid4()), team=team, environment=env, version=version, task_spec={},
                             split="train", task_index=index, status="deleted", created_at=created,
                             last_activity_at=created, ended_at=created, calls=count, total_reward=reward,
                             finished=True, run_name=f"run-{i // 500}"))
        calls.append((count, reward, broken))
        if len(batch) == 5000:
            flush()
    if batch:
        flush()


def main() -> int:
    args = parse_args()
    name = f"ors_flags_bench_{os.getpid()}"
    pg(args, "createdb", name)
    try:
        os.environ["DATABASE_URL"] = f"postgres://{args.user}@{args.host}:{args.port}/{name}"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")
        os.environ.setdefault("ORS_LOG_LEVEL", "WARNING")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, connections

        from orsplatform.flags.models import Flag
        from orsplatform.flags.services import flags_compute

        call_command("migrate", verbosity=0)
        t0 = time.perf_counter()
        seed(args.sessions)
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
        print(f"seeded {args.sessions:,} sessions ({args.sessions * 3:,} tool calls) in {time.perf_counter() - t0:.1f} s")
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            found = flags_compute()
            times.append(time.perf_counter() - t0)
        kinds: dict[str, int] = {}
        for flag in Flag.objects.all():
            kinds[flag.kind] = kinds.get(flag.kind, 0) + 1
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"flags_compute over {args.sessions:,} sessions: best {min(times):.2f} s, worst {max(times):.2f} s "
              f"({args.repeat} passes); {len(found)} flags found per pass {dict(sorted(kinds.items()))}; "
              f"peak RSS {rss:.0f} MB")
        connections.close_all()
    finally:
        pg(args, "dropdb", "--if-exists", name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
