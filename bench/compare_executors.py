"""The celery executor next to the inline one and the reference server, in one run.

    cd /work/main && .venv/bin/python bench/compare_executors.py --concurrency 16 --duration 20

Sides, one after the other, each alone on the machine: the reference `ors.Server` hosting
envs/math; the platform with the inline executor (one uvicorn gateway); the platform with the
celery executor in each layout of --layouts (GATEWAYSxRUNNERS; requests rotate between the
gateways with no stickiness, so with two every episode is served by both). The default measures
1x1, the layout two CPUs fit (one gateway beside one runner node, as a production machine of each
kind would run), and 2x2, which proves any gateway serves any session but runs twice the processes
on the same two CPUs. PostgreSQL (a throwaway database per side) and Redis (a throwaway key prefix)
are used by every platform side. Prints the tables, then episodes/s and /call p50 side by side,
CPU per episode by process group, and each layout's celery / inline ratio (target: at most 2x)
and /call p50 difference (target: at most +2 ms at concurrency 1), issue #12.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from compare import (
        ROOT,
        LoadConfig,
        SetupError,
        bench_reference,
        free_port,
        measure,
        platform_command,
        platform_env,
        postgres_database,
        prepare_platform,
        server_process,
        stop_process,
    )
    from loadgen import format_table, install_fast_loop
except ImportError:  # pragma: no cover
    from bench.compare import (ROOT, LoadConfig, SetupError, bench_reference, free_port, measure,  # noqa: I001
                               platform_command, platform_env, postgres_database, prepare_platform,
                               server_process, stop_process)
    from bench.loadgen import format_table, install_fast_loop

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
TICKS = os.sysconf("SC_CLK_TCK")
# Sandbox workers (and their bubblewrap parents), where environment code runs on both executors.
SANDBOX_WORKERS = ("sandbox/worker.py",)  # the pool starts /ors/lib/<its package path>/worker.py
SHARED = ("redis", "postgres")  # servers this script did not start


def cpu_seconds(*needles: str, own: bool = False) -> float:
    """CPU time (user + system) so far of the processes whose command line contains a needle; with
    `own`, only those this process started (directly or not): on a shared machine other people's
    gateways and sandbox workers match the same needles."""
    parents: dict[int, int] = {}
    matched: list[tuple[int, float]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(n in cmdline for n in needles):
                matched.append((int(entry.name), (int(fields[11]) + int(fields[12])) / TICKS))
        except OSError:  # the process ended meanwhile
            continue
    me = os.getpid()

    def mine(pid: int) -> bool:
        for _ in range(64):
            pid = parents.get(pid, 0)
            if pid == me:
                return True
            if pid <= 1:
                return False
        return False

    return sum(seconds for pid, seconds in matched if not own or mine(pid))


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat (idle and iowait are not busy)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(fields[:8])  # guest time is already counted in user
    return total - fields[3] - fields[4], total


def measure_with_cpu(name: str, url: str, key: str | None, load: LoadConfig,
                     groups: dict[str, tuple[str, ...]], database_url: str) -> dict[str, Any]:
    """`measure`, plus the CPU each process group used (cores over the run, warm-up included, and
    per episode at the measured rate), PostgreSQL's backends and this process (the load generator)
    included, and how busy the whole machine was: at 100 % the closed loop is CPU-bound, and its
    latency follows the CPU an episode costs in all processes together."""
    # PostgreSQL's backends serving this run's database (its name is in their process titles).
    groups = {**groups, "postgres": (f" postgres {database_url.rsplit('/', 1)[-1]} ",)}
    before = {group: cpu_seconds(*needles, own=group not in SHARED) for group, needles in groups.items()}
    own_before, busy_before = os.times(), machine_busy()
    result = measure(name, url, key, load)
    spent = {group: cpu_seconds(*needles, own=group not in SHARED) - before[group] for group, needles in groups.items()}
    own_after, busy_after = os.times(), machine_busy()
    spent["load generator"] = (own_after.user + own_after.system) - (own_before.user + own_before.system)
    window = load.duration + load.warmup
    result["cpu"] = {group: {"cores": seconds / window, "ms_per_episode": 1000 * seconds / window
                             / max(result["episodes_per_s"], 1e-9)} for group, seconds in spent.items()}
    busy, total = (after - before for after, before in zip(busy_after, busy_before, strict=True))
    result["machine_busy_percent"] = 100 * busy / max(total, 1)
    return result


def start_runner(name: str, prefix: str, workdir: Path) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    environ.update(REDIS_URL=REDIS_URL, ORS_REDIS_PREFIX=prefix)
    log = (workdir / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "orsplatform.executors.node", "--hostname", f"{name}@{prefix}", "--loglevel", "warning"],
        cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_for_runners(prefix: str, count: int, timeout: float = 60) -> None:
    import redis

    from orsplatform.executors.keys import Keys, live_runner_names

    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(live_runner_names(client, Keys(prefix), 5.0)) >= count:
            return
        time.sleep(0.1)  # polling interval while waiting on the heartbeats
    raise SetupError(f"{count} runner heartbeats did not appear within {timeout:g}s")


def bench_inline(database_url: str, load: LoadConfig, workdir: Path) -> dict[str, Any]:
    env = platform_env(database_url)
    key = prepare_platform(env)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_process("inline gateway", platform_command("uvicorn", port), env, url,
                        workdir / "inline.log", 60):
        return measure_with_cpu("platform, inline executor", url, key, load,
                                {"gateways": (f"--port {port} ",), "workers": SANDBOX_WORKERS,
                                 "redis": ("redis-server",)}, database_url)


def bench_celery(database_url: str, load: LoadConfig, workdir: Path, gateways: int, runners: int) -> dict[str, Any]:
    prefix = f"orsbench-{secrets.token_hex(4)}"
    env = {**platform_env(database_url), "ORS_EXECUTOR": "celery", "REDIS_URL": REDIS_URL,
           "CELERY_BROKER_URL": REDIS_URL, "ORS_REDIS_PREFIX": prefix, "CELERY_TASK_ALWAYS_EAGER": "false"}
    key = prepare_platform(env)
    nodes = [start_runner(f"runner{i}", prefix, workdir) for i in range(runners)]
    try:
        wait_for_runners(prefix, runners)
        with contextlib.ExitStack() as stack:
            urls, ports = [], []
            for i in range(gateways):
                port = free_port()
                ports.append(port)
                url = f"http://127.0.0.1:{port}"
                stack.enter_context(server_process(f"celery gateway {i}", platform_command("uvicorn", port), env,
                                                   url, workdir / f"gateway{i}.log", 60))
                urls.append(url)
            groups = {"gateways": tuple(f"--port {p} " for p in ports), "runners": (f"@{prefix} ",),
                      "workers": SANDBOX_WORKERS, "redis": ("redis-server",)}
            return measure_with_cpu(f"platform, celery executor ({gateways} gateways, {runners} runners)",
                                    ",".join(urls), key, load, groups, database_url)
    finally:
        for node in nodes:
            stop_process(node)
        forget_prefix(prefix)


def forget_prefix(prefix: str) -> None:
    """Delete the run's keys (session records live a day): a shared Redis is left as it was found."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    batch = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


def database() -> contextlib.AbstractContextManager[str]:
    """DATABASE_URL when set (a database of one's own on a shared server), else a throwaway one."""
    url = os.environ.get("DATABASE_URL", "")
    return contextlib.nullcontext(url) if url.startswith("postgres") else postgres_database()


def layouts(text: str) -> list[tuple[int, int]]:
    """ "1x1,2x2" -> [(1, 1), (2, 2)] (gateways x runners)."""
    try:
        pairs = [tuple(int(n) for n in part.split("x")) for part in text.split(",") if part]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"layouts look like 1x1,2x2 (gateways x runners), not {text!r}")
    return pairs  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--layouts", type=layouts, default=[(1, 1), (2, 2)],
                        help="celery layouts to measure, GATEWAYSxRUNNERS, comma-separated (default 1x1,2x2)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    install_fast_loop()
    load = LoadConfig(env="math", concurrency=args.concurrency, duration=args.duration, warmup=args.warmup,
                      task_mode="index", answer="correct")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="orsbench-") as tmp:
        workdir = Path(tmp)
        results["reference"] = bench_reference(ROOT / "envs" / "math" / "env.py", load, workdir, 60)
        with database() as database_url:
            results["inline"] = bench_inline(database_url, load, workdir)
        for gateways, runners in args.layouts:
            with database() as database_url:
                results[f"celery {gateways}x{runners}"] = bench_celery(database_url, load, workdir, gateways, runners)
    for name, result in results.items():
        print(format_table(result, title=name))
    print("== side by side ==")
    print(f"{'side':<12} {'episodes/s':>11} {'call p50 ms':>12} {'call p99 ms':>12} {'errors':>7}")
    for name, result in results.items():
        call = result["endpoints"].get("call", {})
        print(f"{name:<12} {result['episodes_per_s']:>11.1f} {call.get('p50_ms', 0):>12.2f} "
              f"{call.get('p99_ms', 0):>12.2f} {result['errors']:>7}")
    print("== CPU per episode (ms), machine busy ==")
    totals = {}
    for name, result in results.items():
        if name == "reference":
            continue
        cpu = result["cpu"]
        parts = "  ".join(f"{group} {v['ms_per_episode']:.2f}" for group, v in cpu.items())
        totals[name] = sum(v["ms_per_episode"] for v in cpu.values())
        print(f"{name:<12} {parts}  = {totals[name]:.2f} ms; machine {result['machine_busy_percent']:.0f} % busy")
    inline_p50 = results["inline"]["endpoints"]["call"]["p50_ms"]
    for name in totals:
        if name.startswith("celery"):
            diff = results[name]["endpoints"]["call"]["p50_ms"] - inline_p50
            print(f"{name}: CPU per episode {totals[name] / totals['inline']:.2f}x inline (target <= 2x); "
                  f"/call p50 {diff:+.2f} ms (target <= +2 ms at concurrency 1)")
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
