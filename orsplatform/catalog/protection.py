"""Writes for hidden task fields and sealed splits (docs/hidden-tasks.md); the rules themselves are
in catalog/hidden.py. Kept apart from catalog/services.py, which calls in after every ingest."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from orsplatform.catalog.hidden import digest, normalize_fields
from orsplatform.catalog.models import Environment, Split, Task, TaskDigest

DIGEST_BATCH = 2000
MAX_HIDDEN_FIELDS = 100
MAX_FIELD_NAME = 200


class ProtectionError(ValueError):
    """A setting that cannot be applied (answered 400 with its message)."""


def split_digests_refresh(*, split: Split, start: int = 0) -> int:
    """(Re)compute the digests of the split's tasks from `start` on (an append digests only the new
    rows); a split without hidden fields keeps none. Callers hold the split's transaction."""
    TaskDigest.objects.filter(split=split, index__gte=start).delete()
    hidden = frozenset(split.hidden_fields or ())
    if not hidden:
        return 0
    batch: list[TaskDigest] = []
    count = 0
    rows = Task.objects.filter(split=split, index__gte=start).values_list("index", "spec")
    for index, spec in rows.iterator(chunk_size=DIGEST_BATCH):
        batch.append(TaskDigest(split=split, digest=digest(spec, hidden), index=index))
        count += 1
        if len(batch) >= DIGEST_BATCH:
            TaskDigest.objects.bulk_create(batch)
            batch = []
    if batch:
        TaskDigest.objects.bulk_create(batch)
    return count


def split_protection_set(*, split: Split, hidden_fields: Any = None, sealed: bool | None = None) -> Split:
    """Set a split's hidden fields (a list of top-level field names; [] shows them all again)
    and/or whether it is sealed. Digests are recomputed only when the hidden fields change."""
    if hidden_fields is not None and (not isinstance(hidden_fields, list)
                                      or not all(isinstance(f, str) for f in hidden_fields)):
        raise ProtectionError("hidden_fields must be a list of field names.")
    if hidden_fields is not None and (len(hidden_fields) > MAX_HIDDEN_FIELDS or any(
            len(f) > MAX_FIELD_NAME or not f.isprintable() for f in hidden_fields)):
        raise ProtectionError(f"hidden_fields takes at most {MAX_HIDDEN_FIELDS} printable field names of at most "
                              f"{MAX_FIELD_NAME} characters.")
    if sealed is not None and not isinstance(sealed, bool):
        raise ProtectionError("sealed must be true or false.")
    with transaction.atomic():
        split = Split.objects.select_for_update().get(pk=split.pk)
        update: list[str] = []
        if hidden_fields is not None:
            fields = normalize_fields(hidden_fields)
            if fields != list(split.hidden_fields or []):
                split.hidden_fields = fields
                # Readers' caches are keyed by the revision: bump it so none serves the old view.
                split.revision += 1
                update += ["hidden_fields", "revision"]
                split_digests_refresh(split=split)
        if sealed is not None and sealed != split.sealed:
            split.sealed = sealed
            update.append("sealed")
        if update:
            split.save(update_fields=update)
    return split


def manifest_protection_apply(*, environment: Environment, manifest: dict, split_names: list[str]) -> None:
    """A published manifest's `hidden_task_fields` (every split of the version) and `sealed_splits`.
    A manifest adds protection and never removes it: a version that stops declaring a field leaves
    it hidden until the owner shows it in the console or the REST API (nothing leaks by accident)."""
    fields = normalize_fields(manifest.get("hidden_task_fields") or [])
    sealed = set(manifest.get("sealed_splits") or [])
    unknown = sorted(sealed - set(split_names))
    if unknown:
        raise ProtectionError(f"sealed_splits names {', '.join(map(repr, unknown))}, which the environment "
                              f"does not have (its splits: {', '.join(split_names) or 'none'}).")
    if not fields and not sealed:
        return
    for split in Split.objects.filter(environment=environment, name__in=split_names):
        merged = sorted(set(split.hidden_fields or []) | set(fields))
        split_protection_set(split=split, hidden_fields=merged, sealed=True if split.name in sealed else None)
