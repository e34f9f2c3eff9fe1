"""Tenant code that hangs, exits, forks, allocates or writes without bound during validation: the
validation process (and every process it forked) is killed, the report says what happened, nothing is
published, and the platform keeps serving."""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from orsplatform.catalog.models import Environment
from tests.catalog.conftest import stored_packages
from tests.catalog.support import env_with, publish, wait_until


def failed(response) -> dict:
    assert response.status_code == 400, response.content
    body = response.json()
    assert set(body) == {"detail", "check", "traceback"}
    assert not Environment.objects.filter(slug="hostile").exists()
    assert stored_packages(settings) == []  # nothing half-published
    return body


@pytest.fixture(autouse=True)
def platform_unharmed(live_db):
    yield
    assert Client().get("/api/v1/environments").status_code == 200


def test_code_that_hangs_is_killed_at_the_time_limit(owner, settings):
    settings.ORS_INSPECT_TIMEOUT_SECONDS = 2
    started = time.monotonic()
    body = failed(publish(owner, "hostile", "hang.py", env_with("time.sleep(10**6)", imports="import time")))
    assert time.monotonic() - started < 15
    assert body["check"] == "timeout"
    assert "timed out after 2 s" in body["detail"] and "'import' check" in body["detail"]


def test_code_that_calls_os_exit_is_reported_with_the_check_it_was_in(owner):
    body = failed(publish(owner, "hostile", "exit.py", env_with("os._exit(3)", imports="import os")))
    assert body["check"] == "process"
    assert "exit code 3" in body["detail"] and "'import' check" in body["detail"]


def test_code_that_raises_system_exit_is_reported(owner):
    body = failed(publish(owner, "hostile", "exit.py", env_with("sys.exit('bye')", imports="import sys")))
    assert body["check"] == "import" and "SystemExit: bye" in body["detail"]


def _sleepers(mark: str) -> list[int]:
    """Host processes running `sleep <mark>` (the validation sandbox has its own pid namespace, so
    tenant code cannot tell the test its children's pids: the test finds them by their command)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", mark.encode()]:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_children_forked_during_validation_are_killed_even_when_validation_passes(owner):
    mark = f"{1000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
    forker = f"""
for _ in range(3):
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", {mark!r}])
time.sleep(0.5)  # the children are running when validation goes on
"""
    r = publish(owner, "forker", "forker.py", env_with(forker, imports="import os, time"))
    assert r.status_code == 201, r.json()
    assert wait_until(lambda: not _sleepers(mark)), "forked children outlived validation"


def test_a_fork_loop_that_hangs_is_killed_with_its_whole_process_group(owner, settings):
    settings.ORS_INSPECT_TIMEOUT_SECONDS = 6
    mark = f"{1000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
    forker = f"""
for _ in range(4):
    if os.fork() == 0:
        if os.fork() == 0:  # a grandchild too
            os.execvp("sleep", ["sleep", {mark!r}])
        os.execvp("sleep", ["sleep", {mark!r}])
time.sleep(1000)
"""
    seen: set[int] = set()
    watcher = threading.Thread(target=lambda: wait_until(lambda: seen.update(_sleepers(mark)) or len(seen) >= 8,
                                                         timeout=10), daemon=True)
    watcher.start()
    body = failed(publish(owner, "hostile", "forks.py", env_with(forker, imports="import os, time")))
    watcher.join()
    assert body["check"] == "timeout"
    assert len(seen) == 8, seen  # four children and four grandchildren ran
    assert wait_until(lambda: not _sleepers(mark))


def test_unbounded_allocation_hits_the_memory_limit(owner, settings):
    settings.ORS_INSPECT_MEMORY_BYTES = 512 * 1024 * 1024
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 1024 * 1024))"
    body = failed(publish(owner, "hostile", "hog.py", env_with(hog)))
    assert body["check"] == "import"
    assert "MemoryError" in body["detail"] and "memory limit (512 MiB)" in body["detail"]


def test_one_huge_allocation_hits_the_memory_limit(owner):
    body = failed(publish(owner, "hostile", "hog.py", env_with("x = bytearray(64 * 1024 ** 3)")))
    assert "memory limit" in body["detail"]


def test_writing_a_huge_file_hits_the_file_size_limit(owner, settings):
    settings.ORS_INSPECT_FILE_BYTES = 1024 * 1024
    # In /tmp: the package's folder, where the code starts, is read-only.
    writer = "with open('/tmp/big.bin', 'wb') as fh:\n    fh.write(b'x' * (8 * 1024 * 1024))"
    body = failed(publish(owner, "hostile", "writer.py", env_with(writer)))
    assert body["check"] == "import" and "File too large" in body["detail"]


def test_validation_runs_without_the_platforms_environment_variables(owner, monkeypatch):
    monkeypatch.setenv("ORS_CANARY_PLATFORM_SECRET", "hunter2")
    monkeypatch.setenv("DATABASE_PASSWORD", "hunter3")
    snoop = """
leaked = {k: v for k, v in os.environ.items() if "hunter" in v or k.startswith(("DATABASE", "SECRET", "DJANGO"))}
if leaked:
    raise RuntimeError(f"leaked: {sorted(leaked)}")
"""
    r = publish(owner, "snoop", "snoop.py", env_with(snoop, imports="import os"))
    assert r.status_code == 201, r.json()


def test_what_tenant_code_writes_during_validation_never_reaches_the_stored_package(owner, settings):
    # The package is read-only in the sandbox: the write fails, and so does the publish.
    scribbler = "import pathlib\npathlib.Path(__file__).with_name('scribbled.txt').write_text('x')"
    r = publish(owner, "scribbler", "s.py", env_with(scribbler))
    assert r.status_code == 400 and "Read-only file system" in r.json()["detail"], r.json()
    assert not list(settings.ORS_PACKAGE_DIR.rglob("scribbled.txt")) if settings.ORS_PACKAGE_DIR.exists() else True
