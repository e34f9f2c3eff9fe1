"""The sandbox's two runtimes side by side in one run: bubblewrap (the host's kernel) and gVisor.

    .venv/bin/python bench/sandbox_runtimes.py --runtimes bwrap,gvisor --starts 5 --calls 500

For each runtime, through the inline executor's pool (no server, no database: the workers' own
figures), on a small ors-sdk environment with a `count` tool (ECHO_ENV):

- cold start: a session's setup on a pair with no worker (worker start + setup), median of STARTS;
- warm start: a further session's setup on that worker, median of STARTS;
- tool call round trip on a warm worker, p50 and p99 of CALLS sequential calls;
- memory per idle worker: PSS (shared pages split between sharers) and RSS summed over every host
  process of the worker (bubblewrap's and the worker, or runsc's, gVisor's Sentry and gofer);
- the CPU of those processes per call.

bench/compare.py --sandbox bwrap,gvisor gives the episodes/s and CPU per episode of the whole
platform at concurrency 16 against the reference server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sandbox_memory import memory_kib, tree  # noqa: E402

from orsplatform.executors.executor import SessionSpec  # noqa: E402
from orsplatform.executors.inline import InlineExecutor  # noqa: E402
from orsplatform.sandbox.config import SandboxConfig  # noqa: E402

ECHO_ENV = """
from ors import Environment, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel


class CountParams(BaseModel):
    n: int


class Echo(Environment):
    @classmethod
    def list_splits(cls):
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split):
        return [{"id": 0}]

    def get_prompt(self):
        return [TextBlock(text="count")]

    @tool
    def count(self, params: CountParams) -> ToolOutput:
        \"\"\"Twice n.\"\"\"
        return ToolOutput(blocks=[TextBlock(text=str(2 * params.n))], reward=0.0)
"""


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def spec(sid: str, package: str, team: int) -> SessionSpec:
    return SessionSpec(sid=sid, package_path=package, entrypoint="env:Echo", task_spec={"id": 0}, owner={"team": team, "env": "bench/math@1"})


async def measure(runtime: str, package: str, starts: int, calls: int) -> dict:
    os.environ["ORS_SANDBOX"] = runtime
    config = SandboxConfig.from_env(threads=8)
    assert config.mode == runtime, (config.mode, runtime)
    executor = InlineExecutor(threads=8, config=config)
    cold, warm, rtt = [], [], []
    try:
        for n in range(starts):
            begun = time.perf_counter()
            await executor.start(spec(f"c{n}", package, team=1000 + n))  # a new pair: a new worker
            await executor.wait_ready(f"c{n}", 120)
            cold.append(time.perf_counter() - begun)
            begun = time.perf_counter()
            await executor.start(spec(f"w{n}", package, team=1000 + n))
            await executor.wait_ready(f"w{n}", 120)
            warm.append(time.perf_counter() - begun)
        worker = next(w for w in executor.pool.workers() if "c0" in w.sessions)
        pids = tree(worker.proc.pid)
        cpu_before = cpu_seconds(pids)
        for _ in range(calls):
            begun = time.perf_counter()
            outcome = await executor.call("c0", "count", {"n": 4}, timeout=30)
            rtt.append(time.perf_counter() - begun)
            assert outcome.result["output"]["blocks"][0]["text"] == "8", outcome
        cpu = cpu_seconds(tree(worker.proc.pid)) - cpu_before
        idle = [memory_kib(tree(w.proc.pid)) for w in executor.pool.workers()]
    finally:
        await executor.close()
    rtt.sort()
    return {
        "runtime": runtime,
        "cold_start_ms": statistics.median(cold) * 1000,
        "warm_start_ms": statistics.median(warm) * 1000,
        "call_p50_ms": rtt[len(rtt) // 2] * 1000,
        "call_p99_ms": rtt[min(len(rtt) - 1, int(len(rtt) * 0.99))] * 1000,
        "worker_cpu_ms_per_call": cpu * 1000 / calls,
        "idle_pss_mib": statistics.median(pss for _, pss in idle) / 1024,
        "idle_rss_mib": statistics.median(rss for rss, _ in idle) / 1024,
    }


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="orsruntimes-") as tmp:
        package = Path(tmp) / "echo"
        package.mkdir()
        (package / "env.py").write_text(ECHO_ENV)
        os.chmod(tmp, 0o755)
        rows = [await measure(r.strip(), str(package), args.starts, args.calls) for r in args.runtimes.split(",")]
    keys = [k for k in rows[0] if k != "runtime"]
    print(f"{'':<24}" + "".join(f"{r['runtime']:>12}" for r in rows))
    for key in keys:
        print(f"{key:<24}" + "".join(f"{r[key]:>12.2f}" for r in rows))
    if len(rows) == 2:
        a, b = rows
        print(f"\n{b['runtime']} / {a['runtime']}: cold start {b['cold_start_ms'] / a['cold_start_ms']:.2f}x, "
              f"call p50 {b['call_p50_ms'] / a['call_p50_ms']:.2f}x, idle PSS {b['idle_pss_mib'] / a['idle_pss_mib']:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default="bwrap,gvisor")
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    asyncio.run(main(parser.parse_args()))
