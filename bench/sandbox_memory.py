"""Resident memory of sandbox workers: per idle worker, and per open session at scale.

    .venv/bin/python bench/sandbox_memory.py --sessions 1000 --envs 10

Opens SESSIONS sessions spread evenly over ENVS environment packages (copies of envs/math with
different content, so each is its own version and gets its own workers), all of one team, through
the inline executor's sandbox pool (no server, no database: the figures are the workers' own).
Memory is the sum of RSS and of PSS (shared pages split between the processes sharing them) over
every process of each worker: the worker, and bubblewrap's two processes around it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orsplatform.executors.executor import SessionSpec  # noqa: E402
from orsplatform.executors.inline import InlineExecutor  # noqa: E402
from orsplatform.sandbox.config import SandboxConfig  # noqa: E402


def tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    found, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) in KiB summed over `pids`."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss, pss


def workers_memory(executor: InlineExecutor) -> tuple[int, int, int]:
    workers = [w for w in executor.pool.workers() if w.alive and w.proc is not None]
    rss = pss = 0
    for w in workers:
        r, p = memory_kib(tree(w.proc.pid))
        rss, pss = rss + r, pss + p
    return len(workers), rss, pss


def packages(root: Path, count: int) -> list[Path]:
    out = []
    for i in range(count):
        target = root / f"math{i}"
        shutil.copytree(ROOT / "envs" / "math", target)
        with (target / "env.py").open("a") as fh:
            fh.write(f"\nBENCH_COPY = {i}\n")  # other content: another version
        out.append(target)
    return out


async def main(args: argparse.Namespace) -> None:
    config = SandboxConfig.from_env(threads=args.threads)
    executor = InlineExecutor(threads=args.threads, config=config)
    with tempfile.TemporaryDirectory(prefix="ors-sbx-mem-") as tmp:
        pkgs = packages(Path(tmp), args.envs)

        async def open_session(i: int) -> str:
            sid = f"s{i}"
            await executor.start(SessionSpec(sid=sid, package_path=str(pkgs[i % len(pkgs)]), entrypoint="env:Math",
                                             task_spec={"question": "1+1", "answer": "2", "id": i},
                                             owner={"team": 1, "env": f"bench/math{i % len(pkgs)}@1"}))
            await executor.wait_ready(sid, 120)
            return sid

        # One session per environment: one worker each, then its idle size once the session ends.
        started = time.monotonic()
        first = [await open_session(i) for i in range(args.envs)]
        for sid in first:
            await executor.stop(sid)
        n, rss, pss = workers_memory(executor)
        print(f"{n} idle workers (started in {time.monotonic() - started:.1f} s): "
              f"RSS {rss / n / 1024:.1f} MiB, PSS {pss / n / 1024:.1f} MiB per worker")
        idle_rss, idle_pss = rss / n, pss / n

        started = time.monotonic()
        for batch in range(0, args.sessions, 50):
            await asyncio.gather(*(open_session(i) for i in range(batch, min(batch + 50, args.sessions))))
        n2, rss2, pss2 = workers_memory(executor)
        print(f"{args.sessions} open sessions over {args.envs} environments in {n2} workers "
              f"(opened in {time.monotonic() - started:.1f} s): total RSS {rss2 / 1024:.0f} MiB, "
              f"PSS {pss2 / 1024:.0f} MiB")
        print(f"per open session beyond the workers' idle size: RSS {(rss2 - n2 * idle_rss) / args.sessions:.0f} KiB, "
              f"PSS {(pss2 - n2 * idle_pss) / args.sessions:.0f} KiB")
        await executor.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--envs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
