"""A platform for the verification tests: a real gateway (inline executor, so episodes run in its
sandbox workers) and a real Celery platform worker that runs the replays, on the test database
(PostgreSQL in CI) and Redis, sharing one package folder of the test's own."""

from __future__ import annotations

import pytest


@pytest.fixture
def platform(cluster, server_factory, tmp_path, settings):
    settings.ORS_PACKAGE_DIR = tmp_path / "packages"
    extra = {"ORS_PACKAGE_DIR": str(tmp_path / "packages"), "ORS_EXECUTOR": "inline",
             "ORS_REPLAY_PROGRESS_SECONDS": "0.1"}
    # The gateway first: the worker's start (not waited for) would compete with the gateway's for the CPU.
    gateway = server_factory(**cluster.env(**extra))
    cluster.start_platform_worker(**extra)
    return gateway
