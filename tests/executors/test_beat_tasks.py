"""The beat's lost-runner check (orsplatform/executors/tasks.py), called directly against real
Redis and the test database: a runner is lost when another start of its node beats under its
name, or when its heartbeat stays missing past ORS_RUNNER_GRACE_SECONDS; a heartbeat missing for
less (a restarted Redis loses every heartbeat at once) loses nothing."""

from __future__ import annotations

import json
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import redis
from django.db import connection, transaction

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.episodes import services
from orsplatform.episodes.models import Session
from orsplatform.executors.keys import Keys, runner_identity
from orsplatform.executors.tasks import fail_lost_runners
from orsplatform.teams.models import ApiKey
from tests.fixtures.celery import REDIS_URL, wait_until


@pytest.fixture
def beat(settings):
    settings.REDIS_URL = REDIS_URL
    settings.ORS_REDIS_PREFIX = f"ors-test-{uuid.uuid4().hex[:8]}"
    settings.ORS_RUNNER_GRACE_SECONDS = 1.0
    return SimpleNamespace(keys=Keys(settings.ORS_REDIS_PREFIX), redis=redis.Redis.from_url(REDIS_URL))


@pytest.fixture
def open_session_on(live_db, owner):
    version = EnvironmentVersion.objects.first()
    caller = SimpleNamespace(team_id=owner.team.pk, api_key_id=ApiKey.objects.get(team_id=owner.team.pk).pk)
    env = SimpleNamespace(environment_id=version.environment_id, version_id=version.pk)

    def make(runner: str) -> str:
        sid = uuid.uuid4().hex
        services.sessions_create(rows=[{"sid": sid, "caller": caller, "env": env, "task_spec": {}, "runner": runner}])
        return sid

    return make


def beats(beat, hostname: str, boot: str) -> None:
    beat.redis.set(beat.keys.runner(hostname), json.dumps({"boot": boot, "sessions": 1}), ex=60)


def status(sid: str) -> str:
    return Session.objects.get(sid=sid).status


def test_a_heartbeat_missing_for_less_than_the_grace_period_loses_no_session(beat, open_session_on):
    sid = open_session_on(runner_identity("node@a", "b1"))
    assert fail_lost_runners() == 0  # missing: the grace period starts now
    beats(beat, "node@a", "b1")  # the node writes its heartbeat again (Redis came back)
    assert fail_lost_runners() == 0
    beat.redis.delete(beat.keys.runner("node@a"))
    assert fail_lost_runners() == 0  # missing again: a new grace period, not the old one
    assert status(sid) == "creating"


def test_a_heartbeat_missing_past_the_grace_period_loses_the_runners_sessions(beat, open_session_on):
    sid = open_session_on(runner_identity("node@b", "b1"))
    other = open_session_on(runner_identity("node@c", "b1"))
    beats(beat, "node@c", "b1")
    assert fail_lost_runners() == 0
    wait_until(lambda: fail_lost_runners() == 1, 10, "runner lost after the grace period")
    assert (status(sid), status(other)) == ("lost", "creating")
    assert json.loads(beat.redis.get(beat.keys.state(sid))) == {"state": "gone"}


def test_another_start_of_the_node_under_its_name_loses_the_old_starts_sessions_at_once(
        beat, open_session_on, owner):
    old = open_session_on(runner_identity("node@d", "first"))
    new = open_session_on(runner_identity("node@d", "second"))
    slots = beat.keys.slots(owner.team.pk)
    beat.redis.zadd(slots, {old: 1, new: 1})  # both hold one of the team's open-session slots
    beats(beat, "node@d", "second")
    assert fail_lost_runners() == 1
    assert (status(old), status(new)) == ("lost", "creating")
    # The lost session's slot is free at once, not when a gateway's lease on it lapses.
    assert [m.decode() for m in beat.redis.zrange(slots, 0, -1)] == [new]


@pytest.fixture
def row_writer():
    """Another connection holding a session row's lock until the test releases it, as a gateway's
    write does (a row lock on PostgreSQL, the one writer's lock on SQLite)."""
    held: list[tuple[threading.Event, threading.Thread]] = []

    def hold(sid: str) -> threading.Event:
        locked, release = threading.Event(), threading.Event()

        def run() -> None:
            try:
                with transaction.atomic():
                    Session.objects.filter(sid=sid).update(error="")
                    locked.set()
                    release.wait(30)
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        held.append((release, thread))
        assert locked.wait(10), "the writer took the row's lock"
        return release

    yield hold
    for release, thread in held:
        release.set()
        thread.join(30)


def beat_in_thread(pool: ThreadPoolExecutor) -> Future:
    def run() -> int:
        try:
            return fail_lost_runners()
        finally:
            connection.close()

    return pool.submit(run)


def test_a_lost_runners_session_that_a_writer_holds_is_marked_in_the_same_pass_once_released(
        beat, open_session_on, row_writer):
    old = runner_identity("node@e", "first")
    held, free = open_session_on(old), open_session_on(old)
    beats(beat, "node@e", "second")  # another start of the node: lost at once
    release = row_writer(held)
    with ThreadPoolExecutor(1) as pool:
        marked = beat_in_thread(pool)
        if connection.vendor == "postgresql":
            # The first pass marks the free row and skips the held one; then the writer lets go.
            wait_until(lambda: status(free) == "lost", 10, "the beat's first pass")
            assert status(held) == "creating"
        release.set()  # (SQLite: the beat waits for the one writer meanwhile)
        assert marked.result(timeout=30) == 2
    assert (status(held), status(free)) == ("lost", "lost")


def test_a_row_held_past_the_wait_is_left_for_the_next_beat_rather_than_holding_this_one(
        beat, open_session_on, row_writer, monkeypatch):
    monkeypatch.setattr("orsplatform.executors.tasks.LOCKED_ROWS_WAIT", 0.2)
    old = runner_identity("node@f", "first")
    held, free = open_session_on(old), open_session_on(old)
    beats(beat, "node@f", "second")
    release = row_writer(held)
    if connection.vendor != "postgresql":  # SQLite locks the database, not rows: the beat waits its turn
        with ThreadPoolExecutor(1) as pool:
            marked = beat_in_thread(pool)
            release.set()
            assert marked.result(timeout=30) == 2
        assert (status(held), status(free)) == ("lost", "lost")
        return
    assert fail_lost_runners() == 1  # returns while the row is still held
    assert (status(held), status(free)) == ("creating", "lost")
    release.set()
    wait_until(lambda: fail_lost_runners() == 1, 10, "the held row marked once its writer let go")
    assert status(held) == "lost"
