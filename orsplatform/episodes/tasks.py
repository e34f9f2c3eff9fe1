"""Beat tasks of the celery executor: idle expiry, lost runners, orphaned call results.

Each task handles a bounded batch and re-queues itself when the batch was full, so a backlog
drains without one task running for long; two beats are safe (skip_locked rows, status re-checks).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import redis
from celery import shared_task
from celery.utils.nodenames import worker_direct
from django.conf import settings
from django.utils import timezone

from orsplatform.episodes import services

log = logging.getLogger(__name__)
BATCH = 500


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _key(kind: str, name: str) -> str:
    return f"{settings.ORS_REDIS_PREFIX}:{kind}:{name}"


@shared_task(name="orsplatform.episodes.tasks.reap_idle_sessions")
def reap_idle_sessions() -> int:
    from orsplatform.celery import app

    idle_before = timezone.now() - timedelta(seconds=settings.ORS_IDLE_TIMEOUT_SECONDS)
    expired = services.sessions_expire_idle(idle_before=idle_before, limit=BATCH)
    for sid, runner in expired:
        app.send_task("ors.runner.teardown", args=[sid], queue=worker_direct(runner))
        _redis().set(_key("state", sid), json.dumps({"state": "gone"}), ex=3600)
    if len(expired) == BATCH:
        reap_idle_sessions.delay()
    if expired:
        log.info("expired %d idle sessions", len(expired))
    return len(expired)


@shared_task(name="orsplatform.episodes.tasks.fail_lost_runners")
def fail_lost_runners() -> int:
    client = _redis()
    marked = 0
    for runner in services.open_session_runners():
        if client.exists(_key("runner", runner)):
            continue
        count = services.sessions_mark_lost(runner=runner, limit=BATCH)
        marked += count
        log.warning("runner %s has no heartbeat: %d sessions marked lost", runner, count)
        if count == BATCH:
            fail_lost_runners.delay()
    return marked


@shared_task(name="orsplatform.episodes.tasks.finish_orphaned_calls")
def finish_orphaned_calls() -> int:
    """Calls whose gateway went away before recording the result: the runner left it in Redis."""
    client = _redis()
    started_before = timezone.now() - timedelta(seconds=30)
    rows = []
    for task_id, _runner in services.tool_calls_running(started_before=started_before, limit=BATCH):
        raw = client.get(_key("result", task_id))
        if raw is None:
            continue
        payload = json.loads(raw)
        rows.append({"task_id": task_id, **payload})
    if rows:
        services.tool_calls_complete_from_runner(rows=rows)
    return len(rows)
