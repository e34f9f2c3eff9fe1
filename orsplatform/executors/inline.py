"""The embedded executor: the gateway supervises sandbox workers on its own machine.

Environment code never runs in this process: every session lives in a sandbox worker of its
(environment version, calling team) pair (see sandbox/pool.py), spoken to over a pipe. setup()
runs in the background so /create returns at once; calls of one session are serialized here (one
at a time per session), different sessions run concurrently; a call that outlives its timeout is
answered with a timeout result at once and its worker is killed if the tool has not returned by
the end of the grace period. Runner nodes of the celery executor use this class too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from orsplatform.containers import worker as containers
from orsplatform.executors.executor import (
    CallOutcome,
    Executor,
    SessionSpec,
    SetupFailed,
    SetupPending,
    UnknownSession,
    WorkerLost,
)
from orsplatform.sandbox import framing
from orsplatform.sandbox.config import SandboxConfig, SandboxUnavailable, env_setting, fallback_reason, probe
from orsplatform.sandbox.framing import ReplyTooLarge
from orsplatform.sandbox.pool import CallTimedOut, SandboxPool, Worker, WorkerError, WorkerGone
from orsplatform.sandbox.redact import redact, redact_head, secret_values

log = logging.getLogger(__name__)
TEARDOWN_SECONDS = 10.0


@dataclass
class _Live:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    worker: Worker | None = None
    error: str | None = None
    finished: bool = False  # a tool returned finished=True; later calls are refused
    setup_task: asyncio.Task | None = None
    # What the worker answered with setup (prompt, task tools): served until the first call, after
    # which the instance may have changed and the worker is asked again.
    first: dict | None = None
    # The session's secret values: everything of the worker's that leaves this executor (errors,
    # the audit copies) is stripped of them here, in platform code, never trusted to the worker.
    secrets: tuple[str, ...] = ()


# Every call after a tool returned finished=true gets this same answer (OpenEnv reports it with
# done: true), so a trainer's `while not done` loop ends and the log says what to do instead.
EPISODE_FINISHED = ("The episode has already finished (a tool returned finished=true); no further calls are "
                    "accepted. End this session and start a new one for the next episode.")


def tool_error(message: str, reason: str) -> dict:
    return {"ok": False, "error": message, "reason": reason}


def checked_result(value: object) -> dict | None:
    """The worker's result if it has the shape of an ORS result (what the gateway counts and
    records: ok, and for a success an output whose reward is a number or null), else None."""
    if not isinstance(value, dict) or not isinstance(value.get("ok"), bool):
        return None
    if not value["ok"]:
        return value if isinstance(value.get("error", ""), str) else None
    output = value.get("output")
    if not isinstance(output, dict):
        return None
    reward = output.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        return None
    return value


def install_django_settings() -> None:
    """The sandbox package imports no Django: where Django's settings are configured (a gateway),
    its channel limits read them through this lookup, at each worker start (so settings changed
    at run time apply to the next worker, as before)."""
    try:
        from django.conf import settings

        if settings.configured:
            framing.settings_lookup = lambda name, default: getattr(settings, name, default)
    except ImportError:
        pass


def sandbox_config(threads: int) -> SandboxConfig:
    """The pool's settings: Django's when configured (a gateway), else the environment (a node)."""
    try:
        from django.conf import settings

        if settings.configured:
            return SandboxConfig.from_settings(settings, threads=threads)
    except ImportError:
        pass
    return SandboxConfig.from_env(threads=threads)


def _asked() -> str:
    """ORS_SANDBOX as set (before `auto` is resolved)."""
    try:
        from django.conf import settings

        if settings.configured:
            return str(getattr(settings, "ORS_SANDBOX", "auto")).lower()
    except ImportError:
        pass
    return str(env_setting("ORS_SANDBOX")).lower()


def checked(config: SandboxConfig) -> SandboxConfig:
    """The config if its sandbox can run here; refuse to start otherwise, and say at every start
    when tenants run without isolation (ORS_SANDBOX=none)."""
    problem = probe(config)
    if problem is not None:
        raise SandboxUnavailable(f"{problem} Tenant code cannot be isolated on this machine; set "
                                 "ORS_SANDBOX=none to run without isolation (every tenant's code could then "
                                 "read the platform's credentials and other tenants' sessions).")
    if config.mode == "gvisor":
        from orsplatform.sandbox.gvisor import runsc_global_flags

        log.info("tenant code runs under gVisor (runsc %s)", " ".join(runsc_global_flags()))
    elif config.mode == "bwrap" and (why := fallback_reason(config.mode, _asked())):
        log.warning("tenant code runs under bubblewrap on the host's kernel, not gVisor: %s", why)
    if not config.isolated:
        log.warning("ORS_SANDBOX=none: tenants are NOT isolated. Environment code runs in plain worker "
                    "processes that can read this machine's files, network and other sessions.")
    return config


class InlineExecutor(Executor):
    def __init__(self, *, threads: int, config: SandboxConfig | None = None,
                 on_lost: Callable[[list[str], str], None] | None = None) -> None:
        # on_lost(sids, reason): sessions whose worker ended (a runner node records them as lost).
        install_django_settings()
        self.pool = SandboxPool(checked(config or sandbox_config(threads)), on_lost=on_lost,
                                worker_class=containers.worker_class)
        self._live: dict[str, _Live] = {}
        self._teardowns: set[asyncio.Task] = set()

    def keep_warm(self, wanted: dict[str, str]) -> None:
        self.pool.keep_warm(wanted)

    async def start(self, spec: SessionSpec, runner: str = "") -> None:
        live = _Live(secrets=secret_values(spec.secrets))
        self._live[spec.sid] = live
        live.setup_task = asyncio.create_task(self._setup(live, spec))

    async def _setup(self, live: _Live, spec: SessionSpec) -> None:
        label = str(spec.owner.get("env") or spec.entrypoint)
        try:
            live.worker = await self.pool.acquire(sid=spec.sid, package_dir=spec.package_path,
                                                  team=spec.owner.get("team"), caller=spec.owner.get("caller"),
                                                  label=label, secrets=spec.secrets)
            first = await live.worker.request("setup", sid=spec.sid, entrypoint=spec.entrypoint,
                                              task_spec=spec.task_spec, secrets=dict(spec.secrets), first=True)
            live.first = first if isinstance(first, dict) else None
        except asyncio.CancelledError:
            live.error = "Session deleted during setup."
            raise
        except WorkerError as exc:  # the environment's message: stripped here, not trusted to the worker
            live.error = redact(str(exc), live.secrets)
            # Only the exception's name in the log (a short, identifier-like one): the message is
            # the tenant's, and the log is the operator's.
            name = live.error.partition(":")[0]
            log.warning("setup failed for session %s: %s", spec.sid,
                        name if name.isidentifier() and len(name) <= 100 else "(the environment's error)")
        except ReplyTooLarge as exc:
            live.error = str(exc)
        except (WorkerGone, PermissionError) as exc:
            live.error = redact(str(exc), live.secrets)
        except Exception as exc:  # e.g. the task spec cannot be encoded
            live.error = redact(f"{type(exc).__name__}: {exc}", live.secrets)
        finally:
            live.ready.set()

    def ready_now(self, sid: str) -> bool:
        live = self._live.get(sid)
        return (live is not None and live.ready.is_set() and live.error is None
                and (live.worker is None or live.worker.alive))

    async def wait_ready(self, sid: str, timeout: float) -> None:
        live = self._live.get(sid)
        if live is None:
            raise UnknownSession(sid)
        if not live.ready.is_set():
            try:
                await asyncio.wait_for(asyncio.shield(live.ready.wait()), timeout)
            except TimeoutError:
                raise SetupPending(sid) from None
        if live.error is not None:
            raise SetupFailed(live.error)
        if live.worker is not None and not live.worker.alive:
            raise WorkerLost(live.worker.dead or "")

    def _worker(self, sid: str) -> tuple[_Live, Worker]:
        live = self._live.get(sid)
        if live is None or live.worker is None or live.error is not None or not live.ready.is_set():
            raise UnknownSession(sid)
        if not live.worker.alive:
            raise WorkerLost(live.worker.dead or "")
        return live, live.worker

    async def _ask(self, sid: str, op: str) -> list:
        live, worker = self._worker(sid)
        if live.first is not None and op in live.first:
            return live.first[op]
        try:
            return await worker.request(op, sid=sid)
        except WorkerGone as exc:
            raise WorkerLost(str(exc)) from None
        except ReplyTooLarge as exc:
            raise EnvironmentFailed(str(exc)) from None
        except WorkerError as exc:
            if exc.kind == "unknown":
                raise UnknownSession(sid) from None
            raise _environment_error(redact(str(exc), live.secrets)) from None

    async def prompt(self, sid: str) -> list[dict]:
        return await self._ask(sid, "prompt")

    async def task_tools(self, sid: str) -> list[dict]:
        return await self._ask(sid, "task_tools")

    async def native_state(self, sid: str) -> dict:
        return await self._ask(sid, "state")

    async def call(self, sid: str, name: str, input: dict, timeout: float, task_id: str = "",
                   note: dict | None = None) -> CallOutcome:
        live, worker = self._worker(sid)
        live.first = None
        async with live.lock:
            if live.finished:
                return CallOutcome(result=tool_error(EPISODE_FINISHED, "episode_finished"))
            try:
                value = await worker.request("call", timeout=timeout, sid=sid, name=name, input=input)
            except CallTimedOut:
                return CallOutcome(result=tool_error(f"Tool {name!r} timed out after {timeout:g} s", "timeout"))
            except ReplyTooLarge as exc:
                # The agent gets a tool error; the audit log keeps the answer's beginning.
                result = tool_error(f"Tool {name!r} answered with more than the platform accepts: {exc}",
                                    "output_too_large")
                audit = {**result, "truncated_output": redact_head(exc.head, live.secrets)}
                return CallOutcome(result=result, audit=audit, audit_input=self._audit_input(live, input))
            except WorkerGone as exc:
                return CallOutcome(exception=str(exc))
            except WorkerError as exc:
                if exc.kind == "unknown":
                    raise UnknownSession(sid) from None
                return CallOutcome(exception=redact(str(exc), live.secrets))
            # Only the result and the exception are taken from the worker; the audit copies are made
            # here from the very result the agent is sent (a worker's own copies are never read).
            raw = value.get("result") if isinstance(value, dict) else None
            exception = value.get("exception") if isinstance(value, dict) else None
            result = checked_result(raw)
            if result is None and (raw is not None or not isinstance(exception, str)):
                return CallOutcome(exception=f"The environment's answer to {name!r} does not follow the protocol.")
            if result is not None and result["ok"] and result["output"].get("finished"):
                live.finished = True
            if exception is not None:
                return CallOutcome(exception=redact(str(exception), live.secrets))
            audit = None
            if live.secrets:
                stripped = redact(result, live.secrets)
                audit = stripped if stripped != result else None
            return CallOutcome(result=result, audit=audit, audit_input=self._audit_input(live, input))

    @staticmethod
    def _audit_input(live: _Live, tool_input: dict) -> dict | None:
        if not live.secrets:
            return None
        stripped = redact(tool_input, live.secrets)
        return stripped if stripped != tool_input else None

    async def stop(self, sid: str) -> None:
        # The session is gone for every request from here on; its teardown in the worker runs in
        # the background (as on runner nodes, whose teardown is a message): the client's delete
        # does not wait for a round trip to the worker and the environment's teardown().
        live = self._live.pop(sid, None)
        if live is None:
            return
        if live.worker is not None:
            # Its place in the worker is free now: counted until the teardown's reply, it made
            # a pair with a steady number of sessions look over its cap and start workers.
            self.pool.release(live.worker, sid)
        task = asyncio.create_task(self._teardown(sid, live))
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)

    async def _teardown(self, sid: str, live: _Live) -> None:
        if live.setup_task is not None and not live.setup_task.done():
            live.setup_task.cancel()
            try:
                await live.setup_task
            except (asyncio.CancelledError, Exception):
                pass
        worker = live.worker
        if worker is None:
            return
        try:
            if worker.alive and live.error is None:
                # Lazy: nobody waits for it, so it rides along with the next request's write.
                await worker.request("stop", timeout=TEARDOWN_SECONDS, lazy=True, sid=sid)
        except (WorkerGone, WorkerError, CallTimedOut) as exc:
            log.warning("teardown failed for session %s: %s", sid, type(exc).__name__)
        finally:
            self.pool.release(worker, sid)

    async def close(self) -> None:
        for sid in list(self._live):
            await self.stop(sid)
        if self._teardowns:
            await asyncio.wait(list(self._teardowns), timeout=TEARDOWN_SECONDS)
        await self.pool.close()


class EnvironmentFailed(Exception):
    """The environment's own code raised (get_prompt, list_task_tools); the message says what."""


def _environment_error(message: str) -> EnvironmentFailed:
    """An exception named like the one the environment raised in its worker ("ValueError: x"),
    so errors read as they did when environments ran in this process."""
    name, sep, rest = message.partition(": ")
    if not sep or not name.isidentifier():
        return EnvironmentFailed(message)
    return type(name, (EnvironmentFailed,), {})(rest)
