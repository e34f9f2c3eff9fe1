"""The ORM path of the gateway's group commit (engine/store.py): a batch the database refuses is
redone row by row, and each write gets exactly one answer, even one refused only at its commit."""

from __future__ import annotations

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
