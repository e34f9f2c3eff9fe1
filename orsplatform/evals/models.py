"""Agents (AAP endpoints of versions 1 to 3 a team registered), evaluation runs over an environment's tasks, and
one row per task of a run. Rows only: the driving lives in evals/engine.py, writes in services."""

from __future__ import annotations

from django.db import models

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.episodes.models import Session
from orsplatform.teams.models import Team


class Agent(models.Model):
    class Stream(models.TextChoices):
        NONE = "none"
        MESSAGE = "message"
        DELTA = "delta"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=500)
    # The agent's name on that server (AAP `agent.name`).
    agent = models.CharField(max_length=200)
    options = models.JSONField(default=dict, blank=True)
    stream = models.CharField(max_length=8, choices=Stream.choices, default=Stream.NONE)
    # Server-side tools (from /meta) the team trusts; every other one the agent asks for is denied.
    trusted_tools = models.JSONField(default=list, blank=True)
    # Fernet token of the agent's API key (evals/crypto.py); never serialised, shown or logged.
    api_key_encrypted = models.TextField(blank=True)
    # What /meta said about this agent at registration (version, tools, options, capabilities).
    meta = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], condition=models.Q(deleted_at__isnull=True),
                                               name="evals_agent_unique_live_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.agent} at {self.url})"

    @property
    def capabilities(self) -> dict:
        return self.meta.get("capabilities") or {}


class EvalRun(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"
        FAILED = "failed"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="eval_runs")
    # Agents are removed softly (services.agent_remove), so runs and leaderboards keep them.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="runs")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="eval_runs")
    # Pinned at launch: every episode of the run (resumes included) uses this version.
    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="eval_runs")
    split = models.CharField(max_length=100)
    start = models.PositiveIntegerField()
    stop = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField(default=4)
    max_turns = models.PositiveIntegerField(default=20)
    pass_threshold = models.FloatField(default=1.0)
    # Per-turn wall-clock limit for the agent (None: ORS_EVAL_TURN_TIMEOUT_SECONDS).
    turn_timeout = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    error = models.TextField(blank=True)
    # The names of the secrets the run was launched with, never their values: those travel only
    # sealed inside the run's Celery message (evals/crypto.py) and live in the driving worker's
    # memory, so a resume must be given them again.
    secret_names = models.JSONField(default=list, blank=True)
    # Which worker drives the run and until when it vouches for it (a dead worker's lease lapses,
    # so a redelivered or resumed run is taken over, never driven twice). On a queued run with no
    # owner, until when its Celery message is expected to be taken (a resume waits that out).
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["team", "created_at"]),
                   models.Index(fields=["environment", "split", "status"])]

    @property
    def total(self) -> int:
        return self.stop - self.start

    @property
    def is_active(self) -> bool:
        return self.status in (self.Status.QUEUED, self.Status.RUNNING)


class EvalEpisode(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SCORED = "scored"

    run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="episodes")
    task_index = models.PositiveIntegerField()
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    sid = models.CharField(max_length=128, blank=True)
    reward = models.FloatField(null=True, blank=True)
    passed = models.BooleanField(default=False)
    finished = models.BooleanField(default=False)
    # How the episode ended: finished | end_turn | max_turns | max_tokens | refusal | error | cancelled.
    stop_reason = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    turns = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    # The agent's side of the episode in order: its text, thinking and tool calls with their results
    # (the trajectory page shows them between the ORS tool calls).
    transcript = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "task_index"], name="evals_episode_unique_task")]
        indexes = [models.Index(fields=["run", "status"]), models.Index(fields=["sid"])]
