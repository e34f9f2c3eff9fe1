"""Evaluation throughput: an AAP agent run over the bundled math tasks, driven by the platform.

    .venv/bin/python bench/evals_bench.py --episodes 1000 --concurrency 32 [--stream delta]
        [--database-url postgres://postgres@127.0.0.1:5432/aap] [--aap-version 1|2|3]

The reference agent (tests/evals/aap_agent.py, its own process, real HTTP and SSE; with
--aap-version 2 or 3 the SDK-shaped tests/evals/aap_sdk_agent.py) plays `solver`.
The platform side is `manage.py eval_run` on the embedded default (eager Celery): the run is driven
inside that one process (engine + episode gateway + inline executor), so its CPU — user + system
of the process and every child it reaped, from wait4 — is the platform's CPU (PostgreSQL's backends
are not included when --database-url points at PostgreSQL; SQLite runs in the process). Two runs: a short one (startup, imports, task generation, warm caches) and the measured one;
CPU per episode is the difference divided by the difference in episodes (the marginal cost), and
the total per episode of the measured run is printed too. Episodes/s is from the run's own
started_at/finished_at. The machine is shared: figures are noisy, run it more than once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
REGISTER = """
from orsplatform.evals.models import Agent
from orsplatform.evals.services import agent_register
from orsplatform.teams.models import Team
team, _ = Team.objects.get_or_create(slug="bench", defaults={{"name": "bench"}})
Agent.objects.filter(team=team).delete()  # an earlier bench run on the same database
agent_register(team=team, name="solver", url={url!r}, agent="solver", stream={stream!r})
"""
REPORT = """
import json
from orsplatform.evals.models import EvalRun
from orsplatform.evals.selectors import run_numbers
run = EvalRun.objects.get(id={run_id})
n = run_numbers(run=run)
print(json.dumps({{"status": run.status, "seconds": (run.finished_at - run.started_at).total_seconds(),
                  "done": n["done"], "errors": n["errors"], "pass_rate": n["pass_rate"]}}))
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def manage(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def timed_run(env: dict[str, str], episodes: int, concurrency: int, start: int) -> tuple[float, str]:
    """CPU seconds (process + reaped children) of `manage.py eval_run`, and its output."""
    process = subprocess.Popen(
        [PY, "manage.py", "eval_run", "--team", "bench", "--agent", "solver", "--environment", "builtin/math",
         "--split", "train", "--start", str(start), "--stop", str(start + episodes), "--concurrency",
         str(concurrency), "--max-turns", "5"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise SystemExit(f"eval_run failed:\n{output}")
    return usage.ru_utime + usage.ru_stime, output


def agent_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup-episodes", type=int, default=64)
    parser.add_argument("--stream", choices=["none", "message", "delta"], default="delta")
    parser.add_argument("--database-url", default="", help="default: SQLite in a temporary directory")
    parser.add_argument("--aap-version", type=int, choices=[1, 2, 3], default=1,
                        help="the AAP version the agent speaks (2 and 3: shaped as the TypeScript SDK's server)")
    args = parser.parse_args()

    # With an outside database the published packages must outlive the run (the database points at
    # them); with SQLite everything is throwaway.
    workdir = ROOT / "var" / "evals-bench" if args.database_url else Path(tempfile.mkdtemp(prefix="evals-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # An allow-list entry admits one port (without one, 80 and 443 only): the agent's.
    env = {**os.environ, "ORS_VAR_DIR": str(workdir), "ORS_EVAL_AGENT_ALLOWED_HOSTS": f"127.0.0.1:{port}",
           "ORS_LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "orsplatform.settings"}
    for name in ("REDIS_URL", "CELERY_BROKER_URL", "CELERY_TASK_ALWAYS_EAGER", "ORS_EXECUTOR"):
        env.pop(name, None)  # the embedded default: eager Celery, inline executor
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    else:
        env.pop("DATABASE_URL", None)
    script = ["aap_agent.py"] if args.aap_version == 1 else ["aap_sdk_agent.py", "--version", str(args.aap_version)]
    agent = subprocess.Popen([PY, str(ROOT / "tests" / "evals" / script[0]), *script[1:], "--port", str(port)],
                             cwd=ROOT, stdout=(workdir / "agent.log").open("w"), stderr=subprocess.STDOUT)
    try:
        print(f"-- setup in {workdir} ({'PostgreSQL' if args.database_url else 'SQLite'})", flush=True)
        manage(["migrate", "--noinput"], env)
        manage(["publish_envs", "math"], env)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/meta", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit("the reference agent did not start") from None
                time.sleep(0.1)  # polling interval while waiting on the readiness condition
        manage(["shell", "-c", REGISTER.format(url=f"http://127.0.0.1:{port}", stream=args.stream)], env)

        print(f"-- warm-up: {args.warmup_episodes} episodes at concurrency {args.concurrency}", flush=True)
        warm_cpu, _ = timed_run(env, args.warmup_episodes, args.concurrency, start=0)
        agent_before = agent_cpu(agent.pid)
        print(f"-- measured: {args.episodes} episodes at concurrency {args.concurrency} ({args.stream}, "
              f"AAP v{args.aap_version})", flush=True)
        cpu, output = timed_run(env, args.episodes, args.concurrency, start=args.warmup_episodes)
        agent_spent = agent_cpu(agent.pid) - agent_before
        run_id = int(output.split("Run #", 1)[1].split(":", 1)[0])
        report = json.loads(manage(["shell", "-c", REPORT.format(run_id=run_id)], env).strip().splitlines()[-1])
        rate = report["done"] / report["seconds"]
        marginal = (cpu - warm_cpu) / (args.episodes - args.warmup_episodes)
        print(output.strip().splitlines()[-1])
        print(json.dumps({"episodes": report["done"], "errors": report["errors"], "status": report["status"],
                          "seconds": round(report["seconds"], 2), "episodes_per_s": round(rate, 1),
                          "platform_cpu_s": round(cpu, 2), "platform_cpu_ms_per_episode": round(1000 * cpu / args.episodes, 2),
                          "platform_cpu_ms_per_episode_marginal": round(1000 * marginal, 2),
                          "agent_cpu_ms_per_episode": round(1000 * agent_spent / args.episodes, 2)},
                         indent=2))
    finally:
        agent.terminate()
        agent.wait(timeout=10)
        if not args.database_url:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
