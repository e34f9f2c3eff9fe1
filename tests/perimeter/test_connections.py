"""Connections against `make run`'s server (uvicorn with the perimeter's protocol): headers have a
deadline, idle and unfinished sockets are shed at the connection cap, the descriptor limit is
raised and kept out of reach, and /health answers in under 100 ms throughout."""

from __future__ import annotations

import socket
import time

import pytest

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


def test_a_connection_in_use_is_not_shed_for_a_newcomer(launch, owner):
    proc = launch(ORS_MAX_CONNECTIONS="20", ORS_HEADER_TIMEOUT_SECONDS="60")
    # A long request (like an SSE stream): a body still arriving keeps its request in flight.
    busy = socket.create_connection(address(proc), timeout=10)
    busy.sendall(b"POST /accounts/login/ HTTP/1.1\r\nHost: ors\r\nContent-Length: 100\r\n"
                 b"Expect: 100-continue\r\n\r\n")
    # The server read the headers and the application waits for the body.
    assert busy.recv(100).startswith(b"HTTP/1.1 100 ")
    busy.sendall(b"ab")
    idle = connect_many(proc, 60)
    with HealthProbe(proc) as probe:
        assert wait_for(lambda: sum(not closed_by_peer(s) for s in idle) < 20, timeout=30)
        probe.wait_answers(5)
    probe.assert_healthy(at_least=5)
    assert not closed_by_peer(busy), proc.log()
    busy.sendall(b"x" * 98)
    assert busy.recv(100).startswith(b"HTTP/1.1 ")
    close_all(idle + [busy])


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
