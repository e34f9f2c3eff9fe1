"""Celery tasks of the analytics app: thin adapters over services."""

from __future__ import annotations

from django.db import transaction

# The project's app, not shared_task: orsplatform/__init__.py does not load the Celery app, and a
# shared task would be bound to Celery's default app, not configured from the settings.
from orsplatform.celery import app


@app.task(name="analytics.rollup_tool_calls", ignore_result=True)
def rollup_tool_calls(max_batches: int = 10, requeue: bool = True) -> int:
    """Fold the audit log into the rollups in bounded batches (beat runs this every 30 s). A big
    backlog (a fresh install, a rebuild) re-queues itself instead of holding a worker for minutes."""
    # Imported here, not at the top: services enqueue this task, so the import runs one way only.
    from orsplatform.analytics.services import tool_call_rollup_advance

    folded = 0
    for _ in range(max_batches):
        progress = tool_call_rollup_advance()
        folded += progress.folded
        if progress.caught_up or progress.folded == 0:  # done, or another worker holds the cursor
            return folded
    if requeue:
        transaction.on_commit(lambda: rollup_tool_calls.delay(max_batches=max_batches, requeue=True))
    return folded


@app.task(name="analytics.rollup_sessions", ignore_result=True)
def rollup_sessions(max_batches: int = 10, requeue: bool = True) -> int:
    """Fold ended sessions into the session rollups in bounded batches (beat runs this every 30 s),
    re-queueing itself while a backlog (a fresh install, a rebuild) is left."""
    from orsplatform.analytics.services import session_rollup_advance

    folded = 0
    for _ in range(max_batches):
        progress = session_rollup_advance()
        folded += progress.folded
        if progress.caught_up or progress.folded == 0:
            return folded
    if requeue:
        transaction.on_commit(lambda: rollup_sessions.delay(max_batches=max_batches, requeue=True))
    return folded
