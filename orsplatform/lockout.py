"""The page a locked-out sign-in gets (django-axes' AXES_LOCKOUT_CALLABLE): the login page's frame
with what happened and how long to wait, answered 429."""

from __future__ import annotations

from datetime import timedelta

from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def wait_text(cool_off: timedelta) -> str:
    seconds = int(cool_off.total_seconds())
    if seconds >= 3600 and seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour" + ("s" if hours != 1 else "")
    if seconds >= 60 and seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes} minute" + ("s" if minutes != 1 else "")
    return f"{seconds} second" + ("s" if seconds != 1 else "")


def locked_out(request: HttpRequest, original_response: HttpResponse | None = None,
               credentials: dict | None = None) -> HttpResponse:
    cool_off = get_cool_off(request)
    context = {
        "failure_limit": get_failure_limit(request, credentials),
        "username": get_client_username(request, credentials) or "",
        "wait": wait_text(cool_off) if cool_off else "",
    }
    return render(request, "registration/locked_out.html", context, status=429)
