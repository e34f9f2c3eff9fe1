from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.contrib.auth.tokens import default_token_generator
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode
from django.views.decorators.http import require_GET

from orsplatform.hub import selectors as hub

HOME_ENVIRONMENTS = 12


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    page = hub.catalog_page(user=request.user, query="", page=1, per_page=HOME_ENVIRONMENTS)
    return render(request, "home.html", {"page": page, "environments": page.object_list})


@require_GET
def dev_login(request: HttpRequest, uidb64: str, token: str) -> HttpResponse:
    """The one-time sign-in link `make run` prints (embedded default only; 404 in production)."""
    if not settings.ORS_DEV_LOGIN:
        raise Http404("Not available.")
    try:
        user = get_user_model().objects.get(pk=int(force_str(urlsafe_base64_decode(uidb64))))
    except (ValueError, TypeError, OverflowError, get_user_model().DoesNotExist):
        user = None
    if user is None or not default_token_generator.check_token(user, token):
        return render(request, "registration/dev_login_used.html", status=400)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect("console:teams")


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

    from orsplatform.executors.keys import Keys, live_runner_names

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
    if not broker.startswith(("filesystem://", "memory://")):  # a folder, or in-process (tests): no server
        checks["broker"] = checks["redis"] if broker == settings.REDIS_URL else ("ok" if _broker_ok() else "down")
    healthy = (all(checks.get(name, "ok") == "ok" for name in ("database", "redis", "broker"))
               and checks.get("runners") != "none")
    return JsonResponse({"status": "ok" if healthy else "unavailable", **checks}, status=200 if healthy else 503)
