"""What the gateway refuses, in terms every face can map onto its own wire.

A ``GatewayError`` carries the HTTP status that describes it best: the ORS face answers it as it is,
OpenEnv turns it into an error frame, the evaluator into a failed episode."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


class StoreUnavailable(Exception):
    """The database could not be reached; requests answer 503."""


class Unstorable(Exception):
    """The database refused a value the client sent (a NUL character, say); requests answer 400."""


def storable(value: Any) -> Any:
    """The audit log's copy without NUL characters, which PostgreSQL cannot store in text or JSON
    (the client still gets the result exactly as the environment produced it)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def _unavailable_errors() -> tuple[type[BaseException], ...]:
    """Errors meaning a backing service (database, Redis, broker) is down: answer 503, not 500."""
    import kombu.exceptions
    import redis

    return (StoreUnavailable, redis.RedisError, kombu.exceptions.OperationalError, ConnectionRefusedError)


UNAVAILABLE = _unavailable_errors()
