"""An OpenEnv session and what its messages do, in terms of the episode gateway.

An OpenEnv session is one WebSocket (its own), or one MCP session (``openenv/session/create``) that
a socket may attach to with ``/ws?session_id=``. Like upstream's ORS importer template, a session
holds at most one ORS episode at a time: ``reset`` ends the current one (if any) and creates the
next, on the task it names or the first split's task 0; tool calls run on the current episode;
``close`` (or the socket going away) ends it. Every episode is a gateway episode tagged
``protocol="openenv"``: recorded, limited, audited and redacted like an ORS one.

An environment written against OpenEnv's own SDK (``EnvHandle.openenv``, hosted by
sandbox/openenv_host.py) is served in its own terms instead: ``reset`` data are its
``reset`` arguments (the episode's task spec), a step is its own action (one ``step`` tool, or its
MCP tools) and the answers are its own serialized observations and state, which its worker hands
back with the prompt (the block's ``detail``) and with every result (``output.metadata``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from orsplatform.catalog.selectors import EnvHandle
from orsplatform.engine.errors import UNAVAILABLE, GatewayError, Unstorable
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.engine.hints import listed
from orsplatform.engine.live import LiveSession
from orsplatform.episodes.models import Session
from orsplatform.openenv.wire import (
    CAPACITY_REACHED,
    CLOSE_TRY_AGAIN,
    EXECUTION_ERROR,
    SESSION_ERROR,
    VALIDATION_ERROR,
    CallToolAction,
    OpenEnvError,
    ResetData,
    observation_data,
    tool_spec,
)
from orsplatform.runs.naming import BadRunName, run_name_clean
from orsplatform.teams.auth import Caller

log = logging.getLogger("orsplatform.openenv")

PROTOCOL = Session.Protocol.OPENENV
NOT_RESET = "Call reset() before invoking ORS tools"
STEP_TOOL = "step"  # a plain OpenEnv-SDK environment's one tool (openenv_host.STEP_TOOL)
NATIVE = "openenv"  # where an OpenEnv-SDK environment's worker puts its observation and state
# A tool's refusal (the worker's reason) as OpenEnv's ToolErrorType.
TOOL_ERROR_TYPES = {"not_found": "tool_not_found", "input_validation": "invalid_args", "timeout": "timeout",
                    "tool_not_found": "tool_not_found", "invalid_args": "invalid_args",
                    "transport_error": "transport_error"}
# MCP sessions a create looks at for sweeping: a constant, so a create costs the same with 100 or
# 20,000 others open (each create adds one and retires up to this many, so the registry keeps pace).
SWEEP_STEP = 2
# Setup normally finishes well within one gateway wait; a slow one gets a few more before the
# reset answers an error (OpenEnv clients wait 60 s per message by default).
SETUP_WAITS = 2


class Uninterruptible:
    """Marks the stretch of a reset that must not be cancelled (by a socket going away): from the
    gateway creating the episode to the session holding it, so its end is never lost."""

    def __init__(self) -> None:
        self.free = asyncio.Event()
        self.free.set()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        self.free.clear()
        try:
            yield
        finally:
            self.free.set()


@dataclass
class OpenEnvSession:
    id: str
    caller: Caller
    env: EnvHandle
    live: LiveSession | None = None
    episode_id: str | None = None
    step_count: int = 0
    task_spec: Any = None
    split: str | None = None
    index: int | None = None
    attached: bool = False  # a socket serves this (MCP) session now
    run: str | None = None  # the X-Run header its socket was opened with (reset's `run` wins)
    close_pending: bool = False  # openenv/session/close came while a socket held it
    native_state: dict[str, Any] | None = None  # an OpenEnv-SDK environment's state, as last reported
    # Its answers leave the state out (a container's: its server is asked for the state only when
    # a client asks, as OpenEnv's own client does): `state` asks the instance.
    state_on_request: bool = False
    last_used: float = field(default_factory=time.monotonic)
    # One message at a time, in order, whichever transport it came by.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def owned_by(self, caller: Caller, env: EnvHandle) -> bool:
        return self.caller.team_id == caller.team_id and self.env.environment_id == env.environment_id


def _native(holder: Any) -> dict[str, Any]:
    """The observation and state an OpenEnv-SDK environment's worker put in a block's detail or a
    result's metadata (empty when absent)."""
    native = holder.get(NATIVE) if isinstance(holder, dict) else None
    return native if isinstance(native, dict) else {}


def gateway_error(exc: GatewayError, *, creating: bool = False) -> OpenEnvError:
    """A gateway refusal in OpenEnv's codes."""
    if exc.status == 429 and creating:
        # The team is at its open-session limit: upstream answers this and closes the socket.
        return OpenEnvError(CAPACITY_REACHED, exc.detail, close=CLOSE_TRY_AGAIN, status=429,
                            retry_after=exc.headers.get("Retry-After"))
    if exc.status == 400:
        return OpenEnvError(VALIDATION_ERROR, exc.detail, status=400)
    if exc.status in (404, 410):
        return OpenEnvError(SESSION_ERROR, exc.detail, status=exc.status)
    return OpenEnvError(EXECUTION_ERROR, exc.detail, status=exc.status)


class Episodes:
    """reset / step / state / close of OpenEnv sessions, and the registry of MCP sessions."""

    def __init__(self, gateway: EpisodeGateway) -> None:
        self.gateway = gateway
        # In sweep order (oldest looked-at first): an OrderedDict, whose first entry and
        # move_to_end are O(1) however many were removed before (a dict's first entry is not).
        self.mcp_sessions: OrderedDict[str, OpenEnvSession] = OrderedDict()
        self.mcp_per_key: dict[int | None, int] = {}

    def new_session(self, caller: Caller, env: EnvHandle) -> OpenEnvSession:
        return OpenEnvSession(id=str(uuid.uuid4()), caller=caller, env=env)

    # --- MCP sessions ---------------------------------------------------------------------------

    def mcp_open(self, caller: Caller, env: EnvHandle) -> OpenEnvSession:
        """A new MCP session, or CAPACITY_REACHED past the key's ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY."""
        self._sweep()
        limit = settings.ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY
        held = self.mcp_per_key.get(caller.api_key_id, 0)
        if held >= limit:
            raise OpenEnvError(CAPACITY_REACHED, f"This API key has {held} MCP sessions open here (limit {limit}); "
                                                 "close one first.", close=CLOSE_TRY_AGAIN, status=429)
        session = self.new_session(caller, env)
        self.mcp_sessions[session.id] = session
        self.mcp_per_key[caller.api_key_id] = held + 1
        return session

    def _forget(self, session: OpenEnvSession) -> None:
        if self.mcp_sessions.pop(session.id, None) is None:
            return
        key = session.caller.api_key_id
        left = self.mcp_per_key.get(key, 1) - 1
        if left > 0:
            self.mcp_per_key[key] = left
        else:
            self.mcp_per_key.pop(key, None)

    def mcp_session(self, caller: Caller, env: EnvHandle, session_id: Any) -> OpenEnvSession | None:
        """The caller's MCP session on this environment (another team's answers as unknown)."""
        session = self.mcp_sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None or not session.owned_by(caller, env):
            return None
        session.last_used = time.monotonic()
        return session

    async def mcp_close(self, session: OpenEnvSession) -> None:
        self._forget(session)
        await self.close(session)

    def _sweep(self) -> None:
        # MCP sessions whose episode the gateway has ended (idle expiry) and that no socket holds,
        # or that never reset and were left: forgotten, so the registry stays bounded. Only the
        # SWEEP_STEP oldest-looked-at are looked at, then go to the back: the sweep goes round the
        # registry over successive creates instead of walking all of it on each.
        horizon = time.monotonic() - settings.ORS_IDLE_TIMEOUT_SECONDS
        for _ in range(min(SWEEP_STEP, len(self.mcp_sessions))):
            session = next(iter(self.mcp_sessions.values()))
            gone = session.live is not None and session.live.deleted and session.live.sid not in self.gateway.sessions
            if not session.attached and (gone or (session.live is None and session.last_used < horizon)):
                self._forget(session)
            else:
                self.mcp_sessions.move_to_end(session.id)

    # --- messages -------------------------------------------------------------------------------

    async def reset(self, session: OpenEnvSession, data: ResetData,
                    guard: Uninterruptible | None = None) -> dict[str, Any]:
        gw, env, caller = self.gateway, session.env, session.caller
        if caller.max_open_sessions is None:
            # The previous episode's end (its row, its teardown) need not delay the next one's
            # start; a team with a session limit waits for it, so its freed slot is there to take.
            previous, session.live = session.live, None
            if previous is not None:
                gw.spawn(self._end(caller, previous))
        else:
            await self.close(session)
        split, index, task_spec = data.split, data.index, data.task_spec
        if env.openenv and task_spec is None and split is None and index is None:
            task_spec = data.reset_kwargs() or None  # the environment's own reset arguments
        if task_spec is None:
            if split is None and index is None:
                if not env.split_order:
                    raise OpenEnvError(VALIDATION_ERROR, "The environment has no splits; give a task_spec.")
                split, index = env.split_order[0], 0
            elif split is None or index is None:
                raise OpenEnvError(VALIDATION_ERROR, "split and index (or task_index) must be provided together; "
                                                     f"the splits are: {listed(env.split_order)}.")
            task_spec = await self._guard(gw.task_spec(env, split, index))
        else:
            split = index = None
        try:
            run = run_name_clean(data.run) or session.run
        except BadRunName as exc:
            raise OpenEnvError(VALIDATION_ERROR, str(exc)) from None
        sid = gw.open_session(caller, secrets={})
        with guard.hold() if guard is not None else contextlib.nullcontext():
            live = await self._guard(gw.create_episode(
                caller, sid=sid, env=env, task_spec=task_spec if split is None else None, split=split,
                index=index, secrets=data.secret_values(), protocol=PROTOCOL, run=run), creating=True)
            session.live = live
        session.step_count = 0
        session.episode_id = data.episode_id or sid
        # The observation carries the task as the caller may see it (hidden fields never: an adapter
        # that hands str(observation) to the model must not hand it the answer), and where a task
        # object was matched back to, the split and index it is.
        session.task_spec, session.split, session.index = live.task_public, live.split or None, live.index
        try:
            blocks = await self._prompt(live)
        except OpenEnvError:
            await self.close(session)
            raise
        if env.openenv:
            native = _native(blocks[0].get("detail") if blocks and isinstance(blocks[0], dict) else None)
            session.native_state, session.state_on_request = native.get("state"), "state" not in native
            return native.get("observation") or observation_data({"metadata": {}}, None, False)
        metadata = {"source_type": "ors", "original_env_class": env.entrypoint.rpartition(":")[2],
                    "environment": f"{env.full_name}@{env.version_number}", "session_id": sid,
                    "episode_id": session.episode_id, "task_spec": session.task_spec, "split": session.split,
                    "index": session.index,
                    "prompt": blocks}
        return observation_data({"metadata": metadata}, None, False, metadata)

    async def _prompt(self, live: LiveSession) -> list[dict]:
        for attempt in range(SETUP_WAITS):
            try:
                return await self.gateway.prompt(live)
            except GatewayError as exc:
                if exc.status != 503 or exc.headers.get("X-Backend-State") != "starting" or attempt + 1 == SETUP_WAITS:
                    raise gateway_error(exc) from None
        raise AssertionError("unreachable")

    async def tools(self, session: OpenEnvSession) -> list[dict[str, Any]]:
        """The session's tools: the episode's (shared and task) after a reset, the shared ones before
        (upstream lists tools without a reset)."""
        if session.live is None:
            return [tool_spec(t) for t in session.env.tools]
        live = await self._current(session)
        return [tool_spec(t) for t in await self._guard(self.gateway.tools(live))]

    async def list_tools(self, session: OpenEnvSession) -> dict[str, Any]:
        return observation_data({"metadata": {}, "tools": await self.tools(session)}, None, False)

    async def call_observation(self, session: OpenEnvSession, action: CallToolAction) -> dict[str, Any]:
        """The ``CallToolObservation`` of one tool call (its fields, reward and done included)."""
        if session.live is None:
            raise OpenEnvError(EXECUTION_ERROR, NOT_RESET)
        live = await self._current(session)
        entry = await self._guard(self.gateway.call(session.caller, live, action.tool_name, action.arguments))
        result, exception = entry.outcome()
        session.step_count += 1
        if exception is not None:
            raise OpenEnvError(EXECUTION_ERROR, exception)
        if result is None or not result.get("ok"):
            message = str((result or {}).get("error") or "ORS tool call failed")
            # After the episode finished every call is refused: done stays true, or a trainer's
            # `while not done` loop would spin on the refusals.
            done = (result or {}).get("reason") == "episode_finished"
            return {"done": done, "reward": None, "metadata": {}, "tool_name": action.tool_name, "result": None,
                    "error": {"error_type": "execution_error", "message": message}}
        output = result["output"]
        metadata = output.get("metadata") or {}
        return {"done": bool(output.get("finished")), "reward": output.get("reward"), "metadata": metadata,
                "tool_name": action.tool_name,
                "result": {"blocks": output.get("blocks") or [], "metadata": metadata}, "error": None}

    async def native_step(self, session: OpenEnvSession, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One step of an OpenEnv-SDK environment: its serialized observation ({observation, reward,
        done, metadata?}). A session without an episode gets one first (OpenEnv's sessions hold an
        instance from their start, so a tool may be called before any reset)."""
        if session.live is None:
            await self.reset(session, ResetData())
        live = await self._current(session)
        entry = await self._guard(self.gateway.call(session.caller, live, tool_name, arguments))
        result, exception = entry.outcome()
        session.step_count += 1
        if exception is not None:
            raise OpenEnvError(EXECUTION_ERROR, exception)
        if result is None or not result.get("ok"):
            message = str((result or {}).get("error") or "The step failed")
            reason = str((result or {}).get("reason") or "execution_error")
            if session.env.openenv.get("kind") != "mcp":
                code = VALIDATION_ERROR if reason == "input_validation" else EXECUTION_ERROR
                raise OpenEnvError(code, message)
            return observation_data({"metadata": {}, "tool_name": tool_name, "result": None,
                                     "error": {"error_type": TOOL_ERROR_TYPES.get(reason, "execution_error"),
                                               "message": message}}, None, False)
        native = _native(result["output"].get("metadata"))
        if "state" in native:
            session.native_state = native["state"]
        elif session.state_on_request:
            session.native_state = None  # changed by the step: asked for again when wanted
        return native.get("observation") or observation_data({"metadata": {}}, None, False)

    async def call_tool(self, session: OpenEnvSession, action: CallToolAction) -> dict[str, Any]:
        if session.env.openenv:
            return await self.native_step(session, action.tool_name, action.arguments)
        observation = await self.call_observation(session, action)
        reward, done = observation.pop("reward"), observation.pop("done")
        return observation_data(observation, reward, done, observation["metadata"])

    async def state(self, session: OpenEnvSession) -> dict[str, Any]:
        if session.env.openenv and session.live is not None and session.state_on_request \
                and session.native_state is None:
            live = await self._current(session)
            session.native_state = await self._guard(self.gateway.native_state(live))
        if session.env.openenv and session.live is not None and session.native_state is not None:
            return session.native_state
        state: dict[str, Any] = {"episode_id": session.episode_id, "step_count": session.step_count}
        if session.live is not None:
            state.update(source_type="ors", original_env_class=session.env.entrypoint.rpartition(":")[2],
                         session_id=session.live.sid, environment=session.env.full_name,
                         task_spec=session.task_spec, split=session.split, index=session.index)
        return state

    async def close(self, session: OpenEnvSession) -> None:
        """End the session's episode, if any (teardown and the audit row closed by the gateway)."""
        live, session.live = session.live, None
        session.native_state, session.state_on_request = None, False
        if live is not None:
            await self._end(session.caller, live)

    async def _end(self, caller: Caller, live: LiveSession) -> None:
        if live.deleted:
            return
        try:
            await self.gateway.end(caller, live.sid)
        except GatewayError:
            pass  # already gone (expired, lost): nothing left to end
        except UNAVAILABLE as exc:
            # The row stays open; the reaper expires it once the database is back.
            log.warning("could not end openenv episode %s: %s", live.sid, exc)

    # --- helpers --------------------------------------------------------------------------------

    async def _current(self, session: OpenEnvSession) -> LiveSession:
        assert session.live is not None
        live = session.live
        if live.deleted or self.gateway.live(session.caller, live.sid) is None:
            # Ended underneath the session (idle expiry, a lost runner): the gateway says how.
            try:
                live = await self.gateway.session(session.caller, live.sid)
            except GatewayError as exc:
                session.live = None
                raise gateway_error(exc) from None
        return live

    @staticmethod
    async def _guard(awaitable, *, creating: bool = False):
        try:
            return await awaitable
        except GatewayError as exc:
            raise gateway_error(exc, creating=creating) from None
        except Unstorable:
            raise OpenEnvError(VALIDATION_ERROR, "The request holds a value that cannot be stored "
                                                 "(such as a NUL character).") from None
        except UNAVAILABLE as exc:
            log.warning("backing service unavailable: %s: %s", type(exc).__name__, exc)
            raise OpenEnvError(EXECUTION_ERROR, "Temporarily unavailable; retry shortly.", status=503) from None
