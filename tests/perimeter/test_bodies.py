"""Request bodies: Django's paths count the bytes a request actually sends. An anonymous chunked
POST of hundreds of MB is cut at the small limit with 413 and nothing large reaches the disk;
only the upload routes of a caller who may publish to the team take a large body; /health answers
in under 100 ms throughout."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.catalog.support import bare_environment
from tests.perimeter.support import HealthProbe, address, start, temp_bytes, wait_for

SMALL = 1024 * 1024  # ORS_MAX_REQUEST_BYTES's default
ATTACK_BYTES = 300 * 1024 * 1024


@pytest.fixture
def launch(live_db, tmp_path):
    started = []

    def launch(**kwargs):
        tmpdir = tmp_path / f"tmp-{len(started)}"
        tmpdir.mkdir()
        proc = start(tmp_path, TMPDIR=str(tmpdir), **kwargs)
        proc.tmpdir = tmpdir
        started.append(proc)
        return proc

    yield launch
    for proc in started:
        proc.stop()


class ChunkedAttack:
    """An anonymous chunked POST that keeps sending until the server stops it."""

    def __init__(self, proc, path: str, total: int) -> None:
        self.proc, self.path, self.total = proc, path, total
        self.sent = 0
        self.response = b""
        self.done = threading.Event()
        self.sock = socket.create_connection(address(proc), timeout=60)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._writer = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        chunk = b"x" * (256 * 1024)
        frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        try:
            self.sock.sendall(f"POST {self.path} HTTP/1.1\r\nHost: ors\r\nTransfer-Encoding: chunked\r\n"
                              "Content-Type: application/x-www-form-urlencoded\r\n\r\n".encode())
            while self.sent < self.total and not self.done.is_set():
                self.sock.sendall(frame)
                self.sent += len(chunk)
            self.sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection: what we are here to see

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                self.response += data
        except OSError:
            pass
        self.done.set()

    def __enter__(self) -> ChunkedAttack:
        self._reader.start()
        self._writer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.sock.close()
        self._writer.join(timeout=30)
        self._reader.join(timeout=30)


def run_attack(proc, path: str) -> tuple[ChunkedAttack, int]:
    """The attack beside a /health prober; returns it and the most bytes the server held in
    temporary files at any moment."""
    largest = 0
    with HealthProbe(proc) as probe, ChunkedAttack(proc, path, ATTACK_BYTES) as attack:
        deadline = time.monotonic() + 120
        while not attack.done.is_set() and time.monotonic() < deadline:
            largest = max(largest, temp_bytes(proc.process.pid, proc.tmpdir))
            attack.done.wait(0.02)
        assert attack.done.is_set(), f"the server still reads after {attack.sent} bytes"
    probe.assert_healthy(at_least=1)
    return attack, largest


def test_an_anonymous_chunked_login_post_of_hundreds_of_mb_is_cut_at_the_small_limit(launch):
    proc = launch()
    attack, largest = run_attack(proc, "/accounts/login/")
    assert attack.response.startswith(b"HTTP/1.1 413"), attack.response[:200]
    assert json.loads(attack.response.split(b"\r\n\r\n", 1)[1]) == {
        "detail": f"Request body is larger than {SMALL} bytes."}
    assert attack.sent < 64 * 1024 * 1024  # cut early: what the sockets' buffers hold, not 300 MB
    assert largest < SMALL
    assert list(proc.tmpdir.iterdir()) == []
    assert httpx.get(f"{proc.url}/accounts/login/").status_code == 200  # and it keeps serving


def test_an_anonymous_chunked_post_to_an_upload_route_is_cut_at_the_small_limit_too(launch, owner):
    bare_environment(owner.team, "quiz")
    proc = launch()
    attack, largest = run_attack(proc, "/api/v1/environments/acme/quiz/splits/train/tasks")
    assert attack.response.startswith(b"HTTP/1.1 413"), attack.response[:200]
    assert largest < SMALL


def test_a_declared_length_above_the_limit_is_refused_before_the_body_is_read(launch):
    proc = launch()
    with socket.create_connection(address(proc), timeout=30) as s:
        s.sendall(b"POST /api/v1/agents HTTP/1.1\r\nHost: ors\r\nContent-Length: 4000000000\r\n\r\n")
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()


def tasks_file(size: int) -> bytes:
    row = json.dumps({"question": "q" * 1000, "answer": "a"}).encode() + b"\n"
    return row * (size // len(row) + 1)


def post_tasks(proc, headers: dict[str, str], size: int = 3 * SMALL) -> httpx.Response:
    return httpx.post(f"{proc.url}/api/v1/environments/acme/quiz/splits/train/tasks?mode=append",
                      headers=headers, files={"file": ("train.jsonl", tasks_file(size))}, timeout=120)


def test_a_team_key_with_the_publish_scope_uploads_a_body_above_the_small_limit(launch, owner, member, outsider):
    bare_environment(owner.team, "quiz")
    proc = launch()
    with HealthProbe(proc) as probe:
        accepted = post_tasks(proc, owner.headers)
        assert accepted.status_code in (200, 202), accepted.text
        # The same body from a key without the publish scope, another team's key, or nobody.
        for headers in (member.headers, outsider.headers, {}, {"X-API-Key": "ors_0000000a_" + "0" * 32}):
            refused = post_tasks(proc, headers)
            assert refused.status_code == 413, (headers, refused.text)
            assert refused.json() == {"detail": f"Request body is larger than {SMALL} bytes."}
        # Below the small limit, the view itself decides (401 without a key, 404 for another team).
        assert post_tasks(proc, {}, size=SMALL // 2).status_code == 401
        assert post_tasks(proc, outsider.headers, size=SMALL // 2).status_code == 404
    probe.assert_healthy(at_least=1)


@contextmanager
def signed_in(proc, person) -> Iterator[httpx.Client]:
    django_client = Client()
    django_client.force_login(get_user_model().objects.get(username=person.username))
    with httpx.Client(base_url=proc.url, timeout=120,
                      cookies={"sessionid": django_client.cookies["sessionid"].value}) as client:
        assert client.get(f"/console/{person.team.slug}/environments/").status_code == 200  # the CSRF cookie
        yield client


def console_upload(client: httpx.Client, environment_id: int, size: int = 3 * SMALL) -> httpx.Response:
    return client.post("/console/acme/environments/tasks", headers={"X-CSRFToken": client.cookies["csrftoken"]},
                       data={"environment": str(environment_id), "split": "train", "mode": "append"},
                       files={"file": ("train.jsonl", tasks_file(size))})


def test_a_signed_in_member_uploads_through_the_console_and_an_outsider_is_cut(launch, owner, member, outsider):
    quiz = bare_environment(owner.team, "quiz")
    proc = launch()
    with signed_in(proc, member) as client:
        accepted = console_upload(client, quiz.id)
        assert accepted.status_code == 302, accepted.text[:500]
    with signed_in(proc, outsider) as client:
        refused = console_upload(client, quiz.id)
        assert refused.status_code == 413
    with httpx.Client(base_url=proc.url, cookies={"sessionid": "forged"}) as client:
        assert client.post("/console/acme/environments/tasks",
                           files={"file": ("t.jsonl", tasks_file(3 * SMALL))}).status_code == 413


def test_daphne_answers_413_past_the_small_limit_and_keeps_serving(launch):
    # Twisted reads a whole body before the application sees it, so on daphne the limit is the
    # answer, not the disk (docs/perimeter.md: put nginx in front or use `make run`'s uvicorn).
    proc = launch(server="daphne")
    with HealthProbe(proc) as probe:
        r = httpx.post(f"{proc.url}/accounts/login/", content=b"x" * (3 * SMALL),
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413 and r.json() == {"detail": f"Request body is larger than {SMALL} bytes."}

        def chunks():
            for _ in range(3):
                yield b"x" * SMALL

        r = httpx.post(f"{proc.url}/accounts/login/", content=chunks(),
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413
        assert wait_for(lambda: httpx.get(f"{proc.url}/accounts/login/").status_code == 200, timeout=10)
    probe.assert_healthy(at_least=1)


def answer_to_headers_only(proc, path: str, headers: dict[str, str], length: int) -> tuple[int, dict]:
    """A POST that announces `length` bytes of body and sends none: only an answer given from the
    headers comes back (a server reading the body first would wait for it)."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection(address(proc), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: ors\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {length}\r\n{extra}\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        size = int(re.search(rb"content-length: (\d+)", head, re.I)[1])
        while len(body) < size:
            body += s.recv(65536)
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.mark.parametrize("path", ["/create", "/acme/quiz/create", "/openenv/acme/quiz/reset"])
def test_the_ors_and_openenv_faces_refuse_a_caller_without_a_key_before_reading_its_body(launch, owner, outsider, path):
    bare_environment(owner.team, "quiz")
    proc = launch()
    big = 5 * 1024 * 1024  # under ORS_MAX_BODY_BYTES: only the order of the checks answers it early
    status, body = answer_to_headers_only(proc, path, {}, big)
    assert status == 401 and body["detail"]
    status, body = answer_to_headers_only(proc, path, {"Authorization": "Bearer ors_nope_nope"}, big)
    assert status == 401 and body["detail"]


@pytest.mark.parametrize("path", ["/acme/quiz/tasks", "/openenv/acme/quiz/tasks"])
def test_anonymous_catalog_reads_get_the_small_body_limit_and_a_key_the_large_one(launch, owner, path):
    bare_environment(owner.team, "quiz")
    proc = launch()
    status, body = answer_to_headers_only(proc, path, {}, SMALL + 1)
    assert (status, body) == (413, {"detail": f"Request body is larger than {SMALL} bytes."})
    # A team key's request of the same size is read (and answered for what it says, not its size).
    r = httpx.post(f"{proc.url}{path}", headers=owner.headers, content=b'{"split": "' + b"x" * SMALL + b'"}',
                   timeout=60)
    assert r.status_code != 413 and r.status_code < 500, r.text
    assert r.json()["detail"]
