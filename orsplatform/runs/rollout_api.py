"""The `openreward` client's Rollout API at /v1/ (thin views over runs.wire and runs.services).

Status codes are chosen for that client: it retries a batch on 5xx only, so every fault of the
batch itself is a 4xx with {"detail"} (and nothing of it is written); success is 200 with counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import DatabaseError, DataError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.selectors import environment_get_visible
from orsplatform.runs.services import rollout_batch_ingest
from orsplatform.runs.wire import BadBatch, decode_body, parse_batch
from orsplatform.teams.auth import ANONYMOUS, Access, AuthError, Caller, authorize, extract_token

log = logging.getLogger(__name__)


def _detail(detail: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"detail": detail}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


def _token(request: HttpRequest) -> str | None:
    headers = {}
    for meta, name in (("HTTP_X_API_KEY", b"x-api-key"), ("HTTP_AUTHORIZATION", b"authorization")):
        if meta in request.META:
            headers[name] = request.META[meta].encode("latin-1", "replace")
    return extract_token(headers)


def _ingest(token: str | None, body: bytes, encoding: str | None) -> tuple[int, dict]:
    """The whole POST on a writer thread: key, body, batch, transaction."""
    try:
        caller = authorize(token, Access.TEAM)
        data = decode_body(body, encoding, max_bytes=settings.ORS_ROLLOUT_MAX_JSON_BYTES)
        result = rollout_batch_ingest(caller=caller, batch=parse_batch(data))
    except AuthError as exc:
        return exc.status, {"detail": str(exc)}
    except BadBatch as exc:
        return exc.status, {"detail": exc.detail}
    except DataError as exc:
        return 422, {"detail": f"A value of the batch cannot be stored: {str(exc).splitlines()[0][:200]}"}
    except DatabaseError as exc:
        # A lost or failing database: 503, which the client retries; the next batch reconnects.
        log.warning("rollout batch not stored: %s", exc)
        with contextlib.suppress(Exception):
            connection.close()
        return 503, {"detail": "The database is unavailable; retry shortly."}
    return 200, {"accepted": result.accepted, "duplicates": result.duplicates}


def _writers() -> ThreadPoolExecutor:
    # Batches are written on threads of their own, several at once: a batch mostly waits on
    # PostgreSQL (its queries and its commit), and Django's one thread for sync views would write
    # them one after another (measured: ~1,300 messages/s that way on a 2-CPU machine). Each thread
    # keeps its connection between batches. SQLite takes one writer at a time anyway.
    global _pool
    if _pool is None:
        threads = 1 if connection.vendor == "sqlite" else settings.ORS_ROLLOUT_WRITER_THREADS
        _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rollout-writer")
    return _pool


_pool: ThreadPoolExecutor | None = None


@csrf_exempt
async def rollouts(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return _detail("Method not allowed; use POST.", 405, Allow="POST")
    try:
        token = _token(request)
    except AuthError as exc:
        return _detail(str(exc), exc.status)
    loop = asyncio.get_running_loop()
    status, payload = await loop.run_in_executor(
        _writers(), _ingest, token, request.body, request.headers.get("Content-Encoding"))
    return JsonResponse(payload, status=status)


def _looked_up(request: HttpRequest) -> Caller:
    # The client sends no key on these look-ups: without one only public environments are found.
    token = _token(request)
    return ANONYMOUS if token is None else authorize(token, Access.CATALOG)


@csrf_exempt
def environment(request: HttpRequest, owner: str, name: str) -> JsonResponse:
    if request.method != "GET":
        return _detail("Method not allowed; use GET.", 405, Allow="GET")
    try:
        caller = _looked_up(request)
    except AuthError as exc:
        return _detail(str(exc), exc.status)
    env = None if "\x00" in owner + name else environment_get_visible(caller=caller, team_slug=owner, slug=name)
    if env is None:
        return _detail(f"Environment {owner}/{name} not found.", 404)
    current = env.current_version
    return JsonResponse({"id": str(env.pk), "name": f"{owner}/{name}", "owner": owner, "slug": name,
                         "description": env.description, "visibility": env.visibility,
                         "current_version": current.number if current else None})


@csrf_exempt
def variants(request: HttpRequest, owner: str, name: str) -> JsonResponse:
    """An environment's ready versions as the client's "variants" (`variant="v3"` pins version 3)."""
    if request.method != "GET":
        return _detail("Method not allowed; use GET.", 405, Allow="GET")
    try:
        caller = _looked_up(request)
    except AuthError as exc:
        return _detail(str(exc), exc.status)
    env = None if "\x00" in owner + name else environment_get_visible(caller=caller, team_slug=owner, slug=name)
    if env is None:
        return _detail(f"Environment {owner}/{name} not found.", 404)
    versions = env.versions.filter(status=EnvironmentVersion.Status.READY).order_by("number")
    return JsonResponse([{"id": str(v.pk), "name": f"v{v.number}", "number": v.number} for v in versions],
                        safe=False)
