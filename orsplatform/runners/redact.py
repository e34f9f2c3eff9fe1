"""Keep secrets out of what the platform stores, logs or shows.

Environment code may put a secret it was given into an exception message or a tool output; the
platform strips every secret value of the session from errors and from the audit log's copy.
"""

from __future__ import annotations

from typing import Any

REDACTED = "[redacted]"
MIN_SECRET_LENGTH = 4  # shorter values would redact ordinary text


def redact(value: Any, secrets: tuple[str, ...]) -> Any:
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    return value


def secret_values(secrets: dict[str, str]) -> tuple[str, ...]:
    # Longest first, so a secret that contains another is removed whole.
    return tuple(sorted({v for v in secrets.values() if len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True))
