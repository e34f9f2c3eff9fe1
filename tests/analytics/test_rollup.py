"""The Celery-maintained rollups: incremental, never double counting, waiting for ids to settle."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from orsplatform.analytics import services
from orsplatform.analytics.models import CallRollup, LatencyRollup, RollupCursor
from orsplatform.analytics.services import tool_call_rollup_advance, tool_call_rollup_run
from orsplatform.analytics.tasks import rollup_tool_calls
from orsplatform.episodes.models import ToolCall
from tests.analytics.conftest import login
from tests.analytics.seed import seed


@pytest.fixture(autouse=True)
def eager_celery(monkeypatch):
    # The embedded default runs tasks in-process; keep it so even where a broker is configured.
    from orsplatform.celery import app

    monkeypatch.setitem(app.conf, "task_always_eager", True)


def rolled_calls() -> int:
    return CallRollup.objects.aggregate(n=Sum("calls"))["n"] or 0


def add_calls(session, count: int, prefix: str) -> None:
    now = timezone.now()
    ToolCall.objects.bulk_create([
        ToolCall(session=session, task_id=f"{prefix}-{i}", name="move", input={}, status="ok", output={"ok": True},
                 started_at=now, finished_at=now + timedelta(milliseconds=3)) for i in range(count)])


def test_the_rollup_folds_everything_once_and_then_only_new_calls(owner, outsider):
    data = seed(acme=owner.team, globex=outsider.team)
    assert tool_call_rollup_run(settle=0) == 105
    assert rolled_calls() == 105 and tool_call_rollup_run(settle=0) == 0 and rolled_calls() == 105
    add_calls(data.sessions[0], 7, "more")
    assert tool_call_rollup_run(settle=0) == 7 and rolled_calls() == 112
    assert LatencyRollup.objects.aggregate(n=Sum("count"))["n"] == 112


def test_small_batches_give_the_same_rollups_as_one_big_batch(owner, outsider):
    seed(acme=owner.team, globex=outsider.team)
    tool_call_rollup_run(settle=0, batch_size=7)
    small = sorted(CallRollup.objects.values_list("environment_id", "version_id", "name", "hour", "calls", "errors"))
    small_lat = sorted(LatencyRollup.objects.values_list("version_id", "name", "day", "bucket", "count"))
    services.tool_call_rollup_rebuild()
    tool_call_rollup_run(settle=0)
    assert small == sorted(CallRollup.objects.values_list("environment_id", "version_id", "name", "hour", "calls", "errors"))
    assert small_lat == sorted(LatencyRollup.objects.values_list("version_id", "name", "day", "bucket", "count"))
    # Folding in small batches added to existing rows instead of writing duplicates.
    assert CallRollup.objects.count() == len(small)


def test_new_ids_are_folded_only_after_they_have_settled(owner, monkeypatch):
    # An id becomes visible when its INSERT commits, so a lower id can still appear later: the
    # rollup only folds up to the highest id it saw at least `settle` seconds ago.
    seed(acme=owner.team)
    clock = [timezone.now()]
    monkeypatch.setattr(services.timezone, "now", lambda: clock[0])
    first = tool_call_rollup_advance(settle=10)
    assert first.folded == 0  # seen, not yet settled
    clock[0] += timedelta(seconds=5)
    assert tool_call_rollup_advance(settle=10).folded == 0
    clock[0] += timedelta(seconds=6)
    assert tool_call_rollup_advance(settle=10).folded == 104
    assert RollupCursor.objects.get().last_id == ToolCall.objects.order_by("-id").first().id


def test_the_periodic_task_folds_a_backlog_in_bounded_batches_and_requeues(owner, monkeypatch):
    seed(acme=owner.team)
    monkeypatch.setattr(services, "DEFAULT_BATCH", 10)
    monkeypatch.setattr(services, "settle_seconds", lambda: 0.0)
    calls = []
    original = tool_call_rollup_advance

    def counting(**kwargs):
        calls.append(1)
        return original(batch_size=10, **kwargs)

    monkeypatch.setattr(services, "tool_call_rollup_advance", counting)  # the task imports it when it runs
    # Eager in tests: each run does at most 3 batches, then re-queues itself until caught up.
    rollup_tool_calls.delay(max_batches=3)
    assert rolled_calls() == 104 and len(calls) >= 11


def test_the_beat_schedule_runs_the_rollup():
    entry = settings.CELERY_BEAT_SCHEDULE["analytics-rollup"]
    assert entry["task"] == rollup_tool_calls.name and entry["schedule"] <= 60


def test_a_page_view_nudges_a_stale_rollup_in_the_embedded_default(owner, monkeypatch):
    monkeypatch.setattr(services, "settle_seconds", lambda: 0.0)
    seed(acme=owner.team)
    assert rolled_calls() == 0
    page = login(owner).get("/analytics/acme/").content.decode()
    # Celery runs eagerly without a broker: the nudge folded the backlog before the page was read.
    assert rolled_calls() == 104 and 'id="tile-calls">104<' in page


def test_deleting_a_team_deletes_its_rollups(owner, outsider):
    seed(acme=owner.team, globex=outsider.team)
    tool_call_rollup_run(settle=0)
    owner.team.delete()
    assert set(CallRollup.objects.values_list("team_id", flat=True)) == {outsider.team.id}
