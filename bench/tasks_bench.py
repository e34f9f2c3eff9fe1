"""Task ingest and task lookup on a 1,000,000-task split (docs/design.md §7: `task` and `task_range` p50 under
5 ms, `num_tasks` constant time).

    cd /work/main && .venv/bin/python bench/tasks_bench.py [--rows 1000000] [--requests 3000]

On a fresh PostgreSQL database (createdb here, dropped afterwards):
1. migrate; publish a small environment whose class lists no tasks (split `train`);
2. write a JSONL file of --rows tasks and ingest it through `catalog.services.tasks_ingest` in a child
   process, reporting rows/s and the child's peak RSS (resource.getrusage) against its RSS before;
3. start the platform under uvicorn (as bench/compare.py does) and time `/{env}/task` (random
   indices), `/{env}/task_range` (100 tasks from a random start) and `/{env}/num_tasks`, first one
   request at a time (latency), then with --concurrency clients (throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

try:  # run as a script (bench/ on sys.path) or imported as bench.tasks_bench
    from compare import free_port, manage, platform_command, platform_env, postgres_database, server_process
except ImportError:  # pragma: no cover
    from bench.compare import (
        free_port,
        manage,
        platform_command,
        platform_env,
        postgres_database,
        server_process,
    )

ROOT = Path(__file__).resolve().parents[1]
TEAM, SLUG, SPLIT = "bench", "million", "train"
ENV_SOURCE = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool


    class Tasks(Environment):
        """Tasks come from an upload, not from the class."""

        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            raise NotImplementedError

        def get_prompt(self):
            return [TextBlock(text=self.task_spec["question"])]

        @tool
        def done(self) -> ToolOutput:
            """Finish."""
            return ToolOutput(blocks=[TextBlock(text="ok")], reward=1.0, finished=True)
''')


def write_tasks(path: Path, rows: int) -> int:
    """A JSONL split of ``rows`` tasks, about 150 bytes each, written in chunks."""
    with path.open("w", encoding="utf-8") as out:
        chunk: list[str] = []
        for i in range(rows):
            chunk.append(json.dumps({"id": f"t{i}", "question": f"What is {i} + {i % 97}?",
                                     "answer": str(i + i % 97), "tags": ["arith", f"b{i % 10}"],
                                     "level": i % 5}) + "\n")
            if len(chunk) == 10_000:
                out.write("".join(chunk))
                chunk = []
        out.write("".join(chunk))
    return path.stat().st_size


def ingest_child(task_file: str) -> None:
    """Runs inside a child process configured for the bench database; prints one JSON line."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")
    sys.path.insert(0, str(ROOT))
    django.setup()
    from orsplatform.catalog.models import Environment
    from orsplatform.catalog.services import environment_publish_path, tasks_ingest
    from orsplatform.teams.models import Team

    team, _ = Team.objects.get_or_create(slug=TEAM, defaults={"name": "Benchmark"})
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "tasks.py"
        source.write_text(ENV_SOURCE)
        environment_publish_path(team=team, path=source, slug=SLUG, visibility="private")
    environment = Environment.objects.get(team=team, slug=SLUG)
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    updates: list[tuple[float, int]] = []
    started = time.perf_counter()
    result = tasks_ingest(environment=environment, split_name=SPLIT, mode="replace", path=Path(task_file),
                          fmt="jsonl", progress=lambda rows, _b: updates.append((time.perf_counter(), rows)))
    seconds = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": result.rows, "seconds": seconds, "rows_per_s": result.rows / seconds,
                      "rss_before_mb": before_kb / 1024, "peak_rss_mb": peak_kb / 1024,
                      "progress_updates": len(updates), "num_tasks": result.split.num_tasks}))


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000

    return {"n": len(ordered), "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99)}


def make_body(kind: str, num_tasks: int, rng: random.Random) -> dict:
    if kind == "task":
        return {"split": SPLIT, "index": rng.randrange(num_tasks)}
    if kind == "task_range":
        start = rng.randrange(num_tasks - 100)
        return {"split": SPLIT, "start": start, "stop": start + 100}
    return {"split": SPLIT}


async def timed_requests(session: aiohttp.ClientSession, kind: str, num_tasks: int, rng: random.Random,
                         turns: Iterator[int], samples: list[float]) -> int:
    """One client: takes turns from the shared iterator until it is exhausted; returns its errors."""
    url, errors = f"/{TEAM}/{SLUG}/{kind}", 0
    for _ in turns:
        payload = make_body(kind, num_tasks, rng)
        started = time.perf_counter()
        async with session.post(url, json=payload) as r:
            data = await r.read()
            ok = r.status == 200
        samples.append(time.perf_counter() - started)
        if not ok or (kind == "task_range" and len(json.loads(data)["tasks"]) != 100):
            errors += 1
    return errors


async def measure(base_url: str, key: str, num_tasks: int, requests: int, concurrency: int) -> dict:
    headers = {"X-API-Key": key, "Content-Type": "application/json"}
    rng = random.Random(7)
    results: dict[str, dict] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base_url, headers=headers, connector=connector) as session:
        for kind in ("task", "task_range", "num_tasks"):
            # Warm-up: connections, the catalog cache.
            await timed_requests(session, kind, num_tasks, rng, iter(range(50)), [])
            samples: list[float] = []
            turns = iter(range(requests))
            wall = time.perf_counter()
            errors = await asyncio.gather(*(timed_requests(session, kind, num_tasks, rng, turns, samples)
                                            for _ in range(concurrency)))
            wall = time.perf_counter() - wall
            results[kind] = {**percentiles(samples), "req_per_s": requests / wall, "errors": sum(errors)}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=3000, help="per endpoint and concurrency level")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--ingest-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ingest_child:
        ingest_child(args.ingest_child)
        return 0

    import subprocess

    with tempfile.TemporaryDirectory(prefix="orstasks-") as tmp, postgres_database() as database_url:
        work = Path(tmp)
        env = {**platform_env(database_url), "ORS_VAR_DIR": str(work / "var")}
        print(f"-- migrating {database_url}", flush=True)
        manage(["migrate", "--noinput"], env)
        task_file = work / "train.jsonl"
        started = time.perf_counter()
        size = write_tasks(task_file, args.rows)
        print(f"-- wrote {args.rows:,} tasks ({size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s",
              flush=True)
        child = subprocess.run([sys.executable, __file__, "--ingest-child", str(task_file)], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=3600)
        if child.returncode != 0:
            print(child.stdout[-3000:], child.stderr[-3000:], file=sys.stderr)
            return 1
        ingest = json.loads(child.stdout.strip().splitlines()[-1])
        print(f"== ingest: {ingest['rows']:,} rows in {ingest['seconds']:.1f} s = {ingest['rows_per_s']:,.0f} rows/s "
              f"({size / 1e6 / ingest['seconds']:.1f} MB/s); RSS {ingest['rss_before_mb']:.0f} MB before, "
              f"peak {ingest['peak_rss_mb']:.0f} MB; {ingest['progress_updates']} progress updates", flush=True)
        task_file.unlink()

        key = manage(["create_api_key", TEAM, "bench", "--scopes", "sessions"], env).strip().splitlines()[-1]
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        report = {"ingest": ingest, "lookups": {}}
        with server_process("platform (uvicorn)", platform_command("uvicorn", port), env, base_url,
                            work / "platform.log", 60.0):
            for concurrency in (1, args.concurrency):
                lookups = asyncio.run(measure(base_url, key, ingest["num_tasks"], args.requests, concurrency))
                report["lookups"][concurrency] = lookups
                print(f"== lookups on {ingest['num_tasks']:,} tasks, concurrency {concurrency}, "
                      f"{args.requests} requests each:")
                for kind, stats in lookups.items():
                    print(f"   {kind:<11} p50 {stats['p50_ms']:6.2f} ms   p90 {stats['p90_ms']:6.2f} ms   "
                          f"p99 {stats['p99_ms']:6.2f} ms   {stats['req_per_s']:7.0f} req/s   "
                          f"errors {stats['errors']}", flush=True)
        budget = all(report["lookups"][1][k]["p50_ms"] < 5.0 for k in ("task", "task_range"))
        print(f"budget (task, task_range p50 < 5 ms at concurrency 1): {'PASS' if budget else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
