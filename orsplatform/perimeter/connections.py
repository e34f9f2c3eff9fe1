"""uvicorn's httptools protocol with what it lacks against idle and slow clients.

- A header deadline: a request's headers must be complete within ORS_HEADER_TIMEOUT_SECONDS of its
  first byte (of the connection, for a first request), else the connection is closed. uvicorn arms
  its keep-alive timer only after a response, so a socket that never sends, or sends half a header
  line, is otherwise kept for ever.
- A per-process connection cap (descriptors.connection_cap): when a new connection would pass it,
  one connection that holds no request is closed to make room, in this order: the one waiting
  longest for its headers (a fresh socket that has sent nothing is one), then the connection idle
  longest between requests whose last request carried no credentials, then any idle one. Requests
  in flight, SSE streams and WebSockets are never shed; when nothing can be shed the newcomer gets
  a 503 and is closed. So a flood of idle sockets costs its sender its own oldest sockets, and a
  health check or a trainer that connects and sends a request is served.

Bookkeeping is two insertion-ordered dicts touched once per request (no timer per request, no
scan): the hot path keeps its speed. Run it with `uvicorn --http
orsplatform.perimeter.connections:PerimeterHttpToolsProtocol` (the Makefile's `run` does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from orsplatform.perimeter.descriptors import connection_cap

logger = logging.getLogger("orsplatform.perimeter")

_REFUSED_BODY = b'{"detail": "The server is at its connection limit."}'
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"content-length: %d\r\n\r\n" % len(_REFUSED_BODY)) + _REFUSED_BODY
# Credentials in a connection's last request: its idle connection is shed after anonymous ones.
_CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key"})
# How many idle connections, oldest first, are looked at for one without credentials.
_SCAN = 64
_WARN_EVERY_SECONDS = 60.0


def _carries_credentials(headers: list[tuple[bytes, bytes]] | None) -> bool:
    for name, value in headers or ():
        if name in _CREDENTIAL_HEADERS or name == b"cookie" and b"sessionid=" in value:
            return True
    return False


class Perimeter:
    """One process's connection bookkeeping (uvicorn runs one server, one loop, per process)."""

    def __init__(self, *, cap: int, header_timeout: float, loop: asyncio.AbstractEventLoop) -> None:
        self.cap = cap
        self.header_timeout = header_timeout
        self.loop = loop
        # Connections whose current request's headers are incomplete -> when that request began.
        self.waiting: dict[PerimeterHttpToolsProtocol, float] = {}
        # Connections between requests, oldest first.
        self.idle: dict[PerimeterHttpToolsProtocol, None] = {}
        # Shed or timed out, closed, not yet gone from uvicorn's connection set.
        self.closing: set[Any] = set()
        self.shed = 0
        self.timed_out = 0
        self.refused = 0
        self._warned_at = 0.0
        self._sweep_interval = max(0.05, min(1.0, header_timeout / 4))
        loop.call_later(self._sweep_interval, self._sweep)

    def _sweep(self) -> None:
        # Insertion order is start order, so the expired ones are at the front.
        deadline = self.loop.time() - self.header_timeout
        while self.waiting:
            protocol, started = next(iter(self.waiting.items()))
            if started > deadline:
                break
            self.timed_out += 1
            self._close(protocol)
        self.loop.call_later(self._sweep_interval, self._sweep)

    def _close(self, protocol: PerimeterHttpToolsProtocol) -> None:
        self.waiting.pop(protocol, None)
        self.idle.pop(protocol, None)
        self.closing.add(protocol)
        protocol.transport.close()

    def admit(self, protocol: PerimeterHttpToolsProtocol, connections: set) -> bool:
        """Called for each new connection (already in `connections`): make room or refuse it."""
        if len(connections) - len(self.closing) <= self.cap:
            self.waiting[protocol] = self.loop.time()
            return True
        victim = self._victim()
        self._warn()
        if victim is None:
            self.refused += 1
            return False
        self.shed += 1
        self._close(victim)
        self.waiting[protocol] = self.loop.time()
        return True

    def _victim(self) -> PerimeterHttpToolsProtocol | None:
        if self.waiting:
            return next(iter(self.waiting))
        if not self.idle:
            return None
        for scanned, protocol in enumerate(self.idle):
            if scanned >= _SCAN:
                break
            if not _carries_credentials(protocol.headers):
                return protocol
        return next(iter(self.idle))

    def _warn(self) -> None:
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_SECONDS:
            self._warned_at = now
            logger.warning("connection cap of %d reached: %d idle connections shed, %d refused, %d past the "
                           "header deadline so far", self.cap, self.shed, self.refused, self.timed_out)


_perimeter: Perimeter | None = None


def perimeter_for(loop: asyncio.AbstractEventLoop) -> Perimeter:
    global _perimeter
    if _perimeter is None or _perimeter.loop is not loop:
        from django.conf import settings

        _perimeter = Perimeter(
            cap=connection_cap(configured=settings.ORS_MAX_CONNECTIONS, headroom=settings.ORS_FD_HEADROOM),
            header_timeout=settings.ORS_HEADER_TIMEOUT_SECONDS, loop=loop)
        logger.info("perimeter: at most %d connections, headers within %.1f s",
                    _perimeter.cap, _perimeter.header_timeout)
    return _perimeter


class PerimeterHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.perimeter = perimeter_for(self.loop)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.perimeter.admit(self, self.connections):
            self.perimeter.closing.add(self)
            transport.write(REFUSED)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        perimeter = self.perimeter
        perimeter.waiting.pop(self, None)
        perimeter.idle.pop(self, None)
        perimeter.closing.discard(self)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # The first byte of a request: its headers' clock starts (a fresh connection's started
        # when it connected).
        perimeter = self.perimeter
        was_idle = self in perimeter.idle
        if was_idle:
            del perimeter.idle[self]
        if was_idle or self not in perimeter.waiting:
            perimeter.waiting[self] = self.loop.time()

    def on_headers_complete(self) -> None:
        self.perimeter.waiting.pop(self, None)
        super().on_headers_complete()

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the transport (and its own place among the connections).
        self.perimeter.waiting.pop(self, None)
        super().handle_websocket_upgrade()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn armed its keep-alive timer: the connection now waits for a next request.
        if self.timeout_keep_alive_task is not None:
            self.perimeter.idle[self] = None
