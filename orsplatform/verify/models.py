"""Verified versions (issue #25.3): an environment's replay settings, and one verification per
published version (the replay of the previous version's recorded episodes and the package's
reference solutions against the new code, and whether the version waits for its author)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from orsplatform.catalog.models import Environment, EnvironmentVersion


class VerifySettings(models.Model):
    """The author's settings from the console or the REST API. A field left null falls back to the
    package manifest's ``[verify]`` table, then to the platform's default."""

    environment = models.OneToOneField(Environment, on_delete=models.CASCADE, related_name="verify_settings")
    sample_size = models.PositiveIntegerField(null=True, blank=True)
    # Agreement (0..1) below which a new version is published but not made current; null with
    # report_only False falls back to the manifest.
    threshold = models.FloatField(null=True, blank=True)
    # True: the author chose "report only" here, whatever the manifest says.
    report_only = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)


class Verification(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        REPORTED = "reported"  # report only: the version was made current at publish
        PASSED = "passed"  # held while it ran; made current when it passed
        HELD = "held"  # below the threshold or a reference solution failed: waits for the author
        CONFIRMED = "confirmed"  # held, then made current by the author
        ERROR = "error"  # the replay itself could not run; a held version stays held

    version = models.OneToOneField(EnvironmentVersion, on_delete=models.CASCADE, related_name="verification")
    # The version whose recorded episodes are replayed (current when this one was published).
    baseline = models.ForeignKey(EnvironmentVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    # Whether the version waits for this verification before it is made current.
    gated = models.BooleanField(default=False)
    sample_size = models.PositiveIntegerField()
    threshold = models.FloatField(null=True, blank=True)
    solutions = models.PositiveIntegerField(default=0)
    items_total = models.PositiveIntegerField(default=0)  # episodes + reference solutions to run
    items_done = models.PositiveIntegerField(default=0)
    agreement = models.FloatField(null=True, blank=True)
    report = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    confirmed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    confirmed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["status", "created_at"])]

    @property
    def finished(self) -> bool:
        return self.status not in (self.Status.QUEUED, self.Status.RUNNING)

    @property
    def percent(self) -> int:
        if self.finished:
            return 100
        if not self.items_total:
            return 0
        return min(99, int(100 * self.items_done / self.items_total))
