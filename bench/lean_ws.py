"""A lean WebSocket client for load generators: the frames ``GenericEnvClient`` sends, at a fraction of its CPU.

The OpenEnv hold runs 16,384 held sockets from one Python process on the 2-core machine that serves
them. The unmodified client (``websockets``' asyncio client under ``GenericEnvClient``) costs about
0.3 ms of CPU per step, a quarter of the box's CPU per step in a hold; this is an
``asyncio.Protocol`` that writes the same frames on the wire: the same handshake headers, the same
JSON messages (``{"type": "reset", "data": {...}}``, ``{"type": "step", "data": action}``), masked
client frames (RFC 6455 §5.3, with ``websockets``' C mask), one request answered at a time, and a
ping every ``ping_every`` seconds (the client's default keepalive is 20 s, so the server answers as
many pongs as under real clients). The compare mode and the tests keep the unmodified client; this
is only the hold's load generator. Not a general client: no extensions, no fragmented sends.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from typing import Any
from urllib.parse import urlsplit

import orjson

try:  # websockets' C speedup (installed with the openenv client); a Python XOR otherwise
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the test extra installs websockets with its speedups
    def apply_mask(data: bytes, mask: bytes) -> bytes:
        return bytes(b ^ mask[i % 4] for i, b in enumerate(data))


class WsError(Exception):
    pass


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One final, masked client frame."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    mask = os.urandom(4)
    return head + mask + apply_mask(payload, mask)


class _Socket(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.upgraded = False
        self.handshake: asyncio.Future | None = None
        self.waiter: asyncio.Future | None = None
        self.parts: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for fut in (self.handshake, self.waiter):
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionResetError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self.buffer = bytes(self.buffer[:end]), self.buffer[end + 4:]
            status = head.split(b"\r\n", 1)[0]
            if self.handshake is not None and not self.handshake.done():
                if b" 101 " in status + b" ":
                    self.upgraded = True
                    self.handshake.set_result(None)
                else:
                    self.handshake.set_exception(WsError(f"handshake refused: {status.decode(errors='replace')}"))
                    return
        self._frames()

    def _frames(self) -> None:
        buf = self.buffer
        while len(buf) >= 2:
            first, second = buf[0], buf[1]
            n, at = second & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    return
                n, at = struct.unpack_from("!H", buf, 2)[0], 4
            elif n == 127:
                if len(buf) < 10:
                    return
                n, at = struct.unpack_from("!Q", buf, 2)[0], 10
            if second & 0x80:  # a server never masks (RFC 6455 §5.1)
                self._fail(WsError("masked server frame"))
                return
            if len(buf) < at + n:
                return
            payload = bytes(buf[at:at + n])
            del buf[:at + n]
            opcode = first & 0x0F
            if opcode == 0x9:  # ping → pong with the same data
                self.write(client_frame(0xA, payload))
            elif opcode == 0x8:
                self._fail(WsError("closed by the server: " + payload[2:].decode(errors="replace")))
                return
            elif opcode in (0x0, 0x1, 0x2):
                self.parts.append(payload)
                if first & 0x80:
                    message, self.parts = b"".join(self.parts), []
                    if self.waiter is not None and not self.waiter.done():
                        self.waiter.set_result(message)

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no answer in time"))


class LeanSocket:
    """One OpenEnv session socket: ``await LeanSocket.open(url, headers)``, then ``request`` per message."""

    def __init__(self, conn: _Socket, timeout: float, ping_every: float | None) -> None:
        self._conn, self._timeout = conn, timeout
        self._ping: asyncio.TimerHandle | None = None
        self._ping_every = ping_every
        if ping_every:
            self._schedule_ping()

    @classmethod
    async def open(cls, base_url: str, headers: dict[str, str], *, timeout: float = 60.0,
                   ping_every: float | None = 20.0) -> LeanSocket:
        """Connect to ``<base_url>/ws`` as the OpenEnv client does (http→ws, trailing slash dropped)."""
        parts = urlsplit(base_url.rstrip("/"))
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(_Socket, host, port), timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {parts.path}/ws HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
                 *(f"{k}: {v}" for k, v in headers.items())]
        conn.handshake = loop.create_future()
        conn.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            await asyncio.wait_for(conn.handshake, timeout)
        except BaseException:
            if conn.transport is not None:
                conn.transport.close()
            raise
        return cls(conn, timeout, ping_every)

    def _schedule_ping(self) -> None:
        self._ping = asyncio.get_running_loop().call_later(self._ping_every, self._send_ping)

    def _send_ping(self) -> None:
        if not self._conn.closed:
            self._conn.write(client_frame(0x9, os.urandom(4)))
            self._schedule_ping()

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message and return the server's answer; an ``error`` frame raises, as the client does."""
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the socket is closed")
        loop = asyncio.get_running_loop()
        waiter = conn.waiter = loop.create_future()
        conn.write(client_frame(0x1, orjson.dumps(message)))
        # A timer, not asyncio.wait_for: that makes a task per message (Python 3.11).
        timer = loop.call_later(self._timeout, _expire, waiter)
        try:
            raw = await waiter
        finally:
            timer.cancel()
        answer = orjson.loads(raw)
        if answer.get("type") == "error":
            raise WsError(f"server error: {answer.get('data')}")
        return answer

    async def close(self) -> None:
        if self._ping is not None:
            self._ping.cancel()
        conn = self._conn
        if not conn.closed:
            conn.write(client_frame(0x1, b'{"type": "close"}'))
            conn.write(client_frame(0x8, struct.pack("!H", 1000)))
            if conn.transport is not None:
                conn.transport.close()
