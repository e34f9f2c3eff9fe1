from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    """Every error of the REST API is {"detail": "..."}, like the ORS surface."""
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if not (isinstance(data, dict) and set(data) == {"detail"}):
        response = Response({"detail": _flatten(data)}, status=response.status_code, headers=dict(response.items()))
    return response


def _flatten(data) -> str:
    if isinstance(data, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in data.items())
    if isinstance(data, list):
        return " ".join(_flatten(v) for v in data)
    return str(data)
