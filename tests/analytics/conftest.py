from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from orsplatform.analytics.services import session_rollup_run, tool_call_rollup_run
from tests.analytics.seed import Seeded, seed


def login(person) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=person.username))
    return client


@pytest.fixture
def seeded(owner, outsider) -> Seeded:
    """The known dataset (seed.py), folded into the rollups (the open session stays out: it is read live)."""
    data = seed(acme=owner.team, globex=outsider.team)
    tool_call_rollup_run(settle=0)
    session_rollup_run()
    return data


@pytest.fixture(autouse=True)
def fresh_rollups(live_db):
    """The rollup cursor is global state that outlives live_db's cleanup; every test starts without it."""
    from orsplatform.analytics.models import RollupCursor

    RollupCursor.objects.all().delete()
    yield
