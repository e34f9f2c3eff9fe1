from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower

# Slugs become the first segments of ORS paths (/{team}/{slug}/tools), so they may not contain
# path characters and may not take a segment reserved for the platform itself.
RESERVED_SEGMENTS = frozenset({
    "admin", "api", "console", "static", "media", "openenv", "aap", "accounts", "analytics",
    "health", "version", "list_environments", "create_session", "create", "ping", "delete",
    "delete_session", "tools", "splits", "tasks", "num_tasks", "task", "task_range", "task_tools",
    "prompt", "call", "messages", "ready", "environments",
    "v1",  # the openreward client's Rollout API (/v1/rollouts, /v1/environments/...)
})
slug_validator = RegexValidator(r"^[a-z0-9][a-z0-9-]{0,62}$", "Use lowercase letters, digits and hyphens.")


class Team(models.Model):
    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    # Per-team limits; null means unlimited.
    max_open_sessions = models.PositiveIntegerField(null=True, blank=True)
    max_tool_calls_per_second = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_user_team_unique")]


class ApiKey(models.Model):
    class Scope(models.TextChoices):
        # What each grants is enforced by teams.auth.admit; docs/authorization.md has the table.
        SESSIONS = "sessions", "sessions: run episodes and evaluations, read the team's data"
        PUBLISH = "publish", "publish: publish environments and tasks"
        MANAGE = "manage", "manage: register and remove the team's AAP agents"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    # sha256 of the secret part; the secret itself is shown once and never stored.
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    # A key bound to one environment uses that environment only (and it is the default for clients
    # that name none); see teams.auth.admit_environment.
    environment = models.ForeignKey(
        "catalog.Environment", null=True, blank=True, on_delete=models.CASCADE, related_name="bound_keys"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # A name picks one live key out of the team's list (console, logs, `revoke`): two live keys
            # may not share one, in any case. Revoked keys keep theirs, so a name can be reused.
            models.UniqueConstraint(
                Lower("name"), "team", condition=Q(revoked_at__isnull=True), name="apikey_live_name_unique_per_team"),
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name} ({self.prefix})"
