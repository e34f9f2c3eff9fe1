"""What neutral mount sources cost a bubblewrap sandbox's start: launch.py's read-only overlays
(launch._stage) against plain binds (the reference), side by side in one run, interleaved.

    .venv/bin/python bench/sandbox_stage.py --starts 15

Each start is a whole sandboxed process as a worker gets it (launcher, bubblewrap, the interpreter
and site-packages at /ors/python and /ors/venv, the platform's modules under /ors/lib), running
`python -I` with the imports a worker makes (the ors SDK, pydantic), so the overlays' lookups are
in the figure too. Runs as root (the overlays take it, as tenant isolation does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orsplatform.sandbox import binding, bwrap  # noqa: E402
from orsplatform.sandbox.config import SandboxConfig  # noqa: E402

CODE = "import json, asyncio, pydantic, ors; print('ok')"


def argv(staged: bool) -> list[str]:
    config = SandboxConfig.from_env(threads=4).with_mode("bwrap")
    binds = binding.module_binds(binding.WORKER_MODULES)
    cmd = bwrap.sandboxed(config, config.defaults, binds, [bwrap.python_of(config, None), "-I", "-c", CODE])
    spec = json.loads(cmd[-1])
    if not staged:
        spec["stage"] = None
    return [*cmd[:-1], json.dumps(spec)]


def once(cmd: list[str]) -> float:
    begun = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, timeout=120)
    took = time.perf_counter() - begun
    if done.stdout.strip() != b"ok":
        raise SystemExit(f"the sandboxed run failed: {done.stderr.decode(errors='replace')[-800:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=15)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the overlays (and the sandbox's own uid) take it")
    commands = {"binds": argv(False), "overlays": argv(True)}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for cmd in commands.values():
        once(cmd)  # page cache warm for both
    for _ in range(args.starts):
        for name, cmd in commands.items():  # interleaved: load drifts hit both alike
            times[name].append(once(cmd))
    med = {name: statistics.median(t) * 1000 for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:9s} start+imports median {med[name]:7.1f} ms  min {min(t) * 1000:7.1f} ms  (n={len(t)})")
    print(f"overlays / binds: {med['overlays'] / med['binds']:.3f}x; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
