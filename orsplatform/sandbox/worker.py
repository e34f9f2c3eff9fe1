"""A sandbox worker: hosts the sessions of one environment version opened by one team.

Started by the pool (pool.py) inside bubblewrap as ``python -I .../worker.py PACKAGE_DIR THREADS``,
with the package bound read-only and, of the platform, only the modules binding.py lists (this
file, the OpenEnv adapter, and the package loader and redaction it shares with the gateway: one
copy of each rule). It imports no Django and nothing else of ``orsplatform`` (the rest of the tree
is not mounted in the sandbox), only the SDKs (``ors``, and ``openreward.environments`` when the
environment is written against it), pydantic and orjson from the read-only site-packages.

The two SDKs' types are the same models (blocks, ToolOutput, Split, ToolSpec), so what a worker
answers is the same JSON whichever SDK a class uses. Where they differ is tool dispatch: an
``ors`` class runs on this worker's own fast path (``Host._dispatch``); an ``openreward`` class
runs through its SDK's dispatcher (``Host._dispatch_openreward``), whose per-tool locks,
``concurrent``/``exclusive`` tools and refusal of calls after ``finished=True`` are part of the
contract its author wrote against. The choice is made once per session, at setup.

The supervisor speaks to it over the pipe that was its stdin/stdout: frames of a 4-byte big-endian
length and an orjson object. Requests are ``{"id", "op", ...}``; every request gets exactly one
reply ``{"id", "ok", "value" | "error"}``. Requests run concurrently: sync environment methods in a
thread pool, async ones on this process's event loop, so a tool that blocks the loop stalls only
this worker (the supervisor kills it once a call outlives its timeout by the grace period).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import importlib
import inspect
import os
import queue
import signal
import struct
import sys
import threading
import types
from pathlib import Path
from typing import Any

import orjson

# The dotted name of this file's package. Run as a script (the pool's argv), the tree that holds it
# goes first on the path (/ors/lib in a sandbox), so the shared rules import by their own names.
PACKAGE = "orsplatform.sandbox"
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[len(PACKAGE.split("."))]))

from orsplatform.sandbox import loader  # noqa: E402
from orsplatform.sandbox.redact import redact, secret_values  # noqa: E402

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
READ_CHUNK = 256 * 1024
LAZY_SECONDS = 0.05


class EnvironmentExit(Exception):
    """Environment code called sys.exit(); reported like any exception of the environment."""


class UnknownSession(Exception):
    pass


def tool_error(message: str, reason: str) -> dict:
    return {"ok": False, "error": message, "reason": reason}


def readable_validation(tool: str, errors: list[dict]) -> str:
    """pydantic's errors as one line a trainer can read in a log: ``Invalid arguments for tool
    'submit': answer: Field required; n: Input should be a valid integer (got 'many').``"""
    parts = []
    for error in errors[:10]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
        part = f"{where}: {error.get('msg', 'invalid')}"
        if error.get("type") != "missing" and "input" in error:
            shown = repr(error["input"])
            part += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
        parts.append(part)
    more = f"; and {len(errors) - 10} more" if len(errors) > 10 else ""
    return f"Invalid arguments for tool {tool!r}: {'; '.join(parts)}{more}."


class _Live:
    __slots__ = ("instance", "secrets", "dispatch")

    def __init__(self, instance: Any, secrets: tuple[str, ...], dispatch) -> None:
        self.instance = instance
        self.secrets = secrets
        self.dispatch = dispatch  # the SDK's way of running a tool, chosen at setup


# --- importing a package: the loader's rules (loader.py), shared with the inspector -------------

SDK_MODULES = tuple(loader.SDK_MODULES)
IDLE_OPENENV_INSTANCES = 64  # per class: a worker's sessions (ORS_SANDBOX_SESSIONS_PER_WORKER's default)
sdk_base = loader.sdk_base
register_package = loader.register_package


def openenv_host() -> types.ModuleType:
    """The OpenEnv-SDK adapter (openenv_host.py, bound beside this file), imported when the first
    OpenEnv class is."""
    return importlib.import_module(f"{PACKAGE}.openenv_host")


def is_openenv_class(cls: type) -> bool:
    base = getattr(sys.modules.get(SDK_MODULES[2]), "Environment", None)
    return isinstance(base, type) and issubclass(cls, base)


def _quiet_openreward_logs() -> None:
    """The openreward SDK logs every tool call at INFO (to this worker's stderr); the audit log has
    those calls already. Its dispatcher's logger keeps warnings and errors. (Not by its
    OPENREWARD_LOG_LEVEL variable: tenant code sees no variable of the platform's.)"""
    module = sys.modules.get("openreward.environments.environment")
    logger = getattr(module, "logger", None)
    try:
        import logging

        import structlog

        module.logger = structlog.wrap_logger(  # type: ignore[union-attr]
            logger._logger, processors=logger._processors,
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)).bind(**logger._context)
    except Exception:
        pass  # another SDK release: its INFO lines go to stderr, nothing worse


def _per_function(cache: dict, fn: Any, compute: Any) -> Any:
    """`compute(fn)`, kept per function (a bound method's function): the same function gives the
    same answer. An unhashable callable is asked each time; the cache is emptied past 4096 entries,
    so functions made per call cannot grow it."""
    func = getattr(fn, "__func__", fn)
    try:
        known = cache.get(func)
    except TypeError:
        return compute(fn)
    if known is None:
        known = compute(fn)
        if len(cache) >= 4096:
            cache.clear()
        cache[func] = known
    return known


class ToolThreads(concurrent.futures.ThreadPoolExecutor):
    """The worker's threads for sync environment code: up to ORS_TOOL_THREADS, started as needed.

    `run` is Host.run's hop, leaner than ``run_in_executor``: no concurrent Future chained to an
    asyncio one per call, and the answers of calls that finish close together wake the event loop
    once (profiled, the executor's machinery was the biggest part of a small sync tool's cost in
    the worker). `submit` is the executor API, for ``asyncio.to_thread`` (the openreward SDK's sync
    tools): the same threads, so the limit is one for both. A ThreadPoolExecutor by type only, as
    ``loop.set_default_executor`` requires; none of its own machinery is used."""

    def __init__(self, size: int) -> None:
        super().__init__(max_workers=max(1, size))
        self._size = max(1, size)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._waiting = threading.Semaphore(0)  # one release per thread waiting for work
        self._started = 0
        self._done: list[tuple[asyncio.Future, bool, Any]] = []
        self._waking = False

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._put((None, future, functools.partial(fn, **kwargs) if kwargs else fn, args))
        return future

    def run(self, loop: asyncio.AbstractEventLoop, fn: Any, args: tuple) -> asyncio.Future:
        future = loop.create_future()
        self._put((loop, future, fn, args))
        return future

    def _put(self, item: tuple) -> None:
        self._jobs.put(item)
        if self._waiting.acquire(blocking=False):
            return  # a waiting thread takes it
        with self._guard:
            if self._started >= self._size:
                return  # every thread is busy: it waits its turn
            self._started += 1
            n = self._started
        threading.Thread(target=self._serve, name=f"ors-env_{n}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            loop, future, fn, args = self._jobs.get()
            if loop is None:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # environment code may raise anything
                        future.set_exception(exc)
            else:
                try:
                    done = (future, True, fn(*args))
                except BaseException as exc:  # handed to the awaiting call (SystemExit included)
                    done = (future, False, exc)
                with self._guard:
                    self._done.append(done)
                    wake, self._waking = not self._waking, True
                if wake:
                    with contextlib.suppress(RuntimeError):  # the loop closed: the worker is ending
                        loop.call_soon_threadsafe(self._deliver)
            del loop, future, fn, args
            self._waiting.release()

    def _deliver(self) -> None:
        with self._guard:
            done, self._done, self._waking = self._done, [], False
        for future, ok, value in done:
            if future.done():  # its call was cancelled
                continue
            if ok:
                future.set_result(value)
            elif isinstance(value, StopIteration):  # a Future refuses it (it would end a generator)
                future.set_exception(RuntimeError(f"StopIteration: {value}"))
            else:
                future.set_exception(value)


class Host:
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
                    _quiet_openreward_logs()
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

    @staticmethod
    async def _dispatch_openenv(episode: Any, name: str, tool_input: dict) -> dict:
        return await episode.call(name, tool_input)

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
        return _per_function(self._coroutines, fn, lambda f: inspect.iscoroutinefunction(inspect.unwrap(f)))

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

    def _tool(self, fn: Any) -> tuple[bool, Any]:
        """(is `fn` a tool, its input model or None), looked up once per function."""
        return _per_function(self._tools, fn, self._tool_facts)

    def _tool_facts(self, fn: Any) -> tuple[bool, Any]:
        from ors.environment import _introspect_tool

        if not self.Environment._is_tool(fn):
            return False, None
        _, hints, params = _introspect_tool(fn)
        return True, hints[params[0].name] if params else None

    async def _dispatch(self, instance: Any, name: str, tool_input: dict) -> dict:
        from ors import ToolOutput
        from pydantic import ValidationError

        fn = None if name.startswith("_") else getattr(instance, name, None)
        known = self._tool(fn) if fn is not None else (False, None)
        if not known[0]:
            # Toolsets and unknown names: the SDK's own dispatcher knows their rules.
            out = await self.run(instance._call_tool, name, tool_input)
            result = out.model_dump(mode="json")
            if not result["ok"]:
                result["reason"] = "not_found" if "is not a valid tool" in result["error"] else "name_collision"
            return {"result": result}
        model = known[1]
        args: tuple = ()
        if model is not None:
            try:
                args = (model(**tool_input),)
            except ValidationError as exc:
                return {"result": tool_error(readable_validation(name, exc.errors()), "input_validation")}
        res = await self.run(fn, *args)
        if not isinstance(res, ToolOutput):
            raise TypeError(f"{name!r} returned {type(res).__name__}; expected ToolOutput")
        return {"result": {"ok": True, "output": res.model_dump(mode="json")}}

    async def _dispatch_openreward(self, instance: Any, name: str, tool_input: dict) -> dict:
        """An openreward.environments tool, run by its SDK: the same input validation and results
        as ``_dispatch`` (both SDKs answer RunToolOutput), with that SDK's locking rules."""
        try:
            out = await instance._call_tool(name, tool_input)
        except SystemExit as exc:
            raise EnvironmentExit(f"SystemExit({exc.code!r})") from None
        result = out.model_dump(mode="json")
        if not result["ok"] and result.get("reason") is None:
            result["reason"] = "not_found" if "is not a valid tool" in result["error"] else "name_collision"
        if not result["ok"] and result.get("reason") == "input_validation":
            result["error"] = self._openreward_validation(instance, name, tool_input) or result["error"]
        return {"result": result}

    @staticmethod
    def _openreward_validation(instance: Any, name: str, tool_input: dict) -> str | None:
        """The SDK's refusal of a tool's input as one readable line: the input checked again against
        the tool's model (only on this error path), since the SDK answers pydantic's list as text."""
        from openreward.environments.environment import _introspect_tool
        from pydantic import ValidationError

        try:
            _, hints, params = _introspect_tool(getattr(instance, name))
            hints[params[0].name](**tool_input)
        except ValidationError as exc:
            return readable_validation(name, exc.errors())
        except Exception:
            return None  # a toolset's tool, say: the SDK's own wording stays
        return None

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


def end_strays() -> None:
    """Kill what sessions left running once none is left: in the sandbox's own pid namespace every
    process but its init (bubblewrap's, pid 1, or under gVisor this worker) and this worker is such a leftover (a `setsid`
    child, a daemon), so none outlives the sessions that could have started it, even while the
    worker itself is kept for the next session. Outside a sandbox (ORS_SANDBOX=none) /proc is the
    host's, and nothing is touched."""
    me = os.getpid()
    try:
        # Under gVisor the worker is its sandbox's init (pid 1); under bubblewrap, bubblewrap's is.
        if me != 1:
            with open("/proc/1/cmdline", "rb") as f:
                if b"bwrap" not in f.read():
                    return
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        if pid not in (1, me):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # its own children: reaped, not left as zombies
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


class SetupError(Exception):
    pass


class Channel:
    """The framed pipe to the supervisor. Replies of one event-loop pass go out in one write (one
    wake-up of the supervisor, not one per reply); lazy ones (teardowns) wait for company up to
    LAZY_SECONDS."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.WriteTransport) -> None:
        self.reader = reader
        self.transport = transport
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._soon: asyncio.Handle | None = None
        self._later: asyncio.TimerHandle | None = None

    async def read(self) -> list[dict] | None:
        """Every whole frame the pipe holds (at least one); None when it closed or spoke garbage."""
        buffer = self._buffer
        try:
            while True:
                messages, offset, end = [], 0, len(buffer)
                while end - offset >= HEADER.size:
                    (size,) = HEADER.unpack_from(buffer, offset)
                    if size > MAX_FRAME:
                        return None
                    if end - offset - HEADER.size < size:
                        break
                    start = offset + HEADER.size
                    messages.append(orjson.loads(memoryview(buffer)[start:start + size]))
                    offset = start + size
                del buffer[:offset]
                if messages:
                    return messages
                chunk = await self.reader.read(READ_CHUNK)
                if not chunk:
                    return None
                buffer += chunk
        except orjson.JSONDecodeError:
            return None

    def send(self, message: dict, lazy: bool = False) -> None:
        try:
            body = orjson.dumps(message)
        except (TypeError, orjson.JSONEncodeError) as exc:  # the environment's value
            body = orjson.dumps({"id": message.get("id"), "ok": False,
                                 "error": f"The environment's answer is not valid JSON: {exc}"})
        self._out.append(HEADER.pack(len(body)) + body)
        if self._soon is not None:
            return
        loop = asyncio.get_running_loop()
        if not lazy:
            self._soon = loop.call_soon(self.flush)
        elif self._later is None:
            self._later = loop.call_later(LAZY_SECONDS, self.flush)

    def flush(self) -> None:
        self._soon = None
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._out:
            data, self._out = b"".join(self._out), []
            self.transport.write(data)


async def serve(host: Host, channel: Channel) -> None:
    ops = {"setup": host.op_setup, "prompt": host.op_prompt, "task_tools": host.op_task_tools,
           "call": host.op_call, "stop": host.op_stop}
    tasks: set[asyncio.Task] = set()

    async def handle(msg: dict) -> None:
        reply: dict[str, Any] = {"id": msg.get("id")}
        try:
            reply["value"] = await ops[msg["op"]](msg)
            reply["ok"] = True
        except UnknownSession:
            reply.update(ok=False, kind="unknown")
        except SetupError as exc:
            reply.update(ok=False, kind="setup", error=str(exc))
        except BaseException as exc:  # environment code may raise anything
            live = host.live.get(msg.get("sid", ""))
            reply.update(ok=False, kind="error", error=redact(f"{type(exc).__name__}: {exc}",
                                                              live.secrets if live else ()))
        channel.send(reply, lazy=msg.get("op") == "stop")

    while True:
        messages = await channel.read()
        if messages is None:
            channel.flush()
            return  # the supervisor closed the pipe (or spoke garbage): the worker ends
        for msg in messages:
            task = asyncio.create_task(handle(msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


async def main_async(package_dir: str, threads: int, fd_in: int, fd_out: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_FRAME)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd_in, "rb", 0))
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(fd_out, "wb", 0))
    host = Host(package_dir, threads)
    loop.set_default_executor(host.pool)  # asyncio.to_thread (the openreward SDK's sync tools) shares the pool
    channel = Channel(reader, transport)
    channel.send({"id": 0, "ok": True, "value": {"pid": os.getpid()}})  # ready
    channel.flush()
    await serve(host, channel)


def _open_fds() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def main() -> None:
    package_dir, threads = sys.argv[1], int(sys.argv[2])
    # The protocol moves off fds 0 and 1, so a tenant's print() (or a library's) goes to stderr
    # instead of corrupting the framing.
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    # Nothing inherited reaches tenant code (the launcher closes them in a sandbox already; this
    # also covers ORS_SANDBOX=none and any launcher in front of this one).
    for fd in _open_fds():
        if fd > 2 and fd not in (fd_in, fd_out):
            with contextlib.suppress(OSError):
                os.close(fd)
    try:  # uvloop where installed: the worker's hop is mostly event-loop work
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main_async(package_dir, threads, fd_in, fd_out))
    os._exit(0)  # stuck tool threads must not keep an orphaned worker alive


if __name__ == "__main__":
    main()
