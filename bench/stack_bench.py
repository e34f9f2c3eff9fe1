"""Episodes/s through the production stack's proxy (docker/compose.yml on real containers), with two
runner nodes and then with one (runner-2 stopped), and the time from `docker kill` of a runner node
to its sessions answering 410.

    bin/stack-test --bench --concurrency 16 --duration 20      # brings the stack up, runs this, tears down

Runs inside bin/stack-test, which sets ORS_STACK_URL, ORS_STACK_COMPOSE and ORS_STACK_DOCKER. The load
is bench/loadgen.py's closed loop (whole math episodes: create_session, create, prompt, call, delete)
from this machine, through nginx, to the two gateways. The load generator shares the machine's cores
with the stack, as in the other benches: compare figures taken on the same machine only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen import format_table, run_load  # noqa: E402


def sh(*argv: str, timeout: float = 120) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout).stdout


class Stack:
    def __init__(self) -> None:
        self.url = os.environ["ORS_STACK_URL"]
        self.docker = os.environ.get("ORS_STACK_DOCKER", "docker")
        self.compose = shlex.split(os.environ["ORS_STACK_COMPOSE"])

    def container(self, service: str) -> str:
        return sh(*self.compose, "ps", "-q", service).split()[0]

    def manage(self, *args: str) -> str:
        return sh(*self.compose, "exec", "-T", "web", "python", "manage.py", *args)

    def wait_runners(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/ready", timeout=5).json().get("runners") == f"{count} live":
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # polling interval while the heartbeats settle
        raise SystemExit(f"not {count} live runners within {timeout:g} s")


def kill_to_410(stack: Stack, key: str, sessions: int = 4) -> float:
    """Open sessions, kill the node holding the first, time until that session answers 410."""
    headers = {"X-API-Key": key}
    sids = []
    for _ in range(sessions):
        sid = httpx.post(f"{stack.url}/create_session", headers=headers, timeout=30).json()["sid"]
        r = httpx.post(f"{stack.url}/math/create", headers={**headers, "X-Session-ID": sid},
                       json={"split": "test", "index": 0}, timeout=60)
        r.raise_for_status()
        sids.append(sid)
    out = stack.manage("shell", "-c", "from orsplatform.episodes.models import Session; "
                       f"print(Session.objects.get(sid={sids[0]!r}).runner)")
    node = out.strip().splitlines()[-1].split("@", 1)[0]
    container = stack.container(node)
    killed = time.monotonic()
    sh(stack.docker, "kill", container)
    while True:
        r = httpx.get(f"{stack.url}/math/prompt", headers={**headers, "X-Session-ID": sids[0]}, timeout=30)
        if r.status_code == 410:
            seconds = time.monotonic() - killed
            break
        if time.monotonic() - killed > 120:
            raise SystemExit("no 410 within 120 s")
        time.sleep(0.05)  # polling interval: the figure's resolution
    sh(stack.docker, "start", container)
    stack.wait_runners(2)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--kills", type=int, default=3, help="kill-to-410 measurements")
    parser.add_argument("--prime", type=float, default=10.0,
                        help="seconds of unmeasured load first (each node starts its sandbox workers)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    stack = Stack()
    stack.manage("create_team", "bench", "--name", "Bench")
    key = stack.manage("create_api_key", "bench", "stack-bench").strip().splitlines()[-1].strip()
    results = {}
    stack.wait_runners(2)

    def measure() -> dict:
        asyncio.run(run_load(stack.url, "math", args.concurrency, args.prime, 0.0, key))  # not counted
        return asyncio.run(run_load(stack.url, "math", args.concurrency, args.duration, args.warmup, key))

    results["2 runner nodes"] = measure()
    runner2 = stack.container("runner-2")
    sh(stack.docker, "stop", "-t", "10", runner2)
    try:
        stack.wait_runners(1)
        results["1 runner node"] = measure()
    finally:
        sh(stack.docker, "start", runner2)
    stack.wait_runners(2)
    kills = [kill_to_410(stack, key) for _ in range(args.kills)]
    summary = {name: {k: r[k] for k in ("episodes_per_s", "errors") if k in r} for name, r in results.items()}
    summary["kill_to_410_seconds"] = [round(k, 2) for k in kills]
    if args.json:
        print(json.dumps({"results": results, "summary": summary}, indent=1))
    else:
        for name, r in results.items():
            print(format_table(r, f"through the proxy, {name}, concurrency {args.concurrency}"))
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
