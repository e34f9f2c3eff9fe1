"""The `openreward` client's Rollout API at /v1/ (thin views over runs.wire and runs.services).

Status codes are chosen for that client: it retries a batch on 5xx only, so every fault of the
batch itself is a 4xx with {"detail"} (and nothing of it is written); success is 200 with counts.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.selectors import environment_get_visible
from orsplatform.runs.services import rollout_batch_ingest
from orsplatform.runs.wire import BadBatch, decode_body, parse_batch
from orsplatform.teams.auth import ANONYMOUS, Access, AuthError, Caller, authorize, extract_token


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


@csrf_exempt
def rollouts(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return _detail("Method not allowed; use POST.", 405, Allow="POST")
    try:
        caller = authorize(_token(request), Access.TEAM)
    except AuthError as exc:
        return _detail(str(exc), exc.status)
    try:
        data = decode_body(request.body, request.headers.get("Content-Encoding"),
                           max_bytes=settings.ORS_ROLLOUT_MAX_JSON_BYTES)
        result = rollout_batch_ingest(caller=caller, batch=parse_batch(data))
    except BadBatch as exc:
        return _detail(exc.detail, exc.status)
    return JsonResponse({"accepted": result.accepted, "duplicates": result.duplicates})


def _looked_up(request: HttpRequest) -> Caller:
    # The client sends no key on these look-ups: without one only public environments are found.
    token = _token(request)
    return ANONYMOUS if token is None else authorize(token, Access.CATALOG)


def environment(request: HttpRequest, owner: str, name: str) -> JsonResponse:
    if request.method != "GET":
        return _detail("Method not allowed; use GET.", 405, Allow="GET")
    try:
        caller = _looked_up(request)
    except AuthError as exc:
        return _detail(str(exc), exc.status)
    env = environment_get_visible(caller=caller, team_slug=owner, slug=name)
    if env is None:
        return _detail(f"Environment {owner}/{name} not found.", 404)
    current = env.current_version
    return JsonResponse({"id": str(env.pk), "name": f"{owner}/{name}", "owner": owner, "slug": name,
                         "description": env.description, "visibility": env.visibility,
                         "current_version": current.number if current else None})


def variants(request: HttpRequest, owner: str, name: str) -> JsonResponse:
    """An environment's ready versions as the client's "variants" (`variant="v3"` pins version 3)."""
    if request.method != "GET":
        return _detail("Method not allowed; use GET.", 405, Allow="GET")
    try:
        caller = _looked_up(request)
    except AuthError as exc:
        return _detail(str(exc), exc.status)
    env = environment_get_visible(caller=caller, team_slug=owner, slug=name)
    if env is None:
        return _detail(f"Environment {owner}/{name} not found.", 404)
    versions = env.versions.filter(status=EnvironmentVersion.Status.READY).order_by("number")
    return JsonResponse([{"id": str(v.pk), "name": f"v{v.number}", "number": v.number} for v in versions],
                        safe=False)
