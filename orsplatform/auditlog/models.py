"""Retention and archive records of the audit log (docs/audit-log.md).

A team's calls are kept in the database for its retention (`RetentionPolicy.hot_days`, else the
platform's ORS_AUDIT_RETENTION_DAYS); older days are written to the archive store as Parquet, one
file per day and team, and only then leave the database. `ArchivedPeriod` is both the record of a
file (where, how many rows, its SHA-256) and the state that makes archiving crash-safe: a period is
`written` before it is verified, `verified` before any row of it is deleted, and `dropped` only
after; readers take a period from the archive only once it is `dropped`, from the database before.
"""

from __future__ import annotations

from django.db import models

from orsplatform.teams.models import Team


class RetentionPolicy(models.Model):
    """How many days of a team's calls stay in the database (the hot store)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="retention_policy")
    hot_days = models.PositiveIntegerField()
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.team_id}: {self.hot_days} days"


class ArchivedPeriod(models.Model):
    class State(models.TextChoices):
        WRITING = "writing"  # the file may be partial or absent
        VERIFIED = "verified"  # the file is whole (rows and checksum checked); the rows are still in the database
        DROPPED = "dropped"  # the rows left the database: read them from the file

    table = models.CharField(max_length=63)  # the partitioned table (episodes_toolcall)
    day = models.DateField()
    # The team's id, 0 for sessions without a team: a plain integer so the key's unique constraint
    # holds (NULLs never conflict), and so the record outlives nothing it should not.
    team_ref = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.WRITING)
    key = models.CharField(max_length=500, blank=True)  # the file's name in the archive store
    rows = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField()
    verified_at = models.DateTimeField(null=True, blank=True)
    dropped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["table", "day", "team_ref"], name="archivedperiod_key_unique")]
        indexes = [models.Index(fields=["team_ref", "table", "day"], name="archivedperiod_team_day")]

    def __str__(self) -> str:
        return f"{self.table} {self.day} team {self.team_ref}: {self.state}"
