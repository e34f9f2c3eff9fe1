"""A runner node: a Celery worker that holds the environment instances of the sessions assigned to it.

Start one with ``celery -A orsplatform.runners.node worker --pool threads --concurrency 8
--hostname runner1@%h`` (see ``make runner``). It needs only the broker and Redis: no Django
settings, no SECRET_KEY, no database credentials. Gateways send it work on its own queue
(``worker_direct``); it answers on Redis:

- replies to a request are published on the requesting gateway's channel from this node,
  ``{prefix}:gw:{gateway}:{hostname}``;
- a finished call's result is also kept under ``{prefix}:result:{task_id}`` (the durable hand-off:
  whoever records the audit row reads it from there, so a lost wake-up costs latency, not data);
- a session's record lives under ``{prefix}:state:{sid}``: its setup state, its owner (so any
  gateway can serve it without a database read) and its initial prompt, and is broadcast to
  every gateway (on ``{prefix}:sessions:{hostname}``) when setup ends;
- a heartbeat ``{prefix}:runner:{hostname}`` (with a short TTL) says the node is alive and how
  loaded it is; the sorted set ``{prefix}:runners`` lists the nodes (see keys.py).

Instances live in an InlineExecutor on one background event loop, so a node has exactly the
semantics of the embedded executor: sync tools in a thread pool, async tools on the loop, one call
at a time per session, and the per-tool timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis
from celery import Celery, bootsteps
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown

from orsplatform import config
from orsplatform.runners.coalesce import Coalescer
from orsplatform.runners.executor import SessionSpec, SetupFailed, UnknownSession, WorkerLost
from orsplatform.runners.inline import InlineExecutor
from orsplatform.runners.keys import GONE_RECORD, INLINE_PAYLOAD_BYTES, Keys, runner_identity
from orsplatform.runners.redact import redact, secret_values
from orsplatform.runners.sealing import NodeKey, SealError

log = logging.getLogger("orsplatform.runner")

# The same registry as Django's settings (orsplatform/config.py), read without Django: a value it does
# not allow (here or in any variable the gateways read) stops the node before it connects anywhere.
ENV = config.load_or_exit(os.environ, program="runner node")
PREFIX = ENV["ORS_REDIS_PREFIX"]
REDIS_URL = ENV["REDIS_URL"] or "redis://127.0.0.1:6379/0"
BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL  # validated above; defaults to REDIS_URL here
HEARTBEAT_SECONDS = ENV["ORS_RUNNER_HEARTBEAT_SECONDS"]
HEARTBEAT_TTL = ENV["ORS_RUNNER_HEARTBEAT_TTL"]
RESULT_TTL = ENV["ORS_RESULT_TTL_SECONDS"]
STATE_TTL = ENV["ORS_STATE_TTL_SECONDS"]
# A node dedicated to one team (its slug) runs only that team's sessions; empty: the shared pool.
TEAM = ENV["ORS_RUNNER_TEAM"]
SEEN_CALLS_KEPT = 200_000  # task ids remembered against duplicate delivery
KEYS = Keys(PREFIX)

app = Celery("ors-runner", broker=BROKER_URL)
app.conf.update(
    # Kombu's Redis transport, taking several messages per round trip (transport.py); an AMQP
    # broker keeps its own.
    broker_transport="orsplatform.runners.transport:Transport" if BROKER_URL.startswith("redis") else None,
    worker_direct=True,  # each node consumes its own queue, named after its hostname
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=False,  # a redelivered call must never run twice; the node dedupes too
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    task_default_queue="ors-runners-unused",  # nothing is sent to a shared queue
    # No unacked bookkeeping in Redis: it cost two extra round trips per message on the consumer
    # thread, and bought nothing here (acks are early, and a dead node's sessions are lost anyway).
    broker_transport_options={"ack_emulation": False},
    # No remote control: nothing inspects runner nodes through Celery (the heartbeat says what they
    # are), and its fanout would be one more channel a node's Redis user had to be allowed.
    worker_enable_remote_control=False,
)


class Node:
    """The node's process-wide state: the executor on its loop, Redis, the calls already seen."""

    def __init__(self) -> None:
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ors-runner-loop", daemon=True)
        self.thread.start()
        # Its writes (records, results, wake-ups), made on its loop and coalesced (coalesce.py):
        # never blocking the loop, and many sessions' writes per round trip at load.
        self.writes = Coalescer(aioredis.from_url(REDIS_URL))
        # Work handed over by the consumer thread, started on the loop in batches (see submit).
        self.inbox: deque = deque()
        self._drain_scheduled = False
        self._tasks: set[asyncio.Task] = set()
        self.executor = InlineExecutor(threads=ENV["ORS_TOOL_THREADS"],
                                       on_lost=self.sessions_lost)
        self.sessions: set[str] = set()
        self.seen_calls: OrderedDict[str, None] = OrderedDict()  # task ids, oldest first
        self.hostname = ""
        # This start of the node (see keys.runner_identity): sessions placed here record it.
        self.boot = os.urandom(4).hex()
        self.identity = ""
        # Secrets arrive sealed to this start of the node (sealing.py); the private half never
        # leaves this process's memory.
        self.key = NodeKey()
        self._stop = threading.Event()

    def sessions_lost(self, sids: list[str], reason: str) -> None:
        """A sandbox worker ended with these sessions in it: their records say so (with the
        reason, which names the environment), so every gateway answers 410 for them."""
        for sid in sids:
            if sid in self.sessions:
                message = {"kind": "state", "sid": sid, "state": "lost", "error": reason}
                self.record(sid, orjson.dumps({"state": "lost", "error": reason}), message)

    def record(self, sid: str, record: bytes, message: dict[str, Any] | None = None) -> None:
        """Write the session's record, and broadcast `message` to every gateway after it."""
        def build(pipe) -> None:
            pipe.set(KEYS.state(sid), record, ex=STATE_TTL)
            if message is not None:
                pipe.publish(KEYS.sessions(self.hostname), encode(message))

        self.writes.push(build)

    def submit(self, coro) -> None:
        """Run `coro` on the node's loop (called from the consumer thread). One wake-up of the
        loop starts every coroutine handed over meanwhile: at load, messages arrive faster than
        the loop turns, and each wake-up is a write to its self-pipe and a thread switch."""
        self.inbox.append(coro)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self.loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        self._drain_scheduled = False  # first: a coroutine appended from here on schedules a drain
        while self.inbox:
            task = self.loop.create_task(self.inbox.popleft())
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    def publish(self, gateway: str, message: dict[str, Any]) -> None:
        if gateway:
            self.writes.push(lambda pipe: pipe.publish(KEYS.gateway(gateway, self.hostname), encode(message)))

    def heartbeat_forever(self) -> None:
        while not self._stop.is_set():
            try:
                now = time.time()
                payload = json.dumps({"boot": self.boot, "sessions": len(self.sessions), "at": now,
                                      "pid": os.getpid(), "team": TEAM, "key": self.key.public})
                pipe = self.redis.pipeline(transaction=False)
                pipe.set(KEYS.runner(self.hostname), payload, px=int(HEARTBEAT_TTL * 1000))
                pipe.zadd(KEYS.runners, {self.hostname: now})
                pipe.zremrangebyscore(KEYS.runners, "-inf", now - 3600)  # nodes gone for an hour
                pipe.execute()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
            self._stop.wait(HEARTBEAT_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        try:
            self.redis.pipeline(transaction=False).delete(KEYS.runner(self.hostname)).zrem(
                KEYS.runners, self.hostname).execute()
        except redis.RedisError:
            pass


node = Node()


def encode(message: dict[str, Any]) -> bytes:
    """JSON as the gateways read it (orjson: NaN and Infinity become null, as on the inline
    executor's wire). A reply's value comes straight from environment code (results and prompts
    are checked where they are made): one that cannot be encoded becomes an error reply instead of
    a message no gateway can read."""
    try:
        return orjson.dumps(message)
    except (TypeError, orjson.JSONEncodeError) as exc:
        return orjson.dumps({"kind": message.get("kind"), "request": message.get("request"), "ok": False,
                             "error": f"The environment's answer is not valid JSON: {exc}"})


@celeryd_after_setup.connect
def _consume_only_the_nodes_queue(sender, instance, **kwargs) -> None:
    """Only this node's own queue: the default queue Celery adds would be shared by every node, so
    one node could feed the others work (and the ACL user of a node may touch no other queue)."""
    queues = instance.app.amqp.queues
    if app.conf.task_default_queue in queues.consume_from:
        queues.deselect(app.conf.task_default_queue)
    node.hostname = sender  # known before the first message is handled (worker_ready comes later)
    node.identity = runner_identity(sender, node.boot)


@worker_ready.connect
def _start_heartbeat(sender, **kwargs) -> None:
    node.hostname = sender.hostname
    node.identity = runner_identity(sender.hostname, node.boot)
    threading.Thread(target=node.heartbeat_forever, name="ors-runner-heartbeat", daemon=True).start()
    log.info("runner %s ready", node.hostname)


@worker_shutdown.connect
def _stop_heartbeat(**kwargs) -> None:
    node.stop()


# --- the work ----------------------------------------------------------------------------------


async def _setup(spec: SessionSpec, gateway: str, owner: dict) -> None:
    node.sessions.add(spec.sid)
    await node.executor.start(spec)
    state: dict[str, Any] = {**owner}
    try:
        await node.executor.wait_ready(spec.sid, float("inf"))
        state["state"] = "ready"
        try:
            # The initial prompt (ORS: "the initial prompt for the current task"), computed once
            # here so /prompt is answered from the session's record instead of a round trip to
            # this node; if get_prompt() fails, /prompt asks the node and reports the error.
            state["prompt"] = await node.executor.prompt(spec.sid)
            values = secret_values(spec.secrets)
            audit = redact(state["prompt"], values) if values else state["prompt"]
            if audit is not state["prompt"] and audit != state["prompt"]:
                state["prompt_audit"] = audit  # for the audit log of a gateway that never saw the secrets
        except Exception:
            pass
    except SetupFailed as exc:
        state.update(state="failed", error=str(exc))
    except UnknownSession:
        state = {"state": "gone"}
    if spec.sid not in node.sessions:
        state = {"state": "gone"}  # torn down while setting up: never resurrect it
    try:
        encoded = orjson.dumps(state)
    except (TypeError, orjson.JSONEncodeError) as exc:  # the environment's prompt
        state.pop("prompt", None)  # /prompt asks the node, which reports the error
        log.warning("session %s: the initial prompt is not valid JSON: %s", spec.sid, exc)
        encoded = orjson.dumps(state)
    # Broadcast: any gateway may be waiting for this session's setup, not only the creator; a big
    # prompt stays out of the message (gateways read it from the record).
    message = {"kind": "state", "sid": spec.sid, **state}
    if len(encoded) > INLINE_PAYLOAD_BYTES:
        message.pop("prompt", None)
    node.record(spec.sid, encoded, message)
    if state["state"] == "failed":  # nothing will run in it: free the node now, not at a /delete
        node.sessions.discard(spec.sid)
        await node.executor.stop(spec.sid)


async def _setup_refused(sid: str, gateway: str, owner: dict, error: str) -> None:
    state = {**owner, "state": "failed", "error": error}
    node.record(sid, orjson.dumps(state), {"kind": "state", "sid": sid, **state})


async def _call(sid: str, task_id: str, name: str, tool_input: dict, timeout: float, gateway: str) -> None:
    started = time.time()
    try:
        outcome = await node.executor.call(sid, name, tool_input, timeout, task_id)
        payload = {"result": outcome.result, "exception": outcome.exception}
        if outcome.audit is not None:
            payload["audit"] = outcome.audit  # the result with the session's secret values removed
        if outcome.audit_input is not None:
            payload["audit_input"] = outcome.audit_input  # and the input
    except WorkerLost as exc:
        payload = {"result": None, "exception": str(exc)}
    except UnknownSession:
        payload = {"result": None, "exception": "Session lost: this runner does not hold it."}
    payload.update(started_at=started, finished_at=time.time())
    try:
        encoded = orjson.dumps(payload)
    except (TypeError, orjson.JSONEncodeError) as exc:  # e.g. a lone surrogate in a text block
        payload = {"result": None, "exception": f"The tool's result is not valid JSON: {exc}",
                   "started_at": payload["started_at"], "finished_at": payload["finished_at"]}
        encoded = orjson.dumps(payload)
    # Small results ride along with the wake-up (saving the gateway a read); large ones are read
    # from the durable key. One round trip for both.
    message = {"kind": "call", "task_id": task_id}
    if len(encoded) <= INLINE_PAYLOAD_BYTES:
        message["payload"] = payload
    node.writes.push(lambda pipe: pipe.set(KEYS.result(task_id), encoded, ex=RESULT_TTL))
    node.publish(gateway, message)


async def _reply(gateway: str, request_id: str, fn) -> None:
    try:
        message = {"kind": "reply", "request": request_id, "ok": True, "value": await fn()}
    except WorkerLost as exc:
        message = {"kind": "reply", "request": request_id, "ok": False, "error": "lost", "reason": str(exc)}
    except UnknownSession:
        message = {"kind": "reply", "request": request_id, "ok": False, "error": "unknown_session"}
    except Exception as exc:  # the environment's code failed
        message = {"kind": "reply", "request": request_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    node.publish(gateway, message)


async def _teardown(sid: str, settled: bool) -> None:
    node.sessions.discard(sid)
    if not settled:
        # The gateway wrote "gone" when it sent this, but setup may have ended since and written
        # "ready" over it: say "gone" again, after setup's record. A gateway that had seen setup
        # end (settled) wrote "gone" after that record (a worker that dies meanwhile may still
        # write "lost" over it, which is answered 410 too).
        node.record(sid, GONE_RECORD)
    await node.executor.stop(sid)


def handoff(task, app, consumer, **kwargs):
    """Celery task strategy for the node's tasks: they only hand work to the node's event loop,
    so the message is decoded and handed over right here on the consumer thread. The default
    strategy builds a Request, traces it and hops to a pool thread first: about a millisecond of
    CPU per message on a small machine, for nothing these tasks use (no result, no retries)."""
    run = task.run
    connection_errors = consumer.connection_errors

    def on_message(message, body, ack, reject, callbacks, **kw):
        try:
            if message.content_type == "application/json":  # as message.decode(), in C
                args, task_kwargs, _ = orjson.loads(message.body)
            else:
                args, task_kwargs, _ = message.decode()
            run(*args, **task_kwargs)
        except Exception:  # a malformed message must not stop the consumer
            log.exception("runner message %s could not be handled", message.headers.get("id"))
        finally:
            ack(log, connection_errors)

    return on_message


# Celery tasks only schedule work on the node's loop and return at once: a long tool call
# occupies no Celery thread, so a node serves as many concurrent calls as its executor can.
HANDOFF = "orsplatform.runners.node:handoff"


@app.task(name="runners.node.setup", Strategy=HANDOFF)
def setup(sid: str, package_path: str, entrypoint: str, task_spec: Any, secrets: dict, gateway: str,
          owner: dict | None = None) -> None:
    if sid in node.sessions:
        return  # a redelivered setup
    placed_on = (owner or {}).get("runner")
    if placed_on and placed_on != node.identity:
        # Queued for an earlier start of this node, whose sessions are lost: never resurrect one.
        log.warning("dropping setup of %s, placed on %s (this is %s)", sid, placed_on, node.identity)
        return
    try:
        opened = node.key.open(secrets or {}, sid)
    except SealError as exc:
        log.warning("dropping setup of %s: %s", sid, exc)
        node.submit(_setup_refused(sid, gateway, owner or {}, str(exc)))
        return
    spec = SessionSpec(sid=sid, package_path=package_path, entrypoint=entrypoint, task_spec=task_spec,
                       secrets=opened, owner=owner or {})
    node.submit(_setup(spec, gateway, owner or {}))


@app.task(name="runners.node.call", Strategy=HANDOFF)
def call(sid: str, task_id: str, name: str, tool_input: dict, timeout: float, gateway: str) -> None:
    if task_id in node.seen_calls:
        return  # duplicate delivery: a tool call never runs twice
    node.seen_calls[task_id] = None
    if len(node.seen_calls) > SEEN_CALLS_KEPT:  # redeliveries come soon after: forget the oldest
        node.seen_calls.popitem(last=False)
    node.submit(_call(sid, task_id, name, tool_input, timeout, gateway))


@app.task(name="runners.node.prompt", Strategy=HANDOFF)
def prompt(sid: str, request_id: str, gateway: str) -> None:
    node.submit(_reply(gateway, request_id, lambda: node.executor.prompt(sid)))


@app.task(name="runners.node.task_tools", Strategy=HANDOFF)
def task_tools(sid: str, request_id: str, gateway: str) -> None:
    node.submit(_reply(gateway, request_id, lambda: node.executor.task_tools(sid)))


@app.task(name="runners.node.teardown", Strategy=HANDOFF)
def teardown(sid: str, settled: bool = False) -> None:
    node.submit(_teardown(sid, settled))


class _ScrubEnvironment(bootsteps.StartStopStep):
    """Drop platform credentials from this process's environment before any tenant code runs,
    in case the node was started with them (environment code can read os.environ)."""

    def start(self, worker) -> None:
        for name in ("SECRET_KEY", "DATABASE_URL", "DJANGO_SETTINGS_MODULE", "AWS_SECRET_ACCESS_KEY"):
            os.environ.pop(name, None)


app.steps["worker"].add(_ScrubEnvironment)
