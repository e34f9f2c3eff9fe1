"""The gateway's side of the Celery executor: environment instances live on runner nodes
(``orsplatform/executors/node.py``), and any gateway can serve any session.

Work goes to a node's own inbox, a Redis list (inbox.py, docs/runner-nodes.md); answers come back on Redis (see node.py): a
pub/sub channel per gateway wakes the waiting request, and durable keys (setup state, call results)
are what the request actually reads, so a lost wake-up only costs the polling interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter, OrderedDict
from typing import Any

import orjson
import redis.asyncio as aioredis
from django.conf import settings

from orsplatform.executors import inbox
from orsplatform.executors.coalesce import Coalescer
from orsplatform.executors.executor import (
    CallOutcome,
    Executor,
    NoRunnerAvailable,
    RunnerLost,
    RunnerUnavailable,
    SessionSpec,
    SetupFailed,
    SetupPending,
    UnknownSession,
    WorkerLost,
)
from orsplatform.executors.keys import (
    GONE_RECORD,
    Keys,
    decode,
    heartbeat_identity,
    runner_hostname,
    runner_identity,
)
from orsplatform.executors.sealing import seal

log = logging.getLogger(__name__)
FORGET_BATCH_SECONDS = 0.05
RECORDS_KEPT = 4_000  # session records remembered from the broadcast (at most ~32 MB with prompts)


class CeleryExecutor(Executor):
    shared = True  # sessions live outside this process: any gateway may serve them

    def __init__(self) -> None:
        self.prefix = settings.ORS_REDIS_PREFIX
        self.keys = Keys(self.prefix)
        self.gateway = uuid.uuid4().hex[:12]
        self.redis = aioredis.from_url(settings.REDIS_URL)
        # Requests' commands (work, records, markers, reads) share pipelines (coalesce.py).
        self.batch = Coalescer(self.redis)
        self._runners: dict[str, str] = {}  # sid -> runner identity (keys.runner_identity)
        # Runner identity -> how many of `_runners` it holds, kept with it: place() reads it at
        # every /create, which must not cost a pass over every session this gateway knows.
        self._held: Counter[str] = Counter()
        self._inboxes: dict[str, str] = {}  # runner identity -> its node's inbox (a Redis list)
        self._wakeups: dict[str, set[asyncio.Event]] = {}  # sid or task_id -> its waiters' events
        self._replies: dict[str, asyncio.Future] = {}
        self._runner_cache: tuple[float, list[tuple[str, int, str]]] = (0.0, [])
        # Runner identity -> the public key its heartbeat announced (secrets are sealed to it).
        self._node_keys: dict[str, str] = {}
        self._listener: asyncio.Task | None = None
        self._missing_since: dict[str, float] = {}
        self._ready: set[str] = set()  # sessions seen ready: no more state reads for them
        self._results: dict[str, dict] = {}  # results that arrived with their wake-up message
        # Session records broadcast by the runners when setup ends (most recent last, bounded):
        # a gateway usually learns that a session is ready, who owns it and its prompt before the
        # client's first request for it reaches this gateway.
        self._records: OrderedDict[str, dict] = OrderedDict()
        self._forget: list[str] = []  # finished calls whose markers are dropped in the next batch
        self._forget_task: asyncio.Task | None = None

    # --- plumbing ---------------------------------------------------------------------------

    async def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            ready = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(ready))
            await asyncio.wait_for(ready.wait(), 5)

    async def _listen(self, ready: asyncio.Event) -> None:
        while True:
            pubsub = self.redis.pubsub()
            try:
                # This gateway's own channels (replies, its calls) and the broadcast of session states,
                # since a session's setup may be awaited by any gateway; one channel of each per node
                # (keys.runner_acl_rules), hence patterns.
                await pubsub.psubscribe(self.keys.gateway_pattern(self.gateway), self.keys.sessions_pattern)
                ready.set()
                async for message in pubsub.listen():
                    if message.get("type") == "pmessage":
                        try:
                            self._dispatch(orjson.loads(message["data"]))
                        except Exception:  # one unreadable message must not cost the subscription
                            log.exception("unreadable message on the runner channel")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarted: resubscribe; durable keys cover the gap
                log.warning("runner channel lost (%s); resubscribing", exc)
                ready.set()
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):  # its connection goes back, not leaked
                    await pubsub.aclose()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "reply":
            future = self._replies.pop(message.get("request", ""), None)
            if future is not None and not future.done():
                future.set_result(message)
            return
        if kind == "state":
            sid = message.get("sid", "")
            if message.get("state") == "gone":  # ended through a gateway (stop() below)
                self._ready.discard(sid)
                self._records.pop(sid, None)  # a waiter reads the record: gone
                if message.get("by") != self.gateway and self.on_gone is not None:
                    self.on_gone(sid)
            else:
                self._remember(sid, message)
            if message.get("state") == "lost":
                self._ready.discard(sid)  # wait_ready reads the record again: 410 with the reason
            waiters = self._wakeups.get(sid, ())
        else:
            key = message.get("task_id", "")
            waiters = self._wakeups.get(key, ())
            if "payload" in message and waiters:
                self._results[key] = message["payload"]
        for event in waiters:
            event.set()

    def _remember(self, sid: str, record: dict) -> None:
        self._records[sid] = record
        self._records.move_to_end(sid)
        while len(self._records) > RECORDS_KEPT:
            self._records.popitem(last=False)

    def _watch(self, key: str) -> asyncio.Event:
        event = asyncio.Event()
        self._wakeups.setdefault(key, set()).add(event)
        return event

    def _unwatch(self, key: str, event: asyncio.Event) -> None:
        waiters = self._wakeups.get(key)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                self._wakeups.pop(key, None)

    def _message(self, op: str, runner: str, *args: Any) -> tuple[str, bytes]:
        # Straight onto the node's own list (inbox.py): one LPUSH, pipelined with the request's
        # other writes on this event loop.
        key = self._inboxes.get(runner)
        if key is None:
            key = self._inboxes[runner] = self.keys.inbox(runner_hostname(runner))
        return key, inbox.message(op, *args)

    async def _send(self, op: str, runner: str, *args: Any) -> None:
        queue, message = self._message(op, runner, *args)
        await self.batch.run(lambda pipe: pipe.lpush(queue, message))

    async def _get(self, key: str) -> bytes | None:
        return (await self.batch.run(lambda pipe: pipe.get(key)))[0]

    async def runners(self) -> list[tuple[str, int, str]]:
        """Live runners (identity, session count, dedicated team), from heartbeats (cached 1 s)."""
        cached_at, runners = self._runner_cache
        if time.monotonic() - cached_at < 1.0:
            return runners
        names = [n.decode() for n in await self.redis.zrangebyscore(
            self.keys.runners, time.time() - settings.ORS_RUNNER_HEARTBEAT_TTL, "+inf")]
        values = await self.redis.mget([self.keys.runner(n) for n in names]) if names else []
        runners = []
        for name, value in zip(names, values, strict=True):
            if value:  # the index lags the heartbeat's TTL; the key is the truth
                beat = json.loads(value)
                identity = runner_identity(name, beat.get("boot", ""))
                runners.append((identity, int(beat.get("sessions", 0)), beat.get("team", "")))
                if beat.get("key"):
                    self._node_keys[identity] = beat["key"]
        self._runner_cache = (time.monotonic(), runners)
        return runners

    async def runner_alive(self, runner: str) -> bool:
        """Whether the runner beats, or its node's heartbeat went missing less than
        ORS_RUNNER_GRACE_SECONDS ago (a restarted Redis loses every heartbeat at once; live nodes
        write theirs again within a second). A heartbeat of another start of the node means no."""
        hostname = runner_hostname(runner)
        beating = heartbeat_identity(hostname, await self._get(self.keys.runner(hostname)))
        if beating is not None:
            self._missing_since.pop(runner, None)
            return beating == runner
        first_missing = self._missing_since.setdefault(runner, time.monotonic())
        return time.monotonic() - first_missing < settings.ORS_RUNNER_GRACE_SECONDS

    # --- Executor -----------------------------------------------------------------------------

    async def place(self, team: str | None = None) -> str:
        runners = await self.runners()
        # A team's dedicated nodes first (isolation from other tenants), else the shared pool.
        pool = [r for r in runners if team and r[2] == team] or [r for r in runners if not r[2]]
        if not pool:
            raise NoRunnerAvailable()
        # Least loaded; the cache lags a second, so count this gateway's own placements too.
        name, _, _ = min(pool, key=lambda r: (r[1] + self._held[r[0]], r[0]))
        return name

    def attach(self, sid: str, runner: str) -> None:
        self._release(sid)
        self._runners[sid] = runner
        self._held[runner] += 1

    def _release(self, sid: str) -> str | None:
        runner = self._runners.pop(sid, None)
        if runner is not None:
            self._held[runner] -= 1
            if self._held[runner] <= 0:
                del self._held[runner]
        return runner

    def detach(self, sid: str) -> None:
        self._release(sid)
        self._ready.discard(sid)
        self._records.pop(sid, None)

    def _runner_of(self, sid: str) -> str:
        runner = self._runners.get(sid)
        if runner is None:
            raise UnknownSession(sid)
        return runner

    async def start(self, spec: SessionSpec, runner: str = "") -> None:
        await self._ensure_listener()
        runner = runner or await self.place()
        self.attach(spec.sid, runner)
        owner = {**spec.owner, "runner": runner}
        sealed = await self._sealed(runner, spec)
        self._remember(spec.sid, {"state": "starting", **owner})
        # The record first, then the work, in one round trip: another gateway can serve the
        # session from the record while setup runs.
        record = json.dumps({"state": "starting", **owner})
        queue, message = self._message("setup", runner, spec.sid, spec.package_path,
                                       spec.entrypoint, spec.task_spec, sealed, self.gateway, owner)

        def build(pipe) -> None:
            pipe.set(self.keys.state(spec.sid), record, ex=int(settings.ORS_STATE_TTL_SECONDS))
            pipe.lpush(queue, message)

        try:
            await self.batch.run(build)
        except BaseException:
            self.detach(spec.sid)  # the /create fails (503) and may be retried from scratch
            raise

    async def _sealed(self, runner: str, spec: SessionSpec) -> dict:
        """The session's secrets sealed to the node that will run it: the setup message waits in a
        Redis list, which is no place for secrets in clear."""
        if not spec.secrets:
            return {}
        key = self._node_keys.get(runner)
        if key is None:
            beat = decode(await self._get(self.keys.runner(runner_hostname(runner)))) or {}
            if runner_identity(runner_hostname(runner), beat.get("boot", "")) == runner and beat.get("key"):
                key = self._node_keys[runner] = beat["key"]
        if key is None:
            raise NoRunnerAvailable(f"Runner {runner} announces no key to seal the session's secrets to.")
        return seal(key, dict(spec.secrets), spec.sid)

    async def _state(self, sid: str) -> dict | None:
        record = decode(await self._get(self.keys.state(sid)))
        if record is not None:
            known = self._records.get(sid)
            # A read sent before the runner's update may answer after its broadcast: keep the newer.
            if known is None or known.get("state") == "starting" or record.get("state") != "starting":
                self._remember(sid, record)
        return record

    async def shared_record(self, sid: str) -> dict | None:
        # Always read: a session deleted through another gateway says "gone" there at once. A
        # record naming a node without a heartbeat is not trusted (the row says whether it is lost).
        record = await self._state(sid)
        if record is not None and record.get("runner") not in {r[0] for r in await self.runners()}:
            return None
        return record

    async def wait_ready(self, sid: str, timeout: float) -> None:
        runner = self._runner_of(sid)
        if sid in self._ready:
            return
        await self._ensure_listener()
        deadline = time.monotonic() + timeout
        event = self._watch(sid)
        try:
            polled = False
            while True:
                # Cleared before the read, so a wake-up arriving after the read is not lost. The
                # broadcast keeps `_records` current, so Redis is read only when this gateway has no
                # record of the session or a wait ended without a wake-up (a lost broadcast).
                event.clear()
                state = self._records.get(sid)
                if state is None or polled:
                    state = await self._state(sid)
                if state is not None and state["state"] != "starting":
                    if state["state"] == "ready":
                        self._ready.add(sid)
                        return
                    if state["state"] == "failed":
                        raise SetupFailed(state.get("error", "setup failed"))
                    if state["state"] == "lost":  # its sandbox worker ended (node.sessions_lost)
                        raise WorkerLost(state.get("error", ""))
                    raise UnknownSession(sid)
                if polled and not await self.runner_alive(runner):  # checked when a wait came up empty
                    raise RunnerLost(sid)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SetupPending(sid)
                try:
                    async with asyncio.timeout(min(remaining, settings.ORS_RUNNER_POLL_SECONDS)):
                        await event.wait()
                    polled = False
                except TimeoutError:
                    polled = True
        finally:
            self._unwatch(sid, event)

    async def _request(self, op: str, sid: str) -> Any:
        runner = self._runner_of(sid)
        await self._ensure_listener()
        request_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._replies[request_id] = future
        try:
            await self._send(op, runner, sid, request_id, self.gateway)
            deadline = time.monotonic() + settings.ORS_RUNNER_REPLY_TIMEOUT_SECONDS
            while True:
                try:
                    message = await asyncio.wait_for(asyncio.shield(future), 1.0)
                    break
                except TimeoutError:
                    if not await self.runner_alive(runner):
                        raise RunnerLost(sid) from None
                    if time.monotonic() > deadline:
                        raise RunnerUnavailable(f"runner {runner} did not answer") from None
        finally:
            self._replies.pop(request_id, None)
        if message["ok"]:
            return message["value"]
        if message["error"] == "unknown_session":
            raise UnknownSession(sid)
        if message["error"] == "lost":
            raise WorkerLost(message.get("reason", ""))
        raise RuntimeError(message["error"])

    async def prompt(self, sid: str) -> list[dict]:
        # The initial prompt was computed by the runner when setup ended (node.py): from the
        # broadcast, else from the record; the runner is asked only when neither has it.
        record = self._records.get(sid)
        if record is None or "prompt" not in record:
            record = await self._state(sid)
        if record is not None and record.get("state") == "ready" and "prompt" in record:
            return record["prompt"]
        return await self._request("prompt", sid)

    def prompt_audit(self, sid: str) -> list[dict] | None:
        record = self._records.get(sid)
        return record.get("prompt_audit") if record is not None else None

    async def recorded_prompt(self, sid: str) -> list[dict] | None:
        record = self._records.get(sid)
        if record is not None and record.get("state") == "ready" and "prompt" not in record:
            record = await self._state(sid)  # a big prompt stays out of the broadcast
        if record is None:
            return None
        return record.get("prompt_audit", record.get("prompt"))

    async def task_tools(self, sid: str) -> list[dict]:
        return await self._request("task_tools", sid)

    async def native_state(self, sid: str) -> dict:
        return await self._request("state", sid)

    async def call(self, sid: str, name: str, input: dict, timeout: float, task_id: str = "",
                   note: dict | None = None) -> CallOutcome:
        runner = self._runner_of(sid)
        await self._ensure_listener()
        task_id = task_id or uuid.uuid4().hex
        event = self._watch(task_id)
        try:
            # The call's marker and the work in one round trip.
            marker = None if note is None else json.dumps({**note, "runner": runner, "gateway": self.gateway})
            queue, message = self._message("call", runner, sid, task_id, name, input, timeout,
                                           self.gateway)

            def build(pipe) -> None:
                if marker is not None:
                    pipe.set(self.keys.call(task_id), marker, ex=int(settings.ORS_RESULT_TTL_SECONDS))
                    pipe.zadd(self.keys.calls, {task_id: time.time()})
                pipe.lpush(queue, message)

            await self.batch.run(build)
            return await self._await_result(task_id, runner, timeout, event)
        finally:
            self._unwatch(task_id, event)

    async def forget_call(self, task_id: str) -> None:
        # Markers are dropped in batches (the sweeper only looks at markers older than
        # ORS_ORPHAN_AFTER_SECONDS and skips calls whose row exists): one round trip for many calls.
        self._forget.append(task_id)
        if self._forget_task is None or self._forget_task.done():
            self._forget_task = asyncio.create_task(self._forget_soon())

    async def _forget_soon(self) -> None:
        await asyncio.sleep(FORGET_BATCH_SECONDS)  # gathers the calls that finish meanwhile
        batch, self._forget = self._forget, []

        def build(pipe) -> None:
            pipe.delete(*[self.keys.call(t) for t in batch])
            pipe.zrem(self.keys.calls, *batch)

        try:
            await self.batch.run(build)
        except Exception as exc:  # they expire anyway; the sweeper skips calls already recorded
            log.warning("could not drop %d call markers: %s", len(batch), exc)

    async def call_record(self, task_id: str) -> dict | None:
        return decode(await self._get(self.keys.call(task_id)))

    async def result(self, task_id: str) -> dict | None:
        """A finished call's result as the runner left it (None while it runs)."""
        return decode(await self._get(self.keys.result(task_id)))

    async def wait_result(self, task_id: str, runner: str, timeout: float) -> CallOutcome:
        """Wait for a call started elsewhere (a reconnect on another gateway)."""
        event = self._watch(task_id)
        try:
            return await self._await_result(task_id, runner, timeout, event)
        finally:
            self._unwatch(task_id, event)

    async def _await_result(self, task_id: str, runner: str, timeout: float, event: asyncio.Event) -> CallOutcome:
        # The runner enforces the tool timeout; past it plus a grace period the runner is not answering.
        deadline = time.monotonic() + timeout + settings.ORS_RUNNER_REPLY_TIMEOUT_SECONDS
        poll = settings.ORS_RUNNER_POLL_SECONDS
        while True:
            try:
                async with asyncio.timeout(poll):  # no task per wait, unlike wait_for
                    await event.wait()
            except TimeoutError:
                pass
            event.clear()
            # The wake-up usually carries the result; the durable copy is read when it does not.
            payload = self._results.pop(task_id, None) or await self.result(task_id)
            if payload is not None:
                return CallOutcome(result=payload["result"], exception=payload["exception"],
                                   audit=payload.get("audit"), audit_input=payload.get("audit_input"))
            if not await self.runner_alive(runner):
                return CallOutcome(exception="Runner lost: the node holding this session stopped.")
            if time.monotonic() > deadline:
                return CallOutcome(exception=f"Runner {runner} did not answer in time.")

    async def stop(self, sid: str) -> None:
        known = self._records.pop(sid, None)
        # Whether setup's record was written before the "gone" below (this gateway has seen it):
        # then the node need not write "gone" again after it (node._teardown).
        settled = sid in self._ready or (known is not None and known.get("state") not in (None, "starting"))
        self._ready.discard(sid)
        runner = self._release(sid)
        if runner is not None:
            queue, message = self._message("teardown", runner, sid, settled)
            gone = orjson.dumps({"kind": "state", "sid": sid, "state": "gone", "by": self.gateway})

            def build(pipe) -> None:
                # The record says "gone" at once, so no other gateway adopts the session while
                # the teardown waits in the node's queue; gateways that serve it drop their copy.
                pipe.set(self.keys.state(sid), GONE_RECORD, ex=int(settings.ORS_STATE_TTL_SECONDS))
                pipe.lpush(queue, message)
                pipe.publish(self.keys.sessions("platform"), gone)

            try:
                await self.batch.run(build)
            except Exception as exc:
                log.warning("could not send teardown of %s to %s: %s", sid, runner, exc)

    async def close(self) -> None:
        if self._forget_task is not None:
            await asyncio.gather(self._forget_task, return_exceptions=True)
        if self._listener is not None:
            self._listener.cancel()
        await self.batch.flush()
        await self.redis.aclose()
