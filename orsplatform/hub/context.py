from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def site(request: HttpRequest) -> dict:
    """What base.html and the live pages need on every page."""
    return {"live_seconds": settings.ORS_LIVE_REFRESH_SECONDS}
