"""What differs between the SDKs an environment is written against, in a sandbox worker: which SDK
a class uses, and how each runs a tool (ToolDispatch, the worker's Host's dispatchers).

The two SDKs' types are the same models (blocks, ToolOutput, Split, ToolSpec), so what a worker
answers is the same JSON whichever SDK a class uses. Where they differ is tool dispatch: an
``ors`` class runs on this worker's own fast path (``_dispatch``); an ``openreward`` class runs
through its SDK's dispatcher (``_dispatch_openreward``), whose per-tool locks,
``concurrent``/``exclusive`` tools and refusal of calls after ``finished=True`` are part of the
contract its author wrote against; an OpenEnv class's episode (openenv_host.py) answers its own
calls (``_dispatch_openenv``). The choice is made once per session, at setup (worker_host.py).

Imported by the worker inside its sandbox (bound there by binding.py), with the package loader
it shares with the gateway; the SDKs are imported where they are used.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from orsplatform.sandbox import loader
from orsplatform.sandbox.worker_errors import EnvironmentExit, readable_validation, tool_error

PACKAGE = __name__.rpartition(".")[0]  # this file's package: "orsplatform.sandbox"

# Importing a package: the loader's rules (loader.py), shared with the inspector.
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


def quiet_openreward_logs() -> None:
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


def per_function(cache: dict, fn: Any, compute: Any) -> Any:
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


class ToolDispatch:
    """How a session's tool calls run, one way per SDK (a part of the worker's Host: ``run`` and
    ``Environment`` are the Host's)."""

    _tools: dict[Any, tuple[bool, Any]]
    Environment: type

    @staticmethod
    async def _dispatch_openenv(episode: Any, name: str, tool_input: dict) -> dict:
        return await episode.call(name, tool_input)

    def _tool(self, fn: Any) -> tuple[bool, Any]:
        """(is `fn` a tool, its input model or None), looked up once per function."""
        return per_function(self._tools, fn, self._tool_facts)

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
