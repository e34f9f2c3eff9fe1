"""``/openenv/{team}/{slug}[@N]/ws``: one socket, one OpenEnv session (or a socket attached to an MCP
session with ``?session_id=``), as a Channels consumer.

Frames are answered one at a time, in order (the client pairs each reply with its request). They are
handled by a task of the socket's own rather than inside ``receive``: Channels handles a socket's
events one after another, so a socket that drops during a long tool call would otherwise be noticed
only when the call ends; here its episode is ended as soon as the disconnect arrives.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from orsplatform.openenv.sessions import OpenEnvSession, Uninterruptible
from orsplatform.openenv.wire import CLOSE_POLICY, SESSION_ERROR, OpenEnvError, dumps, error_frame

log = logging.getLogger("orsplatform.openenv")

# A client sends one request and waits for its answer; a backlog past this is not a client.
MAX_QUEUED = 64


class SocketFace(Protocol):
    """What the consumer asks of the face that routes to it (app.py's OpenEnvFace): declared here,
    so that the consumer never imports the module that imports it."""

    async def open_socket_session(self, scope: dict, socket: Any) -> tuple[Any, bool]: ...

    async def socket_frame(self, session: Any, raw: Any, guard: Any) -> tuple[Any, Any]: ...

    async def release_socket_session(self, session: Any, *, owns: bool, socket: Any) -> None: ...


class OpenEnvConsumer(AsyncWebsocketConsumer):
    def __init__(self, *, face: SocketFace, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.face = face
        self.session: OpenEnvSession | None = None
        self.owns = True
        self.queue: asyncio.Queue[str | bytes] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.guard = Uninterruptible()
        self.revoked = False  # its key no longer passes: closing, frames are dropped

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        # The platform configures no channel layer (settings.py has no CHANNEL_LAYERS), so the one
        # source of events is the socket: awaited directly instead of through Channels'
        # await_many_dispatch (a task and an asyncio.wait per frame).
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass

    async def dispatch(self, message: dict) -> None:
        # Channels closes the thread's old Django connections before every event (a hop to a
        # thread, per frame). This consumer never touches the ORM: the gateway's store does, on
        # its own threads and connections.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        # Accepted first, then refused with an OpenEnv error frame and a close code: the client
        # raises the frame's message (a refused handshake would only say "HTTP 403").
        await self.accept()
        try:
            self.session, self.owns = await self.face.open_socket_session(self.scope, self)
        except OpenEnvError as exc:
            await self.send(text_data=dumps(exc.frame()))
            await self.close(code=exc.close or CLOSE_POLICY)
            return
        self.worker = asyncio.create_task(self._work())

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.worker is None or self.revoked:
            return
        if self.queue.qsize() >= MAX_QUEUED:
            await self.send(text_data=dumps(error_frame("Too many requests in flight; send one at a time.",
                                                        "EXECUTION_ERROR")))
            await self.close(code=CLOSE_POLICY)
            return
        self.queue.put_nowait(text_data if text_data is not None else bytes_data or b"")

    async def _work(self) -> None:
        assert self.session is not None
        while True:
            raw = await self.queue.get()
            if self.revoked:
                return
            reply, close = await self.face.socket_frame(self.session, raw, self.guard)
            if self.revoked:  # revoked while the frame ran: the socket is closing, no answer
                return
            try:
                if reply is not None:
                    await self.send(text_data=reply)
                if close is not None:
                    await self.close(code=close)
                    return
            except Exception as exc:
                # The client went away first (the servers raise their own kinds of error for a
                # send on a closed socket); its disconnect ends the session.
                log.debug("openenv socket send failed: %s: %s", type(exc).__name__, exc)
                return

    async def revoke(self, code: int, message: str) -> None:
        """Close the socket because its key no longer passes (openenv/sockets.py): an error frame
        saying why, then the close; the disconnect that follows ends the episode as usual."""
        if self.revoked:
            return
        self.revoked = True
        try:
            await self.send(text_data=dumps(error_frame(message, SESSION_ERROR)))
            await self.close(code=code)
        except Exception as exc:  # the client went away first
            log.debug("openenv socket close failed: %s: %s", type(exc).__name__, exc)

    async def disconnect(self, code: int) -> None:
        if self.worker is not None:
            # Not while an episode is being created (its row and slot are taken but not yet the
            # session's); a call in flight goes on in the gateway and is still recorded.
            await self.guard.free.wait()
            self.worker.cancel()
            try:
                await self.worker
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("openenv socket worker failed")
        if self.session is not None:
            await self.face.release_socket_session(self.session, owns=self.owns, socket=self)
