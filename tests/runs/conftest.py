"""Fixtures of the runs tests: the openreward client pointed at a live server."""

from __future__ import annotations

import pytest


@pytest.fixture
def openreward_at(monkeypatch):
    """Point the unmodified openreward client at a server (it reads its hosts from the environment)."""

    def point(url: str) -> None:
        monkeypatch.setenv("OPENREWARD_SESSION_URL", url)
        monkeypatch.setenv("OPENREWARD_API_URL", url)
        monkeypatch.setenv("OPENREWARD_URL", url)
        monkeypatch.setenv("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
        monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)

    return point
