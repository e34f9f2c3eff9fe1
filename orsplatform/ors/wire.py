"""Parsing of ORS request fields. Every malformed input becomes an HttpError (4xx), and secret
values never appear in an error message."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from orsplatform import bounded_json
from orsplatform.ors.http import HttpError, Request

SID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def require_sid(req: Request) -> str:
    raw = req.header(b"x-session-id")
    if raw is None or not raw.strip():
        raise HttpError(400, "X-Session-ID header is required")
    sid = raw.strip()
    if not SID_RE.match(sid):
        raise HttpError(400, "X-Session-ID must be 1-128 characters of letters, digits and ._:-")
    return sid


def optional_str(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise HttpError(400, f"'{key}' must be a string")
    return value


def require_str(body: dict, key: str) -> str:
    value = optional_str(body, key)
    if value is None:
        raise HttpError(400, f"'{key}' is required")
    return value


def optional_int(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int in Python, but not in JSON.
    if isinstance(value, bool) or not isinstance(value, int):
        raise HttpError(400, f"'{key}' must be an integer")
    return value


def require_int(body: dict, key: str) -> int:
    value = optional_int(body, key)
    if value is None:
        raise HttpError(400, f"'{key}' is required")
    return value


def _secret_map(data: Any, source: str) -> dict[str, str]:
    if not isinstance(data, dict):
        raise HttpError(400, f"{source} must be a JSON object of name to secret")
    secrets: dict[str, str] = {}
    for name, value in data.items():
        if isinstance(value, str):
            secrets[name] = value
        elif isinstance(value, dict) and isinstance(value.get("value"), str):
            secrets[name] = value["value"]
        else:
            raise HttpError(400, f"{source} entry {name!r} must be a string or an object with a string 'value'")
    return secrets


def secrets_from_header(req: Request) -> dict[str, str]:
    """``X-Secrets: base64(json({"KEY": {"value": ..., "allowed_domains": [...]}}))``."""
    raw = req.headers.get(b"x-secrets")
    if raw is None or not raw.strip():
        return {}
    try:
        data = bounded_json.loads(base64.b64decode(raw.strip(), validate=True))
    except bounded_json.JsonRefused as exc:
        raise HttpError(400, f"X-Secrets must be base64-encoded JSON: {exc}") from None
    except (binascii.Error, ValueError):
        raise HttpError(400, "X-Secrets must be base64-encoded JSON") from None
    return _secret_map(data, "X-Secrets")


def secrets_from_body(body: dict) -> dict[str, str]:
    data = body.get("secrets")
    return {} if data is None else _secret_map(data, "'secrets'")


def refuse_env_vars(body: dict) -> None:
    """``/create_session``'s ``env`` (the openreward client's ``env_overrides``): per-session
    environment variables. Refused when non-empty rather than accepted and dropped: the sessions
    of one (version, team) share a sandbox worker process, so no session can have variables of
    its own, and a trainer relying on them must hear so. Values an environment needs per session
    are sent as secrets (which it declares)."""
    data = body.get("env")
    if data is None:
        return
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise HttpError(400, "'env' must be an object of string values")
    if data:
        raise HttpError(400, "Per-session environment variables ('env') are not supported here: sessions "
                             "share their environment's worker process. Send per-session values as "
                             "secrets the environment declares.")

