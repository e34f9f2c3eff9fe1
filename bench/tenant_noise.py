"""A noisy neighbour's cost to another team (docs/design.md §7: at most 1.5x its p50).

    cd /work/main && .venv/bin/python bench/tenant_noise.py --duration 10

Starts the platform (uvicorn, embedded default: SQLite and the inline executor unless DATABASE_URL
is set), with two teams that each publish tests/executors/noisy.py's environment. The quiet team runs
closed-loop episodes of `count` calls throughout; the noisy team, in turn,
  (a) burns CPU in its tools (`burn`),
  (b) floods its channel with 16 MiB frames that answer no request (`flood`; each kills its worker,
      so it opens a fresh session, and worker, for the next),
  (c) returns 48 MiB outputs (`huge`, over ORS_MAX_TOOL_OUTPUT_BYTES).
Each case is measured as `--rounds` pairs of a quiet window followed by a noisy window of the same
length, the latencies of each condition pooled over the rounds, so every ratio (the quiet team's
call p50 under noise / its p50 without) compares like with like on a machine whose load may drift;
each round's own ratio and the load average are printed beside each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare import free_port, manage, platform_command, server_process  # noqa: E402

from tests.executors.noisy import write_noisy  # noqa: E402

BUDGET = 1.5
MiB = 1024 * 1024


class Team:
    def __init__(self, client: httpx.AsyncClient, slug: str, token: str) -> None:
        self.client, self.env, self.headers = client, f"{slug}/noisy", {"X-API-Key": token}

    async def open(self) -> str:
        sid = (await self.client.post("/create_session", headers=self.headers)).json()["sid"]
        r = await self.client.post(f"/{self.env}/create", headers={**self.headers, "X-Session-ID": sid},
                                   json={"task_spec": {"id": 0}})
        r.raise_for_status()
        for _ in range(100):  # setup: 503 while the worker starts
            r = await self.client.get(f"/{self.env}/prompt", headers={**self.headers, "X-Session-ID": sid})
            if r.status_code == 200:
                return sid
        raise RuntimeError(f"session did not become ready: {r.status_code} {r.text[:200]}")

    async def call(self, sid: str, name: str, **params) -> str:
        r = await self.client.post(f"/{self.env}/call", headers={**self.headers, "X-Session-ID": sid},
                                   json={"name": name, "input": params})
        return r.text

    async def close(self, sid: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.client.post("/delete", headers={**self.headers, "X-Session-ID": sid})


async def quiet_loop(team: Team, latencies: list[float], stop: asyncio.Event, errors: list[str]) -> None:
    sid = await team.open()
    n = 0
    while not stop.is_set():
        started = time.perf_counter()
        text = await team.call(sid, "count", n=n)
        latencies.append(time.perf_counter() - started)
        if '"reward":0.5' not in text.replace(" ", ""):
            errors.append(text[:200])
        n += 1
    await team.close(sid)


async def noise_loop(team: Team, case: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    sid = ""
    while not stop.is_set():
        try:
            if not sid:
                sid = await team.open()
            if case == "burn":
                await team.call(sid, "burn", seconds=1.0)
            elif case == "flood":
                await team.call(sid, "flood", n=200, size=16 * MiB)  # kills its worker
                await team.close(sid)
                sid = ""
            elif case == "huge":
                await team.call(sid, "huge", size=48 * MiB)
            counts[case] = counts.get(case, 0) + 1
        except (httpx.HTTPError, RuntimeError):  # its worker is gone: the next session gets another
            counts["failed"] = counts.get("failed", 0) + 1
            sid = ""
    if sid:
        await team.close(sid)


def process_cpu_seconds(pid: int) -> float:
    """CPU (user + system) of the gateway process itself, not its sandbox workers."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


async def measure(quiet: Team, noisy: Team, case: str, duration: float, quiet_workers: int,
                  noisy_workers: int, gateway_pid: int, rounds: int) -> dict:
    """`rounds` pairs of windows, quiet then noisy, the quiet team's loops running throughout; the
    latencies of each condition are pooled over the rounds, so a drift in the machine's load
    during the run falls on both sides alike."""
    latencies: list[float] = []
    errors: list[str] = []
    stop = asyncio.Event()
    workers = [asyncio.create_task(quiet_loop(quiet, latencies, stop, errors)) for _ in range(quiet_workers)]
    await asyncio.sleep(2.0)  # warm-up: sessions open, workers started
    calm: list[float] = []
    loud: list[float] = []
    cpu_calm = cpu_loud = 0.0
    counts: dict[str, int] = {}
    per_round: list[float] = []
    calm_load = os.getloadavg()[0]
    for _ in range(rounds):
        latencies.clear()
        cpu_start = process_cpu_seconds(gateway_pid)
        await asyncio.sleep(duration)
        cpu_calm += process_cpu_seconds(gateway_pid) - cpu_start
        round_calm = list(latencies)
        latencies.clear()
        noise_stop = asyncio.Event()
        noise = [asyncio.create_task(noise_loop(noisy, case, noise_stop, counts)) for _ in range(noisy_workers)]
        cpu_start = process_cpu_seconds(gateway_pid)
        await asyncio.sleep(duration)
        cpu_loud += process_cpu_seconds(gateway_pid) - cpu_start
        round_loud = list(latencies)
        noise_stop.set()
        await asyncio.wait(noise, timeout=120)
        calm += round_calm
        loud += round_loud
        per_round.append(round(p50_ms(round_loud) / p50_ms(round_calm), 2))
    stop.set()
    await asyncio.wait(workers, timeout=120)
    seconds = duration * rounds
    result = {"case": case, "quiet_p50_ms": p50_ms(calm), "noisy_p50_ms": p50_ms(loud),
              "ratio": p50_ms(loud) / p50_ms(calm), "ratio_per_round": per_round,
              "quiet_calls": len(calm), "noisy_calls": len(loud),
              "noise_actions": counts.get(case, 0), "errors": len(errors),
              # The gateway process's own CPU share (its sandbox workers excluded) in each condition.
              "gateway_cpu_quiet": round(cpu_calm / seconds, 3), "gateway_cpu_noisy": round(cpu_loud / seconds, 3),
              "loadavg_before": round(calm_load, 2), "loadavg_after": round(os.getloadavg()[0], 2)}
    print(f"{case:6s} quiet p50 {result['quiet_p50_ms']:7.2f} ms  under noise {result['noisy_p50_ms']:7.2f} ms  "
          f"ratio {result['ratio']:5.2f} (rounds {per_round})  ({len(calm)}/{len(loud)} calls, "
          f"{result['noise_actions']} noisy actions, {len(errors)} wrong answers, gateway CPU "
          f"{result['gateway_cpu_quiet']:.2f} -> {result['gateway_cpu_noisy']:.2f}, load {calm_load:.2f} -> "
          f"{result['loadavg_after']:.2f})", flush=True)
    return result


async def run(base_url: str, tokens: dict[str, str], args: argparse.Namespace, gateway_pid: int) -> list[dict]:
    async with httpx.AsyncClient(base_url=base_url, timeout=300,
                                 limits=httpx.Limits(max_connections=64)) as client:
        quiet, noisy = Team(client, "quiet", tokens["quiet"]), Team(client, "noisy", tokens["noisy"])
        return [await measure(quiet, noisy, case, args.duration, args.quiet_workers, args.noisy_workers,
                              gateway_pid, args.rounds) for case in args.cases]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each quiet and noisy window")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of quiet and noisy windows per case")
    parser.add_argument("--quiet-workers", type=int, default=4)
    parser.add_argument("--noisy-workers", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=["burn", "flood", "huge"], choices=["burn", "flood", "huge"])
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenant-noise-") as tmp:
        workdir = Path(tmp)
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "orsplatform.settings", "ORS_LOG_LEVEL": "WARNING",
               "ORS_VAR_DIR": str(workdir / "var"),
               "DATABASE_URL": os.environ.get("DATABASE_URL") or f"sqlite:///{workdir / 'bench.sqlite3'}"}
        manage(["migrate", "--noinput"], env)
        write_noisy(workdir / "noisy", timeout=60)
        tokens = {}
        for team in ("quiet", "noisy"):
            manage(["create_team", team], env)
            manage(["publish_env", str(workdir / "noisy"), "--team", team], env)
            tokens[team] = manage(["create_api_key", team, "bench"], env).strip().splitlines()[-1]
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        with server_process("platform", platform_command("uvicorn", port), env, base_url,
                            workdir / "platform.log", 60.0) as proc:
            results = asyncio.run(run(base_url, tokens, args, proc.pid))
    worst = max(r["ratio"] for r in results)
    print(f"worst ratio {worst:.2f} (budget {BUDGET})")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0 if worst <= BUDGET and not any(r["errors"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
