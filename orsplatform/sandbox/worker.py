"""A sandbox worker: hosts the sessions of one environment version opened by one team.

Started by the pool (pool.py) inside bubblewrap as ``python -I .../worker.py PACKAGE_DIR THREADS``,
with the package bound read-only and, of the platform, only the modules binding.py lists (this
file and its parts, the OpenEnv adapter, and the package loader and redaction it shares with the
gateway: one copy of each rule). It imports no Django and nothing else of ``orsplatform`` (the
rest of the tree is not mounted in the sandbox), only the SDKs (``ors``, and
``openreward.environments`` when the environment is written against it), pydantic and orjson from
the read-only site-packages.

This file is the process and its protocol loop (the framed pipe, the requests, the replies); its
parts are the sessions and their operations (worker_host.py), how each SDK runs a tool
(worker_sdks.py), the threads sync environment code runs in (worker_threads.py), the processes
sessions leave behind (worker_strays.py) and the errors a reply reports (worker_errors.py).

The supervisor speaks to it over the pipe that was its stdin/stdout: frames of a 4-byte big-endian
length and an orjson object. Requests are ``{"id", "op", ...}``; every request gets exactly one
reply ``{"id", "ok", "value" | "error"}``. Requests run concurrently: sync environment methods in a
thread pool, async ones on this process's event loop, so a tool that blocks the loop stalls only
this worker (the supervisor kills it once a call outlives its timeout by the grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import sys
from pathlib import Path
from typing import Any

import orjson

# The dotted name of this file's package. Run as a script (the pool's argv), the tree that holds it
# goes first on the path (/ors/lib in a sandbox), so the shared rules import by their own names.
PACKAGE = "orsplatform.sandbox"
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[len(PACKAGE.split("."))]))

from orsplatform.sandbox.redact import redact  # noqa: E402
from orsplatform.sandbox.worker_errors import SetupError, UnknownSession  # noqa: E402
from orsplatform.sandbox.worker_host import Host  # noqa: E402

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
READ_CHUNK = 256 * 1024
LAZY_SECONDS = 0.05


class Channel:
    """The framed pipe to the supervisor. Replies of one event-loop pass go out in one write (one
    wake-up of the supervisor, not one per reply); lazy ones (teardowns) wait for company up to
    LAZY_SECONDS."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.WriteTransport) -> None:
        self.reader = reader
        self.transport = transport
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._soon: asyncio.Handle | None = None
        self._later: asyncio.TimerHandle | None = None

    async def read(self) -> list[dict] | None:
        """Every whole frame the pipe holds (at least one); None when it closed or spoke garbage."""
        buffer = self._buffer
        try:
            while True:
                messages, offset, end = [], 0, len(buffer)
                while end - offset >= HEADER.size:
                    (size,) = HEADER.unpack_from(buffer, offset)
                    if size > MAX_FRAME:
                        return None
                    if end - offset - HEADER.size < size:
                        break
                    start = offset + HEADER.size
                    messages.append(orjson.loads(memoryview(buffer)[start:start + size]))
                    offset = start + size
                del buffer[:offset]
                if messages:
                    return messages
                chunk = await self.reader.read(READ_CHUNK)
                if not chunk:
                    return None
                buffer += chunk
        except orjson.JSONDecodeError:
            return None

    def send(self, message: dict, lazy: bool = False) -> None:
        try:
            body = orjson.dumps(message)
        except (TypeError, orjson.JSONEncodeError) as exc:  # the environment's value
            body = orjson.dumps({"id": message.get("id"), "ok": False,
                                 "error": f"The environment's answer is not valid JSON: {exc}"})
        self._out.append(HEADER.pack(len(body)) + body)
        if self._soon is not None:
            return
        loop = asyncio.get_running_loop()
        if not lazy:
            self._soon = loop.call_soon(self.flush)
        elif self._later is None:
            self._later = loop.call_later(LAZY_SECONDS, self.flush)

    def flush(self) -> None:
        self._soon = None
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._out:
            data, self._out = b"".join(self._out), []
            self.transport.write(data)


async def serve(host: Host, channel: Channel) -> None:
    ops = {"setup": host.op_setup, "prompt": host.op_prompt, "task_tools": host.op_task_tools,
           "call": host.op_call, "stop": host.op_stop}
    tasks: set[asyncio.Task] = set()

    async def handle(msg: dict) -> None:
        reply: dict[str, Any] = {"id": msg.get("id")}
        try:
            reply["value"] = await ops[msg["op"]](msg)
            reply["ok"] = True
        except UnknownSession:
            reply.update(ok=False, kind="unknown")
        except SetupError as exc:
            reply.update(ok=False, kind="setup", error=str(exc))
        except BaseException as exc:  # environment code may raise anything
            live = host.live.get(msg.get("sid", ""))
            reply.update(ok=False, kind="error", error=redact(f"{type(exc).__name__}: {exc}",
                                                              live.secrets if live else ()))
        channel.send(reply, lazy=msg.get("op") == "stop")

    while True:
        messages = await channel.read()
        if messages is None:
            channel.flush()
            return  # the supervisor closed the pipe (or spoke garbage): the worker ends
        for msg in messages:
            task = asyncio.create_task(handle(msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


async def main_async(package_dir: str, threads: int, fd_in: int, fd_out: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_FRAME)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd_in, "rb", 0))
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(fd_out, "wb", 0))
    host = Host(package_dir, threads)
    loop.set_default_executor(host.pool)  # asyncio.to_thread (the openreward SDK's sync tools) shares the pool
    channel = Channel(reader, transport)
    channel.send({"id": 0, "ok": True, "value": {"pid": os.getpid()}})  # ready
    channel.flush()
    await serve(host, channel)


def _open_fds() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def main() -> None:
    package_dir, threads = sys.argv[1], int(sys.argv[2])
    # The protocol moves off fds 0 and 1, so a tenant's print() (or a library's) goes to stderr
    # instead of corrupting the framing.
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    # Nothing inherited reaches tenant code (the launcher closes them in a sandbox already; this
    # also covers ORS_SANDBOX=none and any launcher in front of this one).
    for fd in _open_fds():
        if fd > 2 and fd not in (fd_in, fd_out):
            with contextlib.suppress(OSError):
                os.close(fd)
    try:  # uvloop where installed: the worker's hop is mostly event-loop work
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main_async(package_dir, threads, fd_in, fd_out))
    os._exit(0)  # stuck tool threads must not keep an orphaned worker alive


if __name__ == "__main__":
    main()
