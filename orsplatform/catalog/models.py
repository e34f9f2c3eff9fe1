from __future__ import annotations

from django.conf import settings
from django.db import models

from orsplatform.teams.models import Team, slug_validator


class Environment(models.Model):
    class Visibility(models.TextChoices):
        PUBLIC = "public"
        PRIVATE = "private"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="environments")
    slug = models.CharField(max_length=63, validators=[slug_validator])
    description = models.TextField(blank=True)
    visibility = models.CharField(max_length=8, choices=Visibility.choices, default=Visibility.PRIVATE)
    current_version = models.ForeignKey(
        "EnvironmentVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Deleted by its team (catalog.services.environment_delete): the row stays so that the sessions,
    # tool calls and analytics that name it (the audit log) survive, under a renamed slug that
    # frees the name; nothing serves, lists or resolves it any more.
    deleted_at = models.DateTimeField(null=True, blank=True)
    deleted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "slug"], name="environment_team_slug_unique")]
        indexes = [models.Index(fields=["slug"])]

    @property
    def full_name(self) -> str:
        return f"{self.team.slug}/{self.slug}"

    def __str__(self) -> str:
        return self.full_name


class EnvironmentVersion(models.Model):
    """An immutable, content-addressed snapshot of an environment package."""

    class Status(models.TextChoices):
        VALIDATING = "validating"
        BUILDING = "building"  # its requirements are being installed (catalog/pyenvs.py)
        READY = "ready"
        FAILED = "failed"

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    content_hash = models.CharField(max_length=64)
    package_path = models.CharField(max_length=500)
    entrypoint = models.CharField(max_length=200)
    # Stored at publish time so discovery never imports tenant code.
    tools = models.JSONField(default=list)
    splits = models.JSONField(default=list)
    manifest = models.JSONField(default=dict)
    # An OpenEnv-SDK environment's declaration, as its inspection found it: {"kind": "mcp"|"step",
    # "env_name", "schema": {action, observation, state, reset_observation}}; empty for the others.
    openenv = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    error = models.TextField(blank=True)
    # What the package asks to have installed (normalized), and the key of the Python environment
    # built for it (a folder of ORS_PYENV_DIR); empty: it runs on the platform's own runtime.
    requirements = models.JSONField(default=list)
    pyenv = models.CharField(max_length=64, blank=True)
    # The data archive uploaded with it (a folder of ORS_DATA_DIR, by content hash), mounted at
    # /orwd_data; empty: the package's own data/ folder, if any, is mounted there.
    data_hash = models.CharField(max_length=64, blank=True)
    # What the platform noticed but does not use (a Dockerfile), shown on the version.
    notes = models.JSONField(default=list)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    # The API key a REST publish came through (its name and user are in published_by too, so the
    # history still says who published after the key or the user is deleted).
    created_by_key = models.ForeignKey("teams.ApiKey", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="+")
    # Who published, as the versions list shows it: "alice", "key ci-bot (alice)", "command line (root)".
    published_by = models.CharField(max_length=200, blank=True)
    # The publisher's note on this version (console field, CLI --message, REST message).
    message = models.TextField(blank=True)
    # The manifest's tags, copied out so catalog cards need not load whole manifests.
    tags = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["environment", "number"], name="version_env_number_unique"),
            models.UniqueConstraint(fields=["environment", "content_hash"], name="version_env_hash_unique"),
        ]

    @property
    def publisher(self) -> str:
        """Who published it, as shown: the stored label, else (older versions) the user's name."""
        if self.published_by:
            return self.published_by
        return self.created_by.username if self.created_by_id and self.created_by else ""

    def __str__(self) -> str:
        return f"{self.environment}@{self.number}"


class Split(models.Model):
    class Type(models.TextChoices):
        TRAIN = "train"
        VALIDATION = "validation"
        TEST = "test"

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="task_splits")
    name = models.CharField(max_length=100)
    type = models.CharField(max_length=16, choices=Type.choices, default=Type.VALIDATION)
    # Kept in step with the Task rows so num_tasks is constant time.
    num_tasks = models.PositiveIntegerField(default=0)
    # Bumped on every ingest, so caches keyed by it never serve replaced tasks.
    revision = models.PositiveIntegerField(default=0)
    # Top-level task fields only the environment's own code sees (docs/hidden-tasks.md): never
    # served to a client; a task object sent back to /create is matched through TaskDigest.
    hidden_fields = models.JSONField(default=list, blank=True)
    # Episodes may run on it by split+index, but its task specs are readable only by the owning
    # team's publish keys; num_tasks stays public.
    sealed = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["environment", "name"], name="split_env_name_unique")]


class Task(models.Model):
    split = models.ForeignKey(Split, on_delete=models.CASCADE, related_name="tasks")
    index = models.PositiveIntegerField()
    spec = models.JSONField()

    class Meta:
        # task / task_range are lookups on this index, never list scans.
        constraints = [models.UniqueConstraint(fields=["split", "index"], name="task_split_index_unique")]


class TaskDigest(models.Model):
    """Digest of a task's redacted canonical JSON -> its index, kept for splits with hidden fields,
    so a task object a client read (without the hidden fields) is matched back by one index
    lookup, never a scan (catalog/hidden.py)."""

    split = models.ForeignKey(Split, on_delete=models.CASCADE, related_name="+")
    digest = models.BigIntegerField()
    index = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["split", "digest"], name="taskdigest_split_digest")]


class IngestJob(models.Model):
    """One upload of a task file into a split; its progress is visible while the ingest runs."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Mode(models.TextChoices):
        APPEND = "append"
        REPLACE = "replace"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="ingest_jobs")
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="ingest_jobs")
    split_name = models.CharField(max_length=100)
    split_type = models.CharField(max_length=16, blank=True)
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.APPEND)
    format = models.CharField(max_length=8)
    file_name = models.CharField(max_length=255, blank=True)
    # The saved upload; removed once the ingest has finished either way.
    source_path = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    rows_done = models.PositiveBigIntegerField(default=0)
    bytes_done = models.PositiveBigIntegerField(default=0)
    bytes_total = models.PositiveBigIntegerField(default=0)
    num_tasks = models.PositiveIntegerField(null=True, blank=True)  # the split's count after success
    error_report = models.JSONField(default=dict, blank=True)
    # The row check (catalog/row_check.py): a sample of rows run through the environment's setup()
    # and get_prompt(). Rows that fail refuse the upload unless the author accepted them, in which
    # case they are kept here as warnings ({"row", "line", "field", "error", "traceback"}).
    accept_failing_rows = models.BooleanField(default=False)
    row_check = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["team", "-created_at"])]

    @property
    def finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED)

    @property
    def percent(self) -> int:
        if self.status == self.Status.SUCCEEDED:
            return 100
        if not self.bytes_total:
            return 0
        return min(99, int(100 * self.bytes_done / self.bytes_total))
