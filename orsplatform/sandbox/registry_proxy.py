"""The build sandbox's only way out: an HTTPS CONNECT proxy on a Unix socket that reaches the
package registry's hosts (``ORS_BUILD_ALLOWED_HOSTS``, port 443) and nothing else.

An operator's own index served over plain HTTP (``ORS_BUILD_EXTRA_INDEX_URLS=http://…``) is reached
the way a forward proxy does it: an absolute-form request (``GET http://host:port/… HTTP/1.1``) to
exactly that origin is passed on, one request per connection (``Connection: close``), so a
connection cannot be reused for another origin.

The build sandbox has no network namespace of its own to speak of (loopback only); its forwarder
(build.py) hands every connection to this socket. A CONNECT to any other host or port, or any
other method, is answered 403 and written to the build's log, so an author sees what was refused.
TLS is end to end between the installer and the registry: the proxy sees host names, not content.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from orsplatform.sandbox.build import pipe

HEAD_LIMIT = 8192


class RegistryProxy:
    """Serve on ``socket_path`` in a thread of its own for the life of a ``with`` block."""

    def __init__(self, socket_path: Path, allowed_hosts: set[str], log: Callable[[str], None], *,
                 tls_origins: frozenset[tuple[str, int]] = frozenset(),
                 http_origins: frozenset[tuple[str, int]] = frozenset()) -> None:
        self.socket_path = Path(socket_path)
        self.allowed = {(h.strip().lower(), 443) for h in allowed_hosts if h.strip()} | set(tls_origins)
        self.http_origins = set(http_origins)
        self.log = log
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="registry-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def __enter__(self) -> RegistryProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(self._handle, path=str(self.socket_path)), self._loop)
        self._server = future.result(timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.socket_path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:  # the build ended while this connection was open
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        if len(head) > HEAD_LIMIT:
            writer.close()
            return
        request = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request.split()
        forward = _http_origin(parts)
        if forward is not None and forward[:2] in self.http_origins:
            await self._forward_http(head, forward, reader, writer)
            return
        host, _, port = (parts[1].rpartition(":") if len(parts) == 3 else ("", "", ""))
        host = host.strip("[]").lower()
        if len(parts) != 3 or parts[0] != "CONNECT" or not port.isdigit() or (host, int(port)) not in self.allowed:
            await self._refuse(request, writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 30)
        except (OSError, TimeoutError) as exc:
            self.log(f"[platform] could not reach {host}: {exc}")
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


    async def _refuse(self, request: str, writer: asyncio.StreamWriter) -> None:
        self.log(f"[platform] refused a connection outside the package registry: {request[:200]}")
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def _forward_http(self, head: bytes, origin: tuple[str, int, str], reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        host, port, path = origin
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        except (OSError, TimeoutError) as exc:
            self.log(f"[platform] could not reach {host}:{port}: {exc}")
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        lines = head.split(b"\r\n")
        method, _, version = lines[0].split(b" ", 2)
        kept = [ln for ln in lines[1:] if ln and not ln.lower().startswith((b"connection:", b"proxy-", b"keep-alive:"))]
        # One request per connection: whatever follows on this connection goes to the same origin.
        up_writer.write(b"\r\n".join([method + b" " + path.encode("latin-1") + b" " + version, *kept,
                                       b"Connection: close", b"", b""]))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def _http_origin(parts: list[str]) -> tuple[str, int, str] | None:
    """(host, port, path) of an absolute-form plain-HTTP request line, else None."""
    if len(parts) != 3 or parts[0] not in ("GET", "HEAD") or not parts[1].startswith("http://"):
        return None
    authority, slash, rest = parts[1][len("http://"):].partition("/")
    host, _, port = authority.rpartition(":") if ":" in authority.rsplit("]", 1)[-1] else (authority, "", "80")
    if not port.isdigit() or "@" in authority:
        return None
    return host.strip("[]").lower(), int(port), "/" + rest if slash else "/"


def index_origins(urls: list[str]) -> tuple[frozenset[tuple[str, int]], frozenset[tuple[str, int]]]:
    """The (TLS, plain HTTP) origins of the build's package indexes, which the proxy lets through."""
    tls, plain = set(), set()
    for url in urls:
        parsed = urlsplit(url)
        if parsed.hostname is None:
            continue
        if parsed.scheme == "https":
            tls.add((parsed.hostname.lower(), parsed.port or 443))
        elif parsed.scheme == "http":
            plain.add((parsed.hostname.lower(), parsed.port or 80))
    return frozenset(tls), frozenset(plain)
