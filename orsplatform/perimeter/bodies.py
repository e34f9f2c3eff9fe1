"""Request bodies on Django's paths, limited by the bytes actually received.

Django's ASGI handler reads a whole body into a temporary file (on disk past
FILE_UPLOAD_MAX_MEMORY_SIZE) before any middleware or view runs, so a limit in a view comes too
late and a Content-Length check alone lets any chunked body through. Here every Django request may
send ORS_MAX_REQUEST_BYTES (below the spooling threshold: nothing reaches the disk); only the upload
routes, POSTed by a caller who may publish to the team in the path (a signed-in member who is not a
viewer, or a team API key with the publish scope), may send up to the package or task-file limit.
Past the limit the answer is 413 {"detail"} with `Connection: close` (after reading and dropping up
to DRAIN_BYTES more, so a client still sending reads the answer rather than a reset), and Django
is told the client went away, so it stops reading and answers nothing itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from importlib import import_module

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings

# Multipart framing and the form's other fields around the file itself.
UPLOAD_SLACK = 1024 * 1024
# How much of a refused body is still read (and dropped) so the client reads its 413.
DRAIN_BYTES = 8 * 1024 * 1024
_SLUG = r"[-a-zA-Z0-9_]+"
ROLLOUTS_PATH = "/v1/rollouts"


@dataclass(frozen=True)
class UploadRoute:
    pattern: re.Pattern[str]
    limit_setting: str  # the settings name of the file's limit ("A+B": two files, such as package and data)
    by_key: bool  # the REST API (API keys) rather than the console (signed-in users)

    def limit(self) -> int:
        return sum(getattr(settings, name) for name in self.limit_setting.split("+")) + UPLOAD_SLACK


UPLOAD_ROUTES = (
    UploadRoute(re.compile(rf"^/console/(?P<team>{_SLUG})/environments/publish$"), "ORS_MAX_PACKAGE_BYTES", False),
    UploadRoute(re.compile(rf"^/console/(?P<team>{_SLUG})/environments/tasks$"), "ORS_MAX_TASK_FILE_BYTES", False),
    UploadRoute(re.compile(r"^/api/v1/environments/(?P<team>[^/]+)/[^/]+/versions$"),
                "ORS_MAX_PACKAGE_BYTES+ORS_MAX_DATA_ARCHIVE_BYTES", True),
    UploadRoute(re.compile(r"^/api/v1/environments/(?P<team>[^/]+)/[^/]+/splits/[^/]+/tasks$"),
                "ORS_MAX_TASK_FILE_BYTES", True),
)


def _upload_route(scope) -> tuple[UploadRoute, str] | None:
    if scope["method"] != "POST":
        return None
    for route in UPLOAD_ROUTES:
        match = route.pattern.match(scope["path"])
        if match is not None:
            return route, match["team"]
    return None


def declared_length(scope) -> int | None:
    """Content-Length, or None when absent or unreadable (chunked: only the bytes received tell)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def send_too_large(send, limit: int) -> None:
    body = json.dumps({"detail": f"Request body is larger than {limit} bytes."}).encode()
    # Connection: close, so the server stops reading the rest instead of draining it.
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


async def drain(receive, budget: int) -> None:
    """Read and drop the rest of a refused body, up to `budget` bytes: a client (or nginx streaming
    the body) that is still sending when the server closes gets a reset instead of the 413. A
    longer body is cut (Connection: close)."""
    dropped = 0
    while dropped <= budget:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _key_may_publish(token: str, team: str) -> bool:
    from orsplatform.teams.auth import AuthError, identify

    try:
        caller = identify(token)
    except AuthError:
        return False
    return caller.team_slug == team and caller.can("publish")


def _member_may_publish(session_key: str, team: str) -> bool:
    # django.contrib.auth.get_user's checks (the user, its session hash), without its side effects
    # on the session (flush, key rotation): the view's own request does those.
    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.utils.crypto import constant_time_compare

    from orsplatform.teams.models import Membership

    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user_id, session_hash = session.get(SESSION_KEY), session.get(HASH_SESSION_KEY)
    if user_id is None or not session_hash:
        return False
    user = get_user_model()._default_manager.filter(pk=user_id, is_active=True).first()
    if user is None or not constant_time_compare(session_hash, user.get_session_auth_hash()):
        return False
    return user.is_superuser or Membership.objects.filter(user=user, team__slug=team).exclude(
        role=Membership.Role.VIEWER).exists()


def _checked(check: Callable[[str, str], bool]) -> Callable[[str, str], bool]:
    def run(credential: str, team: str) -> bool:
        from django.db import connections

        try:
            return check(credential, team)
        finally:
            connections.close_all()  # this thread's own connection (CONN_MAX_AGE=0 outside a request too)
    return run


async def may_upload(scope, route: UploadRoute, team: str) -> bool:
    """Does the request come from someone who may publish to `team`? (A database lookup: upload
    routes only, never the hot path.)"""
    headers = dict(scope["headers"])
    if route.by_key:
        from orsplatform.teams.auth import AuthError, extract_token

        try:
            token = extract_token(headers)
        except AuthError:
            return False
        if token is None:
            return False
        check, credential = _key_may_publish, token
    else:
        try:
            cookie = SimpleCookie(headers.get(b"cookie", b"").decode("latin-1"))
        except CookieError:
            return False
        morsel = cookie.get(settings.SESSION_COOKIE_NAME)
        if morsel is None or not morsel.value:
            return False
        check, credential = _member_may_publish, morsel.value
    # Its own thread (and so its own database connection), closed when done.
    async with ThreadSensitiveContext():
        return await sync_to_async(_checked(check))(credential, team)


ASGIApp = Callable[..., Awaitable[None]]


def limit_bodies(app: ASGIApp) -> ASGIApp:
    """Wrap Django's ASGI application with the body limits above."""

    async def limited(scope, receive, send) -> None:
        limit = settings.ORS_MAX_REQUEST_BYTES
        if scope["path"] == ROLLOUTS_PATH and scope["method"] == "POST":
            limit = settings.ORS_ROLLOUT_MAX_BODY_BYTES  # the openreward client's batches (runs/rollout_api.py)
        declared = declared_length(scope)
        upload = _upload_route(scope)
        if upload is not None and (declared is None or declared > limit):
            route, team = upload
            upload_limit = route.limit()
            if declared is not None and declared > upload_limit:
                await send_too_large(send, upload_limit)
                return
            if await may_upload(scope, route, team):
                limit = upload_limit
        if declared is not None and declared > limit:
            if declared <= limit + DRAIN_BYTES:
                await drain(receive, DRAIN_BYTES)
            await send_too_large(send, limit)
            return

        received = 0
        refused = False

        async def receive_counted():
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Answer now and tell Django the client left: it drops what it spooled and
                    # sends nothing.
                    refused = True
                    if message.get("more_body", False):
                        await drain(receive, DRAIN_BYTES)
                    await send_too_large(send, limit)
                    return {"type": "http.disconnect"}
            return message

        await app(scope, receive_counted, send)

    return limited
