"""ASGI entry point: the ORS surface at the root, Django under its reserved prefixes."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_application = get_asgi_application()

from orsplatform.ors.app import OrsApp  # noqa: E402
from orsplatform.teams.models import RESERVED_SEGMENTS  # noqa: E402

# First path segments served by Django (web admin, REST API, static files, later adapters).
DJANGO_PREFIXES = frozenset({"", "admin", "api", "console", "static", "media", "accounts", "analytics",
                             "openenv", "aap", "ready"})
assert DJANGO_PREFIXES - {""} <= RESERVED_SEGMENTS


def build_application(ors_app: OrsApp | None = None):
    ors = ors_app or OrsApp()

    async def application(scope, receive, send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            end = path.find("/", 1)
            first = path[1:] if end == -1 else path[1:end]
            if first in DJANGO_PREFIXES:
                await django_application(scope, receive, send)
            else:
                await ors(scope, receive, send)
        elif scope["type"] == "lifespan":
            await ors.lifespan(receive, send)
        # websockets are not part of the platform

    application.ors = ors  # type: ignore[attr-defined]
    return application


application = build_application()
