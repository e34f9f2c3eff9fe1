"""Rollups of the tool-call audit log and of ended sessions, folded by periodic Celery tasks
(analytics.services) so no analytics page scans ToolCall or Session over its window."""

from __future__ import annotations

from django.db import models

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.teams.models import Team

TOOL_CALLS_CURSOR = "tool_calls"
SESSIONS_CURSOR = "sessions"


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


class SessionRollup(models.Model):
    """Ended sessions per team, environment version, split, run, API key and UTC hour of creation
    (the hour a page counts a session in). Only ended sessions are folded: an ended session's
    status, reward and calls never change again (episodes.services.sessions_end skips them), so
    each is added exactly once; open and failed ones are read live (selectors' tail)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="+")
    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="+")
    split = models.CharField(max_length=100)
    run_name = models.CharField(max_length=200)
    api_key_ref = models.BigIntegerField(default=0)  # 0 for none, as CallRollup
    hour = models.DateTimeField()
    episodes = models.PositiveIntegerField(default=0)  # ended sessions
    scored = models.PositiveIntegerField(default=0)  # ended with a reward
    passed = models.PositiveIntegerField(default=0)  # scored with reward >= ORS_ANALYTICS_PASS_REWARD
    reward_sum = models.FloatField(default=0.0)
    reward_sq_sum = models.FloatField(default=0.0)
    reward_min = models.FloatField(null=True)
    reward_max = models.FloatField(null=True)
    calls_sum = models.BigIntegerField(default=0)
    calls_max = models.PositiveIntegerField(default=0)
    first_created_at = models.DateTimeField()
    last_created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["team", "environment", "version", "split", "run_name", "api_key_ref", "hour"],
            name="sessionrollup_key_unique")]
        indexes = [
            models.Index(fields=["team", "hour"], name="sessionrollup_team_hour"),
            models.Index(fields=["team", "environment", "hour"], name="sessionrollup_team_env_hour"),
            models.Index(fields=["team", "run_name"], name="sessionrollup_team_run"),
        ]


class SessionBucketRollup(models.Model):
    """Histogram counts of ended sessions per team, environment version, UTC hour, kind and fixed
    bucket (analytics.session_buckets), so reward and episode-length histograms of any window are
    sums of these rows."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="+")
    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    kind = models.PositiveSmallIntegerField()
    bucket = models.BigIntegerField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["team", "environment", "version", "hour", "kind", "bucket"], name="sessionbucket_key_unique")]
        indexes = [models.Index(fields=["team", "environment", "hour"], name="sessionbucket_team_env_hour")]


class TaskRollup(models.Model):
    """Scored episodes per team, environment version, split, task and UTC hour, for the hardest and
    easiest tasks (a trainer samples a task several times at once, so this is smaller than the
    sessions it sums)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="+")
    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="+")
    split = models.CharField(max_length=100)
    task_index = models.PositiveIntegerField()
    hour = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    passed = models.PositiveIntegerField(default=0)
    reward_sum = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["team", "environment", "version", "split", "task_index", "hour"], name="taskrollup_key_unique")]
        indexes = [models.Index(fields=["team", "environment", "hour"], name="taskrollup_team_env_hour")]
