"""Tasks written into a split: a file of rows checked against the quotas, replacing or appending
(split out of services.py, which re-exports ``tasks_ingest``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Sum

from orsplatform.catalog import ingest, protection, row_check
from orsplatform.catalog.ingest import IngestError, RowsFailed, TaskQuotaExceeded
from orsplatform.catalog.models import Environment, IngestJob, Split, Task


@dataclass(frozen=True)
class IngestResult:
    split: Split
    rows: int
    # The row check's report ({} when it did not run): sampled rows and the failures accepted.
    row_check: dict = field(default_factory=dict)


def _infer_split_type(name: str) -> str:
    return name if name in Split.Type.values else Split.Type.VALIDATION


def _tasks_quota(*, environment: Environment, split_name: str, held: int, mode: str) -> ingest.Quota:
    """Room left under both task quotas for an ingest into a split now holding ``held`` tasks (a
    replace frees them first). The per-split figure is exact (callers lock the split); the team's is
    read from committed rows, so ingests running at once in one team may pass it by one file."""
    per_split, per_team = settings.ORS_MAX_TASKS_PER_SPLIT, settings.ORS_MAX_TASKS_PER_TEAM
    start = held if mode == IngestJob.Mode.APPEND else 0
    team_total = (Split.objects.filter(environment__team_id=environment.team_id)
                  .aggregate(n=Sum("num_tasks"))["n"] or 0)
    in_team = team_total - held + start
    split_room, team_room = per_split - start, per_team - in_team
    if split_room <= team_room:
        kept = f" and keeps its {start}" if start else ""
        return ingest.Quota(room=split_room, message=(
            f"Too many tasks: a split holds at most {per_split}; split '{split_name}'{kept} would pass it "
            "with this file. Nothing was written."))
    return ingest.Quota(room=team_room, message=(
        f"Too many tasks: a team holds at most {per_team} in all its splits, and this team holds {in_team} "
        "besides this file. Nothing was written."))


def _check_declared_rows(path: Path, fmt: str, quota: ingest.Quota) -> None:
    declared = ingest.declared_rows(path, fmt)
    if declared is not None and declared > quota.room:
        raise TaskQuotaExceeded(f"{quota.message} (The file declares {declared} rows.)")


def tasks_ingest(
    *, environment: Environment, split_name: str, mode: str, path: Path, fmt: str,
    split_type: str | None = None, progress: ingest.Progress | None = None, allow_empty: bool = False,
    check_rows: int = 0, accept_failing_rows: bool = False,
) -> IngestResult:
    """Stream a task file into a split, all or nothing: ``replace`` swaps the split's tasks, ``append``
    adds after the last one. The whole ingest is one transaction, so readers see the old tasks until
    it commits, and a bad row (reported with its line) leaves the split exactly as it was.

    ``check_rows``: that many rows (the first, the others at random) are run through the served
    version's setup() and get_prompt() before the commit (catalog/row_check.py); rows that fail
    refuse the file (RowsFailed) unless ``accept_failing_rows``, which keeps them as warnings."""
    ingest.validate_split_name(split_name)
    if mode not in IngestJob.Mode.values:
        raise IngestError(f"Unknown mode {mode!r}: use append or replace.")
    if split_type and split_type not in Split.Type.values:
        raise IngestError(f"Unknown split type {split_type!r}: use train, validation or test.")
    if fmt not in ingest.FORMATS:
        raise IngestError(f"Unknown task file format {fmt!r}.")
    ingest.sniff(path, fmt)
    with transaction.atomic():
        split, _ = Split.objects.select_for_update().get_or_create(
            environment=environment, name=split_name,
            defaults={"type": split_type or _infer_split_type(split_name)},
        )
        quota = _tasks_quota(environment=environment, split_name=split_name, held=split.num_tasks, mode=mode)
        _check_declared_rows(path, fmt, quota)
        if mode == IngestJob.Mode.REPLACE:
            Task.objects.filter(split=split).delete()
            start = 0
        else:
            start = split.num_tasks
        sampler = row_check.Sampler(size=check_rows)
        with ingest.TaskWriter(split.id, start) as writer:
            rows = ingest.stream_into(path=path, fmt=fmt, writer=writer, progress=progress, quota=quota,
                                      sample=sampler if check_rows > 0 else None)
        if rows == 0 and not allow_empty:
            raise IngestError("The file holds no tasks.")
        checked = {}
        if check_rows > 0:
            # Task indexes as the rows will have them; the split's protection as it stands.
            sampled = [(start + position, line, text) for position, line, text in sampler.rows()]
            outcome = row_check.rows_check(version=environment.current_version, split=split, rows=sampled)
            if outcome.failures and not accept_failing_rows:
                raise RowsFailed(
                    f"{len(outcome.failures)} of the {outcome.sampled} rows run through the environment failed "
                    f"(setup() and get_prompt(), as a session starts); no task was written. Fix the rows or "
                    f"the code, or upload again accepting failing rows.",
                    outcome.failures, sampled=outcome.sampled)
            checked = outcome.as_report()
        split.num_tasks = start + rows
        split.revision += 1
        if split_type:
            split.type = split_type
        split.save(update_fields=["num_tasks", "revision", "type"])
        if split.hidden_fields or mode == IngestJob.Mode.REPLACE:
            protection.split_digests_refresh(split=split, start=start)
    return IngestResult(split=split, rows=rows, row_check=checked)
