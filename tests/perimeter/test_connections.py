"""Connections against `make run`'s server (uvicorn with the perimeter's protocol): headers have a
deadline, idle and unfinished sockets are shed at the connection cap, the descriptor limit is
raised and kept out of reach, and /health answers in under 100 ms throughout."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.ors.support import PROBE, publish_probe_sync
from tests.perimeter.support import (
    PROTOCOL,
    HealthProbe,
    address,
    closed_by_peer,
    health_once,
    make_run_args,
    open_fds,
    start,
    wait_for,
)


@pytest.fixture
def launch(live_db, tmp_path):
    started = []

    def launch(**kwargs):
        proc = start(tmp_path, **kwargs)
        started.append(proc)
        return proc

    yield launch
    for proc in started:
        proc.stop()


def connect_many(proc, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(address(proc), timeout=10)
        socks.append(s)
    return socks


def close_all(socks) -> None:
    for s in socks:
        s.close()


def test_make_run_serves_with_the_perimeter_protocol():
    args = make_run_args()
    assert args[args.index("--http") + 1] == PROTOCOL
    assert args[args.index("--loop") + 1] == "uvloop"


def test_sockets_that_never_finish_their_headers_are_closed_after_the_deadline(launch):
    proc = launch(ORS_HEADER_TIMEOUT_SECONDS="2")
    silent = connect_many(proc, 50)
    slow = connect_many(proc, 50)
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: ors\r\n")
    started = time.monotonic()
    with HealthProbe(proc) as probe:
        probe.wait_answers(20)
        # A slowloris keeps sending header lines, a byte at a time, and never ends them.
        def all_closed() -> bool:
            for s in slow:
                try:
                    s.send(b"X")
                except OSError:
                    pass
            return all(closed_by_peer(s) for s in silent + slow)

        assert wait_for(all_closed, timeout=30, interval=0.2)
    assert time.monotonic() - started >= 1.0  # closed by the deadline, not at once
    probe.assert_healthy()
    close_all(silent + slow)
    # A request whose headers arrive in time is served on the same kind of connection.
    with socket.create_connection(address(proc), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: ors\r\n")
        time.sleep(0.5)  # the client's own pause between header lines, well inside the deadline
        s.sendall(b"Connection: close\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 200")


def test_an_idle_keep_alive_connection_that_starts_a_request_gets_the_header_deadline_too(launch):
    proc = launch(ORS_HEADER_TIMEOUT_SECONDS="2")
    with socket.create_connection(address(proc), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: ors\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\n")  # ... and nothing more
        assert wait_for(lambda: closed_by_peer(s), timeout=30, interval=0.2)


def test_an_idle_socket_flood_past_the_cap_sheds_idle_sockets_and_health_keeps_answering(launch):
    cap = 200
    proc = launch(ORS_MAX_CONNECTIONS=str(cap), ORS_HEADER_TIMEOUT_SECONDS="60")
    socks: list[socket.socket] = []
    with HealthProbe(proc) as probe:
        for _ in range(6):
            socks += connect_many(proc, 100)
            assert health_once(proc)[0] == 200
        probe.wait_answers(20)
        # The server keeps at most `cap` of them (the oldest went first).
        assert wait_for(lambda: sum(not closed_by_peer(s) for s in socks) <= cap, timeout=30)
        # Oldest first: every socket still open is newer than every one that was shed (the
        # prober's own connections keep shedding the oldest flood sockets while it runs).
        still_open = [not closed_by_peer(s) for s in socks]
        assert still_open == sorted(still_open)
    probe.assert_healthy()
    sockets_held = sum(1 for target in open_fds(proc.process.pid) if target.startswith("socket:"))
    assert sockets_held <= cap + 20  # the cap, plus the listener, database and pipes
    close_all(socks)


def stalled_post(proc, *, headers: dict[str, str] | None = None, expect: bool = False) -> socket.socket:
    """POST /accounts/login/ announcing 100 bytes of body and sending 2 (Django reads a body
    before any view runs, so the request waits on it). With `expect`, returns once the server has
    read the headers and the application asked for the body (its 100 Continue)."""
    s = socket.create_connection(address(proc), timeout=10)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    s.sendall(f"POST /accounts/login/ HTTP/1.1\r\nHost: ors\r\nContent-Length: 100\r\n{extra}"
              f"{'Expect: 100-continue' + chr(13) + chr(10) if expect else ''}\r\n".encode())
    if expect:
        assert s.recv(100).startswith(b"HTTP/1.1 100 ")
    s.sendall(b"ab")
    return s


def test_unfinished_anonymous_bodies_are_shed_at_the_cap_and_closed_after_the_body_deadline(launch):
    proc = launch(ORS_MAX_CONNECTIONS="20", ORS_HEADER_TIMEOUT_SECONDS="60", ORS_BODY_TIMEOUT_SECONDS="10")
    stalled = [stalled_post(proc) for _ in range(25)]
    sent = time.monotonic()
    # The cap holds them (the ones past it were refused or shed), inside the deadline.
    assert sum(not closed_by_peer(s) for s in stalled) >= 10
    # A newcomer sheds the oldest stalled anonymous body instead of being refused.
    assert wait_for(lambda: health_once(proc)[0] == 200, timeout=30)
    with HealthProbe(proc) as probe:
        probe.wait_answers(20)
    probe.assert_healthy()
    # The rest are closed once no body byte has come for the deadline, not before.
    assert wait_for(lambda: all(closed_by_peer(s) for s in stalled), timeout=60, interval=0.2)
    assert time.monotonic() - sent >= 9.0
    assert "past the body deadline" in proc.log() or "body deadline" in proc.log()
    close_all(stalled)


def test_a_body_making_progress_or_sent_with_credentials_is_not_shed_but_a_stalled_anonymous_one_is(launch, owner):
    proc = launch(ORS_MAX_CONNECTIONS="20", ORS_HEADER_TIMEOUT_SECONDS="60", ORS_BODY_TIMEOUT_SECONDS="60")
    keyed = [stalled_post(proc, headers=owner.headers, expect=True) for _ in range(18)]
    anonymous = stalled_post(proc, expect=True)
    # An anonymous upload that keeps sending, slowly: a byte every 0.2 s.
    trickle = stalled_post(proc, expect=True)
    stop = threading.Event()

    def send_slowly() -> None:
        for _ in range(97):
            if stop.wait(0.2):  # the client's own pace, not a synchronisation
                return
            trickle.sendall(b"x")

    writer = threading.Thread(target=send_slowly, daemon=True)
    writer.start()
    try:
        # Full: 18 keyed + 2 anonymous; a newcomer is the 21st. The stalled anonymous body makes room.
        assert wait_for(lambda: health_once(proc)[0] == 200, timeout=30)
        assert wait_for(lambda: closed_by_peer(anonymous), timeout=30)
        with HealthProbe(proc) as probe:
            probe.wait_answers(10)
        probe.assert_healthy(at_least=10)
        assert not any(closed_by_peer(s) for s in keyed), proc.log()
        assert not closed_by_peer(trickle), proc.log()
    finally:
        stop.set()
        writer.join(timeout=30)
    # Both are still served once their bodies end.
    keyed[0].sendall(b"x" * 98)
    assert keyed[0].recv(100).startswith(b"HTTP/1.1 ")
    close_all(keyed + [anonymous, trickle])


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length (its head may come before its body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: (\d+)", head, re.I)[1])
    while len(rest) < length:
        rest += sock.recv(4096)
    return data


def test_a_request_that_began_before_the_previous_response_ended_is_not_shed_as_idle(launch, owner):
    proc = launch(ORS_MAX_CONNECTIONS="20", ORS_HEADER_TIMEOUT_SECONDS="60", ORS_BODY_TIMEOUT_SECONDS="60")
    busy = socket.create_connection(address(proc), timeout=10)
    # The next request's first bytes come with the first request: they are parsed before its
    # response is written.
    busy.sendall(b"GET /health HTTP/1.1\r\nHost: ors\r\n\r\nPOST /accounts/login/ HTTP/1.1\r\nHost: ors\r\n")
    assert read_response(busy).startswith(b"HTTP/1.1 200")
    key = owner.headers["X-API-Key"]
    busy.sendall(f"X-API-Key: {key}\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n".encode())
    assert busy.recv(100).startswith(b"HTTP/1.1 100 ")
    busy.sendall(b"ab")
    # Keyed keep-alive connections that had a request: idle, and shed oldest first past the cap.
    newcomers = []
    for _ in range(30):
        s = socket.create_connection(address(proc), timeout=10)
        s.sendall(f"GET /health HTTP/1.1\r\nHost: ors\r\nX-API-Key: {key}\r\n\r\n".encode())
        assert read_response(s).startswith(b"HTTP/1.1 200")
        newcomers.append(s)
    assert sum(closed_by_peer(s) for s in newcomers) >= 5
    assert not closed_by_peer(busy), proc.log()
    busy.sendall(b"x" * 98)
    assert busy.recv(100).startswith(b"HTTP/1.1 ")
    close_all(newcomers + [busy])


def test_websockets_cannot_take_the_reserve_and_health_keeps_answering(launch, owner, tmp_path):
    publish_probe_sync(owner.team, tmp_path)
    proc = launch(ORS_MAX_CONNECTIONS="20", ORS_CONNECTION_RESERVE="5", ORS_HEADER_TIMEOUT_SECONDS="60")
    url = proc.url.replace("http://", "ws://") + f"/openenv/{PROBE}/ws"
    sockets = [connect(url, additional_headers=owner.headers, open_timeout=10) for _ in range(15)]
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=owner.headers, open_timeout=10)
        assert refused.value.response.status_code == 503
        assert b"WebSocket" in refused.value.response.body
        with HealthProbe(proc) as probe:
            probe.wait_answers(20)
        probe.assert_healthy()
        # A place given back is a place taken again.
        sockets.pop().close()
        assert wait_for(lambda: _opens(url, owner.headers, sockets), timeout=30, interval=0.2)
    finally:
        for ws in sockets:
            ws.close()


def _opens(url: str, headers: dict[str, str], sockets: list) -> bool:
    try:
        sockets.append(connect(url, additional_headers=headers, open_timeout=10))
        return True
    except InvalidStatus:
        return False


def test_the_open_files_limit_is_raised_and_a_flood_past_it_leaves_health_answering(launch):
    # A shell's soft 1024 below a hard 1024: without a headroom, 1,200 idle sockets exhaust it.
    proc = launch(nofile=(512, 1024))
    limits = open(f"/proc/{proc.process.pid}/limits").read()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    assert line.split()[3:5] == ["1024", "1024"], line
    socks: list[socket.socket] = []
    with HealthProbe(proc) as probe:
        for _ in range(12):
            socks += connect_many(proc, 100)
            assert health_once(proc)[0] == 200
        probe.wait_answers(20)
        assert wait_for(lambda: sum(not closed_by_peer(s) for s in socks) <= 1024 - 256, timeout=30)
    probe.assert_healthy()
    close_all(socks)
    assert "Too many open files" not in proc.log()


def test_a_websocket_upgrade_after_a_request_on_the_same_connection_outlives_the_keep_alive_timer(
        launch, owner, tmp_path):
    publish_probe_sync(owner.team, tmp_path)
    proc = launch()
    with socket.create_connection(address(proc), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: ors\r\n\r\n")
        assert read_response(s).startswith(b"HTTP/1.1 200")
        key = owner.headers["X-API-Key"]
        s.sendall(f"GET /openenv/{PROBE}/ws HTTP/1.1\r\nHost: ors\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                  f"X-API-Key: {key}\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 101")
        # uvicorn's keep-alive timer (5 s) must not have been re-armed for the upgraded socket.
        assert not wait_for(lambda: closed_by_peer(s), timeout=8, interval=0.2), proc.log()
