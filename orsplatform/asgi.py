"""ASGI entry point: the ORS surface at the root, the OpenEnv face under /openenv/ (HTTP and its
WebSocket), Django under its other reserved prefixes."""

from __future__ import annotations

import os
from importlib import import_module

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_application = get_asgi_application()

from django.conf import settings  # noqa: E402

from orsplatform.engine.gateway import EpisodeGateway  # noqa: E402
from orsplatform.openenv.app import OpenEnvFace  # noqa: E402
from orsplatform.ors.app import OrsApp  # noqa: E402
from orsplatform.perimeter.bodies import limit_bodies  # noqa: E402
from orsplatform.perimeter.descriptors import raise_descriptor_limit  # noqa: E402
from orsplatform.perimeter.heap import heap_settle  # noqa: E402
from orsplatform.teams.models import RESERVED_SEGMENTS  # noqa: E402

# The URLconf (every view module, DRF, the schema generator) is imported now: the first Django
# request would otherwise import it on the event loop, and every stream and /health would wait for
# seconds (measured: 2.5 s on a loaded 2-CPU machine).
import_module(settings.ROOT_URLCONF)

# First path segments served by Django (web admin, REST API, static files, later adapters).
DJANGO_PREFIXES = frozenset({"", "admin", "api", "console", "static", "media", "accounts", "analytics",
                             "aap", "ready", "environments", "v1"})
OPENENV_PREFIX = "openenv"
assert DJANGO_PREFIXES - {""} | {OPENENV_PREFIX} <= RESERVED_SEGMENTS


async def _refuse_websocket(receive, send) -> None:
    # No face speaks WebSocket on this path: refuse the handshake (the server answers 403).
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


def build_application(ors_app: OrsApp | None = None):
    # One episode gateway per process, shared by every face.
    ors = ors_app or OrsApp(gateway=EpisodeGateway())
    openenv = OpenEnvFace(gateway=ors.gateway)
    # Django spools a whole body to disk before any view runs: its paths count what they receive.
    django = limit_bodies(django_application)

    async def application(scope, receive, send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            end = path.find("/", 1)
            first = path[1:] if end == -1 else path[1:end]
            if first == OPENENV_PREFIX:
                await openenv(scope, receive, send)
            elif first in DJANGO_PREFIXES:
                await django(scope, receive, send)
            else:
                await ors(scope, receive, send)
        elif scope["type"] == "lifespan":
            # A server starting (uvicorn sends this before it takes connections; an in-process
            # test client does not): everything the process keeps for its life is loaded, so that
            # heap is frozen and the young generation enlarged (perimeter/heap.py), and held
            # sockets cause no periodic full-collection stall.
            heap_settle(freeze=settings.ORS_GC_FREEZE, young_threshold=settings.ORS_GC_YOUNG_THRESHOLD)
            await ors.lifespan(receive, send)
        elif scope["type"] == "websocket":
            if scope["path"].startswith("/openenv/"):
                await openenv(scope, receive, send)  # Channels' router and the /ws consumer
            else:
                await _refuse_websocket(receive, send)

    application.ors = ors  # type: ignore[attr-defined]
    application.gateway = ors.gateway  # type: ignore[attr-defined]
    application.openenv = openenv  # type: ignore[attr-defined]
    return application


# Whatever server runs us (uvicorn, daphne): sockets may use the hard open-files limit, not a
# shell's soft 1024 (the connection cap keeps a headroom below it; orsplatform/perimeter).
raise_descriptor_limit()
application = build_application()
