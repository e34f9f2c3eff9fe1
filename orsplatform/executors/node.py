"""A runner node: the process that holds the environment instances of the sessions placed on it.

Start one with ``python -m orsplatform.executors.node --hostname runner1@%h`` (see ``make runner``). It
needs only Redis: no Django settings, no SECRET_KEY, no database credentials, no Celery. Gateways
push work on its own Redis list, ``{prefix}:inbox:{hostname}`` (inbox.py, docs/runner-nodes.md);
it answers on Redis:

- replies to a request are published on the requesting gateway's channel from this node,
  ``{prefix}:gw:{gateway}:{hostname}``;
- a finished call's result is also kept under ``{prefix}:result:{task_id}`` (the durable hand-off:
  whoever records the audit row reads it from there, so a lost wake-up costs latency, not data);
- a session's record lives under ``{prefix}:state:{sid}``: its setup state, its owner (so any
  gateway can serve it without a database read) and its initial prompt, and is broadcast to
  every gateway (on ``{prefix}:sessions:{hostname}``) when setup ends;
- a heartbeat ``{prefix}:runner:{hostname}`` (with a short TTL) says the node is alive and how
  loaded it is; the sorted set ``{prefix}:runners`` lists the nodes (see keys.py).

Instances live in an InlineExecutor on one event loop, so a node has exactly the semantics of the
embedded executor: sync tools in a thread pool, async tools on the loop, one call at a time per
session, and the per-tool timeout. The inbox is read on that loop too: a message only starts a
coroutine there, so a long tool call holds nothing but its own task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time
from collections import OrderedDict
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis

from orsplatform import config
from orsplatform.executors import inbox
from orsplatform.executors.coalesce import Coalescer
from orsplatform.executors.executor import SessionSpec, SetupFailed, UnknownSession, WorkerLost
from orsplatform.executors.inline import InlineExecutor
from orsplatform.executors.keys import GONE_RECORD, INLINE_PAYLOAD_BYTES, Keys, runner_identity
from orsplatform.executors.sealing import NodeKey, SealError
from orsplatform.sandbox.redact import redact, secret_values

log = logging.getLogger("orsplatform.runner")

# The same registry as Django's settings (orsplatform/config.py), read without Django: a value it does
# not allow (here or in any variable the gateways read) stops the node before it connects anywhere.
ENV = config.load_or_exit(os.environ, program="runner node")
PREFIX = ENV["ORS_REDIS_PREFIX"]
REDIS_URL = ENV["REDIS_URL"] or "redis://127.0.0.1:6379/0"
HEARTBEAT_SECONDS = ENV["ORS_RUNNER_HEARTBEAT_SECONDS"]
HEARTBEAT_TTL = ENV["ORS_RUNNER_HEARTBEAT_TTL"]
RESULT_TTL = ENV["ORS_RESULT_TTL_SECONDS"]
STATE_TTL = ENV["ORS_STATE_TTL_SECONDS"]
# A node dedicated to one team (its slug) runs only that team's sessions; empty: the shared pool.
TEAM = ENV["ORS_RUNNER_TEAM"]
SEEN_CALLS_KEPT = 200_000  # task ids remembered against duplicate delivery
KEYS = Keys(PREFIX)

# Platform credentials a node must not hand to tenant code (environment code can read os.environ),
# dropped at start in case the node was started with them.
SCRUBBED = ("SECRET_KEY", "DATABASE_URL", "DJANGO_SETTINGS_MODULE", "AWS_SECRET_ACCESS_KEY", "CELERY_BROKER_URL")


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

    def spawn(self, coro) -> None:
        """Run `coro` on the node's loop (called on the loop: the inbox is read there)."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def consume(self) -> None:
        """Read this node's inbox until the node stops: up to inbox.BATCH messages per blocking
        pop (BLMPOP, Redis 7; one per BRPOP on an older server), oldest first. The pop holds its
        connection, so it has one of its own; a Redis restart costs a retry, not the node."""
        client = aioredis.from_url(REDIS_URL)
        key = KEYS.inbox(self.hostname)
        batched = True
        while not self._stop.is_set():
            try:
                if batched:
                    reply = await client.blmpop(1, 1, key, direction="RIGHT", count=inbox.BATCH)
                    items = reply[1] if reply else ()
                else:
                    reply = await client.brpop([key], timeout=1)
                    items = (reply[1],) if reply else ()
            except redis.ResponseError as exc:
                if batched and "unknown command" in str(exc).lower():
                    batched = False  # Redis 6
                    continue
                log.warning("inbox read refused: %s", exc)
                await asyncio.sleep(0.5)
                continue
            except (redis.RedisError, OSError) as exc:
                log.warning("inbox read failed (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for raw in items:
                try:
                    self.handle(*inbox.parse(raw))
                except inbox.BadMessage as exc:
                    log.warning("%s", exc)
                except Exception:  # a message with the wrong arguments must not stop the node
                    log.exception("runner message could not be handled")
        await client.aclose()

    def handle(self, op: str, args: list) -> None:
        HANDLERS[op](*args)

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


# What each op of the inbox does (inbox.py): its arguments, in order, are the function's.


def setup(sid: str, package_path: str, entrypoint: str, task_spec: Any, secrets: dict, gateway: str,
          owner: dict | None = None) -> None:
    if sid in node.sessions:
        return  # a setup sent twice
    placed_on = (owner or {}).get("runner")
    if placed_on and placed_on != node.identity:
        # Queued for an earlier start of this node, whose sessions are lost: never resurrect one.
        log.warning("dropping setup of %s, placed on %s (this is %s)", sid, placed_on, node.identity)
        return
    try:
        opened = node.key.open(secrets or {}, sid)
    except SealError as exc:
        log.warning("dropping setup of %s: %s", sid, exc)
        node.spawn(_setup_refused(sid, gateway, owner or {}, str(exc)))
        return
    spec = SessionSpec(sid=sid, package_path=package_path, entrypoint=entrypoint, task_spec=task_spec,
                       secrets=opened, owner=owner or {})
    node.spawn(_setup(spec, gateway, owner or {}))


def call(sid: str, task_id: str, name: str, tool_input: dict, timeout: float, gateway: str) -> None:
    if task_id in node.seen_calls:
        return  # sent twice: a tool call never runs twice
    node.seen_calls[task_id] = None
    if len(node.seen_calls) > SEEN_CALLS_KEPT:  # a repeat comes soon after: forget the oldest
        node.seen_calls.popitem(last=False)
    node.spawn(_call(sid, task_id, name, tool_input, timeout, gateway))


def prompt(sid: str, request_id: str, gateway: str) -> None:
    node.spawn(_reply(gateway, request_id, lambda: node.executor.prompt(sid)))


def task_tools(sid: str, request_id: str, gateway: str) -> None:
    node.spawn(_reply(gateway, request_id, lambda: node.executor.task_tools(sid)))


def state(sid: str, request_id: str, gateway: str) -> None:
    node.spawn(_reply(gateway, request_id, lambda: node.executor.native_state(sid)))


def teardown(sid: str, settled: bool = False) -> None:
    node.spawn(_teardown(sid, settled))


HANDLERS = {"setup": setup, "call": call, "prompt": prompt, "task_tools": task_tools, "state": state,
            "teardown": teardown}
assert set(HANDLERS) == inbox.OPS


# --- the process ------------------------------------------------------------------------------


def node_name(template: str) -> str:
    """``name@%h`` as Celery spelled it: %h is this machine's host name; a bare name gets it too."""
    name = template.replace("%h", socket.gethostname())
    return name if "@" in name else f"{name}@{socket.gethostname()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orsplatform.executors.node", description=__doc__.split("\n")[0])
    parser.add_argument("--hostname", default=ENV["ORS_RUNNER_NAME"],
                        help="this node's name, name@host (%%h: the machine's host name); default runner@%%h")
    parser.add_argument("--loglevel", default=ENV["ORS_LOG_LEVEL"])
    options = parser.parse_args(argv)
    logging.basicConfig(level=options.loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in SCRUBBED:
        os.environ.pop(name, None)
    node.hostname = node_name(options.hostname)
    node.identity = runner_identity(node.hostname, node.boot)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    consumer = asyncio.run_coroutine_threadsafe(node.consume(), node.loop)
    threading.Thread(target=node.heartbeat_forever, name="ors-runner-heartbeat", daemon=True).start()
    log.info("runner %s ready", node.hostname)
    while not stopping.wait(1.0):
        if consumer.done():  # it only returns when stopped: anything else is a fault worth dying of
            consumer.result()
            return 1
    node.stop()
    try:
        consumer.result(timeout=5)  # its pop returns within a second of the stop
    except Exception as exc:  # noqa: BLE001 - shutting down anyway
        log.warning("inbox reader did not stop cleanly: %r", exc)
    try:  # sessions end with their node: their sandbox workers go with it, not orphaned
        asyncio.run_coroutine_threadsafe(node.executor.close(), node.loop).result(timeout=10)
    except Exception as exc:  # noqa: BLE001 - shutting down anyway
        log.warning("executor did not close cleanly: %r", exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
