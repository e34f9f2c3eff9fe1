from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from orsplatform.catalog.models import Environment


def home(request: HttpRequest) -> HttpResponse:
    environments = (Environment.objects.select_related("team", "current_version")
                    .filter(visibility=Environment.Visibility.PUBLIC, current_version__isnull=False)
                    .order_by("team__slug", "slug"))
    return render(request, "home.html", {"environments": environments})


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        return False


def _redis_checks() -> dict[str, str]:
    """Redis answers, and (celery executor) at least one runner node has a heartbeat."""
    import redis

    from orsplatform.runners.keys import Keys, live_runner_names

    checks: dict[str, str] = {}
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        client.ping()
        checks["redis"] = "ok"
        if settings.ORS_EXECUTOR == "celery":
            keys = Keys(settings.ORS_REDIS_PREFIX)
            names = live_runner_names(client, keys, settings.ORS_RUNNER_HEARTBEAT_TTL)
            live = sum(1 for beat in (client.mget([keys.runner(n) for n in names]) if names else []) if beat)
            checks["runners"] = f"{live} live" if live else "none"
    except Exception:
        checks["redis"] = "down"
    return checks


def _broker_ok() -> bool:
    """Celery's broker accepts a connection (when it is not Redis itself, checked above)."""
    from kombu import Connection

    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
        return True
    except Exception:
        return False


def ready(request: HttpRequest) -> JsonResponse:
    """Readiness: the database, the broker and (with the celery executor) a live runner."""
    checks = {"database": "ok" if _database_ok() else "down"}
    if settings.REDIS_URL:
        checks.update(_redis_checks())
    broker = settings.CELERY_BROKER_URL
    if not broker.startswith("memory://"):  # the embedded default runs Celery tasks eagerly
        checks["broker"] = checks["redis"] if broker == settings.REDIS_URL else ("ok" if _broker_ok() else "down")
    healthy = (all(checks.get(name, "ok") == "ok" for name in ("database", "redis", "broker"))
               and checks.get("runners") != "none")
    return JsonResponse({"status": "ok" if healthy else "unavailable", **checks}, status=200 if healthy else 503)
