"""Every database access of the ORS hot path goes through here.

Selectors and services run on a small dedicated thread pool, each thread keeping its own
connection, so the event loop never blocks on the database and a request does not pay for a new
connection. Catalog lookups are cached briefly: versions are immutable, and a moved
``current_version`` (rollback) or a re-ingested split is seen within ORS_CATALOG_CACHE_SECONDS.

Writes are group-committed: concurrent requests queue their writes, one flusher runs everything
queued in a single transaction, and each request resumes only after that commit, so every answer
the platform gives is already durable while a busy gateway pays one commit per batch, not per row.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, connection, connections, transaction

from orsplatform.catalog import hidden
from orsplatform.catalog import selectors as catalog
from orsplatform.catalog.selectors import EnvHandle, SplitInfo
from orsplatform.engine.errors import StoreUnavailable, Unstorable
from orsplatform.episodes import selectors as episodes
from orsplatform.episodes import services as episode_services
from orsplatform.episodes.hot_writes import (
    SESSION_CREATE,
    SESSION_END,
    SESSION_RECORD_PROMPT,
    TOOL_CALL_RECORD,
    HotWrite,
)
from orsplatform.episodes.selectors import SessionRow
from orsplatform.episodes.services import SessionTotals
from orsplatform.runs import services as run_services
from orsplatform.teams.auth import Caller, key_cache
from orsplatform.teams.services import api_keys_touch

T = TypeVar("T")


def _guarded(fn: Callable[..., T], kwargs: dict) -> T:
    try:
        return fn(**kwargs)
    except IntegrityError:
        raise
    except DataError as exc:
        raise Unstorable(str(exc)) from exc
    except DatabaseError as exc:
        # Drop a broken connection so the next call on this thread reconnects.
        try:
            connection.close()
        except Exception:
            pass
        raise StoreUnavailable(str(exc)) from exc


Op = HotWrite | Callable[..., Any]


def _run_one(op: Op, kwargs: dict) -> Any:
    return op.single(**kwargs) if isinstance(op, HotWrite) else op(**kwargs)


def _run_grouped(ops: list[tuple[Op, dict]]) -> list[tuple[bool, Any]]:
    # Ops in one batch are independent (a request awaits its write before the next depends on
    # it), so grouping them by kind does not reorder anything that matters.
    results: list[tuple[bool, Any] | None] = [None] * len(ops)
    groups: dict[HotWrite, list[int]] = {}
    for i, (op, kwargs) in enumerate(ops):
        if isinstance(op, HotWrite):
            groups.setdefault(op, []).append(i)
        else:
            results[i] = (True, op(**kwargs))
    for write, indexes in groups.items():
        value = write.run(rows=[ops[i][1] for i in indexes])
        for n, i in enumerate(indexes):
            results[i] = (True, value[n] if write.per_row else None)
    return results  # type: ignore[return-value]


def _run_batch(ops: list[tuple[Op, dict]]) -> list[tuple[bool, Any]]:
    """Run queued writes in one transaction; if any fails, redo them one by one so a single bad
    write (a duplicate sid) fails alone."""
    try:
        with transaction.atomic():
            return _run_grouped(ops)
    except DatabaseError:
        pass
    results: list[tuple[bool, Any]] = []
    for op, kwargs in ops:
        try:
            # Appended after the commit: SQLite checks foreign keys at commit, so a row can fail
            # there, after its statement ran (one result per op, whatever fails where).
            with transaction.atomic():
                value = _run_one(op, kwargs)
            results.append((True, value))
        except IntegrityError as exc:
            results.append((False, exc))
        except DataError as exc:
            results.append((False, Unstorable(str(exc))))
        except DatabaseError as exc:
            try:
                connection.close()
            except Exception:
                pass
            results.append((False, StoreUnavailable(str(exc))))
    return results


class WriteBatcher:
    """Group commit. Up to ``flushers`` batches are in flight at once (one per DB thread), so on
    PostgreSQL the next batch fills and commits while the previous one waits for its WAL flush."""

    def __init__(self, pool: ThreadPoolExecutor, *, flushers: int, max_batch: int = 500,
                 pg_writers: list | None = None) -> None:
        self._pool = pool
        self._max_batch = max_batch
        # PgWriters (PostgreSQL only): the hot writes on the event loop, one connection per flusher
        # so a batch fills and commits while the previous one waits for its WAL flush.
        self._pg_writers = pg_writers or []
        self._flushers = len(self._pg_writers) or flushers
        self._queue: list[tuple[Op, dict, asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []

    async def submit(self, op: Op, **kwargs: Any) -> Any:
        return await self.enqueue(op, kwargs)

    def enqueue(self, op: Op, kwargs: dict) -> asyncio.Future:
        """The write queued; the future resolves once its batch is committed. For the audit row
        of every call, which awaits this directly: no coroutine of its own, no kwargs repacked."""
        # The first flusher's test settles it while they run (a generator over all per call cost more).
        if not self._tasks or (self._tasks[0].done() and all(t.done() for t in self._tasks)):
            self._wakeup = asyncio.Event()
            self._tasks = [asyncio.create_task(self._flush_forever(n)) for n in range(self._flushers)]
        future = asyncio.get_running_loop().create_future()
        self._queue.append((op, kwargs, future))
        self._wakeup.set()
        return future

    async def _run(self, ops: list[tuple[Op, dict]], pg) -> list[tuple[bool, Any]]:
        if pg is None:
            return await asyncio.get_running_loop().run_in_executor(self._pool, _run_batch, ops)
        hot = [i for i, (op, _) in enumerate(ops) if isinstance(op, HotWrite)]
        rest = [i for i, (op, _) in enumerate(ops) if not isinstance(op, HotWrite)]
        results: list[tuple[bool, Any] | None] = [None] * len(ops)
        if rest:
            rest_results = await asyncio.get_running_loop().run_in_executor(
                self._pool, _run_batch, [ops[i] for i in rest])
            for i, result in zip(rest, rest_results, strict=True):
                results[i] = result
        if hot:
            for i, result in zip(hot, await pg.run([ops[i] for i in hot]), strict=True):
                results[i] = result
        return results  # type: ignore[return-value]

    async def _flush_forever(self, n: int) -> None:
        pg = self._pg_writers[n] if self._pg_writers else None
        while True:
            await self._wakeup.wait()
            if not self._queue:
                self._wakeup.clear()
                continue
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch:]
            if not self._queue:
                self._wakeup.clear()
            try:
                results = await self._run([(f, k) for f, k, _ in batch], pg)
            except Exception as exc:  # the thread pool or the connection itself failed
                results = [(False, StoreUnavailable(str(exc)))] * len(batch)
            for (_, _, future), (ok, value) in zip(batch, results, strict=True):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    async def aclose(self) -> None:
        for writer in self._pg_writers:
            await writer.close()

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()


_MISSING = object()
TASK_BLOCK = 256
ACTIVITY_SLICE = 256  # sessions' activity times per write (Store.flush_activity)


class _TtlCache:
    def __init__(self) -> None:
        self._data: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> Any:
        hit = self._data.get(key)
        if hit is None or time.monotonic() - hit[0] > settings.ORS_CATALOG_CACHE_SECONDS:
            return None
        return hit[1]

    def put(self, key: Any, value: Any) -> None:
        if len(self._data) > 50_000:
            self._data.clear()
        self._data[key] = (time.monotonic(), value)


class Store:
    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ors-db")
        self._envs = _TtlCache()
        self._resolving: dict[tuple, asyncio.Future] = {}
        self._versions: dict[int, EnvHandle] = {}
        # Task specs by (split, revision, index): a re-ingest bumps the revision.
        self._tasks: dict[tuple[int, int, int], Any] = {}
        # (split id, revision, digest) -> task index, or -1 for none (catalog/hidden.py).
        self._digests: dict[tuple[int, int, int], int] = {}
        # (team, run name) pairs whose runs.Run row this process has made sure of.
        self._runs: set[tuple[int, str]] = set()
        pg_writers = []
        if connections["default"].vendor == "postgresql" and settings.ORS_PG_ASYNC_WRITES:
            from orsplatform.engine.pg_writer import PgWriter

            pg_writers = [PgWriter() for _ in range(2)]
        # Its own connection, so a read never waits behind a batch commit.
        self._pg_reader = PgWriter() if pg_writers else None
        self.writes = WriteBatcher(self._pool, flushers=1, pg_writers=pg_writers)

    async def _run(self, fn: Callable[..., T], **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, _guarded, fn, kwargs)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a DB thread (for callers outside this module: the key lookup of auth)."""
        return await self._run(lambda: fn(*args))

    # catalog
    async def environment(self, caller: Caller, ref: str) -> EnvHandle | None:
        key = (caller.team_id, ref)
        handle = self._envs.get(key)
        if handle is None:
            # Requests that miss together share one lookup (an expiry at concurrency 16 sent 16).
            lookup = self._resolving.get(key)
            if lookup is None:
                lookup = self._resolving[key] = asyncio.ensure_future(self._resolve(caller, ref))
                lookup.add_done_callback(lambda _: self._resolving.pop(key, None))
            handle = await asyncio.shield(lookup)
        return None if handle is _MISSING else handle

    async def _resolve(self, caller: Caller, ref: str) -> Any:
        handle = await self._run(catalog.environment_resolve, caller=caller, ref=ref)
        # Misses are cached too, so a stream of requests for an unknown name stays off the DB.
        self._envs.put((caller.team_id, ref), handle if handle is not None else _MISSING)
        return handle if handle is not None else _MISSING

    async def environment_by_id(self, caller: Caller, environment_id: int) -> EnvHandle | None:
        key = (caller.team_id, environment_id)
        handle = self._envs.get(key)
        if handle is None:
            handle = await self._run(catalog.environment_resolve_id, caller=caller, environment_id=environment_id)
            if handle is not None:
                self._envs.put(key, handle)
        return handle

    async def environment_names(self, caller: Caller) -> list[str]:
        """The names an unknown name is compared with (cached: a stream of misses stays off the DB)."""
        key = ("names", caller.team_id, caller.environment_id)
        names = self._envs.get(key)
        if names is None:
            names = await self._run(catalog.environment_names_visible, caller=caller)
            self._envs.put(key, names)
        return names

    async def environments_visible(self, caller: Caller) -> list[str]:
        envs = await self._run(catalog.environments_visible, caller=caller)
        return [e.full_name for e in envs]

    async def version(self, version_id: int) -> EnvHandle | None:
        handle = self._versions.get(version_id)
        if handle is None:
            handle = await self._run(catalog.version_handle, version_id=version_id)
            if handle is not None and len(self._versions) < 10_000:
                self._versions[version_id] = handle
        return handle

    async def task_spec(self, split: SplitInfo, index: int) -> Any:
        key = (split.id, split.revision, index)
        spec = self._tasks.get(key)
        if spec is None:
            # A block of neighbours with it: trainers walk a split in order, so a miss per
            # TASK_BLOCK tasks instead of a database round trip per episode (one read costs about
            # as much as reading the block).
            start = index - index % TASK_BLOCK
            if self._pg_reader is not None:  # on the loop: no DB thread holding the GIL
                rows = await self._pg_reader.fetch_rows(catalog.TASK_SPEC_BLOCK_SQL,
                                                        (split.id, start, start + TASK_BLOCK))
            else:
                rows = await self._run(catalog.task_spec_block, split_id=split.id, start=start,
                                       stop=start + TASK_BLOCK)
            if len(self._tasks) + len(rows) > 100_000:
                self._tasks.clear()
            for i, value in rows:
                if value is not None:
                    self._tasks[(split.id, split.revision, i)] = value
            spec = self._tasks.get(key)
        return spec

    async def task_match(self, env: EnvHandle, spec: Any) -> tuple[SplitInfo, int, Any] | None:
        """The stored task (split, index, full spec) a client's task object is, when the
        environment hides fields: a digest per hiding split, looked up in memory first and then
        in one indexed query; a hit is confirmed against the stored spec."""
        keys = [((info.id, info.revision, hidden.digest(spec, info.hidden)), info)
                for info in env.splits.values() if info.hidden]
        indexes = {key: self._digests.get(key) for key, _ in keys}
        missing = [key for key, index in indexes.items() if index is None]
        if missing:
            rows = await self._run(catalog.task_digest_match, pairs=[(k[0], k[2]) for k in missing])
            found: dict[tuple[int, int], int] = {}
            for split_id, value, index in rows:
                found.setdefault((split_id, value), index)
            if len(self._digests) + len(missing) > 100_000:
                self._digests.clear()
            for key in missing:
                indexes[key] = self._digests[key] = found.get((key[0], key[2]), -1)
        for key, info in keys:
            index = indexes[key]
            if index >= 0:
                full = await self.task_spec(info, index)
                if full is not None and hidden.same_task(spec, full, info.hidden):
                    return info, index, full
        return None

    async def task_specs(self, split_id: int, start: int, stop: int) -> list:
        return await self._run(catalog.task_specs_range, split_id=split_id, start=start, stop=stop)

    # sessions
    async def session_for(self, caller: Caller, sid: str) -> SessionRow | None:
        return await self._run(episodes.session_get_for_caller, caller=caller, sid=sid)

    async def sid_taken(self, sid: str) -> bool:
        return await self._run(episodes.session_sid_taken, sid=sid)

    async def session_create(self, **kwargs: Any) -> int:
        return await self.writes.submit(SESSION_CREATE, **kwargs)

    async def run_ensure(self, team_id: int, name: str) -> None:
        """The run's row, written once per process and run (not once per episode)."""
        if (team_id, name) in self._runs:
            return
        await self.writes.submit(run_services.run_ensure, team_id=team_id, name=name)
        if len(self._runs) > 100_000:
            self._runs.clear()
        self._runs.add((team_id, name))

    async def session_discard(self, pk: int) -> None:
        await self.writes.submit(episode_services.session_discard, pk=pk)

    async def session_mark_failed(self, pk: int, error: str) -> None:
        await self.writes.submit(episode_services.session_mark_failed, pk=pk, error=error)

    async def session_end(self, pk: int, status: str, last_activity_at: datetime | None = None,
                          totals: SessionTotals | None = None, ready_at: datetime | None = None,
                          prompt: list[dict] | None = None) -> None:
        await self.writes.submit(SESSION_END, pk=pk, status=status, last_activity_at=last_activity_at,
                                 totals=totals, ready_at=ready_at, prompt=prompt)

    def tool_call_record(self, **kwargs: Any) -> Awaitable[None]:
        """Awaitable: done once the call's audit row is committed (the batch's future itself)."""
        return self.writes.enqueue(TOOL_CALL_RECORD, kwargs)

    async def tool_call_result(self, session_pk: int, task_id: str) -> tuple[str, dict | None, str] | None:
        return await self._run(episodes.tool_call_result_get, session_pk=session_pk, task_id=task_id)

    async def flush_activity(self, activity: dict[int, tuple[datetime, datetime | None]],
                             prompts: dict[int, list[dict]] | None = None) -> None:
        # In slices written one after another: one write of every open session's activity (8,192
        # rows took 0.3 to 1 s on SQLite) held the one writer, and every call's audit row queued
        # behind it (the stall every ORS_ACTIVITY_FLUSH_SECONDS of a socket hold). A slice's
        # write takes milliseconds; calls' writes that arrive meanwhile go in the next batch.
        items = list(activity.items())
        for start in range(0, len(items), ACTIVITY_SLICE):
            await self.writes.submit(episode_services.sessions_touch,
                                     activity=dict(items[start:start + ACTIVITY_SLICE]))
        if prompts:  # one statement for all of them (the batcher groups a hot write's rows)
            await asyncio.gather(*[self.writes.submit(SESSION_RECORD_PROMPT, pk=pk, blocks=blocks)
                                   for pk, blocks in prompts.items()])
        last_used = key_cache.drain_last_used()
        if last_used:
            await self.writes.submit(api_keys_touch, last_used=last_used)

    async def aclose(self) -> None:
        await self.writes.aclose()
        if self._pg_reader is not None:
            await self._pg_reader.close()

    def close(self) -> None:
        self.writes.stop()
        # Close every thread's connection so the database can be dropped (tests) or restarted; the
        # barrier makes each of the pool's threads take exactly one of the close jobs.
        barrier = threading.Barrier(self._threads)

        def close_on_this_thread() -> None:
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass
            connection.close()

        futures = [self._pool.submit(close_on_this_thread) for _ in range(self._threads)]
        for future in futures:
            try:
                future.result(timeout=5)
            except Exception:
                pass
        self._pool.shutdown(wait=False)
