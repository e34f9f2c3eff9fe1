"""Container environments are tested on the real thing: Docker's engine with gVisor's runsc as its
runtime, real images built by the platform's build service. The engine is the platform's own
(orsplatform/containers/engine.py) in the checkout's var/containers, shared by the test processes
of a run (each holds a share; the last one out stops it) and kept between runs with its layers and
the local base images, so only a fresh machine pays for debootstrap and the first builds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orsplatform.containers import engine as engines
from tests.catalog.conftest import build_dirs, pyenv_root  # noqa: F401 - the same folders

PACKAGES = Path(__file__).with_name("packages")


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
