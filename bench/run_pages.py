"""Run pages at scale: every run page under 300 ms with 1,000 runs and 1,000,000 rollout messages.

On a fresh PostgreSQL database (created here, dropped afterwards): migrate, seed with COPY 1,000
runs (most of ~90 rollouts, a few of 2,000), 100,000 rollouts of 10 messages each on average, and
20 ORS sessions per run (some linked to a rollout of the same task), then time the runs list, one
run, the biggest run, overlays, a point's episodes and a rollout's trajectory (Django test client,
logged-in user; median and max of --repeat runs after a warm-up).

    .venv/bin/python bench/run_pages.py                              # 1,000 runs, 1M messages
    .venv/bin/python bench/run_pages.py --runs 100 --messages 100000 # a quick run

Another team holds a tenth of the data as tenancy noise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 0.3
BIG_RUNS = 5
BIG_ROLLOUTS = 2_000
MESSAGE_TYPES = ["system_message", "user_message", "assistant_message", "tool_call", "tool_result"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1_000)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--per-rollout", type=int, default=10, help="messages per rollout on average")
    p.add_argument("--sessions-per-run", type=int, default=20)
    p.add_argument("--repeat", type=int, default=5, help="timed runs per page (after one warm-up)")
    p.add_argument("--host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--port", default=os.environ.get("PGPORT", "5432"))
    p.add_argument("--user", default=os.environ.get("PGUSER", "postgres"))
    p.add_argument("--keep", action="store_true", help="do not drop the database afterwards")
    return p.parse_args()


def pg(args, *cmd: str) -> None:
    subprocess.run([*cmd, "-h", args.host, "-p", str(args.port), "-U", args.user], check=True)


# --- seeding ---------------------------------------------------------------------------------------

def seed(args) -> dict:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from orsplatform.catalog.models import Environment, EnvironmentVersion
    from orsplatform.teams.models import ApiKey, Membership, Team

    rng = random.Random(26)
    teams = {slug: Team.objects.create(slug=slug, name=slug.title()) for slug in ("acme", "globex")}
    user = get_user_model().objects.create_user("bench", password="bench")
    Membership.objects.create(user=user, team=teams["acme"], role="owner")
    keys = {slug: ApiKey.objects.create(team=t, name=f"{slug}-trainer", prefix=f"{slug[:4]}0001",
                                        secret_hash="0" * 64, scopes=["sessions"]) for slug, t in teams.items()}
    envs = {}
    for slug, team in teams.items():
        env = Environment.objects.create(team=team, slug="puzzle", visibility="private")
        versions = [EnvironmentVersion.objects.create(environment=env, number=n, content_hash=f"{slug}{n}".ljust(64, "0"),
                                                      package_path="", entrypoint="env:Env", status="ready")
                    for n in (1, 2)]
        env.current_version = versions[-1]
        env.save(update_fields=["current_version"])
        envs[slug] = (env, versions)

    rollouts_total = args.messages // args.per_rollout
    big = min(BIG_RUNS, args.runs // 10)
    big_rollouts = min(BIG_ROLLOUTS, rollouts_total // 10 // max(1, big)) if big else 0
    rest = max(1, args.runs - big)
    small = max(1, (rollouts_total - big * big_rollouts) // rest)
    sizes = [big_rollouts] * big + [small] * rest
    sizes[-1] += rollouts_total - sum(sizes)  # exactly the requested total
    now = datetime.now(UTC)
    counts = {"runs": 0, "rollouts": 0, "messages": 0, "sessions": 0}
    run_rows, biggest, typical = [], None, None
    t0 = time.perf_counter()
    with connection.cursor() as wrapper:
        cursor = wrapper.cursor  # the psycopg cursor, for COPY
        with cursor.copy("COPY runs_run (id, team_id, name, info, model_name, first_seen_at, last_seen_at, rollouts,"
                         " messages, reward_sum, rewarded) FROM STDIN") as copy:
            for i, size in enumerate(sizes, start=1):
                slug = "globex" if i % 10 == 0 else "acme"
                name = f"grpo-big-{i}" if i <= big else f"grpo-{i:04d}"
                started = now - timedelta(hours=rng.uniform(1, 24 * 30))
                run_rows.append((i, slug, name, size, started))
                if slug == "acme" and i <= big and biggest is None:
                    biggest = name
                if slug == "acme" and i > big and typical is None:
                    typical = name
                copy.write_row((i, teams[slug].id, name, json.dumps({"model_name": "tiny", "rl_algorithm": "grpo"}),
                                "tiny", started, started + timedelta(minutes=size / 10), 0, 0, 0.0, 0))
                counts["runs"] += 1
        session_id = 0
        linked: dict[int, int] = {}  # rollout id -> session id
        with cursor.copy("COPY episodes_session (id, sid, team_id, api_key_id, environment_id, version_id, task_spec,"
                         " split, task_index, status, runner, error, created_at, ready_at, last_activity_at, ended_at,"
                         " calls, total_reward, finished, protocol, prompt, run_name) FROM STDIN") as copy:
            rollout_id = 0
            for _run_id, slug, name, size, started in run_rows:
                env, versions = envs[slug]
                for k in range(args.sessions_per_run):
                    session_id += 1
                    at = started + timedelta(seconds=k * 7)
                    reward = rng.choice([0.0, 0.5, 1.0])
                    copy.write_row((session_id, f"bench-{session_id}", teams[slug].id, keys[slug].id, env.id,
                                    versions[k % 2].id, json.dumps({"q": k}), "train", k, "deleted", "", "", at, at,
                                    at, at, 4, reward, True, "ors", None, name))
                    # Half of a run's sessions are the environment side of one of its rollouts.
                    if k % 2 == 0 and k // 2 < size:
                        linked[rollout_id + 1 + k // 2] = session_id
                    counts["sessions"] += 1
                rollout_id += size
        # One COPY at a time per connection: the rollouts first (remembering each one's message count
        # and reward), then their messages.
        made: list[tuple[int, int, float, datetime]] = []  # (rollout id, messages, reward, started)
        per_run: dict[int, tuple[int, int, float, int]] = {}
        with cursor.copy("COPY runs_rollout (id, team_id, run_id, api_key_id, event_id, seq, name, environment_name,"
                         " environment_id, version_id, variant, split, task_spec, task_index, metadata, run_info, info,"
                         " step, session_id, started_at, created_at, last_event_at, messages, tool_calls, reward,"
                         " finished, error) FROM STDIN") as copy_rollouts:
            rollout_id = 0
            for run_id, slug, _name, size, started in run_rows:
                env, versions = envs[slug]
                group = 8
                messages_in_run, reward_sum = 0, 0.0
                for seq in range(1, size + 1):
                    rollout_id += 1
                    step = (seq - 1) // group
                    at = started + timedelta(milliseconds=seq * 300)
                    n = max(2, args.per_rollout + rng.choice((-2, -1, 0, 1, 2)))  # mean per_rollout exactly
                    reward = round(min(1.0, max(0.0, rng.gauss(0.2 + step / max(1, size / group), 0.2))), 4)
                    split = "train" if seq % 5 else "test"
                    copy_rollouts.write_row((
                        rollout_id, teams[slug].id, run_id, keys[slug].id, str(uuid.UUID(int=rng.getrandbits(128))),
                        seq, f"r{seq}", f"{slug}/puzzle", env.id, versions[seq % 2].id, "", split,
                        json.dumps({"q": seq}), seq % 50, "{}", None, json.dumps({"current_step": step}), step,
                        linked.get(rollout_id), at, at, at, n, n // 4, reward, True,
                        "tool crashed" if rng.random() < 0.02 else ""))
                    made.append((rollout_id, n, reward, at))
                    messages_in_run += n
                    reward_sum += reward
                per_run[run_id] = (size, messages_in_run, reward_sum, size)
                counts["rollouts"] += size
                counts["messages"] += messages_in_run
        with cursor.copy("COPY runs_rolloutmessage (id, rollout_id, index, event_id, type, content, content_reference,"
                         " summary, name, call_id, reward, is_finished, metadata, timestamp) FROM STDIN") as copy_messages:
            message_id = 0
            for rollout_id, n, reward, at in made:
                for index in range(n):
                    message_id += 1
                    kind = MESSAGE_TYPES[index % len(MESSAGE_TYPES)] if index else "system_message"
                    last = index == n - 1
                    copy_messages.write_row((
                        message_id, rollout_id, index, str(uuid.UUID(int=rng.getrandbits(128))), kind,
                        f"{kind} {index} of rollout {rollout_id}: " + "lorem ipsum " * 8, "", "",
                        "submit" if kind == "tool_call" else "", f"c{index}" if "tool" in kind else "",
                        reward if last else None, last, "{}", at + timedelta(milliseconds=index)))
        for run_id, (size, messages, reward_sum, rewarded) in per_run.items():
            cursor.execute("UPDATE runs_run SET rollouts = %s, messages = %s, reward_sum = %s, rewarded = %s "
                           "WHERE id = %s", [size, messages, reward_sum, rewarded, run_id])
        for table, last in (("runs_run", counts["runs"]), ("runs_rollout", counts["rollouts"]),
                            ("runs_rolloutmessage", counts["messages"]), ("episodes_session", counts["sessions"])):
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", [last])
    seed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # what autovacuum does on a live database
    return {**counts, "seed_s": seed_s, "vacuum_s": time.perf_counter() - t0, "user": user,
            "biggest": biggest or typical, "typical": typical, "big_rollouts": big_rollouts, "small": small}


# --- timing ----------------------------------------------------------------------------------------

def timed(fn, repeat: int) -> tuple[float, float, int, int]:
    response = fn()  # warm-up (first query plans, template compilation)
    status, size = response.status_code, len(response.content)
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = fn()
        runs.append(time.perf_counter() - t0)
        status = response.status_code
    return statistics.median(runs), max(runs), status, size


def main() -> int:
    args = parse_args()
    name = f"ors_run_pages_bench_{os.getpid()}"
    pg(args, "createdb", name)
    try:
        os.environ["DATABASE_URL"] = f"postgres://{args.user}@{args.host}:{args.port}/{name}"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")
        os.environ.setdefault("ORS_LOG_LEVEL", "WARNING")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections
        from django.test import Client

        from orsplatform.runs.models import Rollout

        t0 = time.perf_counter()
        call_command("migrate", verbosity=0)
        print(f"migrated in {time.perf_counter() - t0:.1f} s")
        seeded = seed(args)
        print(f"seeded {seeded['runs']:,} runs, {seeded['rollouts']:,} rollouts, {seeded['messages']:,} messages and "
              f"{seeded['sessions']:,} sessions in {seeded['seed_s']:.1f} s (COPY), VACUUM ANALYZE "
              f"{seeded['vacuum_s']:.1f} s; runs of {seeded['small']:,} rollouts, the biggest {seeded['big_rollouts']:,}")

        client = Client()
        client.force_login(seeded["user"])
        typical, biggest = seeded["typical"], seeded["biggest"]
        overlay = [f"grpo-{i:04d}" for i in range(BIG_RUNS + 1, BIG_RUNS + 5)]
        ref = Rollout.objects.filter(run__name=typical, session__isnull=False).values_list("event_id", flat=True).first()
        view = "/analytics/acme/runs/view/?"
        pages = [
            ("runs list (page 1 of the team's runs)", "/analytics/acme/runs/"),
            (f"one run ({seeded['small']:,} rollouts)", view + urlencode({"run": typical})),
            ("one run, smoothed 0.9, per split", view + urlencode({"run": typical, "smooth": 0.9, "per": "split"})),
            (f"biggest run ({seeded['big_rollouts']:,} rollouts)", view + urlencode({"run": biggest})),
            ("biggest run, per version, split=train", view + urlencode({"run": biggest, "per": "version",
                                                                         "split": "train"})),
            ("4 runs overlaid", view + urlencode({"run": overlay}, doseq=True)),
            ("biggest + 3 runs overlaid, smoothed", view + urlencode({"run": [biggest, *overlay[:3]], "smooth": 0.6},
                                                                      doseq=True)),
            ("a point's episodes (step 3)", "/analytics/acme/runs/episodes/?" + urlencode(
                {"run": typical, "from": 3, "to": 3})),
            ("a rollout's trajectory (messages + linked session)", f"/analytics/acme/rollouts/{ref}/"),
        ]
        rows = []
        for label, url in pages:
            median, worst, status, size = timed(lambda url=url: client.get(url), args.repeat)
            rows.append((label, status, median, worst, size))
            connections.close_all()
        width = max(len(r[0]) for r in rows)
        print()
        print(f"| {'page'.ljust(width)} | status | median ms | max ms | bytes |")
        print(f"|{'-' * (width + 2)}|--------|-----------|--------|-------|")
        failed = False
        for label, status, median, worst, size in rows:
            over = median >= BUDGET_S
            failed |= over or status != 200
            print(f"| {label.ljust(width)} | {status}    | {median * 1000:9.0f} | {worst * 1000:6.0f} | {size:,} |"
                  + (" OVER BUDGET" if over else ""))
        print()
        print(f"budget: every run page under {BUDGET_S * 1000:.0f} ms (median of {args.repeat})")
        print("RESULT:", "FAIL" if failed else "PASS")
        return 1 if failed else 0
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: BLE001 - Django may not have been set up
            pass
        if not args.keep:
            pg(args, "dropdb", "--if-exists", name)


if __name__ == "__main__":
    sys.exit(main())
