"""Writes of runs and rollouts: the Rollout API's batches, and the run rows sessions name."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from orsplatform.analytics.services import session_run_rename
from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.catalog.selectors import environment_get_visible, parse_env_ref
from orsplatform.episodes.models import Session
from orsplatform.runs.models import RUN_NAME_MAX, Rollout, RolloutMessage, Run
from orsplatform.runs.wire import BadBatch, Batch, Message, RolloutStart
from orsplatform.teams.auth import Caller

# A session is linked to a rollout of the same key and task started within this much of it.
LINK_WINDOW = timedelta(hours=1)
LINK_CANDIDATES = 50
_VERSION_RE = re.compile(r"^[v@]?(\d{1,9})$")


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int


def run_ensure(*, team_id: int, name: str, seen_at: datetime | None = None) -> None:
    """The run's row exists (the first episode of a session-only run creates it; a race is a no-op)."""
    now = seen_at or timezone.now()
    Run.objects.bulk_create([Run(team_id=team_id, name=name[:RUN_NAME_MAX], first_seen_at=now, last_seen_at=now)],
                            ignore_conflicts=True)


def rollout_batch_ingest(*, caller: Caller, batch: Batch) -> IngestResult:
    """Write one batch of the openreward client in one transaction: all of it or, on BadBatch,
    nothing. Events already stored (a retried batch) are counted as duplicates and skipped."""
    for attempt in range(2):
        try:
            with transaction.atomic():
                return _Ingest(caller, batch).run()
        except IntegrityError:
            # The same batch, retried by the client while its first try was still being written:
            # once that commits, a second pass sees its rows as duplicates.
            if attempt:
                raise BadBatch("These events are being written by another request; retry.", 409) from None
    raise AssertionError("unreachable")


def _error_of(metadata: dict[str, Any] | None) -> str:
    value = (metadata or {}).get("error")
    if value in (None, "", False):
        return ""
    return str(value)[:2000]


def _small_int(value: Any) -> int | None:
    """A RolloutInfo integer the database column holds (JSON lets a client send anything there)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**31:
        return value
    return None


def _version_number(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return _small_int(value)
    match = _VERSION_RE.match(str(value or "").strip())
    return int(match.group(1)) if match else None


class _Ingest:
    def __init__(self, caller: Caller, batch: Batch) -> None:
        self.caller = caller
        self.team_id: int = caller.team_id  # type: ignore[assignment]
        self.batch = batch
        self.now = timezone.now()
        self.envs: dict[str, Environment | None] = {}
        self.duplicates = 0
        self.runs: dict[int, Run] = {}
        self.rollouts: dict[str, Rollout] = {}  # by event_id: the batch's rollouts, locked
        self.dirty_runs: set[int] = set()  # locked runs (self.runs) whose row changed
        self.run_deltas: dict[int, list] = {}  # run id -> [messages, reward_sum, rewarded] to add
        self.dirty_rollouts: set[str] = set()
        self.to_link: set[str] = set()

    def run(self) -> IngestResult:
        starts = self._new_starts()
        self._lock(starts)
        self._start(starts)
        self._update()
        self._messages()
        self._link()
        self._save()
        return IngestResult(accepted=len(self.batch) - self.duplicates, duplicates=self.duplicates)

    # --- which rows a batch touches, locked runs first then rollouts (by id): one order for all ---

    def _new_starts(self) -> list[RolloutStart]:
        seen: set[str] = set()
        unique = []
        for start in self.batch.starts:
            if start.event_id in seen:
                self.duplicates += 1
                continue
            seen.add(start.event_id)
            unique.append(start)
        stored = set(Rollout.objects.filter(team_id=self.team_id, event_id__in=seen)
                     .values_list("event_id", flat=True))
        self.duplicates += len(stored)
        return [s for s in unique if s.event_id not in stored]

    def _lock(self, starts: list[RolloutStart]) -> None:
        # Locks: a batch that starts rollouts locks their runs first (a run's row hands out `seq`),
        # then the existing rollouts it names (by id); run counters of messages are added last with
        # an UPDATE, so a batch of messages (the client sends starts alone) takes its rollouts'
        # rows, then their runs', always in that order.
        new_ids = {s.event_id for s in starts}
        refs = ({u.event_id for u in self.batch.updates} | {m.rollout_event_id for m in self.batch.messages}) - new_ids
        names = {s.run_name for s in starts}
        if names:
            Run.objects.bulk_create([Run(team_id=self.team_id, name=n, first_seen_at=self.now, last_seen_at=self.now)
                                     for n in sorted(names)], ignore_conflicts=True)
            self.runs = {r.pk: r for r in Run.objects.select_for_update().filter(
                team_id=self.team_id, name__in=names).order_by("pk")}
        self.run_by_name = {r.name: r for r in self.runs.values()}
        if refs:
            for rollout in (Rollout.objects.select_for_update().filter(team_id=self.team_id, event_id__in=refs)
                            .order_by("pk")):
                self.rollouts[rollout.event_id] = rollout
        unknown = sorted(refs - set(self.rollouts))
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise BadBatch(f"Unknown rollout(s) {shown}: send the rollout's started event first.", 422)

    # --- events ------------------------------------------------------------------------------------

    def _environment(self, start: RolloutStart) -> tuple[Environment | None, EnvironmentVersion | None]:
        ref = start.environment
        if not ref:
            return None, None
        if ref not in self.envs:
            parsed = parse_env_ref(ref)
            env = None
            if parsed is not None and parsed[0] is not None:
                env = environment_get_visible(caller=self.caller, team_slug=parsed[0], slug=parsed[1])
                if env is not None and not self.caller.may_use(env.pk):
                    env = None
            self.envs[ref] = env
        env = self.envs[ref]
        if env is None:
            return None, None
        parsed = parse_env_ref(ref)
        number = parsed[2] if parsed else None
        versions = EnvironmentVersion.objects.filter(environment=env)
        version = None
        if start.variant_id.isdigit():
            version = versions.filter(pk=int(start.variant_id)).first()
        for candidate in (number, _version_number(start.variant),
                          _version_number((start.rollout_info or {}).get("env_version"))):
            if version is None and candidate is not None:
                version = versions.filter(number=candidate).first()
        return env, version or env.current_version

    def _start(self, starts: list[RolloutStart]) -> None:
        rows = []
        for start in starts:
            run = self.run_by_name[start.run_name]
            env, version = self._environment(start)
            info = start.rollout_info or None
            step = _small_int((info or {}).get("current_step", start.step))
            task_index = _small_int((info or {}).get("task_index"))
            run.rollouts += 1
            if start.run_info:
                run.info = start.run_info
                model = start.run_info.get("model_name")
                run.model_name = str(model)[:200] if model is not None else run.model_name
            self.dirty_runs.add(run.pk)
            rollout = Rollout(
                team_id=self.team_id, run=run, api_key_id=self.caller.api_key_id, event_id=start.event_id,
                seq=run.rollouts, name=start.name, environment_name=start.environment, environment=env,
                version=version, variant=start.variant, split=start.split, task_spec=start.task_spec,
                task_index=task_index,
                metadata=start.metadata, run_info=start.run_info, info=info,
                step=step,
                started_at=start.timestamp, created_at=self.now, last_event_at=start.timestamp,
                error=_error_of(start.metadata))
            rows.append(rollout)
            self.to_link.add(start.event_id)
        Rollout.objects.bulk_create(rows)
        for rollout in rows:
            self.rollouts[rollout.event_id] = rollout

    def _update(self) -> None:
        for update in self.batch.updates:
            rollout = self.rollouts[update.event_id]
            info = update.rollout_info or {}
            rollout.info = {**(rollout.info or {}), **info}
            step, task_index = _small_int(info.get("current_step")), _small_int(info.get("task_index"))
            if step is not None:
                rollout.step = step
            if task_index is not None:
                rollout.task_index = task_index
            number = _version_number(info.get("env_version"))
            if number is not None and rollout.environment_id is not None:
                version = EnvironmentVersion.objects.filter(environment_id=rollout.environment_id, number=number).first()
                rollout.version = version or rollout.version
            rollout.last_event_at = max(rollout.last_event_at, update.timestamp)
            self.dirty_rollouts.add(rollout.event_id)
            self.to_link.add(rollout.event_id)

    def _messages(self) -> None:
        if not self.batch.messages:
            return
        firsts: dict[tuple[int, int], Message] = {}
        for m in self.batch.messages:
            key = (self.rollouts[m.rollout_event_id].pk, m.index)
            if key in firsts:
                self.duplicates += 1
            else:
                firsts[key] = m
        inserted = _messages_insert(firsts)
        self.duplicates += len(firsts) - len(inserted)
        for key, m in firsts.items():
            if key not in inserted:
                continue
            rollout = self.rollouts[m.rollout_event_id]
            delta = self.run_deltas.setdefault(rollout.run_id, [0, 0.0, 0])  # messages, reward_sum, rewarded
            rollout.messages += 1
            delta[0] += 1
            if m.type == RolloutMessage.Type.TOOL_CALL:
                rollout.tool_calls += 1
            if m.reward is not None:
                if rollout.reward is None:
                    delta[2] += 1
                    rollout.reward = 0.0
                rollout.reward += m.reward
                delta[1] += m.reward
            if m.is_finished and not rollout.finished:
                rollout.finished = True
                self.to_link.add(rollout.event_id)
            if not rollout.error:
                rollout.error = _error_of(m.metadata)
            rollout.last_event_at = max(rollout.last_event_at, m.timestamp)
            self.dirty_rollouts.add(rollout.event_id)

    # --- a rollout's session: same key, environment and task, started near it ---------------------

    def _link(self) -> None:
        taken: set[int] = set()
        for event_id in sorted(self.to_link):
            rollout = self.rollouts[event_id]
            if (rollout.session_id is not None or rollout.environment_id is None or self.caller.api_key_id is None
                    or (rollout.task_spec is None and rollout.task_index is None)):
                continue
            candidates = (Session.objects.filter(
                team_id=self.team_id, api_key_id=self.caller.api_key_id, environment_id=rollout.environment_id,
                created_at__gte=rollout.started_at - LINK_WINDOW, created_at__lte=rollout.started_at + LINK_WINDOW,
                rollouts__isnull=True).exclude(pk__in=taken)
                .values_list("pk", "task_spec", "split", "task_index", "run_name", "created_at", "sealed")
                [:LINK_CANDIDATES])
            best = None
            for pk, spec, split, index, run_name, created, sealed in candidates:
                # A sealed split's session is matched by its index only: a link made on an equal
                # spec would confirm a guess of a spec the caller may not read.
                same = (rollout.task_spec is not None and not sealed and spec == rollout.task_spec) or (
                    rollout.task_index is not None and index == rollout.task_index
                    and (not rollout.split or split == rollout.split))
                if same:
                    distance = abs((created - rollout.started_at).total_seconds())
                    if best is None or distance < best[0]:
                        best = (distance, pk, run_name)
            if best is None:
                continue
            _, pk, run_name = best
            taken.add(pk)
            rollout.session_id = pk
            self.dirty_rollouts.add(event_id)
            run = self.runs.get(rollout.run_id)
            run_name_of_rollout = run.name if run else Run.objects.values_list("name", flat=True).get(pk=rollout.run_id)
            # A session that took its key's name by default belongs to the run its rollout names.
            if run_name == self.caller.api_key_name and run_name != run_name_of_rollout:
                session_run_rename(pk=pk, run_name=run_name_of_rollout)

    def _save(self) -> None:
        for pk in sorted(self.dirty_runs):
            run = self.runs[pk]
            run.last_seen_at = self.now
            run.save(update_fields=["info", "model_name", "last_seen_at", "rollouts"])
        fields = ["info", "step", "task_index", "version", "last_event_at", "messages", "tool_calls", "reward",
                  "finished", "error", "session"]
        for rollout in sorted((self.rollouts[e] for e in self.dirty_rollouts), key=lambda r: r.pk):
            rollout.save(update_fields=fields)
        for pk, (messages, reward_sum, rewarded) in sorted(self.run_deltas.items()):
            Run.objects.filter(pk=pk).update(messages=F("messages") + messages, reward_sum=F("reward_sum") + reward_sum,
                                             rewarded=F("rewarded") + rewarded, last_seen_at=self.now)


_MESSAGE_COLUMNS = (("rollout_id", "bigint"), ("index", "integer"), ("event_id", "text"), ("type", "text"),
                    ("content", "text"), ("content_reference", "text"), ("summary", "text"), ("name", "text"),
                    ("call_id", "text"), ("reward", "float8"), ("is_finished", "boolean"), ("metadata", "jsonb"),
                    ("timestamp", "timestamptz"))


def _messages_insert(rows: dict[tuple[int, int], Message]) -> set[tuple[int, int]]:
    """Insert the messages; the (rollout, index) keys actually inserted (a key already stored, from
    a retried batch, is skipped). On PostgreSQL one statement over one JSON parameter (measured:
    the ORM's bulk_create of 128 rows, and psycopg's array parameters, each spent more time in
    Python building the statement than PostgreSQL spent storing the rows)."""
    if connection.vendor == "postgresql":
        q = connection.ops.quote_name
        names = [c for c, _ in _MESSAGE_COLUMNS]
        record = ", ".join(f"{q(c)} {t}" for c, t in _MESSAGE_COLUMNS)
        payload = json.dumps([
            [rollout_id, index, m.event_id, m.type, m.content, m.content_reference, m.summary, m.name, m.call_id,
             m.reward, m.is_finished, m.metadata, m.timestamp.isoformat()]
            for (rollout_id, index), m in rows.items()], separators=(",", ":"))
        # jsonb_to_recordset wants objects: each row array is zipped with the column names in SQL.
        keys = "ARRAY[" + ", ".join(f"'{c}'" for c in names) + "]"
        sql = (f"INSERT INTO {RolloutMessage._meta.db_table} ({', '.join(q(c) for c in names)}) "
               f"SELECT {', '.join(f'x.{q(c)}' for c in names)} FROM jsonb_array_elements(%s::jsonb) AS r(row), "
               f"LATERAL jsonb_to_record((SELECT jsonb_object_agg(k, r.row -> (o::int - 1)) "
               f"FROM unnest({keys}) WITH ORDINALITY AS u(k, o))) AS x({record}) "
               f"ON CONFLICT (rollout_id, {q('index')}) DO NOTHING RETURNING rollout_id, {q('index')}")
        with connection.cursor() as cursor:
            cursor.execute(sql, [payload])
            return {(r, i) for r, i in cursor.fetchall()}
    stored = set(RolloutMessage.objects.filter(rollout_id__in={k[0] for k in rows}, index__in={k[1] for k in rows})
                 .values_list("rollout_id", "index"))
    new = {k: m for k, m in rows.items() if k not in stored}
    RolloutMessage.objects.bulk_create([RolloutMessage(
        rollout_id=rollout_id, index=index, event_id=m.event_id, type=m.type, content=m.content,
        content_reference=m.content_reference, summary=m.summary, name=m.name, call_id=m.call_id, reward=m.reward,
        is_finished=m.is_finished, metadata=m.metadata, timestamp=m.timestamp) for (rollout_id, index), m in new.items()],
        batch_size=500)
    return set(new)
