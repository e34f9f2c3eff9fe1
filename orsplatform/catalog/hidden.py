"""Hidden task fields and sealed splits (docs/hidden-tasks.md): the one copy of the rules.

A split may hide top-level task fields (the answer): clients get the task without them, the
environment's own code gets all of it. A task object sent back to /create is matched to the stored
task through a digest of its redacted canonical JSON (TaskDigest), so the unmodified clients, which
send the object they read, still start the right episode with the full spec.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson


def normalize_fields(fields: Iterable[Any]) -> list[str]:
    """A clean, sorted list of field names (strings, stripped, no duplicates)."""
    return sorted({f.strip() for f in fields if isinstance(f, str) and f.strip()})


def redact(spec: Any, hidden: frozenset[str]) -> Any:
    """The task as clients may see it. A new dict only when there is something to drop: a split
    without hidden fields pays one truthiness test per task."""
    if not hidden or not isinstance(spec, dict) or hidden.isdisjoint(spec):
        return spec
    # A C-level copy and a pop per hidden key: several times cheaper than a comprehension over
    # every key (task_range redacts up to ORS_MAX_LIST_TASKS tasks per request).
    public = spec.copy()
    for key in hidden:
        public.pop(key, None)
    return public


def digest(spec: Any, hidden: frozenset[str]) -> int:
    """A signed 64-bit digest of the redacted task's canonical JSON (sorted keys; orjson writes
    the same bytes for the same values, whatever the key order a client sent them in)."""
    text = orjson.dumps(redact(spec, hidden), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big", signed=True)


def same_task(given: Any, stored: Any, hidden: frozenset[str]) -> bool:
    """Whether `given` is `stored` as a client saw it (a digest match is confirmed, so a
    collision can never start another task). The hidden fields a caller sends are ignored:
    the stored ones are used."""
    return redact(given, hidden) == redact(stored, hidden)


def owner_key(caller: Any, team_id: int) -> bool:
    """A publish key of the team that owns the environment: the only caller that reads a sealed
    split's specs, and (REST API only) the hidden fields of its own tasks. `caller` is a
    teams.auth.Caller."""
    return caller.team_id == team_id and caller.can("publish")


def sealed_reader(caller: Any) -> int | None:
    """The team whose sealed splits' specs a key reads: its own, with the publish scope (owner_key);
    None for any other key (a sessions-only key of the owning team included) and for anonymous
    callers. The web's counterpart is a publisher of the team (analytics/views.py, hub/views.py)."""
    return caller.team_id if caller.team_id is not None and caller.can("publish") else None


def session_spec(spec: Any, *, sealed: bool, environment_team_id: int | None, reader: int | None) -> Any:
    """A session record's task spec as a viewer may see it: stored without the hidden fields
    already; a sealed split's spec only for a `reader` (sealed_reader) of the environment's team,
    None for anyone else, the team that ran the episode included."""
    return spec if not sealed or (reader is not None and reader == environment_team_id) else None


def sealed_reason(split: str, environment: str) -> str:
    return (f"Split {split!r} is sealed: its tasks are readable only with a publish key of the team that owns "
            f"{environment}. Episodes may still run on it by split and index, and num_tasks is public.")
