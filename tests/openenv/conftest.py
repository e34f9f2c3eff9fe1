"""Helpers of the OpenEnv face tests, which run against real server processes (``servers`` and
``server`` in tests/fixtures/server.py: the unmodified ``openenv`` 0.10.0 client only speaks to a
socket): the OpenEnv base URL of an environment on them."""

from __future__ import annotations

from tests.fixtures.server import ServerProcess


def base_url(server: ServerProcess, env: str) -> str:
    """Where an OpenEnv client is pointed: the environment's prefix (it appends /ws and /mcp)."""
    return f"{server.url}/openenv/{env}"
