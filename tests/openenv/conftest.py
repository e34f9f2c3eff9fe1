"""Fixtures of the OpenEnv face tests: real server processes (the unmodified ``openenv`` 0.10.0
client only speaks to a socket) whose logs must stay free of tracebacks, and the OpenEnv base URL
of an environment on them."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import assert_log_clean
from tests.fixtures.server import ServerProcess


@pytest.fixture
def oe_servers(server_factory):
    started: list[ServerProcess] = []

    def factory(**env: str) -> ServerProcess:
        proc = server_factory(**env)
        started.append(proc)
        return proc

    yield factory
    for proc in started:
        assert_log_clean(proc.log())


@pytest.fixture
def oe_server(oe_servers) -> ServerProcess:
    """A daphne server with default settings."""
    return oe_servers()


def base_url(server: ServerProcess, env: str) -> str:
    """Where an OpenEnv client is pointed: the environment's prefix (it appends /ws and /mcp)."""
    return f"{server.url}/openenv/{env}"
