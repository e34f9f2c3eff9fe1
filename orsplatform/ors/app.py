"""The ORS surface as a lean ASGI application: routing, authentication and the ORS wire (status
codes, SSE framing). Episodes themselves live in the gateway (``orsplatform/engine/``).

Routing is a dictionary lookup on the last path segment; everything before it names the
environment (``/{slug}/tools``, ``/{team}/{slug}@3/tools``). Handlers live in ``discovery.py``,
``lifecycle.py`` and ``calls.py``; each takes the gateway, never this app.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from orsplatform.engine.errors import UNAVAILABLE, GatewayError, Unstorable
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.ors import calls, discovery, lifecycle
from orsplatform.ors.http import HttpError, Request, read_body, send_error, send_json
from orsplatform.teams.auth import Access, AuthError, Caller, extract_token

log = logging.getLogger("orsplatform.ors")

Handler = Callable[[EpisodeGateway, Request, Caller, str | None], Awaitable[Any]]

OPEN, C, S = Access.OPEN, Access.CATALOG, Access.SESSIONS
# op -> (method, handler, access)
ROUTES: dict[str, tuple[str, Handler, Access]] = {
    "health": ("GET", discovery.health, OPEN),
    "version": ("GET", discovery.version, C),
    "list_environments": ("GET", discovery.list_environments, C),
    "tools": ("GET", discovery.tools, C),
    "splits": ("GET", discovery.splits, C),
    "tasks": ("POST", discovery.tasks, C),
    "num_tasks": ("POST", discovery.num_tasks, C),
    "task": ("POST", discovery.task, C),
    "task_range": ("POST", discovery.task_range, C),
    "create_session": ("POST", lifecycle.create_session, S),
    "create": ("POST", lifecycle.create, S),
    "ping": ("POST", lifecycle.ping, S),
    "delete": ("POST", lifecycle.delete, S),
    "delete_session": ("POST", lifecycle.delete_session, S),
    "prompt": ("GET", lifecycle.prompt, S),
    "task_tools": ("GET", lifecycle.task_tools, S),
    "call": ("POST", calls.call, S),
}


class OrsApp:
    def __init__(self, *, gateway: EpisodeGateway | None = None) -> None:
        self.gateway = gateway or EpisodeGateway()

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        self.gateway.ensure_background()
        headers = dict(scope["headers"])
        req = Request(scope=scope, receive=receive, send=send, method=scope["method"], path=scope["path"],
                      headers=headers)
        try:
            await self._handle(req)
        except GatewayError as exc:
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
        # Who calls is known from the headers: a caller who may not is refused before any body is
        # read, and an anonymous one (where the settings allow it) gets the small Django limit.
        try:
            token = extract_token(req.headers) if access is not Access.OPEN else None
            caller = await self.gateway.authorize(token, access)
        except AuthError as exc:
            raise HttpError(exc.status, str(exc)) from None
        if req.method == "POST":
            limit = settings.ORS_MAX_REQUEST_BYTES if caller.is_anonymous else settings.ORS_MAX_BODY_BYTES
            req.body = await read_body(req.receive, limit, req.headers.get(b"content-length"))
        result = await handler(self.gateway, req, caller, env_ref)
        if not req.started:
            await send_json(req.send, 200, result)

    async def shutdown(self) -> None:
        await self.gateway.shutdown()

    async def lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # At start, not at the first request: a restarted platform's spares (containers/
                # warm.py) are running before the first session asks for one.
                self.gateway.ensure_background()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
