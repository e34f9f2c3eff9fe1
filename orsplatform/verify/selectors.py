"""Reads of the verify app. Everything that touches a team's data takes the team: a replay samples
only the episodes the environment's own team recorded (the author never sees other teams'
sessions, docs/tenant-record.md), and reports are read by that team only."""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict

from django.conf import settings

from orsplatform.catalog.models import Environment, EnvironmentVersion, Task
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import Team
from orsplatform.verify.models import Verification, VerifySettings
from orsplatform.verify.replay import Call, Episode, outcome_of

# Episodes that ended normally; a lost session's record may stop mid-call.
ENDED = (Session.Status.DELETED, Session.Status.EXPIRED)


def verification_of(*, team: Team | int, environment: Environment, number: int) -> Verification | None:
    """A version's verification, for its own team only (another team's is indistinguishable from none)."""
    team_id = team if isinstance(team, int) else team.id
    if environment.team_id != team_id:
        return None
    return (Verification.objects.select_related("version__environment__team", "baseline", "confirmed_by")
            .filter(version__environment=environment, version__number=number).first())


def verify_settings_of(*, team: Team | int, environment: Environment) -> VerifySettings | None:
    team_id = team if isinstance(team, int) else team.id
    if environment.team_id != team_id:
        return None
    return VerifySettings.objects.filter(environment=environment).first()


def task_label(split: str, index: int | None, spec: object) -> str:
    if split and index is not None:
        return f"{split}/{index}"
    text = json.dumps(spec, sort_keys=True, default=str).encode()
    return f"spec:{hashlib.sha256(text).hexdigest()[:12]}"


def full_specs(*, environment: Environment, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], object]:
    """The stored task specs, hidden fields included (what the environment's own code must get),
    by (split, index); batched per split on the (split, index) index."""
    by_split: dict[str, list[int]] = defaultdict(list)
    for split, index in wanted:
        by_split[split].append(index)
    found: dict[tuple[str, int], object] = {}
    for split, indexes in by_split.items():
        for start in range(0, len(indexes), 1000):
            rows = Task.objects.filter(split__environment=environment, split__name=split,
                                       index__in=indexes[start:start + 1000]).values_list("index", "spec")
            found.update({(split, index): spec for index, spec in rows})
    return found


def has_recorded_episodes(*, team: Team | int, version: EnvironmentVersion) -> bool:
    team_id = team if isinstance(team, int) else team.id
    return Session.objects.filter(environment_id=version.environment_id, version=version, team_id=team_id,
                                  status__in=ENDED, calls__gt=0).exists()


def recorded_episodes(*, team: Team | int, version: EnvironmentVersion, sample_size: int,
                      seed: int | None = None) -> list[Episode]:
    """Up to ``sample_size`` ended episodes of ``version`` recorded by ``team``, drawn at random from
    its most recent ones (ORS_REPLAY_SAMPLE_POOL times the sample, on the (environment, created_at)
    index: the cost is bounded by the sample, not by the history), with their calls in order."""
    team_id = team if isinstance(team, int) else team.id
    if sample_size <= 0:
        return []
    pool = list(Session.objects.filter(environment_id=version.environment_id, version=version, team_id=team_id,
                                       status__in=ENDED, calls__gt=0)
                .order_by("-created_at").values_list("id", flat=True)[:sample_size * settings.ORS_REPLAY_SAMPLE_POOL])
    chosen = sorted(random.Random(seed).sample(pool, min(sample_size, len(pool))))
    sessions = {row["id"]: row for row in Session.objects.filter(id__in=chosen).values(
        "id", "sid", "split", "task_index", "task_spec")}
    calls: dict[int, list[Call]] = defaultdict(list)
    unfinished: set[int] = set()
    for session_id, name, tool_input, status, output in (
            ToolCall.objects.filter(session_id__in=chosen).order_by("session_id", "started_at", "id")
            .values_list("session_id", "name", "input", "status", "output")):
        if status == ToolCall.Status.RUNNING:
            unfinished.add(session_id)
        recorded = outcome_of(output) if status == ToolCall.Status.OK else outcome_of(None)
        calls[session_id].append(Call(name=name, input=tool_input if isinstance(tool_input, dict) else {},
                                      recorded=recorded))
    environment = version.environment
    stored = full_specs(environment=environment, wanted={(s["split"], s["task_index"]) for s in sessions.values()
                                                         if s["split"] and s["task_index"] is not None})
    episodes = []
    for session_id in chosen:
        row = sessions.get(session_id)
        if row is None or session_id in unfinished or not calls.get(session_id):
            continue
        where = (row["split"], row["task_index"])
        spec = stored.get(where, row["task_spec"])
        episodes.append(Episode(key=row["sid"], task=task_label(row["split"], row["task_index"], row["task_spec"]),
                                task_spec=spec, calls=tuple(calls[session_id])))
    return episodes
