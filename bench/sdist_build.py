"""Building a requirement published only as a source distribution (issue #27, item 1) against the
same package published as a wheel: wall time of the environment's build, the ratio between them.

    cd /work/main && .venv/bin/python bench/sdist_build.py [--runs 3]

A local package index (tests/catalog/local_index.py) serves two packages of identical content,
``ors-bench-sdist`` (an sdist only) and ``ors-bench-wheel`` (a wheel only), at a new version every
run so no build is reused. One uv cache warmed first with the SDKs' dependencies (not timed), then
each run times ``pyenvs.ensure`` (what a publish's build does: resolve, build from source where
needed, install) for each, alternating. The sdist case adds: a wheels-only resolve that fails, the
sdist's download, ``uv build`` in its own sandbox with a private cache (which downloads setuptools
for the build, every time: nothing is shared), a second resolve, and a copy install of the wheel.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def wheel_bytes(name: str, version: str, files: dict[str, str]) -> bytes:
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    members = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
               f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    members[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in members.items():
            z.writestr(path, text)
    return buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ors-bench-sdist-"))
    os.environ.update(DJANGO_SETTINGS_MODULE="orsplatform.settings", ORS_VAR_DIR=str(root / "var"),
                      ORS_PYENV_DIR=str(root / "pyenvs"), ORS_BUILD_LOG_DIR=str(root / "builds"))
    import django

    from tests.catalog.local_index import local_index

    with local_index() as index:
        os.environ["ORS_BUILD_EXTRA_INDEX_URLS"] = index.url
        django.setup()
        from orsplatform.catalog import pyenvs

        log = pyenvs.BuildLog(root / "builds" / "bench.log")
        started = time.monotonic()
        pyenvs.ensure(["six"], log)  # warms the shared cache with the SDKs' dependencies
        print(f"warm-up (SDK dependencies into the shared cache): {time.monotonic() - started:.1f} s")
        code = {"VALUE": "VALUE = 42\n"}
        times: dict[str, list[float]] = {"sdist": [], "wheel": []}
        for run in range(args.runs):
            version = f"1.0.{run}"
            index.add_sdist("ors-bench-sdist", version, {"ors_bench_sdist.py": code["VALUE"]})
            index.add("ors-bench-wheel", f"ors_bench_wheel-{version}-py3-none-any.whl",
                      wheel_bytes("ors-bench-wheel", version, {"ors_bench_wheel.py": code["VALUE"]}))
            for kind in ("wheel", "sdist"):
                started = time.monotonic()
                built = pyenvs.ensure([f"ors-bench-{kind}=={version}"], log)
                times[kind].append(time.monotonic() - started)
                assert not built.reused
                print(f"run {run + 1}: {kind:5} {times[kind][-1]:.2f} s")
    sdist, wheel = statistics.median(times["sdist"]), statistics.median(times["wheel"])
    print(f"median over {args.runs} runs: sdist {sdist:.2f} s, wheel {wheel:.2f} s, "
          f"sdist / wheel = {sdist / wheel:.2f}x, the source build's cost {sdist - wheel:.2f} s")


if __name__ == "__main__":
    main()
