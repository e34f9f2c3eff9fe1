"""Minimal ASGI request/response primitives for the ORS surface (no Django request cycle: the hot
path costs a fraction of Django's handler; see docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from orsplatform import bounded_json
from orsplatform.engine.errors import GatewayError

# Every response of the ORS and OpenEnv faces is built from one of these two constant lists; nosniff
# keeps a browser from reading a JSON or SSE body (which may echo tenant text) as HTML or script.
NOSNIFF = (b"x-content-type-options", b"nosniff")
JSON_HEADERS = [(b"content-type", b"application/json"), NOSNIFF]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    NOSNIFF,
]


class HttpError(GatewayError):
    """A request the ORS face refuses before it reaches the gateway (bad input, wrong method)."""


@dataclass
class Request:
    scope: dict
    receive: Any
    send: Any
    method: str
    path: str
    headers: dict[bytes, bytes]
    body: bytes = b""
    started: bool = False  # a response (or a stream) has begun; errors can no longer be sent
    _json: Any = field(default=None, repr=False)

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")

    def json(self, *, required: bool = True) -> Any:
        """The body as a JSON object ({} for an empty body when not required)."""
        if self._json is None:
            if not self.body.strip():
                if required:
                    raise HttpError(400, "Request body must be a JSON object.")
                self._json = {}
            else:
                try:
                    self._json = bounded_json.loads(self.body)
                except bounded_json.JsonRefused as exc:
                    raise HttpError(400, f"Request body: {exc}") from None
            if not isinstance(self._json, dict):
                raise HttpError(400, "Request body must be a JSON object.")
        return self._json

    def accepts_sse(self) -> bool:
        return b"text/event-stream" in self.headers.get(b"accept", b"")


async def read_body(receive, limit: int, content_length: bytes | None) -> bytes:
    if content_length is not None:
        try:
            if int(content_length) > limit:
                raise HttpError(413, f"Request body is larger than {limit} bytes.")
        except ValueError:
            raise HttpError(400, "Invalid Content-Length header.") from None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"Request body is larger than {limit} bytes.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header_list(extra: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]


async def send_json(send, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
    body = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": JSON_HEADERS + [(b"content-length", str(len(body)).encode())] + _header_list(headers)})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, error: GatewayError) -> None:
    await send_json(send, error.status, {"detail": error.detail}, error.headers)


def sse_event(event: str, data: str) -> bytes:
    # A data field may not hold a newline; multi-line data is sent as several data lines,
    # which clients join back with "\n".
    lines = "".join(f"data: {line}\n" for line in data.split("\n")) if data else "data: \n"
    return f"event: {event}\n{lines}\n".encode()


SSE_PING = b": ping\n\n"
