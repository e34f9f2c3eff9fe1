"""The supervisor: a pool of sandbox workers per (environment version, calling team).

A gateway (inline executor) or a runner node (celery executor) owns one pool. A worker hosts only
sessions of one package opened by one team, so one author's code and one caller's secrets share a
process; other pairs get other workers. Workers start on demand, more start when a pair has many
sessions, and idle ones are retired. Each runs ``worker.py`` under bubblewrap, started as
bwrap.py's `command` says: own namespaces, tenant code as an unused host uid of its own, a
read-only view of the Python runtime, its site-packages and the package, a private tmpfs, an empty
environment, rlimits and a cgroup of its own.

A worker that dies takes only its own sessions: their waiters get `WorkerGone` with a reason
naming the environment, and the next session of that pair gets a fresh worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import secrets as random
import time
from collections.abc import Callable, Mapping
from typing import Any

from orsplatform.sandbox.config import Limits, SandboxConfig
from orsplatform.sandbox.supervised import (
    BACKOFF_FIRST_SECONDS,
    BACKOFF_MAX_SECONDS,
    BACKOFF_RESET_SECONDS,
    JANITOR_SECONDS,
    CallTimedOut,
    Worker,
    WorkerError,
    WorkerGone,
    _consume,
)

__all__ = ["CallTimedOut", "SandboxPool", "Worker", "WorkerError", "WorkerGone"]
log = logging.getLogger("orsplatform.sandbox")
SPARE_RETRY_SECONDS = 300.0  # a spare that failed to start is tried again after this long
# Keys the digest of the secrets a worker starts with: the pool's keys hold no value a dump of this
# process's memory could test guesses against offline (the values themselves stay with the sessions).
_DIGEST_KEY = random.token_bytes(32)


def secrets_digest(values: Mapping[str, str]) -> str:
    return hashlib.blake2b(json.dumps(sorted(values.items())).encode(), key=_DIGEST_KEY, digest_size=16).hexdigest()


class SandboxPool:
    def __init__(self, config: SandboxConfig,
                 on_lost: Callable[[list[str], str], None] | None = None,
                 worker_class: Callable[[str], type[Worker]] | None = None) -> None:
        self.config = config
        self.on_lost = on_lost
        # package dir -> the kind of worker that runs it (a container for an image; containers/worker.py)
        self.worker_class = worker_class or (lambda package_dir: Worker)
        self._workers: dict[tuple, list[Worker]] = {}
        self._locks: dict[tuple, asyncio.Lock] = {}
        self._spawning: dict[tuple, asyncio.Task] = {}  # a pair's next worker, while it starts
        self._janitor: asyncio.Task | None = None
        self._limits: dict[str, Limits] = {}
        # (package, team) -> (when its last worker was killed for a protocol fault, the back-off
        # its next start waits): a tenant that makes its workers flood or break the channel cannot
        # make the supervisor start one worker after another (each start costs the host CPU that
        # every team's calls need; bench/tenant_noise.py's `flood`).
        self._backoff: dict[tuple, tuple[float, float]] = {}
        # Spares: a started worker per package kept warm (keep_warm), no pair's yet. A pair's first
        # session takes it instead of waiting for a start (a container's server imports for
        # seconds under gVisor) and the next spare starts behind it.
        self._warm: dict[str, str] = {}  # package dir -> label, as keep_warm last said
        self._spares: dict[str, Worker] = {}
        self._spare_starts: dict[str, asyncio.Task] = {}
        self._spare_failed: dict[str, float] = {}  # package dir -> when its last spare failed to start
        self._spare_gate: asyncio.Semaphore | None = None

    def _faulted(self, key: tuple) -> None:
        now = time.monotonic()
        last = self._backoff.get(key)
        recent = last is not None and now - last[0] < BACKOFF_RESET_SECONDS
        delay = min(BACKOFF_MAX_SECONDS, last[1] * 2) if recent else BACKOFF_FIRST_SECONDS
        self._backoff[key] = (now, delay)

    def backoff(self, key: tuple) -> float:
        """Seconds the pair's next worker start still waits (0: none)."""
        last = self._backoff.get(key)
        if last is None:
            return 0.0
        now = time.monotonic()
        if now - last[0] >= BACKOFF_RESET_SECONDS:
            del self._backoff[key]
            return 0.0
        return max(0.0, last[0] + last[1] - now)

    def limits(self, package_dir: str) -> Limits:
        limits = self._limits.get(package_dir)
        if limits is None:
            limits = self._limits[package_dir] = self.config.limits_for(package_dir)
        return limits

    def workers(self) -> list[Worker]:
        return [w for ws in self._workers.values() for w in ws]

    def spares(self) -> dict[str, Worker]:
        return dict(self._spares)

    async def acquire(self, *, sid: str, package_dir: str, team: Any, label: str, caller: Any = None,
                      secrets: Mapping[str, str] | None = None) -> Worker:
        """A live worker of (package, team, caller) with room for the session (started if needed).
        `caller` (the API key) keeps one caller's processes from another's sessions: a child left
        by one key's session, killed when its worker's last session ends, could otherwise live on
        into another key's session of the same team on a busy worker. A worker started with some of
        the session's `secrets` (a container's declared ones) serves only sessions with the same
        values: they are part of its key, and no spare (started with none) stands in for it."""
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.create_task(self._janitor_loop())
        # Most sessions send no secrets: then no look at the package on this path (a file stat, and a
        # container's record read, per session create).
        start = self.worker_class(package_dir).start_secrets(package_dir, secrets) if secrets else {}
        key = (package_dir, team, caller, secrets_digest(start)) if start else (package_dir, team, caller)
        limits = self.limits(package_dir)  # PermissionError: the manifest asks for what is refused
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            workers = [w for w in self._workers.get(key, []) if w.alive]
            cap = self.config.sessions_per_worker
            roomy = [w for w in workers if len(w.sessions) < cap]
            spawning = self._spawning.get(key)
            if not workers and spawning is None and not start and (
                    spare := await self._spare_for(key, package_dir, label)):
                worker = spare
            elif roomy:
                worker = min(roomy, key=lambda w: len(w.sessions))
            elif spawning is None and len(workers) < self.config.max_workers_per_key:
                # Over the cap: the next worker starts in the background while sessions overflow
                # onto the running ones by up to a quarter of the cap (a start takes a second or
                # two, which every new session of the pair would otherwise wait for); only a pair
                # with no worker, or past the overflow, waits for the start.
                spawning = self._spawn(key, package_dir, limits, label, len(workers) + 1, start)
                overflow = [w for w in workers if len(w.sessions) < cap + cap // 4]
                worker = min(overflow, key=lambda w: len(w.sessions)) if overflow else await asyncio.shield(spawning)
            elif spawning is not None:
                overflow = [w for w in workers if len(w.sessions) < cap + cap // 4]
                worker = min(overflow, key=lambda w: len(w.sessions)) if overflow else await asyncio.shield(spawning)
            else:  # at the cap: share the least loaded one
                worker = min(workers, key=lambda w: len(w.sessions))
            if (roomy and spawning is None and len(workers) < self.config.max_workers_per_key
                    and all(len(w.sessions) + 1 >= cap - cap // 4 for w in roomy)):
                # A warm spare: a busy pair's next worker starts while this one still has room, so
                # the session that fills it does not wait for a start (a second under gVisor).
                self._spawn(key, package_dir, limits, label, len(workers) + 1, start)
            worker.sessions.add(sid)
            worker.idle_since = None
            return worker

    def _spawn(self, key: tuple, package_dir: str, limits: Limits, label: str, nth: int,
               start: dict[str, str]) -> asyncio.Task:
        spawning = self._spawning[key] = asyncio.create_task(
            self._start_worker(key, package_dir, limits, label, nth, start))
        spawning.add_done_callback(_consume)  # a failed start is reported to whoever awaits it
        return spawning

    async def _start_worker(self, key: tuple, package_dir: str, limits: Limits, label: str, nth: int,
                            start: dict[str, str]) -> Worker:
        try:
            wait = self.backoff(key)
            if wait:
                log.warning("sandbox worker for %s starts in %.1f s: its last one was killed for breaking the "
                            "channel's protocol", label, wait)
                await asyncio.sleep(wait)
            worker = self.worker_class(package_dir)(key, label, self.config)
            worker.on_death = self.on_lost
            worker.on_fault = functools.partial(self._faulted, key)
            worker.environ = start
            await worker.spawn(package_dir, limits)
            # Idle from when it can take a session, not from before its start (a second or two):
            # else the janitor could retire it as idle before the session it was started for is
            # placed on it (that session's setup then failed with "it was idle").
            worker.idle_since = time.monotonic()
            # Looked up again: the janitor drops a pair's empty list while a worker starts.
            self._workers.setdefault(key, []).append(worker)
            log.info("sandbox worker %s started for %s (%d of this pair)",
                     worker.proc.pid if worker.proc else "?", label, nth)
            return worker
        finally:
            self._spawning.pop(key, None)

    # --- spares: versions kept warm -------------------------------------------------------------

    def keep_warm(self, wanted: dict[str, str]) -> None:
        """Hold one started spare for each of these packages (dir -> label) and none for any other.
        The caller bounds the list (containers/warm.py: how many versions, how many of one team's,
        how long unused); a spare no longer wanted is stopped."""
        if self._janitor is None or self._janitor.done():  # it notices a spare that died
            self._janitor = asyncio.create_task(self._janitor_loop())
        self._warm = dict(wanted)
        for package_dir in [p for p in self._spares if p not in wanted]:
            self._spares.pop(package_dir).kill("its version is no longer kept warm")
        for package_dir in wanted:
            self._spare_ensure(package_dir)

    def _spare_ensure(self, package_dir: str) -> None:
        spare = self._spares.get(package_dir)
        if package_dir not in self._warm or (spare is not None and spare.alive) or package_dir in self._spare_starts:
            return
        failed = self._spare_failed.get(package_dir)
        if failed is not None and time.monotonic() - failed < SPARE_RETRY_SECONDS:
            return  # a version whose container does not start is not retried on every pass
        task = self._spare_starts[package_dir] = asyncio.create_task(self._spare_start(package_dir))
        task.add_done_callback(_consume)

    async def _spare_start(self, package_dir: str) -> None:
        try:
            # One start at a time: a platform (re)starting with many versions to warm does not
            # start them all at once on the CPUs that serve sessions.
            self._spare_gate = self._spare_gate or asyncio.Semaphore(1)
            async with self._spare_gate:
                label = self._warm.get(package_dir)
                if label is None:
                    return
                worker = self.worker_class(package_dir)((package_dir, None, None), label, self.config)
                try:
                    await worker.spawn(package_dir, self.limits(package_dir))
                except (WorkerGone, PermissionError, OSError) as exc:
                    self._spare_failed[package_dir] = time.monotonic()
                    log.warning("no spare for %s: %s", label, str(exc)[:300])
                    return
                if package_dir in self._warm:
                    self._spare_failed.pop(package_dir, None)
                    self._spares[package_dir] = worker
                    log.info("spare worker started for %s", label)
                else:
                    worker.kill("its version is no longer kept warm")
        finally:
            self._spare_starts.pop(package_dir, None)

    async def _spare_for(self, key: tuple, package_dir: str, label: str) -> Worker | None:
        """The package's spare, now the pair's worker (awaited when it is starting: it is closer to
        ready than a start begun now); None when there is none or the pair is backing off."""
        if self.backoff(key):
            return None  # taking spares must not let a faulting pair skip its back-off
        starting = self._spare_starts.get(package_dir)
        if package_dir not in self._spares and starting is not None:
            await asyncio.shield(starting)
        worker = self._spares.pop(package_dir, None)
        if worker is None or not worker.alive:
            self._spare_ensure(package_dir)  # one that died unclaimed: another starts
            return None
        worker.key, worker.label = key, label
        worker.on_death = self.on_lost
        worker.on_fault = functools.partial(self._faulted, key)
        self._workers.setdefault(key, []).append(worker)
        self._spare_ensure(package_dir)  # the next one starts behind it
        log.info("spare worker taken for %s", label)
        return worker

    def release(self, worker: Worker, sid: str) -> None:
        worker.sessions.discard(sid)
        if not worker.sessions:
            worker.idle_since = time.monotonic()
            worker.end_strays()

    async def _janitor_loop(self) -> None:
        while True:
            await asyncio.sleep(JANITOR_SECONDS)
            try:
                self.sweep(time.monotonic())
            except Exception:
                log.exception("sandbox janitor failed")

    def sweep(self, now: float) -> None:
        for package_dir, spare in list(self._spares.items()):
            if not spare.alive:  # it died unclaimed: another takes its place
                del self._spares[package_dir]
                self._spare_ensure(package_dir)
        for key, workers in list(self._workers.items()):
            for worker in workers:
                if not worker.alive:
                    continue
                if worker.overdue(now):
                    worker.kill(f"a tool call outlived its timeout by the {self.config.grace_seconds:g} s grace period")
                elif worker.out_of_memory():
                    # v1 has no memory.oom.group: one process was killed, the worker goes whole.
                    worker.kill(worker.memory_reason())
                elif worker.idle_since is not None and now - worker.idle_since > self.config.idle_seconds:
                    worker.kill("it was idle")
                else:
                    worker.pace(now)
            workers[:] = [w for w in workers if w.alive or w.proc is None or w.proc.returncode is None]
            lock = self._locks.get(key)
            if not workers and not (lock is not None and lock.locked()):
                self._workers.pop(key, None)
                self._locks.pop(key, None)

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
        self._warm = {}
        if self._spare_starts:  # a start under way ends as a spare, stopped below
            await asyncio.wait(list(self._spare_starts.values()), timeout=self.config.start_seconds)
        for spare in self._spares.values():
            spare.kill("the platform shut down")
        self._spares.clear()
        if self._spawning:  # registered once started, so closed with the others below
            await asyncio.wait(list(self._spawning.values()), timeout=self.config.start_seconds)
        for worker in self.workers():
            if worker.proc is not None and worker.proc.stdin is not None:
                with contextlib.suppress(Exception):
                    worker._flush()  # teardowns still waiting for company
                    worker.proc.stdin.close()  # the worker ends when its pipe closes
        deadline = time.monotonic() + 2.0
        for worker in self.workers():
            if worker.proc is None:
                continue
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.wait_for(worker.proc.wait(), max(0.05, deadline - time.monotonic()))
            worker.kill("the platform shut down")
        for worker in self.workers():  # their cgroups go once their processes have
            if worker._reader is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(worker._reader), 5)
        pending = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_remove_later"]
        if pending:
            await asyncio.wait(pending, timeout=5)
        self._workers.clear()
