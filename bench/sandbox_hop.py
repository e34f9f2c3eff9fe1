"""CPU the sandbox boundary costs per episode: the same episodes through the sandboxed inline
executor and through an in-process executor (the pre-sandbox InlineExecutor, loaded from git).

    .venv/bin/python bench/sandbox_hop.py --episodes 2000 --concurrency 16 [--baseline-rev REV]

An episode is what the gateway asks of its executor: start + wait_ready, prompt, one call (the math
environment's `submit`), stop. No HTTP, no database: what remains is the executor's own work, so the
difference is the boundary (framing, the pipe, the worker's loop). CPU is this process's plus, for
the sandbox, every process of every worker (bubblewrap included), from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TICKS = os.sysconf("SC_CLK_TCK")

from orsplatform.executors.executor import SessionSpec  # noqa: E402
from orsplatform.executors.inline import InlineExecutor  # noqa: E402
from orsplatform.sandbox.config import SandboxConfig  # noqa: E402


def tree_cpu(pid: int) -> float:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
        except (OSError, IndexError):
            pass
        todo.extend(children.get(p, []))
    return total


def old_executor(rev: str):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:orsplatform/executors/inline.py"],
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "inline_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("inline_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["inline_before"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.InlineExecutor(threads=64)


async def run(executor, episodes: int, concurrency: int, workers_cpu) -> tuple[float, float]:
    package = str(ROOT / "envs" / "math")
    counter = iter(range(episodes))

    async def episode(i: int) -> None:
        sid = f"e{i}"
        await executor.start(SessionSpec(sid=sid, package_path=package, entrypoint="env:Math",
                                         task_spec={"question": "1+1", "answer": "2", "id": i},
                                         owner={"team": 1, "env": "builtin/math@1"}))
        await executor.wait_ready(sid, 60)
        await executor.prompt(sid)
        outcome = await executor.call(sid, "submit", {"answer": "2"}, 30)
        assert outcome.result and outcome.result["ok"], outcome
        await executor.stop(sid)

    async def loop() -> None:
        for i in counter:
            await episode(i)

    await episode(-1)  # warm: the worker started, the class imported
    cpu0, wall0, w0 = time.process_time(), time.perf_counter(), workers_cpu()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    cpu = time.process_time() - cpu0 + workers_cpu() - w0
    return 1000 * cpu / episodes, episodes / (time.perf_counter() - wall0)


async def main(args: argparse.Namespace) -> None:
    before = old_executor(args.baseline_rev)
    ms, eps = await run(before, args.episodes, args.concurrency, lambda: 0.0)
    await before.close()
    print(f"in-process (before, {args.baseline_rev}): {ms:.3f} ms CPU per episode, {eps:.0f} episodes/s")
    executor = InlineExecutor(threads=64, config=SandboxConfig.from_env(threads=64))

    def workers_cpu() -> float:
        return sum(tree_cpu(w.proc.pid) for w in executor.pool.workers() if w.proc is not None)

    ms2, eps2 = await run(executor, args.episodes, args.concurrency, workers_cpu)
    await executor.close()
    print(f"sandboxed (bubblewrap worker): {ms2:.3f} ms CPU per episode, {eps2:.0f} episodes/s")
    print(f"the boundary costs {ms2 - ms:+.3f} ms CPU per episode (3 round trips: setup, which brings the "
          "prompt back, call, stop; the frames of one loop pass share a write)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--baseline-rev", default="266333b")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args))
