"""A WebSocket client (RFC 6455) on asyncio streams, standard library only: the shim (shim.py) runs
with whatever Python the author's image has, and speaks to the author's own server on the
container's loopback as OpenEnv's client does (text frames of JSON, one request answered at a time).

Client frames are masked, as the RFC requires; pings are answered; a close frame ends the socket.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE = 64 * 1024 * 1024


class Closed(Exception):
    """The server closed the socket (or broke the protocol)."""


class WebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, host: str, port: int, path: str) -> WebSocket:
        reader, writer = await asyncio.open_connection(host, port, limit=MAX_MESSAGE)
        key = base64.b64encode(os.urandom(16))
        writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + f"{host}:{port}".encode()
                     + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + key
                     + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        if b" 101 " not in status + b" " or accept not in head:
            writer.close()
            raise Closed(f"the server refused the WebSocket: {status.decode(errors='replace')}")
        return cls(reader, writer)

    def send(self, text: str, opcode: int = 1) -> None:
        payload = text.encode() if isinstance(text, str) else text
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        mask = os.urandom(4)
        # XOR with the mask as one big integer: far cheaper than a byte loop in Python.
        repeated = (mask * (size // 4 + 1))[:size]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(size, "big")
        self.writer.write(head + mask + masked)

    async def receive(self) -> str:
        """The next text (or binary) message, whole."""
        parts: list[bytes] = []
        while True:
            first, second = await self.reader.readexactly(2)
            opcode, size = first & 0x0F, second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
            if size > MAX_MESSAGE:
                raise Closed("a message larger than the shim accepts")
            mask = await self.reader.readexactly(4) if second & 0x80 else b""
            payload = await self.reader.readexactly(size)
            if mask:
                repeated = (mask * (size // 4 + 1))[:size]
                payload = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(size, "big")
            if opcode == 8:
                raise Closed(payload[2:].decode(errors="replace") or "closed by the server")
            if opcode == 9:  # ping
                self.send(payload, opcode=10)
                continue
            if opcode == 10:
                continue
            parts.append(payload)
            if first & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        try:
            self.send(struct.pack("!H", 1000), opcode=8)
        except Exception:
            pass
        self.writer.close()
