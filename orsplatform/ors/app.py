"""The ORS surface as a lean ASGI application.

Routing is a dictionary lookup on the last path segment; everything before it names the
environment (``/{slug}/tools``, ``/{team}/{slug}@3/tools``). Handlers live in ``discovery.py``,
``episodes.py`` and ``calls.py``; their database access goes through ``store.py``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from orsplatform.catalog.selectors import EnvHandle
from orsplatform.episodes.models import Session
from orsplatform.ors import calls, discovery, episodes
from orsplatform.ors.http import HttpError, Request, read_body, send_error, send_json
from orsplatform.ors.limits import Limits
from orsplatform.ors.sessions import LiveSession, PendingSid, instance_gone
from orsplatform.ors.store import Store, StoreUnavailable, Unstorable
from orsplatform.ors.wire import require_sid
from orsplatform.runners.executor import Executor, SetupFailed, SetupPending, UnknownSession
from orsplatform.teams.auth import ANONYMOUS, AuthError, Caller, extract_token

log = logging.getLogger("orsplatform.ors")

# team/slug@N as a client may write it; anything else names no environment (and never reaches SQL).
ENV_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}(/[A-Za-z0-9][A-Za-z0-9._-]{0,62})?(@[0-9]{1,9})?$")

Handler = Callable[["OrsApp", Request, Caller, str | None], Awaitable[Any]]

# op -> (method, handler, access): access is "open" (no auth), "catalog" or "session".
ROUTES: dict[str, tuple[str, Handler, str]] = {
    "health": ("GET", discovery.health, "open"),
    "version": ("GET", discovery.version, "catalog"),
    "list_environments": ("GET", discovery.list_environments, "catalog"),
    "tools": ("GET", discovery.tools, "catalog"),
    "splits": ("GET", discovery.splits, "catalog"),
    "tasks": ("POST", discovery.tasks, "catalog"),
    "num_tasks": ("POST", discovery.num_tasks, "catalog"),
    "task": ("POST", discovery.task, "catalog"),
    "task_range": ("POST", discovery.task_range, "catalog"),
    "create_session": ("POST", episodes.create_session, "session"),
    "create": ("POST", episodes.create, "session"),
    "ping": ("POST", episodes.ping, "session"),
    "delete": ("POST", episodes.delete, "session"),
    "delete_session": ("POST", episodes.delete_session, "session"),
    "prompt": ("GET", episodes.prompt, "session"),
    "task_tools": ("GET", episodes.task_tools, "session"),
    "call": ("POST", calls.call, "session"),
}


def _host_env(req: Request) -> str | None:
    """A per-environment host name: `wordle.ors.example.com` names `wordle`, and
    `acme--maze.ors.example.com` names `acme/maze` (for clients that cannot name the environment,
    like ors.client's split+index sessions)."""
    host = (req.header(b"host") or "").split(":", 1)[0]
    labels = host.split(".")
    if len(labels) < 3 or labels[0].isdigit():
        return None
    return labels[0].replace("--", "/", 1)


def make_executor() -> Executor:
    if settings.ORS_EXECUTOR == "inline":
        from orsplatform.runners.inline import InlineExecutor

        return InlineExecutor(threads=settings.ORS_TOOL_THREADS)
    if settings.ORS_EXECUTOR == "celery":
        from orsplatform.runners.remote import CeleryExecutor

        return CeleryExecutor()
    raise RuntimeError(f"Unknown ORS_EXECUTOR {settings.ORS_EXECUTOR!r}")


def _unavailable_errors() -> tuple[type[BaseException], ...]:
    """Errors meaning a backing service (database, Redis, broker) is down: answer 503, not 500."""
    import kombu.exceptions
    import redis

    return (StoreUnavailable, redis.RedisError, kombu.exceptions.OperationalError, ConnectionRefusedError)


UNAVAILABLE = _unavailable_errors()


class OrsApp:
    def __init__(self, *, executor: Executor | None = None, store: Store | None = None) -> None:
        self.executor = executor or make_executor()
        self.store = store or Store(threads=1 if "sqlite" in settings.DATABASES["default"]["ENGINE"] else 4)
        self.limits = Limits()
        self.sessions: dict[str, LiveSession] = {}
        self.pending: dict[str, PendingSid] = {}
        self._reaper: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    # --- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        self._ensure_reaper()
        headers = dict(scope["headers"])
        req = Request(scope=scope, receive=receive, send=send, method=scope["method"], path=scope["path"],
                      headers=headers)
        try:
            await self._handle(req)
        except HttpError as exc:
            if not req.started:
                await send_error(send, exc)
        except Unstorable:
            if not req.started:
                await send_error(send, HttpError(400, "The request holds a value that cannot be stored "
                                                      "(such as a NUL character)."))
        except UNAVAILABLE as exc:
            log.warning("backing service unavailable: %s: %s", type(exc).__name__, exc)
            if not req.started:
                await send_error(send, HttpError(503, "Temporarily unavailable; retry shortly.",
                                                 {"Retry-After": "2"}))
        except ConnectionResetError:
            pass
        except Exception:
            log.exception("unhandled error on %s %s", req.method, req.path)
            if not req.started:
                await send_error(send, HttpError(500, "Internal server error."))

    async def _handle(self, req: Request) -> None:
        if sum(len(k) + len(v) for k, v in req.headers.items()) > settings.ORS_MAX_HEADER_BYTES:
            raise HttpError(431, "Request headers are too large.")
        segments = req.path.strip("/").split("/")
        op = segments[-1]
        env_ref = "/".join(segments[:-1]) or None
        route = ROUTES.get(op)
        if route is None or (env_ref is not None and len(segments) > 3):
            raise HttpError(404, "Not found.")
        method, handler, access = route
        if req.method != method and not (method == "GET" and req.method == "HEAD"):
            raise HttpError(405, f"Method not allowed; use {method}.", {"Allow": method})
        if req.method == "POST":
            req.body = await read_body(req.receive, settings.ORS_MAX_BODY_BYTES, req.headers.get(b"content-length"))
        caller = await self._authenticate(req, access)
        result = await handler(self, req, caller, env_ref)
        if not req.started:
            await send_json(req.send, 200, result)

    async def _authenticate(self, req: Request, access: str) -> Caller:
        if access == "open":
            return ANONYMOUS
        try:
            token = extract_token(req.headers)
            if token is not None:
                caller = await self.store.authenticate(token)
                if access == "session" and not caller.can("sessions"):
                    raise HttpError(403, "This API key may not run sessions (missing scope 'sessions').")
                return caller
        except AuthError as exc:
            raise HttpError(401, str(exc)) from None
        allowed = settings.ORS_ANONYMOUS_CATALOG if access == "catalog" else settings.ORS_ANONYMOUS_SESSIONS
        if not allowed:
            raise HttpError(401, "An API key is required (X-API-Key or Authorization: Bearer).")
        return ANONYMOUS

    # --- environments -------------------------------------------------------------------------

    async def environment_for(self, req: Request, caller: Caller, env_ref: str | None,
                              body_env: str | None = None) -> EnvHandle:
        """X-Deployment first, then the path, then the body's env_name, then a per-environment
        host name, then the key's bound environment, then the configured default."""
        deployment = req.header(b"x-deployment")
        if deployment is not None and deployment.strip():
            env = await self.store.environment(caller, deployment.strip()) if ENV_REF_RE.match(
                deployment.strip()) else None
            if env is None:
                raise HttpError(404, "Deployment not found.")
            return env
        host_ref = _host_env(req)
        if not env_ref and not body_env and host_ref and ENV_REF_RE.match(host_ref):
            env = await self.store.environment(caller, host_ref)
            if env is not None:  # a host name that names no environment is just a host name
                return env
        for ref in (env_ref, body_env):
            if ref:
                env = await self.store.environment(caller, ref) if ENV_REF_RE.match(ref) else None
                if env is None:
                    raise HttpError(404, f"Environment {ref!r} not found.")
                return env
        if caller.environment_id is not None:
            env = await self.store.environment_by_id(caller, caller.environment_id)
            if env is not None:
                return env
        if settings.ORS_DEFAULT_ENVIRONMENT:
            env = await self.store.environment(caller, settings.ORS_DEFAULT_ENVIRONMENT)
            if env is not None:
                return env
        raise HttpError(404, "No environment named and no default environment is available.")

    # --- sessions -----------------------------------------------------------------------------

    async def place_session(self, caller: Caller) -> str:
        from orsplatform.runners.remote import NoRunnerAvailable

        try:
            return await self.executor.place(caller.team_slug)
        except NoRunnerAvailable:
            raise HttpError(503, "No runner is available; retry shortly.", {"Retry-After": "5"}) from None

    async def live_session(self, req: Request, caller: Caller, env_ref: str | None = None) -> LiveSession:
        """The caller's open session named by X-Session-ID, or the right 4xx for it. When the path
        names an environment other than the session's, that is an error (a client that started the
        session on another environment than it now addresses), not silently ignored."""
        live = await self._live_session(req, caller)
        if env_ref and ENV_REF_RE.match(env_ref):
            named = await self.store.environment(caller, env_ref)
            if named is not None and named.environment_id != live.env.environment_id:
                raise HttpError(404, f"Session {live.sid} runs {live.env.full_name}, not {env_ref}.")
        return live

    async def _live_session(self, req: Request, caller: Caller) -> LiveSession:
        sid = require_sid(req)
        live = self.sessions.get(sid)
        if live is not None and live.team_id == caller.team_id and live.adopted_at is not None and (
                time.monotonic() - live.adopted_at > settings.ORS_SESSION_CACHE_SECONDS):
            # Another gateway may have ended it since: read the row again (keeping this gateway's
            # unflushed activity if it is still open).
            row = await self.store.session_for(caller, sid)
            if row is not None and row.status in (Session.Status.CREATING, Session.Status.READY):
                live.adopted_at = time.monotonic()
            else:
                self.sessions.pop(sid, None)
                self.executor.detach(sid)
                if live.holds_slot:  # ended elsewhere (another gateway, the beat): free its slot now
                    await self.limits.release_session(live.team_id, sid)
                raise await self.session_gone_error(caller, sid)
        if live is None and self.executor.shared:
            live = await self.adopt(caller, sid)
        if live is not None and live.team_id == caller.team_id and not live.deleted:
            live.touch()
            return live
        raise await self.session_gone_error(caller, sid)

    async def adopt(self, caller: Caller, sid: str) -> LiveSession | None:
        """A session created by another gateway, served here too (shared executors only): from
        the executor's record of it when there is one (no database read), else from its row."""
        record = await self.executor.shared_record(sid)
        if record is not None and record.get("pk") is not None:
            if record.get("team") != caller.team_id or record.get("state") not in ("starting", "ready"):
                return None  # another team's, or ended: the caller gets the row's answer
            pk, version_id, runner = record["pk"], record["version"], record["runner"]
            holds_slot = record.get("slot", True)
        else:
            row = await self.store.session_for(caller, sid)
            if row is None or row.status not in (Session.Status.CREATING, Session.Status.READY):
                return None
            pk, version_id, runner = row.pk, row.version_id, row.runner
            holds_slot = True  # not known here: releasing a slot never taken is harmless
        env = await self.store.version(version_id)
        if env is None:
            return None
        live = LiveSession(sid=sid, pk=pk, team_id=caller.team_id, env=env, runner=runner,
                           adopted_at=time.monotonic(), holds_slot=holds_slot)
        self.executor.attach(sid, runner)
        self.sessions[sid] = live
        return live

    async def session_gone_error(self, caller: Caller, sid: str) -> HttpError:
        row = await self.store.session_for(caller, sid)
        if row is None:
            return HttpError(404, "Session not found.")
        if row.status == Session.Status.DELETED:
            return HttpError(410, "Session was deleted.")
        if row.status == Session.Status.EXPIRED:
            minutes = settings.ORS_IDLE_TIMEOUT_SECONDS / 60
            return HttpError(404, f"Session expired after {minutes:g} minutes without activity.")
        if row.status == Session.Status.FAILED:
            return HttpError(500, f"Environment setup failed: {row.error}")
        # Open in the database but not held here: the process that held it is gone.
        return HttpError(410, "Session lost: the runner that held it stopped.")

    async def ready(self, live: LiveSession) -> None:
        try:
            await self.executor.wait_ready(live.sid, settings.ORS_SETUP_WAIT_SECONDS)
        except SetupPending:
            raise HttpError(503, "Environment is still starting; retry shortly.",
                            {"X-Backend-State": "starting", "Retry-After": "2"}) from None
        except SetupFailed as exc:
            raise HttpError(500, f"Environment setup failed: {exc}") from None
        except UnknownSession as exc:
            raise instance_gone(exc) from None

    async def end_session(self, live: LiveSession, status: str) -> None:
        live.deleted = True  # no new request for it from here on
        # With a shared executor other gateways may have served calls: totals come from the audit log.
        totals = None if self.executor.shared else live.totals()
        try:
            # The row first: while the database is down the request fails (503) and the session is
            # left as it was (instance included), so the client's retried /delete finds it intact.
            await self.store.session_end(live.pk, status, live.last_activity_at(), totals, live.ready_at)
        except BaseException:
            live.deleted = False
            raise
        self.sessions.pop(live.sid, None)
        if live.holds_slot:
            await self.limits.release_session(live.team_id, live.sid)
        await self.executor.stop(live.sid)

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # --- background work ----------------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        # Started on the first request, since not every ASGI server sends lifespan events.
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        last_flush = time.monotonic()
        while True:
            await asyncio.sleep(min(settings.ORS_REAPER_INTERVAL_SECONDS, settings.ORS_ACTIVITY_FLUSH_SECONDS))
            try:
                await self.reap_once()
                if time.monotonic() - last_flush >= settings.ORS_ACTIVITY_FLUSH_SECONDS:
                    await self.flush_activity()
                    last_flush = time.monotonic()
            except StoreUnavailable as exc:  # an outage: one line per pass, not a traceback
                log.warning("reaper pass skipped: database unavailable (%s)", (str(exc).splitlines() or [""])[0][:200])
            except Exception:
                log.exception("reaper pass failed")

    async def reap_once(self) -> None:
        now = time.monotonic()
        timeout = settings.ORS_IDLE_TIMEOUT_SECONDS
        for live in list(self.sessions.values()):
            if live.adopted_at is not None and now - live.adopted_at > max(timeout, 60):
                self.sessions.pop(live.sid, None)  # a cached copy nobody asked for in a long while
                self.executor.detach(live.sid)
                continue
            if self.executor.shared:
                # Idle expiry is the beat's job (it sees every gateway's activity). A call running
                # here is activity: flushed like any other, so no session expires under a long call.
                if live.busy():
                    live.touch()
            elif now - live.last_activity > timeout and not live.busy():
                log.info("session %s expired after %.0f s idle", live.sid, now - live.last_activity)
                await self.end_session(live, Session.Status.EXPIRED)
                continue
            linger = settings.ORS_RESULT_LINGER_SECONDS
            for task_id, entry in list(live.calls.items()):
                if entry.finished_at is not None and now - entry.finished_at > linger:
                    live.calls.pop(task_id, None)
        for sid, pending in list(self.pending.items()):
            if now - pending.created > max(timeout, 600):
                self.pending.pop(sid, None)

    async def flush_activity(self) -> None:
        changed = [live for live in self.sessions.values()
                   if live.last_activity != live.flushed_activity or (live.ready_at and not live.ready_flushed)]
        await self.store.flush_activity({live.pk: (live.last_activity_at(), live.ready_at) for live in changed})
        await self.limits.renew([(live.team_id, live.sid) for live in self.sessions.values()
                                 if live.team_id is not None])
        for live in changed:
            live.flushed_activity = live.last_activity
            live.ready_flushed = live.ready_at is not None

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self.executor.shared:
            # The sessions live on runner nodes and outlive this gateway; just record activity.
            await self.flush_activity()
            self.sessions.clear()
        for live in list(self.sessions.values()):
            try:
                await self.end_session(live, Session.Status.LOST)
            except Exception:
                log.exception("could not end session %s at shutdown", live.sid)
        await self.executor.close()
        await self.limits.close()
        await self.store.aclose()
        self.store.close()

    async def lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
