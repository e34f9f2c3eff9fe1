"""A pull-through package index for the stack's requirements builds: the containers of `make stack-test`
have no route to the internet (dockerd --iptables=false: no NAT), so the worker's builds reach PyPI
through this relay on the host, as an operator's private index or mirror would serve them
(ORS_BUILD_INDEX_URL). /simple/... is fetched from PyPI's simple index with the file links rewritten
to /files/..., which is fetched from PyPI's file host. Nothing is cached or changed but the links.

    python tests/stack/pypi_relay.py HOST PORT-FILE     # binds HOST on a free port, writes the port
"""

from __future__ import annotations

import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

INDEX = "https://pypi.org"
FILES = "https://files.pythonhosted.org"
PASSED_HEADERS = ("accept", "range", "if-none-match", "if-modified-since")
RETURNED_HEADERS = ("content-type", "etag", "last-modified", "content-range", "accept-ranges")


def handler(upstream: httpx.Client) -> type[BaseHTTPRequestHandler]:
    class Relay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the build log says what was fetched
            pass

        def do_HEAD(self) -> None:
            self._relay(head=True)

        def do_GET(self) -> None:
            self._relay(head=False)

        def _relay(self, head: bool) -> None:
            path = self.path.split("#", 1)[0]
            if path.startswith("/simple/") or path == "/simple":
                url, rewrite = INDEX + path, True
            elif path.startswith("/files/"):
                url, rewrite = FILES + path[len("/files"):], False
            else:
                self._send(404, b"not found", "text/plain")
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() in PASSED_HEADERS}
            try:
                with upstream.stream("HEAD" if head else "GET", url, headers=headers) as r:
                    if rewrite and not head:
                        here = f"http://{self.headers.get('Host', '')}/files/".encode()
                        body = r.read().replace(FILES.encode() + b"/", here)
                        self._send(r.status_code, body, r.headers.get("content-type", "text/html"),
                                   {k: v for k, v in r.headers.items() if k.lower() in ("etag", "last-modified")})
                        return
                    self.send_response(r.status_code)
                    for k, v in r.headers.items():
                        if k.lower() in RETURNED_HEADERS or k.lower() == "content-length":
                            self.send_header(k, v)
                    if "content-length" not in r.headers and not head:
                        self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    if head:
                        return
                    chunked = "content-length" not in r.headers
                    for chunk in r.iter_raw(65536):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
            except httpx.HTTPError as exc:
                self._send(502, f"upstream: {exc}".encode(), "text/plain")

        def _send(self, status: int, body: bytes, content_type: str, extra: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

    return Relay


def main(host: str, port_file: str) -> None:
    # identity: bodies pass through as they come (the relay sets no Content-Encoding of its own).
    # The machine's trust store (SSL_CERT_FILE), which may hold an egress proxy's authority.
    bundle = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    upstream = httpx.Client(timeout=60, follow_redirects=True, headers={"Accept-Encoding": "identity"},
                            verify=bundle if os.path.isfile(bundle) else True)
    server = ThreadingHTTPServer((host, 0), handler(upstream))
    server.daemon_threads = True
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
