"""The sessions of a sandbox worker (Host): the environment instances it holds, by session id, and
the operations the supervisor asks of them (setup, prompt, task tools, call, stop).

Imported by the worker inside its sandbox (bound there by binding.py), with the package loader
and the redaction it shares with the gateway; the SDKs are imported where they are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from typing import Any

from orsplatform.sandbox import loader
from orsplatform.sandbox.redact import redact, secret_values
from orsplatform.sandbox.worker_errors import EnvironmentExit, SetupError, UnknownSession
from orsplatform.sandbox.worker_sdks import (
    IDLE_OPENENV_INSTANCES,
    ToolDispatch,
    is_openenv_class,
    openenv_host,
    per_function,
    quiet_openreward_logs,
    register_package,
    sdk_base,
)
from orsplatform.sandbox.worker_strays import end_strays
from orsplatform.sandbox.worker_threads import ToolThreads


class _Live:
    __slots__ = ("instance", "secrets", "dispatch")

    def __init__(self, instance: Any, secrets: tuple[str, ...], dispatch) -> None:
        self.instance = instance
        self.secrets = secrets
        self.dispatch = dispatch  # the SDK's way of running a tool, chosen at setup


class Host(ToolDispatch):
    """The environment instances of this worker, by session id."""

    def __init__(self, package_dir: str, threads: int) -> None:
        from ors import Environment

        self.Environment = Environment
        self.package_dir = package_dir
        openenv_host().NoWebInterface.install()  # before the package imports openenv, if it does
        self.pool = ToolThreads(threads)
        self.live: dict[str, _Live] = {}
        self._cls: dict[str, type] = {}
        # A tool function -> (is it a tool, its input model): the SDK's checks (signature, type
        # hints) cost more than a small tool itself, and give the same answer for the same function.
        self._tools: dict[Any, tuple[bool, Any]] = {}
        self._coroutines: dict[Any, bool] = {}
        self._declarations: dict[str, Any] = {}  # OpenEnv classes' declarations, by entrypoint
        self._idle: Any = None  # OpenEnv instances kept between episodes (openenv_host.Idle)
        self._lock = threading.Lock()

    # --- loading ---------------------------------------------------------------------------

    def load(self, entrypoint: str) -> type:
        cls = self._cls.get(entrypoint)
        if cls is not None:
            return cls
        with self._lock:
            cls = self._cls.get(entrypoint)
            if cls is None:
                cls = self._cls[entrypoint] = self._import(entrypoint)
                if not issubclass(cls, self.Environment):
                    quiet_openreward_logs()
        return cls

    def _import(self, entrypoint: str) -> type:
        # The inspector's rules and module naming (loader.py): what publishing accepted imports here.
        return loader.load_environment_class(self.package_dir, entrypoint)

    def declaration(self, entrypoint: str, cls: type) -> Any:
        """What an OpenEnv class's app declares (factory, action model), looked up once."""
        declaration = self._declarations.get(entrypoint)
        if declaration is None:
            with self._lock:
                declaration = self._declarations.get(entrypoint)
                if declaration is None:
                    declaration = self._declarations[entrypoint] = openenv_host().declare(
                        register_package(self.package_dir), self.package_dir, cls)
        return declaration

    async def _setup_openenv(self, msg: dict, cls: type) -> dict | None:
        """An OpenEnv-SDK class: its instance built and reset as an episode (openenv_host.py)."""
        host = openenv_host()
        try:
            declaration = self._declarations.get(msg["entrypoint"])
            if declaration is None:  # the first session: the app module imported off the loop
                declaration = await self.run(self.declaration, msg["entrypoint"], cls)
            if self._idle is None:
                self._idle = host.Idle(IDLE_OPENENV_INSTANCES)
            episode = host.Episode(declaration, self.run, self._idle)
            episode.prompt = await episode.start(msg.get("task_spec"))
        except BaseException as exc:  # environment code may raise anything
            raise SetupError(f"{type(exc).__name__}: {exc}") from None
        self.live[msg["sid"]] = _Live(episode, (), self._dispatch_openenv)
        return {"prompt": [episode.prompt], "task_tools": []} if msg.get("first") else None

    def _overrides(self, instance: Any, name: str) -> bool:
        base = self.Environment if isinstance(instance, self.Environment) else sdk_base(type(instance))
        return getattr(type(instance), name) is not getattr(base, name)

    async def run(self, fn, *args) -> Any:
        """Run an environment method: coroutine functions on the loop, the rest in the pool."""
        try:
            if self._is_coroutine(fn):
                return await fn(*args)
            result = await self.pool.run(asyncio.get_running_loop(), fn, args)
            if inspect.isawaitable(result):
                result = await result
            return result
        except SystemExit as exc:
            raise EnvironmentExit(f"SystemExit({exc.code!r})") from None

    def _is_coroutine(self, fn: Any) -> bool:
        """Is `fn` a coroutine function (through its wrappers), looked up once per function."""
        return per_function(self._coroutines, fn, lambda f: inspect.iscoroutinefunction(inspect.unwrap(f)))

    def _instance(self, sid: str) -> _Live:
        live = self.live.get(sid)
        if live is None:
            raise UnknownSession(sid)
        return live

    # --- operations ------------------------------------------------------------------------

    async def op_setup(self, msg: dict) -> dict | None:
        """Build the instance and run setup(). With ``"first": true`` the reply also carries what
        every episode asks next, the prompt and the task tools ({"prompt", "task_tools"}, each
        left out when the environment's method raised: asked for again, it raises where the
        client sees it), so an episode crosses the boundary once less; without it (older
        supervisors) the reply is null as before."""
        secrets = msg.get("secrets") or {}
        values = secret_values(secrets)
        first = bool(msg.get("first"))
        cls = self._cls.get(msg["entrypoint"])
        if cls is None:  # the first session of this class: imported off the loop
            try:
                cls = await self.run(self.load, msg["entrypoint"])
            except BaseException as exc:  # environment code may raise anything
                raise SetupError(redact(f"{type(exc).__name__}: {exc}", values)) from None
        if is_openenv_class(cls):
            return await self._setup_openenv(msg, cls)
        try:
            instance, pending, extra = await self.run(self._build, msg["entrypoint"], msg.get("task_spec"),
                                                      secrets, first)
            if pending is not None:
                await pending
        except BaseException as exc:  # environment code may raise anything
            raise SetupError(redact(f"{type(exc).__name__}: {exc}", values)) from None
        dispatch = self._dispatch if isinstance(instance, self.Environment) else self._dispatch_openreward
        self.live[msg["sid"]] = _Live(instance, values, dispatch)
        if not first:
            return None
        if extra is None:  # setup was a coroutine: the rest after it, as separate requests would
            extra = {}
            with contextlib.suppress(Exception):
                extra["prompt"] = await self.op_prompt(msg)
            if not self._overrides(instance, "list_task_tools"):
                extra["task_tools"] = []
        return extra

    def _build(self, entrypoint: str, task_spec: Any, secrets: dict, first: bool = False) -> tuple[Any, Any, Any]:
        cls = self.load(entrypoint)
        instance = cls(task_spec=task_spec, secrets=dict(secrets))
        if not self._overrides(instance, "setup"):
            return instance, None, self._first(instance) if first else None
        if inspect.iscoroutinefunction(inspect.unwrap(instance.setup)):
            return instance, instance.setup(), None  # a coroutine, awaited on the loop
        result = instance.setup()
        if inspect.isawaitable(result):
            return instance, result, None
        return instance, None, self._first(instance) if first else None

    def _first(self, instance: Any) -> dict:
        """The prompt and task tools of a fresh instance, in the thread that built it (one hop
        for the three), when their methods are plain functions."""
        extra: dict[str, Any] = {}
        if not inspect.iscoroutinefunction(inspect.unwrap(instance.get_prompt)):
            with contextlib.suppress(BaseException):  # SystemExit too: it raises again when asked again
                blocks = instance.get_prompt()
                if not inspect.isawaitable(blocks):
                    extra["prompt"] = self._blocks(blocks)
                elif inspect.iscoroutine(blocks):
                    blocks.close()
        # Task tools only when the class has none of its own: a list_task_tools() of its own may
        # be slow, and readiness must not wait for it (it is asked for when a client asks).
        if not self._overrides(instance, "list_task_tools"):
            extra["task_tools"] = []
        return extra

    @staticmethod
    def _blocks(blocks: Any) -> list:
        from pydantic import BaseModel

        return [b.model_dump(mode="json") if isinstance(b, BaseModel) else b for b in blocks]

    async def op_prompt(self, msg: dict) -> list:
        live = self._instance(msg["sid"])
        if live.dispatch == self._dispatch_openenv:
            return [live.instance.prompt]
        return self._blocks(await self.run(live.instance.get_prompt))

    async def op_task_tools(self, msg: dict) -> list:
        live = self._instance(msg["sid"])
        if live.dispatch == self._dispatch_openenv or not self._overrides(live.instance, "list_task_tools"):
            return []
        return [t.model_dump(mode="json") for t in (await self.run(live.instance.list_task_tools)).tools]

    async def op_call(self, msg: dict) -> dict:
        live = self._instance(msg["sid"])
        tool_input = msg.get("input") or {}
        try:
            outcome = await live.dispatch(live.instance, msg["name"], tool_input)
        except Exception as exc:
            outcome = {"exception": redact(f"{type(exc).__name__}: {exc}", live.secrets)}
        # {"result"} or {"exception"}, nothing else: what is recorded, and stripped of the
        # session's secrets, is decided by the supervisor (this process runs tenant code).
        return outcome

    async def op_stop(self, msg: dict) -> None:
        live = self.live.pop(msg["sid"], None)
        if live is not None and live.dispatch == self._dispatch_openenv:
            await live.instance.stop()
        elif live is not None and self._overrides(live.instance, "teardown"):
            try:
                await self.run(live.instance.teardown)
            except Exception:
                pass  # nothing to report to: the session is over
        if not self.live:
            end_strays()
