"""Fixtures of the ORS endpoint tests (helpers live in tests/ors/support.py)."""

from __future__ import annotations

import pytest

from tests.ors.support import PROBE, in_db, publish_probe_sync


@pytest.fixture
async def probe(owner, tmp_path) -> str:
    """Publishes the probe environment as a private environment of acme (the owner's team)."""
    await in_db(publish_probe_sync, owner.team, tmp_path)
    return PROBE
