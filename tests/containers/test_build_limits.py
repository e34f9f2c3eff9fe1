"""An image build's limits: a step that takes more memory than the build has is killed, one that forks
past the build's processes is refused, and a build that writes more than its disk is stopped while it
writes. Each failure names its limit on the version. Real engine, BuildKit, builds through the REST API."""

from __future__ import annotations

import secrets

import httpx
import pytest

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.containers import build_limits
from tests.catalog.support import zip_bytes
from tests.containers.conftest import BUILD_SECONDS, wait_built

LIMITS = {"ORS_IMAGE_BUILD_MEMORY_MB": "256", "ORS_IMAGE_BUILD_PROCESSES": "64", "ORS_IMAGE_BUILD_DISK_MB": "300"}
# Each step prints a marker computed when it runs, so the log shows whether it got that far, and a
# token of this run, so BuildKit's cache never answers for it.
HOG = "RUN echo TOKEN && python3 -c \"b = b'x' * (1536 * 2**20); print('done-%d' % (40 + 1))\""
FORKS = "RUN echo TOKEN && for i in $(seq 1 200); do sleep 60 & done; echo done-$((40 + 2))"
FILLER = "RUN echo TOKEN && dd if=/dev/zero of=/fill bs=1M count=6000 && echo done-$((40 + 3))"


def _publish(server, owner, slug: str, step: str) -> EnvironmentVersion:
    dockerfile = f'FROM python:3.11-slim\n{step.replace("TOKEN", secrets.token_hex(8))}\nCMD ["python3", "-m", "http.server"]\n'
    files = {"server/Dockerfile": dockerfile, "openenv.yaml": f"name: {slug}\nport: 8000\n"}
    r = httpx.post(f"{server.url}/api/v1/environments/acme/{slug}/versions", headers=owner.headers,
                   files={"package": (f"{slug}.zip", zip_bytes(files))}, timeout=BUILD_SECONDS)
    assert r.status_code == 202, r.text
    return wait_built(slug)


@pytest.fixture
def limited_server(servers, container_dirs):
    return servers(**container_dirs, **LIMITS)


def test_a_build_step_past_the_builds_memory_is_killed_and_the_version_says_so(limited_server, owner):
    version = _publish(limited_server, owner, "hog", HOG)
    assert version.status == EnvironmentVersion.Status.FAILED
    assert "ran out of memory" in version.error and "256 MB" in version.error, version.error
    assert "done-41" not in log_path(version.id).read_text()


def test_a_build_step_forking_past_the_builds_processes_is_refused(limited_server, owner):
    version = _publish(limited_server, owner, "forks", FORKS)
    assert version.status == EnvironmentVersion.Status.FAILED
    assert "64 processes" in version.error, version.error
    assert "done-42" not in log_path(version.id).read_text()


def test_a_build_writing_past_its_disk_is_stopped_while_it_writes(limited_server, owner, container_engine):
    free_before = build_limits.free_bytes(container_engine)
    version = _publish(limited_server, owner, "filler", FILLER)
    assert version.status == EnvironmentVersion.Status.FAILED
    assert "more than its 300 MB of disk" in version.error, version.error
    build_log = log_path(version.id).read_text()
    assert "done-43" not in build_log
    # Stopped while writing: far less than the step's 6,000 MB ever landed (BuildKit drops the
    # cancelled step's layer; what is left of it must not approach the step's size).
    assert build_limits.free_bytes(container_engine) > free_before - 2000 * 2**20
