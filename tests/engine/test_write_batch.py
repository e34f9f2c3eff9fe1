"""The ORM path of the gateway's group commit (engine/store.py): a batch the database refuses is
redone row by row, and each write gets exactly one answer, even one refused only at its commit."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

from django.db import IntegrityError

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.engine.store import _run_batch
from orsplatform.episodes.hot_writes import SESSION_CREATE, TOOL_CALL_RECORD
from orsplatform.episodes.models import ToolCall


def _call(session_pk: int) -> dict:
    now = datetime.now(UTC)
    return {"session_pk": session_pk, "task_id": uuid.uuid4().hex, "name": "submit", "input": {},
            "result": {"ok": True, "output": {"blocks": [], "reward": 1.0, "finished": True}},
            "exception": "", "started_at": now, "finished_at": now}


def test_a_row_refused_at_commit_fails_alone_with_one_answer_per_write(live_db, owner):
    version = EnvironmentVersion.objects.select_related("environment").first()
    caller = SimpleNamespace(team_id=owner.team.pk, api_key_id=None)
    env = SimpleNamespace(environment_id=version.environment_id, version_id=version.pk)
    [(ok, pk)] = _run_batch([(SESSION_CREATE, {"sid": uuid.uuid4().hex, "caller": caller, "env": env,
                                               "task_spec": {}, "split": "", "index": None, "runner": ""})])
    assert ok
    good, orphan = _call(pk), _call(10**9)  # the session of the second does not exist
    results = _run_batch([(TOOL_CALL_RECORD, good), (TOOL_CALL_RECORD, orphan)])
    assert [ok for ok, _ in results] == [True, False]
    assert isinstance(results[1][1], IntegrityError)
    assert list(ToolCall.objects.values_list("task_id", flat=True)) == [good["task_id"]]


async def test_an_activity_flush_is_written_in_slices_that_a_calls_audit_row_does_not_wait_behind(
        live_db, owner, monkeypatch):
    # One write of every open session's activity held SQLite's one writer for up to a second at
    # 8,192 sessions, and every call's audit row queued behind it.
    from asgiref.sync import sync_to_async

    from orsplatform.engine import store as store_module
    from orsplatform.episodes.models import Session

    monkeypatch.setattr(store_module, "ACTIVITY_SLICE", 2)
    version = await sync_to_async(EnvironmentVersion.objects.select_related("environment").first)()
    caller = SimpleNamespace(team_id=owner.team.pk, api_key_id=None)
    env = SimpleNamespace(environment_id=version.environment_id, version_id=version.pk)
    store = store_module.Store(threads=1)
    try:
        pks = [await store.session_create(sid=uuid.uuid4().hex, caller=caller, env=env, task_spec={}, split="",
                                          index=None, runner="") for _ in range(6)]
        at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
        flush = asyncio.create_task(store.flush_activity({pk: (at, None) for pk in pks}))
        await asyncio.sleep(0)  # the flush has queued its first slice
        call = _call(pks[0])
        await store.tool_call_record(**call)
        assert not flush.done(), "the call's audit row waited for the whole activity flush"
        await flush
        touched = await sync_to_async(lambda: list(Session.objects.filter(pk__in=pks)
                                                   .values_list("last_activity_at", flat=True)))()
        assert touched == [at] * 6
        assert await sync_to_async(ToolCall.objects.filter(task_id=call["task_id"]).exists)()
    finally:
        store.close()
