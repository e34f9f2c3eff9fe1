"""Publishing a package with requirements (issue #16): wall time, cold cache and warm, and the
disk each built Python environment costs.

    cd /work/main && .venv/bin/python bench/publish_requirements.py [--runs 3]

Each run starts from an empty ORS_VAR_DIR (fresh SQLite database, package store, environments'
folder and uv cache) and times ``manage.py publish_env`` (which waits for the build) as a whole
process, side by side in one run:
  0. the reference: the same environment without requirements (the platform's own runtime);
  1. cold: requiring numpy with an empty uv cache (everything downloaded);
  2. warm cache, new set: numpy and easydict (numpy and the SDKs hard-linked from the cache);
  3. identical set: numpy again, different code (the built environment is reused: no installer runs).
Disk: each environment's files (apparent size), what it adds beyond uv's cache (files not hard-linked),
and the whole environments' folder (cache included, hard links counted once by du).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

ENV = textwrap.dedent('''
    import numpy as np
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    FLAVOUR = "{flavour}"


    class Answer(BaseModel):
        answer: float


    class Mean(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            return [{{"values": [1, 2, 3, i]}} for i in range(10)]

        def get_prompt(self):
            return [TextBlock(text=f"Mean of {{self.task_spec['values']}}?")]

        @tool
        def submit(self, params: Answer) -> ToolOutput:
            right = abs(params.answer - float(np.mean(self.task_spec["values"]))) < 1e-9
            return ToolOutput(blocks=[TextBlock(text=FLAVOUR)], reward=float(right), finished=True)
''')
NO_REQS = ENV.replace("import numpy as np\n", "import statistics as np\n")


def manage(var: Path, *args: str) -> float:
    env = {**os.environ, "ORS_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "orsplatform.settings"}
    env.pop("DATABASE_URL", None)
    started = time.perf_counter()
    subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def package(root: Path, name: str, source: str, requirements: str | None) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "env.py").write_text(source)
    if requirements:
        (folder / "requirements.txt").write_text(requirements)
    return folder


def usage(path: Path) -> tuple[int, int]:
    total = own = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_size
            own += st.st_size if st.st_nlink == 1 else 0
    return total, own


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()[0])


def one_run() -> dict:
    with tempfile.TemporaryDirectory(prefix="ors-bench-publish-") as tmp:
        root = Path(tmp)
        var = root / "var"
        manage(var, "migrate", "--noinput")
        manage(var, "create_team", "bench")
        steps = [("reference (no requirements)", NO_REQS.format(flavour="ref"), None),
                 ("cold cache: numpy", ENV.format(flavour="a"), "numpy\n"),
                 ("warm cache, new set: numpy + easydict", ENV.format(flavour="b"), "numpy\neasydict\n"),
                 ("identical set: numpy", ENV.format(flavour="c"), "numpy\n")]
        out = {}
        for i, (label, source, reqs) in enumerate(steps):
            folder = package(root, f"p{i}", source, reqs)
            out[label] = manage(var, "publish_env", str(folder), "--team", "bench", "--slug", f"mean{i}")
        envs = sorted(p for p in (var / "pyenvs").iterdir() if p.is_dir() and len(p.name) == 64)
        out["environments"] = [usage(p) for p in envs]
        out["folder"] = du(var / "pyenvs")
        out["cache"] = du(var / "pyenvs" / ".uv-cache")
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = [one_run() for _ in range(parser.parse_args().runs)]
    print(f"load average {os.getloadavg()[0]:.2f}; {len(runs)} runs, each from empty folders")
    for label in [k for k in runs[0] if isinstance(runs[0][k], float)]:
        values = [r[label] for r in runs]
        ref = statistics.median(r["reference (no requirements)"] for r in runs)
        print(f"{label:42s} median {statistics.median(values):6.2f} s  (min {min(values):.2f}, "
              f"max {max(values):.2f}; {statistics.median(values) / ref:4.1f}x the reference)")
    last = runs[-1]
    mib = 1024 * 1024
    for i, (total, own) in enumerate(last["environments"]):
        print(f"environment {i + 1}: {total / mib:6.1f} MiB of files, {own / mib:5.1f} MiB not shared with uv's cache")
    print(f"environments' folder with uv's cache (du, hard links once): {last['folder'] / mib:.1f} MiB; "
          f"the cache alone {last['cache'] / mib:.1f} MiB")


if __name__ == "__main__":
    main()
