"""Writes of runs and rollouts."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from orsplatform.runs.models import RUN_NAME_MAX, Run


def run_ensure(*, team_id: int, name: str, seen_at: datetime | None = None) -> None:
    """The run's row exists (the first episode of a session-only run creates it; a race is a no-op)."""
    now = seen_at or timezone.now()
    Run.objects.bulk_create([Run(team_id=team_id, name=name[:RUN_NAME_MAX], first_seen_at=now, last_seen_at=now)],
                            ignore_conflicts=True)
