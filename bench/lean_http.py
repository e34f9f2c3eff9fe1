"""A lean HTTP/1.1 client for load generators: one connection, one request at a time.

The hold benchmarks run thousands of held sessions from one Python process on the machine that
serves them, so the load generator's own CPU per request is CPU the server does not get. aiohttp
costs about 0.3 ms of CPU per request (a connection per request: 0.5 ms); this is an
``asyncio.Protocol`` around httptools' response parser (the C parser uvicorn uses, already
installed), at a fraction of that. It sends a request, gathers the whole response (an SSE response
is read to its end: the platform ends a call's stream after its ``end`` event) and keeps the
connection for the next request while it has been idle less than ``keep_alive`` seconds.

Only what the benchmarks send: requests with a small body, responses with Content-Length or
chunked bodies. Not a general client.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

try:  # run as a script (bench/ on sys.path) or imported as bench.lean_http
    from loadgen import SseParser
except ImportError:  # pragma: no cover
    from bench.loadgen import SseParser

import httptools


class HttpError(Exception):
    pass


class _Exchange(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.done: asyncio.Future | None = None
        self.got_bytes = False
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(HttpError(f"bad response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(ConnectionResetError("the server closed the connection"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result((self.parser.get_status_code(), b"".join(self.body),
                                  self.parser.should_keep_alive()))

    def _finish(self, exc: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def start(self, request: bytes) -> asyncio.Future:
        self.body, self.got_bytes = [], False
        self.parser = httptools.HttpResponseParser(self)
        self.done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.done


class LeanConnection:
    """Requests to one origin over one kept-alive connection (made again when needed)."""

    def __init__(self, base_url: str, *, keep_alive: float, timeout: float) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.keep_alive, self.timeout = keep_alive, timeout
        self._conn: _Exchange | None = None
        self._idle_since = 0.0

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        head = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        if self.keep_alive <= 0:
            head.append("Connection: close")
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        conn = self._conn
        if conn is None or conn.closed or time.monotonic() - self._idle_since > self.keep_alive:
            await self._close()
            conn = await self._connect()
        try:
            status, data, keep = await asyncio.wait_for(conn.start(request), self.timeout)
        except ConnectionResetError:
            if conn.got_bytes:
                raise
            # A kept connection the server closed before it read the request (its keep-alive
            # ended as the request left): nothing was done, so it is sent again on a new one.
            await self._close()
            conn = await self._connect()
            status, data, keep = await asyncio.wait_for(conn.start(request), self.timeout)
        if keep and self.keep_alive > 0:
            self._idle_since = time.monotonic()
        else:
            await self._close()
        return status, data

    async def _connect(self) -> _Exchange:
        _, conn = await asyncio.wait_for(
            asyncio.get_running_loop().create_connection(_Exchange, self.host, self.port), self.timeout)
        self._conn = conn
        return conn

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None and not conn.closed:
            conn.transport.close()

    async def close(self) -> None:
        await self._close()


def sse_events(body: bytes) -> list[tuple[str, str]]:
    """(event, data) pairs of a whole SSE body; comment lines (``: ping``) are skipped."""
    parser = SseParser()
    events = [e for line in body.decode().replace("\r\n", "\n").split("\n") if (e := parser.line(line)) is not None]
    if (last := parser.end()) is not None:
        events.append(last)
    return events
