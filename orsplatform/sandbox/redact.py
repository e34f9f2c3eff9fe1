"""Keep secrets out of what the platform stores, logs or shows.

Environment code may put a secret it was given into an exception message or a tool output; the
platform strips every secret value of the session from errors and from the audit log's copy.

Django-free and importing nothing of the platform: the sandbox worker imports this very module
(bound into its sandbox, sandbox/binding.py), so the gateway and the worker strip alike.
"""

from __future__ import annotations

from typing import Any

import orjson

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
    # Longest first, so a secret that contains another is removed whole. Values that are not
    # strings (a malformed X-Secrets entry) are no text to strip, and must not raise here.
    return tuple(sorted({v for v in secrets.values() if isinstance(v, str) and len(v) >= MIN_SECRET_LENGTH},
                        key=len, reverse=True))


def redact_head(text: str, secrets: tuple[str, ...]) -> str:
    """`text` cut from a longer one (an over-limit answer's beginning, as raw JSON): its secrets
    stripped, in their JSON-escaped spelling too, and an end that may be the first part of a
    secret cut off, so no piece of one survives the cut."""
    if not secrets:
        return text
    spellings = tuple(sorted({*secrets, *(orjson.dumps(s).decode()[1:-1] for s in secrets)}, key=len, reverse=True))
    text = redact(text, spellings)
    for secret in spellings:
        for n in range(min(len(secret) - 1, len(text)), 0, -1):
            if text.endswith(secret[:n]):
                text = text[:-n]
                break
    return text
