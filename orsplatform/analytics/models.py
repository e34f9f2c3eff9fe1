"""Rollups of the tool-call audit log. Session-level numbers are read straight from the Session table
(20x fewer rows than calls, and indexed by team and time); the million-row ToolCall table is folded
into these small tables by a periodic Celery task so no page ever scans it."""

from __future__ import annotations

from django.db import models

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.teams.models import Team

TOOL_CALLS_CURSOR = "tool_calls"


class RollupCursor(models.Model):
    """How far the audit log has been folded. Every ToolCall with id <= last_id is in the rollups;
    seen_max_id is the highest id observed at seen_at, folded only once it has settled (see
    services.tool_call_rollup_advance for why ids cannot be folded the moment they appear)."""

    name = models.CharField(max_length=50, unique=True)
    last_id = models.BigIntegerField(default=0)
    seen_max_id = models.BigIntegerField(default=0)
    seen_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_id}"


class CallRollup(models.Model):
    """Tool calls per team, environment version, API key, tool and UTC hour. The fold adds to a row
    with one INSERT … ON CONFLICT DO UPDATE, so the key columns carry a unique constraint."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="+")
    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="+")
    # The ApiKey id, 0 for none: a plain integer, not a nullable foreign key, because NULLs never
    # conflict in a unique constraint (so the upsert could not find the row), and because usage
    # history should outlive a deleted key (its rows then show as "deleted key").
    api_key_ref = models.BigIntegerField(default=0)
    name = models.CharField(max_length=200)
    hour = models.DateTimeField()
    calls = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    # Calls that have a finish time, and the sum of their latencies (for the mean).
    timed_calls = models.PositiveIntegerField(default=0)
    latency_ms_sum = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["team", "environment", "version", "api_key_ref", "name", "hour"], name="callrollup_key_unique")]
        indexes = [
            models.Index(fields=["team", "hour"], name="callrollup_team_hour"),
            models.Index(fields=["team", "environment", "hour"], name="callrollup_team_env_hour"),
        ]


class LatencyRollup(models.Model):
    """How many calls fell in each latency bucket, per team, environment version, tool and UTC day.
    Buckets are fixed (analytics.latency.bucket_of), so counts of any days and tools add up, and the
    percentiles of any window come from the summed counts."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="+")
    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    day = models.DateTimeField()
    bucket = models.PositiveSmallIntegerField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["team", "environment", "version", "name", "day", "bucket"], name="latencyrollup_key_unique")]
        indexes = [models.Index(fields=["team", "environment", "day"], name="latencyrollup_team_env_day")]
