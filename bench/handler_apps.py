"""ASGI applications that answer ``GET /health`` with ``{"status": "ok"}``, for bench/handler_cost.py.

Each one puts a different stack in front of the same trivial answer, so the difference between them
is the per-request cost of the stack itself:

- ``django_view``: an async Django view behind Django's own ASGI handler, with the middleware of
  ``orsplatform.settings`` (the cost the platform avoids on the ORS surface);
- ``channels_router``: a plain ASGI callable behind channels' ``ProtocolTypeRouter`` + ``URLRouter``;
- ``lean_ors``: the platform's real entry point, ``orsplatform.asgi.build_application()``;
- ``reference``: the reference ``ors.Server`` (FastAPI) hosting ``envs/math/env.py``.

Serve one with, from the repository root (``PYTHONPATH=.``, ``DJANGO_SETTINGS_MODULE=orsplatform.settings``):

    python -m uvicorn bench.handler_apps:lean_ors --port 8000
    python -m daphne -p 8000 bench.handler_apps:django_view

The applications are built lazily, on first attribute access (PEP 562 module ``__getattr__``, which is
how both uvicorn and daphne look the name up), so a server process imports only what it serves: the
ORS SDK is never imported next to twisted unless ``reference`` itself is asked for, and the
``channels_router`` process pays for no Django setup at all.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import orjson
from django.http import HttpRequest, JsonResponse
from django.urls import path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ROOT = Path(__file__).resolve().parents[1]
MATH_ENV_SCRIPT = ROOT / "envs" / "math" / "env.py"
HEALTH_BODY = orjson.dumps({"status": "ok"})
APP_NAMES: tuple[str, ...] = ("django_view", "channels_router", "lean_ors", "reference")


# --- Django view ---------------------------------------------------------------------------------


async def health_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


# The URLconf of `django_view` is this module; Django imports it by name and reads `urlpatterns`.
urlpatterns = [path("health", health_view)]


def build_django_view() -> ASGIApp:
    """Django's ASGI handler with the project's settings (middleware included), routed by this module.

    Setting ``request.urlconf`` is Django's own per-request URLconf override (the one middleware use):
    ``BaseHandler.resolve_request`` honours it, whereas a ``set_urlconf()`` before the request would be
    undone, because ``get_response_async`` resets the URLconf to ``settings.ROOT_URLCONF`` first. The
    override lives in ``create_request`` rather than in a middleware so that the middleware stack is
    exactly the one configured in ``orsplatform.settings`` (that stack is the cost being measured).
    """
    import django
    from django.core.handlers.asgi import ASGIHandler

    django.setup(set_prefix=False)  # what get_asgi_application() does before building its handler

    class BenchASGIHandler(ASGIHandler):
        def create_request(self, scope: Scope, body_file: Any) -> tuple[HttpRequest | None, Any]:
            request, error_response = super().create_request(scope, body_file)
            if request is not None:
                request.urlconf = __name__  # type: ignore[attr-defined]
            return request, error_response

    return BenchASGIHandler()


# --- channels router -----------------------------------------------------------------------------


async def plain_health(scope: Scope, receive: Receive, send: Send) -> None:
    """The smallest correct ASGI answer: no framework, one pre-encoded body."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(HEALTH_BODY)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": HEALTH_BODY})


def build_channels_router() -> ASGIApp:
    from channels.routing import ProtocolTypeRouter, URLRouter

    # No "lifespan" entry: the router rejects that scope, and uvicorn then just runs without lifespan.
    return ProtocolTypeRouter({"http": URLRouter([path("health", plain_health)])})


# --- the platform and the reference --------------------------------------------------------------


def build_lean_ors() -> ASGIApp:
    # /health is answered by OrsApp without touching the database; the process still needs a
    # migrated database to start (Django setup, catalog models), which handler_cost.py provides.
    from orsplatform.asgi import build_application

    return build_application()


def build_reference() -> ASGIApp:
    import ors

    # Loaded from its file (envs/ is not a package); the __main__ guard keeps it from serving itself.
    spec = importlib.util.spec_from_file_location("bench_math_env", MATH_ENV_SCRIPT)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {MATH_ENV_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app: ASGIApp = ors.Server([module.Math]).app
    return app


BUILDERS: dict[str, Callable[[], ASGIApp]] = {
    "django_view": build_django_view,
    "channels_router": build_channels_router,
    "lean_ors": build_lean_ors,
    "reference": build_reference,
}
_built: dict[str, ASGIApp] = {}


def __getattr__(name: str) -> ASGIApp:
    builder = BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        try:
            _built[name] = builder()
        except AttributeError as exc:
            # Re-raised as another type: an AttributeError escaping a module __getattr__ reads as
            # "no such attribute", which would hide the real failure (e.g. twisted vs the ORS SDK).
            raise RuntimeError(f"building {name!r} failed: {exc!r}") from exc
    return _built[name]
