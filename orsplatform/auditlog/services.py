"""Writes of the audit log's retention (docs/audit-log.md); archiving is in archive.py."""

from __future__ import annotations

from django.utils import timezone

from orsplatform.auditlog.models import RetentionPolicy
from orsplatform.teams.models import Team

MAX_HOT_DAYS = 3650


class InvalidRetention(ValueError):
    pass


def retention_set(*, team: Team, hot_days: int | None) -> int | None:
    """A team's days of calls kept in the database; None returns it to the platform's default.
    Shortening it archives the older days on the next run of the beat (never before their archive
    is verified); lengthening it keeps what is still in the database longer."""
    if hot_days is None:
        RetentionPolicy.objects.filter(team=team).delete()
        return None
    if isinstance(hot_days, bool) or not isinstance(hot_days, int) or not 1 <= hot_days <= MAX_HOT_DAYS:
        raise InvalidRetention(f"hot_days must be a whole number of days from 1 to {MAX_HOT_DAYS}.")
    RetentionPolicy.objects.update_or_create(team=team, defaults={"hot_days": hot_days,
                                                                  "updated_at": timezone.now()})
    return hot_days
