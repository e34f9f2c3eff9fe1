from __future__ import annotations

from django.db import models

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.teams.models import ApiKey, Team


class Session(models.Model):
    """One ORS episode. Secrets are never stored here (nor anywhere)."""

    class Status(models.TextChoices):
        CREATING = "creating"
        READY = "ready"
        FAILED = "failed"
        DELETED = "deleted"
        EXPIRED = "expired"
        LOST = "lost"

    class Protocol(models.TextChoices):
        """The face that opened the episode (every face drives the same gateway)."""

        ORS = "ors"
        OPENENV = "openenv"
        AAP = "aap"

    sid = models.CharField(max_length=128, unique=True)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="sessions")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="sessions")
    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="sessions")
    task_spec = models.JSONField()
    split = models.CharField(max_length=100, blank=True)
    task_index = models.PositiveIntegerField(null=True, blank=True)
    # Run on a sealed split (docs/hidden-tasks.md): marked on the session, its pages and exports.
    sealed = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CREATING)
    runner = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    ready_at = models.DateTimeField(null=True, blank=True)
    last_activity_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    calls = models.PositiveIntegerField(default=0)
    total_reward = models.FloatField(null=True, blank=True)
    finished = models.BooleanField(default=False)
    protocol = models.CharField(max_length=16, choices=Protocol.choices, default=Protocol.ORS)
    # The prompt blocks as served on the wire (text and base64 images), recorded on the first
    # /prompt so the session explorer can replay an episode without importing tenant code.
    prompt = models.JSONField(null=True, blank=True)
    # The training run this episode belongs to (runs.Run.name within the team): X-Run header, a
    # `run` field in /create or OpenEnv reset, else the API key's name. See docs/runs.md.
    run_name = models.CharField(max_length=200, blank=True, default="")
    # Folded into the analytics session rollup (analytics.services.session_rollup_advance): set in
    # the same transaction that adds the ended session to the rollup, so a page reads the rollup
    # plus exactly the sessions not in it (open, failed, just ended) through the partial index below.
    # A database default too: the gateway's PostgreSQL writer inserts sessions with its own column list.
    rolled_up = models.BooleanField(default=False, db_default=False)

    class Meta:
        indexes = [
            models.Index(fields=["team", "created_at"], condition=models.Q(rolled_up=False),
                         name="session_unrolled_team_created"),
            models.Index(fields=["team", "created_at"]),
            models.Index(fields=["team", "run_name", "created_at"]),
            models.Index(fields=["environment", "created_at"]),
            models.Index(fields=["status", "last_activity_at"]),
        ]

    def __str__(self) -> str:
        return self.sid


class ToolCall(models.Model):
    """The audit log of every tool call, and the store that serves reconnects by task_id.

    On PostgreSQL the table is partitioned by day of started_at (docs/audit-log.md): its primary
    key there is (id, started_at) and its unique key (task_id, started_at), as a partitioned table
    requires the partition key in both. Django still addresses a row by id alone, which the
    sequence keeps unique; a call's task_id is a time-ordered random id (engine/ids.py), and the
    gateway and the sweeper that may both record a call give it the same started_at.
    """

    class Status(models.TextChoices):
        RUNNING = "running"
        OK = "ok"
        ERROR = "error"

    # No index of its own: (session, started_at) below serves every lookup by session, and each
    # index is one more page written per audit row.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="tool_calls", db_index=False)
    task_id = models.CharField(max_length=64)
    name = models.CharField(max_length=200)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.RUNNING)
    # The full result JSON as sent on the wire ({"ok": ..., "output"|"error": ...}).
    output = models.JSONField(null=True, blank=True)
    reward = models.FloatField(null=True, blank=True)
    finished = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["session", "started_at"])]
        constraints = [models.UniqueConstraint(fields=["task_id", "started_at"], name="toolcall_task_started_unique")]
