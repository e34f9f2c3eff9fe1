"""Training runs and the rollouts the `openreward` client logs into them.

A run is a name inside a team. Two kinds of episode belong to it: rollouts logged through the
Rollout API (`/v1/rollouts`, the model's messages) and ORS/OpenEnv sessions whose `run_name`
(episodes.Session) carries the same name (the environment's tool calls). A rollout is linked to the
session of the same key and task when one exists, so one trajectory shows both sides.
"""

from __future__ import annotations

from django.db import models

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.episodes.models import Session
from orsplatform.runs.naming import RUN_NAME_MAX
from orsplatform.teams.models import ApiKey, Team


class Run(models.Model):
    """One row per (team, name), whichever side named it first. The rollout counters are kept by
    the ingest transaction so the runs list never scans messages; session counts are read from
    episodes.Session (indexed on team, run_name, created_at)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=RUN_NAME_MAX)
    # The latest RunInfo sent with a rollout of this run (model_name, rl_algorithm, lr, ...).
    info = models.JSONField(default=dict, blank=True)
    model_name = models.CharField(max_length=200, blank=True)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    rollouts = models.PositiveIntegerField(default=0)
    messages = models.PositiveBigIntegerField(default=0)
    # Sum and count of rollout rewards (a rollout's reward is the sum of its messages' rewards).
    reward_sum = models.FloatField(default=0.0)
    rewarded = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="run_team_name_unique")]
        indexes = [models.Index(fields=["team", "last_seen_at"])]

    def __str__(self) -> str:
        return self.name


class Rollout(models.Model):
    """One episode as the trainer saw it (a RolloutStartedEvent and what followed)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="rollouts")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rollout_set")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="rollouts")
    # The client's eventId (a uuid4); retried batches carry it again, so it is the identity.
    event_id = models.CharField(max_length=64)
    # Position in the run by arrival (1, 2, ...): the x axis when no step was given.
    seq = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True)
    # As sent ("team/slug"); environment/version are set when it names one the key may use.
    environment_name = models.CharField(max_length=200, blank=True)
    environment = models.ForeignKey(Environment, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="rollouts")
    version = models.ForeignKey(EnvironmentVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="rollouts")
    variant = models.CharField(max_length=200, blank=True)
    split = models.CharField(max_length=100, blank=True)
    task_spec = models.JSONField(null=True, blank=True)
    task_index = models.IntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    run_info = models.JSONField(null=True, blank=True)  # RunInfo as sent with this rollout
    info = models.JSONField(null=True, blank=True)  # RolloutInfo, merged from rollout_update events
    # RolloutInfo.current_step (or the started event's step); null means "use seq".
    step = models.IntegerField(null=True, blank=True)
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="rollouts")
    started_at = models.DateTimeField()  # the client's timestamp
    created_at = models.DateTimeField()  # when the platform received it
    last_event_at = models.DateTimeField()
    messages = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    # Sum of the messages' rewards; null until a message carries one.
    reward = models.FloatField(null=True, blank=True)
    finished = models.BooleanField(default=False)
    # The first error reported in a message's or the rollout's metadata ("error" key).
    error = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "event_id"], name="rollout_team_event_unique")]
        indexes = [
            models.Index(fields=["run", "seq"]),
            models.Index(fields=["team", "created_at"]),
            models.Index(fields=["session"]),
        ]

    def __str__(self) -> str:
        return self.event_id


class RolloutMessage(models.Model):
    """One logged message (the client's LogMessageEvent, normalized by its serializers)."""

    class Type(models.TextChoices):
        REASONING = "reasoning"
        TOOL_CALL = "tool_call"
        TOOL_RESULT = "tool_result"
        USER = "user_message"
        ASSISTANT = "assistant_message"
        SYSTEM = "system_message"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="message_set")
    # The client's per-rollout counter; unique, so a retried batch inserts nothing twice.
    index = models.PositiveIntegerField()
    event_id = models.CharField(max_length=64)
    type = models.CharField(max_length=24, choices=Type.choices)
    content = models.TextField(blank=True)
    content_reference = models.TextField(blank=True)
    summary = models.TextField(blank=True)
    name = models.CharField(max_length=200, blank=True)  # tool name (tool_call)
    call_id = models.CharField(max_length=200, blank=True)  # joins a tool_call to its tool_result
    reward = models.FloatField(null=True, blank=True)
    is_finished = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    timestamp = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rollout", "index"], name="rollout_message_index_unique")]

    def __str__(self) -> str:
        return f"{self.rollout_id}#{self.index}"
