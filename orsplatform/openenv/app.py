"""The OpenEnv face under ``/openenv/``: a lean ASGI app for HTTP (like the ORS face, Django's
handler is not on this path) and Channels' URLRouter in front of the ``/ws`` consumer.

``/openenv/{team}/{slug}[@N]/<op>`` (or ``/openenv/{slug}/<op>``, a bare slug resolved as on ORS):
``ws``, ``mcp``, ``health``, ``metadata``, ``schema``, ``reset``, ``step``, ``state``,
``list_environments``, and the task routes ``splits``, ``tasks``, ``num_tasks``, ``task``,
``task_range`` (also as OpenEnv spells them, ``{base}/{env_name}/splits`` …).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from channels.routing import URLRouter
from django.conf import settings
from django.urls import re_path
from pydantic import ValidationError

from orsplatform import bounded_json
from orsplatform.catalog.selectors import EnvHandle
from orsplatform.engine import hints
from orsplatform.engine.errors import UNAVAILABLE, GatewayError
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.openenv import selectors
from orsplatform.openenv.consumer import OpenEnvConsumer
from orsplatform.openenv.sessions import NOT_RESET, STEP_TOOL, Episodes, OpenEnvSession, Uninterruptible
from orsplatform.openenv.sockets import OpenSockets, Revocable
from orsplatform.openenv.wire import (
    CAPACITY_REACHED,
    CLOSE_FORBIDDEN,
    CLOSE_NORMAL,
    CLOSE_NOT_FOUND,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    EXECUTION_ERROR,
    INTERNAL_ERROR,
    INVALID_JSON,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    SERVER_ERROR,
    SESSION_ERROR,
    UNKNOWN_TYPE,
    VALIDATION_ERROR,
    CallToolAction,
    ListToolsAction,
    OpenEnvError,
    ResetData,
    ResetRequest,
    SplitRequest,
    StepRequest,
    TaskRangeRequest,
    TaskRequest,
    dumps,
    error_frame,
    observation_data,
    parse_action,
    rpc_error,
    rpc_result,
    schemas,
    tool_spec,
    validation_errors,
)
from orsplatform.ors.http import HttpError, read_body, send_error, send_json
from orsplatform.runs.naming import RUN_HEADER, BadRunName, run_name_clean
from orsplatform.teams.auth import Access, AccessDenied, AuthError, Caller, admit_environment, extract_token

log = logging.getLogger("orsplatform.openenv")

PREFIX = "/openenv/"
ENV_PATTERN = r"(?P<env>[^/]+(?:/[^/]+)?)"
TASK_OPS = frozenset({"splits", "tasks", "num_tasks", "task", "task_range"})
RESET_KEYS = frozenset(ResetData.model_fields)


class Unprocessable(HttpError):
    """FastAPI's request validation answer: 422 with pydantic's errors as the detail list."""

    def __init__(self, errors: list[dict]) -> None:
        super().__init__(422, "validation error")
        self.errors = errors


async def _refuse_socket(scope: dict, receive, send) -> None:
    # Not an OpenEnv socket path: refuse the handshake (the server answers 403), never a 500.
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


class OpenEnvFace:
    def __init__(self, *, gateway: EpisodeGateway) -> None:
        self.gateway = gateway
        self.episodes = Episodes(gateway)
        self.open_sockets = OpenSockets(run=gateway.store.run)
        self.sockets = URLRouter([
            re_path(rf"^openenv/{ENV_PATTERN}/ws/?$", OpenEnvConsumer.as_asgi(face=self)),
            re_path(r"", _refuse_socket),
        ])
        self.routes: dict[str, tuple[str, Callable[..., Awaitable[Any]]]] = {
            "health": ("GET", self.health), "metadata": ("GET", self.metadata), "schema": ("GET", self.schema),
            "state": ("GET", self.http_state), "reset": ("POST", self.http_reset), "step": ("POST", self.http_step),
            "mcp": ("POST", self.http_mcp), "list_environments": ("GET", self.list_environments),
            "splits": ("GET", self.splits), "tasks": ("POST", self.tasks), "num_tasks": ("POST", self.num_tasks),
            "task": ("POST", self.task), "task_range": ("POST", self.task_range),
        }

    async def __call__(self, scope: dict, receive, send) -> None:
        self.gateway.ensure_background()
        if scope["type"] == "websocket":
            await self.sockets(scope, receive, send)
            return
        try:
            await self._http(scope, receive, send)
        except Unprocessable as exc:
            await send_json(send, 422, {"detail": exc.errors})
        except GatewayError as exc:
            await send_error(send, exc)
        except UNAVAILABLE as exc:
            log.warning("backing service unavailable: %s: %s", type(exc).__name__, exc)
            await send_error(send, HttpError(503, "Temporarily unavailable; retry shortly.", {"Retry-After": "2"}))
        except ConnectionResetError:
            pass
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await send_error(send, HttpError(500, "Internal server error."))

    # --- HTTP ----------------------------------------------------------------------------------

    async def _http(self, scope: dict, receive, send) -> None:
        headers = dict(scope["headers"])
        if sum(len(k) + len(v) for k, v in headers.items()) > settings.ORS_MAX_HEADER_BYTES:
            raise HttpError(431, "Request headers are too large.")
        segments = scope["path"][len(PREFIX):].strip("/").split("/")
        op, rest = segments[-1], segments[:-1]
        env_name = None
        if op in TASK_OPS and len(rest) == 3:
            rest, env_name = rest[:2], rest[2]  # OpenEnv's /{env_name}/splits under the base URL
        route = self.routes.get(op)
        if route is None or not 1 <= len(rest) <= 2:
            raise HttpError(404, "Not found.")
        method, handler = route
        if scope["method"] != method and not (method == "GET" and scope["method"] == "HEAD"):
            raise HttpError(405, f"Method Not Allowed; use {method}.", {"Allow": method})
        # Access: opening episodes needs the sessions scope; /mcp decides per method.
        access = Access.SESSIONS if op in ("reset", "step") else Access.CATALOG
        # The token is in the headers: a caller who may not is refused before any body is read, and
        # an anonymous one (where the settings allow it) gets the small Django limit.
        try:
            token = extract_token(headers)
            caller = await self.gateway.authorize(token, access)
        except AuthError as exc:
            raise HttpError(exc.status, str(exc)) from None
        body = b""
        if method == "POST":
            limit = settings.ORS_MAX_REQUEST_BYTES if caller.is_anonymous else settings.ORS_MAX_BODY_BYTES
            body = await read_body(receive, limit, headers.get(b"content-length"))
        payload = _json(body) if op != "mcp" else body
        env = await self._environment(caller, "/".join(rest))
        if env_name is not None and env_name.lower() != env.slug.lower():
            raise HttpError(404, f"unknown environment {env_name!r}")
        result = await handler(caller, env, payload, token)
        await send_json(send, 200, result)

    async def _environment(self, caller: Caller, ref: str) -> EnvHandle:
        env = await self.gateway.environment(caller, ref)
        if env is None:
            # Another team's private environment answers exactly like one that does not exist.
            raise await self.gateway.unknown_environment(caller, ref)
        try:
            admit_environment(caller, env.environment_id, env.full_name)  # a bound key: its own only
        except AccessDenied as exc:
            raise HttpError(403, str(exc)) from None
        return env

    async def health(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        return {"status": "healthy"}

    async def metadata(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        return await self.gateway.store.run(lambda: selectors.environment_metadata(env=env))

    async def schema(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        return schemas(env)

    async def http_state(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        # Stateless, as upstream: the state of a fresh environment.
        return {"episode_id": str(uuid.uuid4()), "step_count": 0}

    async def http_reset(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        """Stateless, as upstream: a fresh episode is reset, observed and ended (and recorded)."""
        data = _validated(ResetRequest, body if body is not None else {}, ("body",))
        reset = _validated(ResetData, data.model_dump(exclude_unset=True) | (body or {}), ("body",))
        session = self.episodes.new_session(caller, env)
        try:
            return await self.episodes.reset(session, reset)
        except OpenEnvError as exc:
            raise HttpError(exc.status, exc.message) from None
        finally:
            await self.episodes.close(session)

    async def http_step(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        request = _validated(StepRequest, body, ("body",))
        try:
            action = parse_action(request.action)
        except ValidationError as exc:
            raise Unprocessable(validation_errors(exc)) from None
        if isinstance(action, ListToolsAction):
            return observation_data({"metadata": {}, "tools": [tool_spec(t) for t in env.tools]}, None, False)
        raise HttpError(400, f"{NOT_RESET}: HTTP /step is stateless (a fresh environment per request); "
                             "use the WebSocket /ws or /mcp sessions.")

    async def list_environments(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        return [env.slug]

    async def splits(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        return [{"name": name, "type": env.splits[name].type} for name in env.split_order]

    def _split(self, env: EnvHandle, name: str):
        return hints.split_named(env, name)

    def _readable(self, caller: Caller, env: EnvHandle, name: str):
        """A split whose specs are read: sealed ones only by the owner's publish keys (403)."""
        self._split(env, name)
        return self.gateway.task_reader(caller, env, name)

    async def tasks(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        split = self._readable(caller, env, _validated(SplitRequest, body, ("body",)).split)
        if split.num_tasks > settings.ORS_MAX_LIST_TASKS:
            raise HttpError(400, f"Split has {split.num_tasks} tasks; page through it with task_range.")
        return {"tasks": await self.gateway.tasks_public(split, 0, split.num_tasks), "env_name": env.slug}

    async def num_tasks(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        return {"num_tasks": self._split(env, _validated(SplitRequest, body, ("body",)).split).num_tasks}

    async def task(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        request = _validated(TaskRequest, body, ("body",))
        split = self._readable(caller, env, request.split)
        if not 0 <= request.index < split.num_tasks:
            raise hints.index_out_of_range(split, request.index)
        return {"task": await self.gateway.task_public(split, request.index)}

    async def task_range(self, caller: Caller, env: EnvHandle, body: Any, token: str | None) -> Any:
        request = _validated(TaskRangeRequest, body, ("body",))
        split = self._readable(caller, env, request.split)
        start, stop, _ = slice(request.start, request.stop).indices(split.num_tasks)
        if stop - start > settings.ORS_MAX_LIST_TASKS:
            raise HttpError(400, f"Range too large; at most {settings.ORS_MAX_LIST_TASKS} tasks per request.")
        return {"tasks": await self.gateway.tasks_public(split, start, stop) if stop > start else []}

    # --- MCP (JSON-RPC 2.0 over POST /mcp, and "mcp" frames on a socket) -------------------------

    async def http_mcp(self, caller: Caller, env: EnvHandle, body: bytes, token: str | None) -> Any:
        try:
            request = bounded_json.loads(body)
        except bounded_json.JsonRefused as exc:
            return rpc_error(None, PARSE_ERROR, f"Parse error: {exc}")
        if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or not isinstance(request.get("method"), str):
            return rpc_error(request.get("id") if isinstance(request, dict) else None, INVALID_REQUEST,
                             "Invalid request: expected a JSON-RPC 2.0 request object")
        params = request.get("params")
        if not (request.get("method") == "tools/list" and (params is None or isinstance(params, dict) and not params.get("session_id"))):
            try:  # everything but a session-less tools/list touches episodes: the sessions scope
                caller = await self.gateway.authorize(token, Access.SESSIONS)
            except AuthError as exc:
                raise HttpError(exc.status, str(exc)) from None
        return await self.rpc(caller, env, request)

    async def rpc(self, caller: Caller, env: EnvHandle, request: dict,
                  socket_session: OpenEnvSession | None = None) -> dict:
        rid, method, params = request.get("id"), request.get("method"), request.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict):
            return rpc_error(rid, INVALID_PARAMS, "Params must be an object")
        try:
            if method == "openenv/session/create":
                return rpc_result(rid, {"session_id": await self._mcp_create(caller, env, params, socket_session)})
            if method == "openenv/session/close":
                return await self._mcp_close(caller, env, rid, params, socket_session)
            if method not in ("tools/list", "tools/call"):
                return rpc_error(rid, METHOD_NOT_FOUND, f"Method not found: {method}")
            if env.openenv and env.openenv.get("kind") != "mcp":
                return rpc_error(rid, INTERNAL_ERROR, "Environment does not support MCP")  # as upstream
            session = socket_session
            if session is None and params.get("session_id"):
                session = self.episodes.mcp_session(caller, env, params["session_id"])
                if session is None:
                    return rpc_error(rid, INVALID_PARAMS, f"Unknown session_id: {params['session_id']}")
            if method == "tools/list":
                if session is None:
                    return rpc_result(rid, {"tools": [tool_spec(t) for t in env.tools]})
                async with _locked(session, socket_session):
                    return rpc_result(rid, {"tools": await self.episodes.tools(session)})
            name, arguments = params.get("name"), params.get("arguments", {})
            if not name or not isinstance(name, str):
                return rpc_error(rid, INVALID_PARAMS, "Missing 'name' in params")
            if not isinstance(arguments, dict):
                return rpc_error(rid, INVALID_PARAMS, "'arguments' must be an object")
            if session is None:
                return rpc_error(rid, INTERNAL_ERROR, NOT_RESET)
            async with _locked(session, socket_session):
                if env.openenv:
                    return _native_rpc(rid, await self.episodes.native_step(session, name, arguments))
                observation = await self.episodes.call_observation(
                    session, CallToolAction(tool_name=name, arguments=arguments))
            return rpc_result(rid, observation)
        except OpenEnvError as exc:
            if exc.code == CAPACITY_REACHED:
                return rpc_error(rid, SERVER_ERROR, exc.message, {"code": exc.code})
            return rpc_error(rid, INTERNAL_ERROR, exc.message, {"code": exc.code})
        except ValidationError as exc:
            return rpc_error(rid, INVALID_PARAMS, "Invalid params", validation_errors(exc))

    async def _mcp_create(self, caller: Caller, env: EnvHandle, params: dict,
                          socket_session: OpenEnvSession | None) -> str:
        if socket_session is not None:
            return socket_session.id
        reset = ResetData.model_validate(params) if RESET_KEYS & params.keys() else None
        session = self.episodes.mcp_open(caller, env)
        if reset is not None:  # an extension: the episode can start with the session
            try:
                await self.episodes.reset(session, reset)
            except BaseException:
                await self.episodes.mcp_close(session)
                raise
        return session.id

    async def _mcp_close(self, caller: Caller, env: EnvHandle, rid: Any, params: dict,
                         socket_session: OpenEnvSession | None) -> dict:
        target = params.get("session_id")
        if not target:
            return rpc_error(rid, INVALID_PARAMS, "Invalid params - 'session_id' is required")
        if socket_session is not None and target == socket_session.id:
            return rpc_error(rid, INVALID_REQUEST, "Cannot close active WebSocket-managed session via MCP method")
        session = self.episodes.mcp_session(caller, env, target)
        if session is None:
            return rpc_error(rid, INVALID_PARAMS, f"Unknown session_id: {target}")
        if session.attached:
            session.close_pending = True  # closed when its socket lets go
            return rpc_result(rid, {"session_id": target, "closed": False, "closing": True})
        async with session.lock:
            await self.episodes.mcp_close(session)
        return rpc_result(rid, {"session_id": target, "closed": True})

    # --- sockets (called by the consumer) --------------------------------------------------------

    async def open_socket_session(self, scope: dict, socket: Revocable) -> tuple[OpenEnvSession, bool]:
        """The socket's session and whether the socket owns it (else it is an attached MCP session).
        The socket is counted against its key's cap, and closed if the key stops passing."""
        try:
            token = extract_token(dict(scope["headers"]))
            caller = await self.gateway.authorize(token, Access.SESSIONS)
        except AuthError as exc:
            raise OpenEnvError(SESSION_ERROR, str(exc), status=exc.status,
                               close=CLOSE_FORBIDDEN if exc.status == 403 else CLOSE_UNAUTHORIZED) from None
        except UNAVAILABLE:
            raise OpenEnvError(SESSION_ERROR, "Temporarily unavailable; retry shortly.", close=CLOSE_TRY_AGAIN) from None
        ref = scope["url_route"]["kwargs"]["env"]
        env = await self.gateway.environment(caller, ref)
        if env is None:
            unknown = await self.gateway.unknown_environment(caller, ref)
            raise OpenEnvError(SESSION_ERROR, unknown.detail, status=404, close=CLOSE_NOT_FOUND)
        try:
            admit_environment(caller, env.environment_id, env.full_name)
        except AccessDenied as exc:
            raise OpenEnvError(SESSION_ERROR, str(exc), status=403, close=CLOSE_FORBIDDEN) from None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        session_id = (query.get("session_id") or [None])[0]
        if not session_id:
            try:
                run = run_name_clean(dict(scope["headers"]).get(RUN_HEADER.encode(), b"").decode("latin-1"))
            except BadRunName as exc:
                raise OpenEnvError(SESSION_ERROR, str(exc), status=400, close=CLOSE_POLICY) from None
            self.open_sockets.add(caller, token, socket)
            session = self.episodes.new_session(caller, env)
            session.run = run
            return session, True
        session = self.episodes.mcp_session(caller, env, session_id)
        if session is None:
            raise OpenEnvError(SESSION_ERROR, f"Unknown session_id: {session_id}", status=404, close=CLOSE_NOT_FOUND)
        if session.attached:
            raise OpenEnvError(SESSION_ERROR, f"Session {session_id} already has an attached WebSocket",
                               close=CLOSE_POLICY)
        self.open_sockets.add(caller, token, socket)
        session.attached = True
        return session, False

    async def release_socket_session(self, session: OpenEnvSession, *, owns: bool, socket: Revocable) -> None:
        self.open_sockets.remove(socket)
        if owns:
            await self.episodes.close(session)
            return
        session.attached = False
        if session.close_pending:
            await self.episodes.mcp_close(session)

    async def socket_frame(self, session: OpenEnvSession, raw: str | bytes,
                           guard: Uninterruptible) -> tuple[str | None, int | None]:
        """One client frame's answer (a frame to send, or None) and a close code (or None)."""
        try:
            message = bounded_json.loads(raw)
        except bounded_json.JsonRefused as exc:
            return dumps(error_frame(str(exc), INVALID_JSON)), None
        if not isinstance(message, dict):
            return dumps(error_frame("Invalid message: expected a JSON object", VALIDATION_ERROR)), None
        kind = message.get("type", "")
        async with session.lock:
            session.last_used = time.monotonic()
            try:
                if kind == "reset":
                    data = _frame_data(message, required=False)
                    reply = await self.episodes.reset(session, ResetData.model_validate(data), guard)
                    return dumps({"type": "observation", "data": reply}), None
                if kind == "step":
                    data = _frame_data(message, required=True)
                    if session.env.openenv.get("kind") == "step":  # its own action, validated by its model
                        reply = await self.episodes.native_step(session, STEP_TOOL, data)
                        return dumps({"type": "observation", "data": reply}), None
                    action = parse_action(data)
                    if isinstance(action, ListToolsAction):
                        reply = await self.episodes.list_tools(session)
                    else:
                        reply = await self.episodes.call_tool(session, action)
                    return dumps({"type": "observation", "data": reply}), None
                if kind == "state":
                    _no_extra(message, {"type"})
                    return dumps({"type": "state", "data": await self.episodes.state(session)}), None
                if kind == "close":
                    _no_extra(message, {"type"})
                    return None, CLOSE_NORMAL
                if kind == "mcp":
                    data = _frame_data(message, required=True)
                    reply = await self.rpc(session.caller, session.env, data, socket_session=session)
                    return dumps({"type": "mcp", "data": reply}), None
                return dumps(error_frame(f"Unknown message type: {kind}", UNKNOWN_TYPE)), None
            except ValidationError as exc:
                return dumps(error_frame("Invalid message", VALIDATION_ERROR, errors=validation_errors(exc))), None
            except OpenEnvError as exc:
                return dumps(exc.frame()), exc.close
            except Exception as exc:
                log.exception("openenv %s frame failed", kind)
                return dumps(error_frame(f"{type(exc).__name__}: {exc}", EXECUTION_ERROR)), None


def _native_rpc(rid: Any, observation: dict) -> dict:
    """``tools/call`` on an OpenEnv-SDK MCP environment, as its own server answers it: the tool's
    result (FastMCP's CallToolResult, whose ``data`` MCPToolClient returns), or its error."""
    fields = observation.get("observation") or {}
    error = fields.get("error")
    if error:
        return rpc_error(rid, INTERNAL_ERROR, str(error.get("message") if isinstance(error, dict) else error))
    return rpc_result(rid, fields.get("result"))


def _frame_data(message: dict, *, required: bool) -> Any:
    """A frame's ``data`` (upstream's message models forbid other keys)."""
    _no_extra(message, {"type", "data"})
    if "data" not in message:
        if required:
            raise OpenEnvError(VALIDATION_ERROR, "Invalid message", errors=[
                {"type": "missing", "loc": ["data"], "msg": "Field required", "input": message}])
        return {}
    if not isinstance(message["data"], dict):
        raise OpenEnvError(VALIDATION_ERROR, "Invalid message", errors=[
            {"type": "dict_type", "loc": ["data"], "msg": "Input should be a valid dictionary",
             "input": message["data"]}])
    return message["data"]


def _no_extra(message: dict, allowed: set[str]) -> None:
    extra = sorted(set(message) - allowed)
    if extra:
        raise OpenEnvError(VALIDATION_ERROR, "Invalid message", errors=[
            {"type": "extra_forbidden", "loc": [key], "msg": "Extra inputs are not permitted", "input": message[key]}
            for key in extra])


def _json(body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        return bounded_json.loads(body)
    except bounded_json.JsonRefused as exc:
        # FastAPI's shape for a body that is not JSON.
        raise Unprocessable([{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error",
                              "input": {}, "ctx": {"error": str(exc)}}]) from None


def _validated(model, body: Any, prefix: tuple[str, ...]):
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise Unprocessable(validation_errors(exc, prefix)) from None


class _locked:
    """A session's lock, unless the caller (a socket frame) already holds it."""

    def __init__(self, session: OpenEnvSession, held_by: OpenEnvSession | None) -> None:
        self.lock = None if held_by is session else session.lock

    async def __aenter__(self) -> None:
        if self.lock is not None:
            await self.lock.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        if self.lock is not None:
            self.lock.release()
