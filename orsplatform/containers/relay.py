"""The build engine's one way out, run inside its network namespace:
``ip netns exec NS python3 -I relay.py PROXY_SOCKET``.

Listens on the namespace's loopback (the only interface there), prints its port, and hands every
connection to PROXY_SOCKET, the registry proxy's Unix socket (sandbox/registry_proxy.py, which lets
through the package registries and refuses the rest, in the build's log). A ``RUN`` step of an
image build sees this port as its HTTP(S) proxy; there is no route to anything else. Ends when its
stdin closes (the build is over). Standard library only.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _forward(socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def main_async(socket_path: str) -> None:
    server = await asyncio.start_server(lambda r, w: _forward(socket_path, r, w), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    async with server:
        await stdin.read()  # EOF: the build ended


if __name__ == "__main__":
    asyncio.run(main_async(sys.argv[1]))
