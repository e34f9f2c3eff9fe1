from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from orsplatform.catalog.models import Environment


def home(request: HttpRequest) -> HttpResponse:
    environments = (Environment.objects.select_related("team", "current_version")
                    .filter(visibility=Environment.Visibility.PUBLIC, current_version__isnull=False)
                    .order_by("team__slug", "slug"))
    return render(request, "home.html", {"environments": environments})


def ready(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return JsonResponse({"status": "unavailable", "database": "down"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})
