"""Runs inside the build sandbox: ``python -I build.py PROXY_SOCKET COMMANDS_JSON``.

The sandbox has no network of its own (a private network namespace with loopback only). The one
way out is PROXY_SOCKET, a Unix socket bound in from the platform's registry proxy
(registry_proxy.py), which lets HTTPS CONNECTs through to the package registry's hosts and
refuses everything else. This script listens on loopback, forwards each connection to that socket,
and runs the installer commands (a JSON list of argv lists) one after the other with
``HTTPS_PROXY`` pointing at the forwarder; it exits with the first failing command's status.

Imports nothing of the platform: only this file is bound into the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction of a connection until it ends (the registry proxy uses it too)."""
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _forward(socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


async def main_async(socket_path: str, commands: list[list[str]]) -> int:
    server = await asyncio.start_server(lambda r, w: _forward(socket_path, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = f"http://127.0.0.1:{port}"
    env = dict(os.environ, HTTPS_PROXY=proxy, HTTP_PROXY=proxy, https_proxy=proxy, http_proxy=proxy)
    async with server:
        for argv in commands:
            proc = await asyncio.create_subprocess_exec(*argv, env=env)
            status = await proc.wait()
            if status != 0:
                return status if status > 0 else 128 - status
    return 0


def main() -> int:
    socket_path, commands = sys.argv[1], json.loads(sys.argv[2])
    return asyncio.run(main_async(socket_path, commands))


if __name__ == "__main__":
    sys.exit(main())
