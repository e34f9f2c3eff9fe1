"""uvicorn's httptools protocol with what it lacks against idle and slow clients.

- A header deadline: a request's headers must be complete within ORS_HEADER_TIMEOUT_SECONDS of its
  first byte (of the connection, for a first request), else the connection is closed. uvicorn arms
  its keep-alive timer only after a response, so a socket that never sends, or sends half a header
  line, is otherwise kept for ever.
- A body deadline: a request whose body is still arriving is closed once no body byte has come for
  ORS_BODY_TIMEOUT_SECONDS (unless uvicorn itself paused reading because the application has not
  taken what came). Neither uvicorn nor the applications' body readers have one, so a POST that
  announces 100 bytes and sends 2 was otherwise held for ever.
- A per-process connection cap (descriptors.connection_cap): when a new connection would pass it,
  one connection that holds no request is closed to make room, in this order: the one waiting
  longest for its headers (a fresh socket that has sent nothing is one), then the connection idle
  longest between requests whose last request carried no credentials, then the anonymous request
  whose body has stalled longest (no byte for _STALLED_SECONDS), then any idle one. Requests in
  flight (a body making progress, or any with credentials), SSE streams and WebSockets are never
  shed; when nothing can be shed the newcomer gets a 503 and is closed. So a flood of idle sockets
  or stalled bodies costs its sender its own oldest sockets, and a health check or a trainer that
  connects and sends a request is served.
- A reserve: WebSockets (and requests in flight) cannot be shed, so a new WebSocket upgrade is
  refused with a 503 once they would leave fewer than ORS_CONNECTION_RESERVE places under the cap;
  the reserve stays for requests such as /health.

Bookkeeping is three insertion-ordered dicts touched a few times per request (no timer per request, no
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
# A body with no byte for this long counts as stalled for shedding at the cap (its deadline is
# ORS_BODY_TIMEOUT_SECONDS): a client that is sending, even slowly, is never shed.
_STALLED_SECONDS = 1.0
_REFUSED_UPGRADE_BODY = b'{"detail": "The server has no room for another WebSocket; try again later."}'
REFUSED_UPGRADE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
                   b"retry-after: 5\r\ncontent-length: %d\r\n\r\n" % len(_REFUSED_UPGRADE_BODY)) + _REFUSED_UPGRADE_BODY
_WARN_EVERY_SECONDS = 60.0


def _carries_credentials(headers: list[tuple[bytes, bytes]] | None) -> bool:
    for name, value in headers or ():
        if name in _CREDENTIAL_HEADERS or name == b"cookie" and b"sessionid=" in value:
            return True
    return False


class Perimeter:
    """One process's connection bookkeeping (uvicorn runs one server, one loop, per process)."""

    def __init__(self, *, cap: int, header_timeout: float, loop: asyncio.AbstractEventLoop,
                 body_timeout: float = 30.0, reserve: int = 0) -> None:
        self.cap = cap
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        # Never more than half the cap, so a small cap still takes WebSockets.
        self.reserve = max(0, min(reserve, cap // 2))
        self.loop = loop
        # Connections whose current request's headers are incomplete -> when that request began.
        self.waiting: dict[PerimeterHttpToolsProtocol, float] = {}
        # Connections between requests, oldest first.
        self.idle: dict[PerimeterHttpToolsProtocol, None] = {}
        # Connections whose current request's body is still arriving -> when its last byte came,
        # least recent first.
        self.receiving: dict[PerimeterHttpToolsProtocol, float] = {}
        # Shed or timed out, closed, not yet gone from uvicorn's connection set.
        self.closing: set[Any] = set()
        self.shed = 0
        self.timed_out = 0
        self.body_timed_out = 0
        self.refused = 0
        self.upgrades_refused = 0
        self._warned_at = 0.0
        self._sweep_interval = max(0.05, min(1.0, header_timeout / 4, body_timeout / 4))
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
        now = self.loop.time()
        deadline = now - self.body_timeout
        paused = []
        while self.receiving:
            protocol, progressed = next(iter(self.receiving.items()))
            if progressed > deadline:
                break
            if protocol.flow is not None and protocol.flow.read_paused:
                # uvicorn stopped reading: the application is behind, not the client.
                del self.receiving[protocol]
                paused.append(protocol)
                continue
            self.body_timed_out += 1
            self._close(protocol)
        for protocol in paused:
            self.receiving[protocol] = now
        self.loop.call_later(self._sweep_interval, self._sweep)

    def _close(self, protocol: PerimeterHttpToolsProtocol) -> None:
        self.waiting.pop(protocol, None)
        self.idle.pop(protocol, None)
        self.receiving.pop(protocol, None)
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
        for scanned, protocol in enumerate(self.idle):
            if scanned >= _SCAN:
                break
            if not _carries_credentials(protocol.headers):
                return protocol
        stalled_since = self.loop.time() - _STALLED_SECONDS
        for scanned, (protocol, progressed) in enumerate(self.receiving.items()):
            if scanned >= _SCAN or progressed > stalled_since:
                break  # least recent first: the rest are making progress
            if not _carries_credentials(protocol.headers):
                return protocol
        if self.idle:
            return next(iter(self.idle))
        return None

    def admit_upgrade(self, connections: set) -> bool:
        """Called when a request asks for a WebSocket: may it take a place that is never shed?"""
        live = len(connections) - len(self.closing)
        # The upgrading connection itself is neither waiting nor idle: it counts as held.
        held = live - len(self.waiting) - len(self.idle)
        if held <= self.cap - self.reserve:
            return True
        self.upgrades_refused += 1
        self._warn()
        return False

    def _warn(self) -> None:
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_SECONDS:
            self._warned_at = now
            logger.warning("connection cap of %d reached: %d connections shed, %d refused, %d WebSockets "
                           "refused, %d past the header deadline, %d past the body deadline so far",
                           self.cap, self.shed, self.refused, self.upgrades_refused, self.timed_out,
                           self.body_timed_out)


_perimeter: Perimeter | None = None


def perimeter_for(loop: asyncio.AbstractEventLoop) -> Perimeter:
    global _perimeter
    if _perimeter is None or _perimeter.loop is not loop:
        from django.conf import settings

        _perimeter = Perimeter(
            cap=connection_cap(configured=settings.ORS_MAX_CONNECTIONS, headroom=settings.ORS_FD_HEADROOM),
            header_timeout=settings.ORS_HEADER_TIMEOUT_SECONDS, loop=loop,
            body_timeout=settings.ORS_BODY_TIMEOUT_SECONDS, reserve=settings.ORS_CONNECTION_RESERVE)
        logger.info("perimeter: at most %d connections (%d kept from WebSockets), headers within %.1f s, "
                    "no body pause over %.1f s", _perimeter.cap, _perimeter.reserve, _perimeter.header_timeout,
                    _perimeter.body_timeout)
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
        perimeter.receiving.pop(self, None)
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
        perimeter = self.perimeter
        perimeter.waiting.pop(self, None)
        # A next request may begin before the current response ends (it was put among the idle).
        perimeter.idle.pop(self, None)
        # Until on_message_complete (at once for a request without a body) its body is arriving.
        perimeter.receiving[self] = self.loop.time()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        receiving = self.perimeter.receiving
        if receiving.pop(self, None) is not None:
            receiving[self] = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        perimeter = self.perimeter
        if perimeter.receiving.pop(self, None) is not None and self.cycle is not None \
                and self.cycle.response_complete and not self.transport.is_closing() \
                and not (self.parser.should_upgrade() and self._should_upgrade()):
            # Answered before its body ended (a 401, a 413): the body's bytes cancelled uvicorn's
            # keep-alive timer, and the connection now waits for a next request like any idle one.
            # (Not a WebSocket upgrade: its cycle is the previous request's, and the transport
            # goes to the WebSocket protocol.)
            perimeter.idle[self] = None
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        perimeter = self.perimeter
        perimeter.waiting.pop(self, None)
        perimeter.idle.pop(self, None)
        if not perimeter.admit_upgrade(self.connections):
            self.transport.write(REFUSED_UPGRADE)
            perimeter._close(self)
            return
        # The WebSocket protocol takes the transport (and its own place among the connections).
        perimeter.receiving.pop(self, None)
        super().handle_websocket_upgrade()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn armed its keep-alive timer: the connection now waits for a next request, unless
        # that request has already begun (pipelined bytes came before this response ended).
        perimeter = self.perimeter
        if self.timeout_keep_alive_task is not None and self not in perimeter.waiting \
                and self not in perimeter.receiving:
            perimeter.idle[self] = None
