"""Fixtures for the end-to-end tests: real server subprocesses whose logs are checked afterwards."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import assert_log_clean
from tests.fixtures.server import ServerProcess, start_server


@pytest.fixture(params=["daphne", "uvicorn"])
def any_servers(request, live_db, tmp_path):
    """Like ``servers``, once with daphne and once with uvicorn."""
    started: list[ServerProcess] = []

    def factory(**env: str) -> ServerProcess:
        proc = start_server(tmp_path, server=request.param, **env)
        started.append(proc)
        return proc

    try:
        yield factory
    finally:
        for proc in started:
            proc.stop()
    for proc in started:
        assert_log_clean(proc.log())


@pytest.fixture
def any_server(any_servers) -> ServerProcess:
    """A server with default settings, once daphne and once uvicorn."""
    return any_servers()


@pytest.fixture
def openreward_at(monkeypatch):
    """Point the openreward client at a server (it reads its hosts from the environment)."""

    def point(url: str) -> None:
        monkeypatch.setenv("OPENREWARD_SESSION_URL", url)
        monkeypatch.setenv("OPENREWARD_API_URL", url)
        monkeypatch.setenv("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
        monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)

    return point
