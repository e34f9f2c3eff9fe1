"""Beat tasks of the celery executor: idle expiry, lost runners, orphaned call results.

Each task handles a bounded batch and re-queues itself when the batch was full, so a backlog
drains without one task running for long; two beats are safe (skip_locked rows, status re-checks).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.utils import timezone

# The project's app, not shared_task (one way to declare a task everywhere): orsplatform/__init__.py
# does not load the Celery app, and a shared task would be bound to Celery's default app.
from orsplatform.celery import app
from orsplatform.episodes import services
from orsplatform.executors import inbox
from orsplatform.executors.keys import GONE_RECORD, Keys, heartbeat_identity, runner_hostname

log = logging.getLogger(__name__)
BATCH = 500
LOCKED_ROWS_WAIT = 2.0  # seconds a lost runner's pass waits for rows another writer holds


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _keys() -> Keys:
    return Keys(settings.ORS_REDIS_PREFIX)


def _beating(client: redis.Redis, keys: Keys, runner: str) -> str | None:
    """The runner identity whose heartbeat is under `runner`'s node name now (None: no heartbeat)."""
    hostname = runner_hostname(runner)
    return heartbeat_identity(hostname, client.get(keys.runner(hostname)))


def _forget(client: redis.Redis, keys: Keys, ended: list[tuple[str, int]],
            runners: dict[str, str] | None = None) -> None:
    """Sessions the beat ended: no gateway serves them from their Redis record any more, and their
    team's open-session slots are free at once (not when the gateways' leases lapse). `runners`
    (sid -> runner identity): their nodes are told to tear them down (their inbox, inbox.py)."""
    if not ended:
        return
    pipe = client.pipeline(transaction=False)
    for sid, runner in (runners or {}).items():
        pipe.lpush(keys.inbox(runner_hostname(runner)), inbox.message("teardown", sid))
    for sid, team_id in ended:
        pipe.set(keys.state(sid), GONE_RECORD, ex=int(settings.ORS_STATE_TTL_SECONDS))
        pipe.zrem(keys.slots(team_id), sid)
    pipe.execute()


@app.task(name="runners.reap_idle_sessions")
def reap_idle_sessions() -> int:
    idle_before = timezone.now() - timedelta(seconds=settings.ORS_IDLE_TIMEOUT_SECONDS)
    expired = services.sessions_expire_idle(idle_before=idle_before, limit=BATCH)
    keys, client = _keys(), _redis()
    _forget(client, keys, [(sid, team_id) for sid, _, team_id in expired],
            runners={sid: runner for sid, runner, _ in expired if runner})
    if len(expired) == BATCH:
        reap_idle_sessions.delay()
    if expired:
        log.info("expired %d idle sessions", len(expired))
    return len(expired)


@app.task(name="runners.fail_lost_runners")
def fail_lost_runners() -> int:
    client, keys = _redis(), _keys()
    marked = 0
    for runner in services.open_session_runners():
        beating = _beating(client, keys, runner)
        if beating == runner:
            client.delete(keys.missing(runner))
            continue
        if beating is None:
            # No heartbeat: lost once it stays missing for ORS_RUNNER_GRACE_SECONDS, since a
            # restarted Redis loses every heartbeat at once (live nodes write theirs again within
            # a second) and LOST is final. Another start of the node under its name: lost at once.
            now = time.time()
            client.set(keys.missing(runner), now, nx=True, ex=3600)
            if now - float(client.get(keys.missing(runner)) or now) < settings.ORS_RUNNER_GRACE_SECONDS:
                continue
        count = _mark_lost(client, keys, runner)
        marked += count
        log.warning("runner %s stopped (heartbeat: %s): %d sessions marked lost", runner, beating, count)
    return marked


def _mark_lost(client: redis.Redis, keys: Keys, runner: str) -> int:
    """Mark the lost runner's open sessions, all of them in this pass: a row a gateway is writing
    at that moment (its activity, a call's audit row; milliseconds) is skipped by the locking read,
    and would otherwise answer 200 from a dead node until the next beat while its siblings answer
    410. Skipped rows are taken again once their writer lets go, up to LOCKED_ROWS_WAIT seconds."""
    marked = 0
    deadline = time.monotonic() + LOCKED_ROWS_WAIT
    while True:
        lost = services.sessions_mark_lost(runner=runner, limit=BATCH)
        _forget(client, keys, lost)
        marked += len(lost)
        if len(lost) == BATCH:  # a backlog: the next batch in a task of its own
            fail_lost_runners.delay()
            return marked
        if not services.sessions_open_on(runner=runner) or time.monotonic() > deadline:
            return marked
        time.sleep(0.02)  # a locked row's writer holds it for one statement


@app.task(name="runners.finish_orphaned_calls")
def finish_orphaned_calls() -> int:
    """Record calls whose gateway went away before writing their audit row. A gateway keeps a
    marker in Redis while a call runs and removes it once the row is written; a marker older than
    ORS_ORPHAN_AFTER_SECONDS is recorded from the result its runner left (or as an error when the
    runner is gone too)."""
    from datetime import datetime

    client = _redis()
    keys = _keys()
    now = timezone.now()
    recorded = 0
    # Running calls are indexed by start time: only those old enough to be orphans are looked at.
    old_enough = time.time() - settings.ORS_ORPHAN_AFTER_SECONDS
    for raw_id in client.zrangebyscore(keys.calls, "-inf", old_enough, start=0, num=BATCH):
        task_id = raw_id.decode()
        raw = client.get(keys.call(task_id))
        if raw is None:  # recorded by its gateway, or expired
            client.zrem(keys.calls, task_id)
            continue
        marker = json.loads(raw)
        started_at = datetime.fromisoformat(marker["started_at"])
        if services.tool_call_exists(task_id=task_id, started_at=started_at):
            client.pipeline(transaction=False).delete(keys.call(task_id)).zrem(keys.calls, task_id).execute()
            continue
        result_raw = client.get(keys.result(task_id))
        if result_raw is not None:
            payload = json.loads(result_raw)
            result, exception = payload.get("audit", payload.get("result")), payload.get("exception")
            marker["input"] = payload.get("audit_input", marker["input"])  # stripped by the runner
        elif _beating(client, keys, marker.get("runner", "")) != marker.get("runner"):
            result, exception = None, "Runner lost: the node holding this session stopped."
        else:
            continue  # still running on a live runner
        services.tool_calls_record(rows=[{
            "session_pk": marker["session_pk"], "task_id": task_id, "name": marker["name"],
            "input": marker["input"], "result": result, "exception": exception,
            "started_at": started_at, "finished_at": now,
        }])
        client.pipeline(transaction=False).delete(keys.call(task_id)).zrem(keys.calls, task_id).execute()
        recorded += 1
    if recorded >= BATCH:
        finish_orphaned_calls.delay()
    return recorded
