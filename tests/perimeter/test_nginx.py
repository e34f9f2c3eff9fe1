"""docker/nginx/ors.conf.template, rendered with test ports, run by Debian's nginx in front of
`make run`'s gateway: the header deadline, the body limits per location, WebSocket and SSE
passing through, and a session's requests sticking to one gateway."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from websockets.sync.client import connect

from tests.catalog.support import bare_environment
from tests.perimeter.support import HealthProbe, address, closed_by_peer, start, start_nginx, wait_for
from tests.perimeter.test_bodies import ChunkedAttack, tasks_file

pytestmark = pytest.mark.services  # nginx and gateway servers: not in make test-fast

SMALL = 1024 * 1024


@pytest.fixture
def stack(live_db, tmp_path):
    """A gateway as `make run` starts it, and nginx in front of it."""
    started = []

    def stack(**nginx_overrides):
        gateway = start(tmp_path)
        started.append(gateway)
        host, port = address(gateway)
        proxy = start_nginx(tmp_path, upstreams=[f"{host}:{port}"], **nginx_overrides)
        started.append(proxy)
        return gateway, proxy

    yield stack
    for proc in reversed(started):
        proc.stop()


def test_nginx_closes_sockets_that_never_finish_their_headers(stack):
    _, proxy = stack(ORS_HEADER_TIMEOUT_SECONDS="2")
    silent = [socket.create_connection(address(proxy), timeout=10) for _ in range(20)]
    slow = [socket.create_connection(address(proxy), timeout=10) for _ in range(20)]
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: ors\r\n")
    with HealthProbe(proxy) as probe:
        probe.wait_answers(20)
        assert wait_for(lambda: all(closed_by_peer(s) for s in silent + slow), timeout=30, interval=0.2)
    probe.assert_healthy()
    for s in silent + slow:
        s.close()


def test_nginx_cuts_an_anonymous_chunked_login_post_at_the_small_limit(stack):
    _, proxy = stack()
    with HealthProbe(proxy) as probe, ChunkedAttack(proxy, "/accounts/login/", 300 * SMALL) as attack:
        assert attack.done.wait(120), f"nginx still reads after {attack.sent} bytes"
    probe.assert_healthy(at_least=1)
    assert attack.response.startswith(b"HTTP/1.1 413"), attack.response[:300]
    assert json.loads(attack.response.split(b"\r\n\r\n", 1)[1]) == {"detail": "Request body is too large."}
    assert attack.sent < 64 * SMALL
    assert not list((proxy.log_path.parent / "body").glob("*"))  # nothing spooled by nginx


def test_through_nginx_an_upload_route_takes_a_publishers_large_body_and_cuts_anyone_elses(stack, owner, outsider):
    bare_environment(owner.team, "quiz")
    _, proxy = stack()
    url = f"{proxy.url}/api/v1/environments/acme/quiz/splits/train/tasks?mode=append"
    body = {"file": ("train.jsonl", tasks_file(3 * SMALL))}
    accepted = httpx.post(url, headers=owner.headers, files=body, timeout=120)
    assert accepted.status_code in (200, 202), accepted.text
    for headers in (outsider.headers, {}):
        refused = httpx.post(url, headers=headers, files=body, timeout=120)
        assert refused.status_code == 413 and refused.json() == {
            "detail": f"Request body is larger than {SMALL} bytes."}  # the gateway's answer
    # The ORS surface takes ORS_MAX_BODY_BYTES, the REST API's other routes the small limit.
    assert httpx.post(f"{proxy.url}/api/v1/agents", content=b"{}" + b" " * 2 * SMALL, headers=owner.headers,
                      timeout=60).json() == {"detail": "Request body is too large."}


def test_an_openenv_websocket_passes_through_nginx(stack, owner):
    _, proxy = stack()
    url = proxy.url.replace("http://", "ws://") + "/openenv/builtin/math/ws"
    with connect(url, additional_headers=owner.headers, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "dance"}))
        answer = json.loads(ws.recv(timeout=30))
    assert answer["type"] == "error" and answer["data"]["code"] == "UNKNOWN_TYPE"


class _Upstream(BaseHTTPRequestHandler):
    """A stand-in gateway that says which one it is and streams SSE slowly."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        name = str(self.server.server_address[1]).encode()
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(2):
                self.wfile.write(b"data: %d\n\n" % i)
                self.wfile.flush()
                self.server.release.wait(30)  # the next event only once the client saw this one
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(name)))
        self.end_headers()
        self.wfile.write(name)


@pytest.fixture
def upstreams():
    servers = []
    for _ in range(3):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
        server.release = threading.Event()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def test_nginx_sends_one_sessions_requests_to_one_gateway_and_spreads_the_rest(tmp_path, upstreams):
    proxy = start_nginx(tmp_path, upstreams=[f"127.0.0.1:{s.server_address[1]}" for s in upstreams])
    try:
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            for sid in ("s-1", "s-2", "s-3", "s-4"):
                served = {client.get("/prompt", headers={"X-Session-ID": sid}).text for _ in range(10)}
                assert len(served) == 1, (sid, served)
            served = {client.get("/prompt", cookies={"sessionid": "abc"}).text for _ in range(10)}
            assert len(served) == 1
            anonymous = {client.get("/health").text for _ in range(60)}
            assert len(anonymous) > 1  # no key to stick to: spread over the gateways
    finally:
        proxy.stop()


def test_sse_events_pass_through_nginx_as_they_are_written(tmp_path, upstreams):
    proxy = start_nginx(tmp_path, upstreams=[f"127.0.0.1:{upstreams[0].server_address[1]}"])
    try:
        with httpx.stream("GET", f"{proxy.url}/stream", timeout=30) as response:
            lines = response.iter_lines()
            started = time.monotonic()
            # The first event arrives while the upstream still holds the stream open.
            assert next(lines) == "data: 0"
            assert time.monotonic() - started < 25
            upstreams[0].release.set()
            assert [line for line in lines if line] == ["data: 1"]
    finally:
        proxy.stop()
