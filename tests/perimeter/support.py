"""Servers started the way `make run` starts them, raw sockets, and a /health prober that runs
beside an attack and records every answer's latency."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.fixtures.server import ROOT, ServerProcess, database_url, free_port

PROTOCOL = "orsplatform.perimeter.connections:PerimeterHttpToolsProtocol"


def make_run_args() -> list[str]:
    """uvicorn's options from the Makefile's `run` recipe (host and port left to the caller)."""
    recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None, "the Makefile has no run target"
    words = recipe.group(1).replace("\\\n", " ").split()
    args = words[words.index("orsplatform.asgi:application") + 1:]
    skip = {"--host", "--port"}
    out: list[str] = []
    it = iter(args)
    for word in it:
        if word in skip:
            next(it)
        else:
            out.append(word)
    return out


def start(tmp_path: Path, *, server: str = "make-run", nofile: tuple[int, int] | None = None,
          **env: str) -> ServerProcess:
    """A real server subprocess on the test database: `make run`'s uvicorn, or daphne."""
    port = free_port()
    environ = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "orsplatform.settings",
               "ORS_LOG_LEVEL": "INFO", **env}
    if server == "daphne":
        cmd = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "orsplatform.asgi:application"]
    else:
        cmd = [sys.executable, "-m", "uvicorn", "orsplatform.asgi:application", "--host", "127.0.0.1",
               "--port", str(port), *make_run_args()]

    def limits() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    log_path = tmp_path / f"{server}-{port}.log"
    process = subprocess.Popen(cmd, cwd=ROOT, env=environ, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
                               preexec_fn=limits)
    proc = ServerProcess(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{proc.log()}")
        try:
            if httpx.get(f"{proc.url}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # polling interval while waiting on the readiness condition
    proc.stop()
    raise RuntimeError(f"server did not become ready:\n{proc.log()}")


def address(proc: ServerProcess) -> tuple[str, int]:
    host, port = proc.url.removeprefix("http://").split(":")
    return host, int(port)


def health_once(proc: ServerProcess, timeout: float = 5.0) -> tuple[int, float]:
    """One GET /health on a new connection: (status, seconds). Raw socket: the client's own cost
    stays out of the figure."""
    started = time.perf_counter()
    with socket.create_connection(address(proc), timeout=timeout) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: ors\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    elapsed = time.perf_counter() - started
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, elapsed


@dataclass
class HealthProbe:
    """Asks /health every `interval` seconds on a new connection until stopped."""

    proc: ServerProcess
    interval: float = 0.05
    answers: list[tuple[int, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.answers.append(health_once(self.proc))
            except OSError as exc:
                self.errors.append(repr(exc))
            self._stop.wait(self.interval)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def assert_healthy(self, *, under: float = 0.1, at_least: int = 5) -> None:
        assert not self.errors, self.errors[:5]
        assert len(self.answers) >= at_least, self.answers
        assert all(status == 200 for status, _ in self.answers), self.answers
        slowest = max(elapsed for _, elapsed in self.answers)
        assert slowest < under, f"slowest /health took {slowest * 1000:.1f} ms of {len(self.answers)}"


def wait_for(condition: Callable[[], bool], *, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)  # polling interval of a condition with a deadline
    return condition()


def closed_by_peer(sock: socket.socket) -> bool:
    """Has the server closed this socket (EOF or reset)? Never blocks."""
    try:
        return sock.recv(65536, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def open_fds(pid: int) -> list[str]:
    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return fds


def temp_bytes(pid: int, tmpdir: Path) -> int:
    """Bytes the process holds in files under `tmpdir`, unlinked ones included (Django's spooled
    bodies are anonymous temporary files: only /proc shows them)."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(tmpdir)):
                total += os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:
            pass
    return total
