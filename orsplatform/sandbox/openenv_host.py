"""OpenEnv-SDK environments (``openenv.core`` ``Environment`` / ``MCPEnvironment`` subclasses) run as
the platform's episodes: what a class declares, and one session's instance.

Imported by the publishing inspector (sandbox/inspector.py) and by the sandbox worker
(worker.py; both bound into their sandboxes by binding.py): standard library, pydantic and orjson here;
``openenv`` is imported only once the package has imported it (its requirement, built per version).

An OpenEnv package declares its server the way OpenEnv's own examples do, in ``server/app.py``:
``app = create_app(EnvClass, ActionClass, ObservationClass, env_name=...)`` (``openenv.yaml``'s
``app:`` names that module when it lives elsewhere). That module is imported with OpenEnv's
``HTTPEnvServer`` watched, so the factory and the action, observation and state models come from
the author's own declaration; without one they are inferred (``MCPEnvironment`` speaks
``CallToolAction``; otherwise the type of ``step``'s action parameter).

How an instance maps onto an episode (the task spec is ``reset``'s keyword arguments, as an
OpenEnv client's ``reset`` data is):

- setup: the factory builds the instance, its MCP session is held open for the episode (as OpenEnv's
  WebSocket handler does), ``reset(**task_spec)`` runs; the prompt is one text block, the reset
  observation as JSON, with the serialized observation and the state in the block's ``detail``.
- a tool environment (``MCPEnvironment``, or a ``CallToolAction`` app): each of its tools is an ORS
  tool, a call is ``step(CallToolAction(...))``; a plain one has one tool, ``step``, whose input is
  its action model.
- every result carries the serialized observation and state in ``output.metadata["openenv"]`` (the
  OpenEnv face answers from them; the audit log keeps them).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

BASE_MODULE = "openenv.core.env_server.interfaces"
DEFAULT_APP_MODULES = ("server.app", "app")
STEP_TOOL = "step"
# Where the serialized observation and state ride in prompts (block detail) and results (metadata).
KEY = "openenv"


class NoWebInterface:
    """Keeps ``openenv.core.env_server.web_interface`` (OpenEnv's Gradio page at ``/web``) from
    importing: it imports Gradio, seconds of start-up per worker for a page the platform does not
    serve. OpenEnv itself runs without it (``env_server/__init__.py`` catches the
    ModuleNotFoundError), as on an install without Gradio."""

    MODULE = "openenv.core.env_server.web_interface"

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.MODULE:
            raise ModuleNotFoundError(f"No module named {fullname!r} (the platform serves no /web page)",
                                      name=fullname)
        return None

    @classmethod
    def install(cls) -> None:
        if not any(isinstance(f, cls) for f in sys.meta_path):
            sys.meta_path.insert(0, cls())


def base_class() -> type | None:
    """OpenEnv's Environment base, when the package imported openenv."""
    base = getattr(sys.modules.get(BASE_MODULE), "Environment", None)
    return base if isinstance(base, type) else None


def is_openenv_class(cls: object) -> bool:
    base = base_class()
    return base is not None and isinstance(cls, type) and cls is not base and issubclass(cls, base)


@dataclass
class Declaration:
    """What OpenEnv's server would be built from: the factory and the models."""

    factory: Any
    action_cls: type
    observation_cls: type
    state_cls: type
    reset_observation_cls: type
    env_name: str

    @property
    def tool_env(self) -> bool:
        from openenv.core.env_server.mcp_types import CallToolAction

        return issubclass(self.action_cls, CallToolAction)

    def schemas(self) -> dict[str, Any]:
        """``/schema`` as OpenEnv's server answers it."""
        return {"action": self.action_cls.model_json_schema(), "observation": self.observation_cls.model_json_schema(),
                "state": self.state_cls.model_json_schema(),
                "reset_observation": self.reset_observation_cls.model_json_schema()}


class _Recorder:
    """Records each HTTPEnvServer built while an app module is imported (create_app and
    create_fastapi_app build one; so does an app that builds it by hand)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def watching(self):
        from openenv.core.env_server.http_server import HTTPEnvServer

        original = HTTPEnvServer.__init__
        signature = inspect.signature(original)
        seen = self.seen

        def __init__(server, *args, **kwargs):  # noqa: N807 - stands in for the original
            bound = signature.bind(server, *args, **kwargs)
            bound.apply_defaults()
            seen.append(dict(bound.arguments))
            original(server, *args, **kwargs)

        HTTPEnvServer.__init__ = __init__
        try:
            yield
        finally:
            HTTPEnvServer.__init__ = original


def _app_modules(package_dir: str) -> list[str]:
    """The app module openenv.yaml names (``app: server.app:app``), then the usual places."""
    modules: list[str] = []
    manifest = Path(package_dir) / "openenv.yaml"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in manifest.read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "app":
                module = value.strip().strip("'\"").partition(":")[0]
                if module and all(p.isidentifier() for p in module.split(".")):
                    modules.append(module)
    return list(dict.fromkeys([*modules, *DEFAULT_APP_MODULES]))


def _module_exists(package_dir: str, module: str) -> bool:
    path = Path(package_dir, *module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _factory_class(factory: Any) -> type | None:
    import functools

    while isinstance(factory, functools.partial):
        factory = factory.func
    return factory if isinstance(factory, type) else None


class CheckedSchemas:
    """``jsonschema.validate`` that checks each distinct schema against its metaschema once.

    MCP's client validates every tool result with ``jsonschema.validate(result, output_schema)``,
    which first validates the output schema itself against the JSON Schema metaschema: the same
    schema, every call, and the larger part of a tool call's CPU in this worker (bench/README.md,
    the OpenEnv-SDK comparison). The answer is the same with the check done once per distinct
    schema: a schema is known by its content (canonical JSON), so one changed in place is checked
    anew; the validator built then is reused. Only calls made the way MCP makes them (no extra
    arguments, an empty registry) take the cache; any other goes to the original unchanged."""

    LIMIT = 256  # distinct schemas kept (a worker serves one package: a handful of tools)

    def __init__(self, original: Any) -> None:
        self.original = original
        self.validators: dict[tuple[Any, bytes], Any] = {}

    def __call__(self, instance: Any, schema: Any, cls: Any = None, *args: Any, **kwargs: Any) -> None:
        from jsonschema import exceptions, validators

        registry = kwargs.get("registry")
        if args or set(kwargs) - {"registry"} or (registry is not None and len(registry)):
            return self.original(instance, schema, cls, *args, **kwargs)
        try:
            key = (cls, orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
        except TypeError:  # not plain JSON: as jsonschema would have it
            return self.original(instance, schema, cls, *args, **kwargs)
        validator = self.validators.get(key)
        if validator is None:
            kind = cls if cls is not None else validators.validator_for(schema)
            kind.check_schema(schema)  # a bad schema raises SchemaError here, as before, and is not kept
            validator = kind(schema, **kwargs)
            if len(self.validators) >= self.LIMIT:
                self.validators.clear()
            self.validators[key] = validator
        error = exceptions.best_match(validator.iter_errors(instance))
        if error is not None:
            raise error

    @classmethod
    def install(cls) -> None:
        try:
            import jsonschema
        except ImportError:  # an environment without MCP's client
            return
        if not isinstance(jsonschema.validate, cls):
            jsonschema.validate = cls(jsonschema.validate)


def declare(pkg_name: str, package_dir: str, cls: type) -> Declaration:
    """The declaration of ``cls``: from the package's app module when it builds a server for it
    (an app module that fails to import is the package's error), else inferred."""
    import importlib

    CheckedSchemas.install()

    from openenv.core.env_server.types import State

    for module in _app_modules(package_dir):
        if not _module_exists(package_dir, module):
            continue
        recorder = _Recorder()
        name = f"{pkg_name}.{module}"
        with recorder.watching():
            if name in sys.modules:  # imported before (the inspector's scan): built again, watched
                importlib.reload(sys.modules[name])
            else:
                importlib.import_module(name)
        for args in recorder.seen:
            made = _factory_class(args["env"])
            if made is None or made is cls or issubclass(made, cls):
                action, observation = args["action_cls"], args["observation_cls"]
                return Declaration(factory=args["env"], action_cls=action, observation_cls=observation,
                                   state_cls=args.get("state_cls") or State,
                                   reset_observation_cls=args.get("reset_observation_cls") or observation,
                                   env_name=args.get("env_name") or cls.__name__)
        break  # the package's app module serves another class: the class's own types
    return _inferred(cls)


def _inferred(cls: type) -> Declaration:
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
    from openenv.core.env_server.types import Action, Observation, State

    if issubclass(cls, MCPEnvironment):
        return Declaration(cls, CallToolAction, CallToolObservation, State, Observation, cls.__name__)
    action: type = Action
    with contextlib.suppress(Exception):  # annotations that do not resolve: the base model
        hints = typing.get_type_hints(cls.step)
        params = [p for p in inspect.signature(cls.step).parameters if p != "self"]
        hint = hints.get(params[0]) if params else None
        if isinstance(hint, type) and issubclass(hint, Action):
            action = hint
    observation: type = Observation
    with contextlib.suppress(Exception):
        hint = typing.get_type_hints(cls.reset).get("return")
        if isinstance(hint, type) and issubclass(hint, Observation):
            observation = hint
    return Declaration(cls, action, observation, State, observation, cls.__name__)


# --- serializing, as OpenEnv's server does ---------------------------------------------------------


def _json(value: Any) -> Any:
    """A JSON-safe copy (numpy values, dataclasses and the like become what orjson makes of them)."""
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_SERIALIZE_NUMPY))


def serialize_observation(observation: Any) -> dict[str, Any]:
    """``serialize_observation`` of openenv's server: the observation's fields, and reward, done and
    a non-empty metadata beside them."""
    try:
        fields = observation.model_dump(mode="json", exclude={"reward", "done"})
    except Exception:  # a field pydantic cannot put in JSON mode (a tensor, a handle): as text
        fields = _json(observation.model_dump(exclude={"reward", "done"}))
    data = {"observation": fields, "reward": observation.reward, "done": bool(observation.done)}
    if observation.metadata:
        data["metadata"] = fields.get("metadata") if isinstance(fields.get("metadata"), dict) else _json(
            observation.metadata)
    return data


def serialize_state(state: Any) -> dict[str, Any]:
    if hasattr(state, "model_dump"):
        try:
            return state.model_dump(mode="json")
        except Exception:  # as for observations
            return _json(state.model_dump())
    return _json(dict(state) if state else {})


def tool_specs(tools: list[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description or "", "input_schema": t.input_schema or
             {"type": "object", "properties": {}}} for t in tools]


def step_tool(declaration: Declaration) -> dict[str, Any]:
    """The one ORS tool of a plain environment: its action model is the input."""
    schema = declaration.action_cls.model_json_schema()
    doc = inspect.getdoc(declaration.action_cls) or ""
    return {"name": STEP_TOOL, "description": f"Take a step: an {declaration.action_cls.__name__}. {doc}".strip(),
            "input_schema": schema}


async def list_tools(declaration: Declaration, run) -> list[dict[str, Any]]:
    """A fresh instance's tools (``step(ListToolsAction())``, as OpenEnv's ``list_tools`` asks)."""
    from openenv.core.env_server.mcp_types import ListToolsAction

    instance = await run(declaration.factory)
    try:
        if _overrides(instance, "step_async"):
            observation = await instance.step_async(ListToolsAction())
        else:
            observation = await run(instance.step, ListToolsAction())
        error = (getattr(observation, "metadata", None) or {}).get("error")
        if error:
            raise ValueError(f"Listing the environment's tools failed: {error}")
        return tool_specs(getattr(observation, "tools", None) or [])
    finally:
        with contextlib.suppress(Exception):
            await run(instance.close)


def _valid_kwargs(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` takes (OpenEnv's server drops the others likewise)."""
    params = inspect.signature(fn).parameters
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def _overrides(instance: Any, name: str) -> bool:
    from openenv.core.env_server.interfaces import Environment

    return getattr(type(instance), name) is not getattr(Environment, name)


class Held:
    """A built instance and the task holding its MCP session open (FastMCP's client session runs
    under anyio, whose scopes must be left by the task that entered them)."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.release: asyncio.Event | None = None
        self.holder: asyncio.Task | None = None

    async def open(self) -> None:
        factory = getattr(self.instance, "mcp_session", None)
        if not callable(factory):
            return
        entered: asyncio.Future = asyncio.get_running_loop().create_future()
        release = self.release = asyncio.Event()

        async def hold() -> None:
            try:
                async with factory():
                    entered.set_result(None)
                    await release.wait()
            except BaseException as exc:
                if not entered.done():
                    entered.set_exception(exc)
                    return
                raise

        self.holder = asyncio.create_task(hold())
        await entered

    async def close(self, run) -> None:
        if self.release is not None:
            self.release.set()
            with contextlib.suppress(BaseException):
                await self.holder
        with contextlib.suppress(Exception):
            await run(self.instance.close)


class Idle:
    """Instances whose episode ended cleanly, kept (MCP session open) for the next episode of the
    same worker: it resets one, as OpenEnv's own server resets a socket's instance for each episode
    instead of building another. A worker serves one environment version for one team, so an
    instance only ever serves that team. At most ``limit`` per declaration."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[int, list[Held]] = {}

    def take(self, declaration: Declaration) -> Held | None:
        stack = self.held.get(id(declaration))
        return stack.pop() if stack else None

    def give(self, declaration: Declaration, held: Held) -> bool:
        stack = self.held.setdefault(id(declaration), [])
        if len(stack) >= self.limit:
            return False
        stack.append(held)
        return True


class Episode:
    """One session's instance. ``run`` runs a sync function off the event loop (the worker's pool);
    ``idle``, where given, lends a kept instance and takes it back at a clean end."""

    def __init__(self, declaration: Declaration, run, idle: Idle | None = None) -> None:
        self.declaration = declaration
        self.run = run
        self.idle = idle
        self.held: Held | None = None
        self.instance: Any = None
        self.clean = True  # no call raised: the instance may serve another episode
        self.running = 0  # calls in flight (an episode ended under one leaves a busy instance)

    async def start(self, task_spec: Any) -> dict[str, Any]:
        """An instance (kept or built, its MCP session open), reset; the prompt's one block."""
        held = self.idle.take(self.declaration) if self.idle is not None else None
        if held is None:
            held = Held(await self.run(self.declaration.factory))
            self.held = held
            await held.open()
        self.held, self.instance = held, held.instance
        kwargs = dict(task_spec) if isinstance(task_spec, dict) else {}
        instance = self.instance
        try:
            if _overrides(instance, "reset_async"):
                observation = await instance.reset_async(**_valid_kwargs(instance.reset_async, kwargs))
            else:
                observation = await self.run(lambda: instance.reset(**_valid_kwargs(instance.reset, kwargs)))
        except BaseException:
            self.clean = False
            raise
        data = serialize_observation(observation)
        return {"type": "text", "text": orjson.dumps(data["observation"]).decode(),
                "detail": {KEY: {"observation": data, "state": self.state()}}}

    def state(self) -> dict[str, Any]:
        # On the loop, as OpenEnv's WebSocket handler reads it: a property, not a step.
        return serialize_state(self.instance.state)

    async def call(self, name: str, tool_input: dict) -> dict:
        """``{"result": <ORS tool result>}``: ok with the observation, or a refusal of the input."""
        from pydantic import ValidationError

        declaration = self.declaration
        if declaration.tool_env:
            from openenv.core.env_server.mcp_types import CallToolAction

            action = CallToolAction(tool_name=name, arguments=tool_input)
        elif name != STEP_TOOL:
            return {"result": {"ok": False, "error": f"{name} is not a valid tool; this environment takes "
                                                     f"'{STEP_TOOL}'.", "reason": "not_found"}}
        else:
            try:
                action = declaration.action_cls.model_validate(tool_input)
            except ValidationError as exc:
                errors = _json(exc.errors(include_url=False))
                return {"result": {"ok": False, "error": f"Invalid action: {errors}", "reason": "input_validation"}}
        instance = self.instance
        self.running += 1
        try:
            if _overrides(instance, "step_async"):
                observation = await instance.step_async(action)
            else:
                observation = await self.run(instance.step, action)
        except BaseException:
            self.clean = False
            raise
        finally:
            self.running -= 1
        data = serialize_observation(observation)
        error = data["observation"].get("error") if declaration.tool_env else None
        if error:  # a tool's own error: refused over ORS, the observation rebuilt by the OpenEnv face
            return {"result": {"ok": False, "error": str(error.get("message", error)),
                               "reason": str(error.get("error_type", "execution_error"))}}
        reward = data["reward"]
        output = {"blocks": [{"type": "text", "text": self._text(data)}],
                  "metadata": {KEY: {"observation": data, "state": self.state()}},
                  "reward": None if reward is None else float(reward), "finished": data["done"]}
        return {"result": {"ok": True, "output": output}}

    def _text(self, data: dict) -> str:
        """What an ORS agent reads: a tool's text content, else the observation as JSON."""
        result = data["observation"].get("result") if self.declaration.tool_env else None
        if isinstance(result, dict) and isinstance(result.get("content"), list):
            texts = [c.get("text") for c in result["content"] if isinstance(c, dict) and isinstance(c.get("text"), str)]
            if texts:
                return "\n".join(texts)
        if isinstance(result, str):
            return result
        return orjson.dumps(data["observation"]).decode()

    async def stop(self) -> None:
        held, self.held = self.held, None
        if held is None:
            return
        if self.clean and not self.running and self.idle is not None and self.idle.give(self.declaration, held):
            return
        await held.close(self.run)
