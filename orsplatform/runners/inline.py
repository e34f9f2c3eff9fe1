"""The embedded executor: instances live in the gateway process.

setup() runs as a background task so /create returns at once; sync methods of the environment run
in a thread pool so a slow tool never blocks the event loop; async ones run on the loop. Calls of
one session are serialized by a per-session lock; different sessions run concurrently.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from ors import Environment, ToolOutput
from ors.environment import _introspect_tool
from pydantic import BaseModel, ValidationError

from orsplatform.runners.executor import (
    CallOutcome,
    Executor,
    SessionSpec,
    SetupFailed,
    SetupPending,
    UnknownSession,
)
from orsplatform.runners.loader import load_environment_class
from orsplatform.runners.redact import redact, secret_values

log = logging.getLogger(__name__)


@dataclass
class _Live:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    instance: Environment | None = None
    error: str | None = None
    secrets: tuple[str, ...] = ()  # values to strip from errors
    finished: bool = False  # a tool returned finished=True; later calls are refused
    setup_task: asyncio.Task | None = None


class EnvironmentExit(Exception):
    """Environment code called sys.exit(); reported like any exception of the environment."""


def tool_error(message: str, reason: str) -> dict:
    return {"ok": False, "error": message, "reason": reason}


def _overrides(instance: Environment, name: str) -> bool:
    return getattr(type(instance), name) is not getattr(Environment, name)


class InlineExecutor(Executor):
    def __init__(self, *, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ors-env")
        self._live: dict[str, _Live] = {}

    async def _run(self, fn, *args) -> Any:
        """Run an environment method: coroutine functions on the loop, the rest in the pool."""
        try:
            if inspect.iscoroutinefunction(inspect.unwrap(fn)):
                return await fn(*args)
            result = await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
            if inspect.isawaitable(result):
                result = await result
            return result
        except SystemExit as exc:
            # Escaping an asyncio task, SystemExit would stop the event loop (and the gateway).
            raise EnvironmentExit(f"SystemExit({exc.code!r})") from None

    async def start(self, spec: SessionSpec, runner: str = "") -> None:
        live = _Live(secrets=secret_values(spec.secrets))
        self._live[spec.sid] = live
        live.setup_task = asyncio.create_task(self._setup(live, spec))

    async def _setup(self, live: _Live, spec: SessionSpec) -> None:
        try:
            # One thread hop for import, construction and a sync setup(); an async setup() then
            # runs on the loop.
            instance, pending = await self._run(self._build, spec)
            if pending is not None:
                await pending
            live.instance = instance
        except asyncio.CancelledError:
            live.error = "Session deleted during setup."
            raise
        except BaseException as exc:  # environment code may raise anything
            log.warning("setup failed for session %s: %s", spec.sid, type(exc).__name__)
            live.error = redact(f"{type(exc).__name__}: {exc}", secret_values(spec.secrets))
        finally:
            live.ready.set()

    @staticmethod
    def _build(spec: SessionSpec) -> tuple[Environment, Any]:
        cls = load_environment_class(spec.package_path, spec.entrypoint)
        instance = cls(task_spec=spec.task_spec, secrets=dict(spec.secrets))
        if not _overrides(instance, "setup"):
            return instance, None
        if inspect.iscoroutinefunction(inspect.unwrap(instance.setup)):
            return instance, instance.setup()  # a coroutine, awaited on the loop
        result = instance.setup()
        return instance, result if inspect.isawaitable(result) else None

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

    def _instance(self, sid: str) -> tuple[_Live, Environment]:
        live = self._live.get(sid)
        if live is None or live.instance is None:
            raise UnknownSession(sid)
        return live, live.instance

    async def prompt(self, sid: str) -> list[dict]:
        _, instance = self._instance(sid)
        blocks = await self._run(instance.get_prompt)
        return [b.model_dump(mode="json") if isinstance(b, BaseModel) else b for b in blocks]

    async def task_tools(self, sid: str) -> list[dict]:
        _, instance = self._instance(sid)
        if not _overrides(instance, "list_task_tools"):
            return []
        return [t.model_dump(mode="json") for t in (await self._run(instance.list_task_tools)).tools]

    async def call(self, sid: str, name: str, input: dict, timeout: float, task_id: str = "",
                   note: dict | None = None) -> CallOutcome:
        live, instance = self._instance(sid)
        async with live.lock:
            if live.finished:
                return CallOutcome(result=tool_error("The episode has already finished.", "episode_finished"))
            try:
                outcome = await asyncio.wait_for(self._dispatch(instance, name, input), timeout)
                if outcome.ok and outcome.result["output"].get("finished"):
                    live.finished = True
            except TimeoutError:
                # A sync tool keeps running in its thread; the session stays usable for new calls.
                outcome = CallOutcome(result=tool_error(f"Tool {name!r} timed out after {timeout:g} s", "timeout"))
            except Exception as exc:
                log.info("tool %s raised %s in session %s", name, type(exc).__name__, sid)
                outcome = CallOutcome(exception=redact(f"{type(exc).__name__}: {exc}", live.secrets))
            return _audited(outcome, input, live.secrets) if live.secrets else outcome

    async def _dispatch(self, instance: Environment, name: str, input: dict) -> CallOutcome:
        fn = None if name.startswith("_") else getattr(instance, name, None)
        if fn is None or not Environment._is_tool(fn):
            # Toolsets and unknown names: the SDK's own dispatcher knows their rules.
            out = await self._run(instance._call_tool, name, input)
            result = out.model_dump(mode="json")
            if not result["ok"]:
                result["reason"] = "not_found" if "is not a valid tool" in result["error"] else "name_collision"
            return CallOutcome(result=result)
        _, hints, params = _introspect_tool(fn)
        args: tuple = ()
        if params:
            model: type[BaseModel] = hints[params[0].name]
            try:
                args = (model(**input),)
            except ValidationError as exc:
                return CallOutcome(result=tool_error(f"Tool input validation error: {exc.errors()}", "input_validation"))
        res = await self._run(fn, *args)
        if not isinstance(res, ToolOutput):
            raise TypeError(f"{name!r} returned {type(res).__name__}; expected ToolOutput")
        return CallOutcome(result={"ok": True, "output": res.model_dump(mode="json")})

    async def stop(self, sid: str) -> None:
        live = self._live.pop(sid, None)
        if live is None:
            return
        if live.setup_task is not None and not live.setup_task.done():
            live.setup_task.cancel()
            try:
                await live.setup_task
            except (asyncio.CancelledError, Exception):
                pass
        if live.instance is not None and _overrides(live.instance, "teardown"):
            try:
                await self._run(live.instance.teardown)
            except Exception as exc:
                log.warning("teardown failed for session %s: %s", sid, type(exc).__name__)

    async def close(self) -> None:
        for sid in list(self._live):
            await self.stop(sid)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _audited(outcome: CallOutcome, tool_input: dict, secrets: tuple[str, ...]) -> CallOutcome:
    """The outcome with audit copies of its result and the tool's input, where they held a secret."""
    audit = redact(outcome.result, secrets) if outcome.result is not None else None
    audit_input = redact(tool_input, secrets)
    return replace(outcome, audit=audit if audit != outcome.result else None,
                   audit_input=audit_input if audit_input != tool_input else None)
