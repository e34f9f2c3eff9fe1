"""Container environments are tested on the real thing: Docker's engine with gVisor's runsc as its
runtime, real images built by the platform's build service. The engine is the platform's own
(orsplatform/containers/engine.py) in the checkout's var/containers, shared by the test processes
of a run (each holds a share; the last one out stops it) and kept between runs with its layers and
the local base images, so only a fresh machine pays for debootstrap and the first builds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.containers import engine as engines
from tests.catalog.conftest import build_dirs, pyenv_root  # noqa: F401 - the same folders

PACKAGES = Path(__file__).with_name("packages")
BUILD_SECONDS = 900  # a fresh machine debootstraps the base and installs openenv with Gradio


@pytest.fixture(scope="session")
def container_engine():
    state = Path(__file__).resolve().parents[2] / "var" / "containers"
    os.environ["ORS_CONTAINERS_DIR"] = str(state)
    why = engines.problem()
    assert why is None, f"container tests need Docker and runsc (bin/system-deps containers): {why}"
    engine = engines.acquire(state)
    try:
        yield engine
    finally:
        engines.release(engine)


@pytest.fixture(autouse=True)
def tmp_package_dirs(settings, tmp_path):
    """Packages (and the image records beside them) under the test's tmp_path, never the checkout's var/."""
    settings.ORS_PACKAGE_DIR = tmp_path / "packages"
    settings.ORS_UPLOAD_DIR = tmp_path / "uploads"
    return settings.ORS_PACKAGE_DIR


@pytest.fixture
def container_dirs(container_engine, settings, build_dirs, tmp_package_dirs):  # noqa: F811 - the imported fixture
    """build_dirs, and the engine's folder for a server subprocess."""
    settings.ORS_CONTAINERS_DIR = container_engine.state
    return {**build_dirs, "ORS_PACKAGE_DIR": str(tmp_package_dirs), "ORS_CONTAINERS_DIR": str(container_engine.state)}


def package_files(name: str) -> dict[str, bytes]:
    root = PACKAGES / name
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def version_of(slug: str, number: int = 1) -> EnvironmentVersion:
    # The team too: another test's committed environment may share the slug under another team.
    return EnvironmentVersion.objects.get(environment__team__slug="acme", environment__slug=slug, number=number)


def wait_built(slug: str, number: int = 1) -> EnvironmentVersion:
    """acme/<slug>@<number> once its build ended (ready or failed)."""
    from tests.e2e.helpers import wait_for

    wait_for(lambda: EnvironmentVersion.objects.filter(
        environment__team__slug="acme", environment__slug=slug, number=number).exclude(
        status=EnvironmentVersion.Status.BUILDING).exists(), timeout=BUILD_SECONDS, what="the build")
    return version_of(slug, number)


# The ledger with hidden task fields and a sealed test split (docs/hidden-tasks.md): `start` is what
# the image's server resets with (its balance shows it reached the server), `answer` a canary the
# server never prints. A reference solution (verify/solutions.jsonl) scores train/0 only with its
# hidden start. The .dockerignore keeps all of this out of the build context, so a version that
# changes only these files is a full cache hit on the image's layers.
LEDGER_CANARY = "SECRETLEDGER"
LEDGER_TASKS = {"train": [7, 2], "test": [1, 2, 3]}
LEDGER_MANIFEST = 'description = "A ledger"\nhidden_task_fields = ["start", "answer"]\nsealed_splits = ["test"]\n'


def ledger_task(split: str, index: int) -> dict:
    return {"label": f"{split}-{index}", "start": LEDGER_TASKS[split][index],
            "answer": f"{LEDGER_CANARY}{split.upper()}{index:03d}XQ"}


def faces_package(*, manifest: str = LEDGER_MANIFEST, extra: dict[str, str] | None = None) -> dict[str, bytes | str]:
    import json

    tasks = {f"tasks/{split}.jsonl": "".join(json.dumps(ledger_task(split, i)) + "\n" for i in range(len(starts)))
             for split, starts in LEDGER_TASKS.items()}
    solution = {"split": "train", "index": 0, "calls": [{"name": "step", "input": {"amount": 3}}],
                "expected_reward": 10.0}
    return {**package_files("ledger_env"), **tasks, "manifest.toml": manifest,
            "verify/solutions.jsonl": json.dumps(solution) + "\n",
            ".dockerignore": "manifest.toml\ntasks\nverify\nCHANGES.md\n", **(extra or {})}
