"""Reward-hacking and anomaly flags: what the scheduled check (flags/services.py) found in a team's
episodes. A flag belongs to the team whose episodes it is about (the trainer's), never to the
environment's author: an author of a public environment does not see callers' sessions."""

from __future__ import annotations

from django.db import models

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.teams.models import Team


class Flag(models.Model):
    class Kind(models.TextChoices):
        FAST_PASS = "fast_pass", "Passed in far fewer calls than the task's typical pass"
        VERSION_JUMP = "version_jump", "A task's pass rate jumped between versions"
        RUN_JUMP = "run_jump", "A task's pass rate jumped between runs"
        REWARD_RANGE = "reward_range", "Reward outside the environment's declared range"
        ERROR_BURST = "error_burst", "A burst of tool errors after a new version"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="flags")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # What the flag is about, so a recomputation updates it instead of adding another.
    key = models.CharField(max_length=300)
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="flags")
    version = models.ForeignKey(EnvironmentVersion, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="flags")
    run_name = models.CharField(max_length=200, blank=True, default="")
    split = models.CharField(max_length=100, blank=True, default="")
    task_index = models.PositiveIntegerField(null=True, blank=True)
    summary = models.TextField()
    # The figures behind it (counts, rates, typical calls, the range), for the page and the API.
    details = models.JSONField(default=dict)
    # The sids of the episodes behind it (bounded): each flag links to them.
    sessions = models.JSONField(default=list)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "kind", "key"], name="flag_team_kind_key_unique")]
        indexes = [
            models.Index(fields=["team", "last_seen_at"]),
            models.Index(fields=["team", "environment", "last_seen_at"]),
            models.Index(fields=["team", "run_name", "last_seen_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.summary}"
