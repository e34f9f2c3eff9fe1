"""A package index of our own for build tests: source distributions written by the test (plain
tarballs: PKG-INFO, setup.py, a module), served as a PEP 503 simple index by a local HTTP server on
a random port, as an operator's private index would be (``ORS_BUILD_EXTRA_INDEX_URLS``)."""

from __future__ import annotations

import hashlib
import html
import io
import tarfile
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from packaging.utils import canonicalize_name

PLAIN_SETUP = textwrap.dedent('''
    from setuptools import setup

    setup(name=NAME, version=VERSION, py_modules=[MODULE])
''')


def sdist_bytes(name: str, version: str, files: dict[str, str], setup: str = PLAIN_SETUP) -> bytes:
    """An sdist as `setup.py sdist` makes it: `<name>-<version>/` with PKG-INFO and setup.py."""
    module = name.replace("-", "_")
    top = f"{module}-{version}"
    setup_py = (f"NAME = {name!r}\nVERSION = {version!r}\nMODULE = {module!r}\n" + setup)
    members = {"PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
               "setup.py": setup_py, **files}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class LocalIndex:
    url: str  # the simple index's root, ending in /simple
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # project -> file name -> bytes
    requests: list[str] = field(default_factory=list)  # paths asked for, in order

    def add(self, name: str, filename: str, data: bytes) -> None:
        self.files.setdefault(canonicalize_name(name), {})[filename] = data

    def add_sdist(self, name: str, version: str, files: dict[str, str], setup: str = PLAIN_SETUP) -> str:
        filename = f"{name.replace('-', '_')}-{version}.tar.gz"
        self.add(name, filename, sdist_bytes(name, version, files, setup))
        return filename


def _handler(index: LocalIndex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: the test reads index.requests
            pass

        def do_HEAD(self) -> None:  # uv asks before a range request for a wheel's metadata
            self.do_GET(head=True)

        def do_GET(self, head: bool = False) -> None:
            self.head = head
            path = self.path.split("?", 1)[0]
            if "://" in path:  # absolute form, as a proxy passes it on
                path = "/" + path.split("://", 1)[1].split("/", 1)[1]
            index.requests.append(path)
            parts = [p for p in path.split("/") if p]
            if len(parts) == 2 and parts[0] == "simple" and parts[1] in index.files:
                links = "".join(
                    f'<a href="/files/{parts[1]}/{html.escape(f)}#sha256={hashlib.sha256(d).hexdigest()}">'
                    f"{html.escape(f)}</a>\n" for f, d in sorted(index.files[parts[1]].items()))
                self._send(200, f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(), "text/html")
            elif len(parts) == 3 and parts[0] == "files" and parts[2] in index.files.get(parts[1], {}):
                self._send(200, index.files[parts[1]][parts[2]], "application/octet-stream")
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not self.head:
                self.wfile.write(body)

    return Handler


@contextmanager
def local_index() -> Iterator[LocalIndex]:
    index = LocalIndex(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    server.daemon_threads = True
    index.url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
