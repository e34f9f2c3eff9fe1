"""Celery tasks of the flags app: thin adapters over services."""

from __future__ import annotations

from orsplatform.celery import app


@app.task(name="flags.compute", ignore_result=True)
def compute() -> int:
    """One bounded pass of the reward-hacking and anomaly check (beat, every ORS_FLAGS_EVERY_SECONDS)."""
    from orsplatform.flags.services import flags_compute

    return len(flags_compute())
