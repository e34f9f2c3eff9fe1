"""Validation's child process reaches no host file, and the platform follows nothing it left: links
planted where its results once were never lead the platform to its own environment or to a host
file, FIFOs and processes holding its pipes never hold a publish, and a flood of files, tasks or
output lands nothing on the host beyond the result cap. Real hostile packages, published through
the REST API; the inspector runs in the sandbox (and without it, where the platform's side is the
same)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import tempfile
import time

import pytest
from django.conf import settings
from django.test import Client

from orsplatform.catalog.models import Environment, EnvironmentVersion, Split, Task
from tests.catalog.conftest import stored_packages
from tests.catalog.hostile_children import PLANT, DiskWatch, answers_within, leaked, platform_environment
from tests.catalog.support import FILE_TASKS_ENV, env_with, publish, wait_until
from tests.catalog.test_validation_sandbox import _sleepers

MiB = 1024 * 1024
# Each sandbox runtime, and none (the inspector's own limits hold without one too).
BOTH = pytest.mark.parametrize("sandbox", ["bwrap", "gvisor", "none"])


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


@pytest.fixture
def host_tmp(tmp_path, monkeypatch):
    """The platform's own temporary folders (tempfile's) under tmp_path, where DiskWatch sees them."""
    folder = tmp_path / "host-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def stored_text() -> str:
    """Everything publishing stored: versions (tools, splits, errors) and tasks."""
    rows = [list(EnvironmentVersion.objects.values()), list(Task.objects.values("spec"))]
    return json.dumps(rows, default=str)


# --- links ------------------------------------------------------------------------------------------


@BOTH
def test_a_package_linking_its_output_to_the_platforms_environment_gets_none_of_it_back(owner, settings, sandbox):
    settings.ORS_SANDBOX = sandbox
    environment = platform_environment()
    assert environment  # there is something to steal
    attack = PLANT + """
planted = plant(lambda p: _os.symlink("/proc/self/environ", p))
print("planted", len(planted), "links", file=sys.stderr, flush=True)
_os._exit(3)
"""
    response = publish(owner, "hostile", "environ.py", env_with(attack, imports="import sys"))
    body = failed(response)
    assert body["check"] == "process" and "exit code 3" in body["detail"]
    assert "planted" in body["traceback"] and "planted 0 links" not in body["traceback"]  # it did plant some
    assert leaked(response.content.decode(), environment) == []
    assert leaked(stored_text(), environment) == []


@BOTH
def test_links_planted_as_validation_exits_lead_nowhere_and_the_package_publishes(owner, settings, sandbox):
    settings.ORS_SANDBOX = sandbox
    environment = platform_environment()
    attack = PLANT + """
import atexit
atexit.register(lambda: plant(lambda p: _os.symlink("/proc/self/environ", p)))
"""
    response = publish(owner, "linker", "linker.py", env_with(attack))
    assert response.status_code == 201, response.content
    assert leaked(response.content.decode(), environment) == []
    assert leaked(stored_text(), environment) == []


@BOTH
def test_task_files_linked_to_a_host_file_are_never_ingested(owner, settings, tmp_path, sandbox):
    settings.ORS_SANDBOX = sandbox
    secret = tmp_path / "host-secret.jsonl"
    secret.write_text(json.dumps({"id": "x", "word": "HOST-SECRET"}) + "\n")
    # Planted after the inspector wrote its last result, where the platform once read the tasks.
    attack = PLANT + f"""
import atexit
atexit.register(lambda: plant(lambda p: _os.symlink({str(secret)!r}, p), names=("tasks/0.jsonl", "tasks/1.jsonl")))
"""
    response = publish(owner, "linker", "linker.py", env_with(attack))
    assert response.status_code == 201, response.content
    specs = list(Task.objects.filter(split__environment__slug="linker").values_list("spec", flat=True))
    assert sorted(s["word"] for s in specs) == [f"{split}word{i}" for split in ("test", "train") for i in range(3)]
    assert "HOST-SECRET" not in stored_text()


def test_a_forged_report_claiming_tasks_the_class_never_listed_ingests_nothing(owner, tmp_path):
    secret = tmp_path / "host-secret.jsonl"
    secret.write_text(json.dumps({"question": "HOST-SECRET"}) + "\n")
    forged = {"ok": True, "check": "done", "entrypoint": "env:Quiz", "prompt_checked": False,
              "tools": [{"name": "submit", "description": "forged", "input_schema": {"type": "object"}}],
              "splits": [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}],
              "task_counts": {"train": 5, "test": 5}}
    # The forged report last on the pipe, and links where the tasks once were as the inspector exits.
    attack = PLANT + f"""
import atexit
after_last_report(lambda out: out.write(b"R " + {json.dumps(forged).encode()!r} + b"\\n"))
atexit.register(lambda: plant(lambda p: _os.symlink({str(secret)!r}, p), names=("tasks/0.jsonl", "tasks/1.jsonl")))
"""
    response = publish(owner, "forger", "forger.py", attack + FILE_TASKS_ENV)
    assert response.status_code == 201, response.content
    version = EnvironmentVersion.objects.get(environment__slug="forger")
    assert version.tools[0]["description"] == "forged"  # the forgery was what the platform got
    assert response.json()["validation"]["class_task_counts"] == {"train": 0, "test": 0}
    assert not Task.objects.filter(split__environment__slug="forger").exists()
    assert list(Split.objects.filter(environment__slug="forger").values_list("num_tasks", flat=True)) == [0, 0]
    assert "HOST-SECRET" not in stored_text()


@pytest.mark.parametrize("record", [b"not a record", b"T1 " + b"x" * 10, b"R " + b"[1, 2]", b"R " + b"{broken"])
def test_garbage_or_a_malformed_report_on_the_result_pipe_fails_the_publish_cleanly(owner, record):
    attack = PLANT + f"""
after_last_report(lambda out: out.write({record!r} + b"\\n"))
"""
    body = failed(publish(owner, "hostile", "garbage.py", env_with(attack)))
    # Refused as it came, a report that is not one, or a task that is not JSON: never a 500.
    assert body["check"] in ("output", "process", "tasks"), body


def test_a_report_with_a_split_the_platform_cannot_store_is_refused(owner):
    forged = {"ok": True, "check": "done", "entrypoint": "env:Echo", "tools": [{"name": "say"}],
              "splits": [{"name": "x" * 500, "type": "train"}], "task_counts": {}}
    attack = PLANT + f"""
after_last_report(lambda out: out.write(b"R " + {json.dumps(forged).encode()!r} + b"\\n"))
"""
    body = failed(publish(owner, "hostile", "forged.py", env_with(attack)))
    assert body["check"] == "splits" and "Invalid split name" in body["detail"]


# --- FIFOs and held pipes ----------------------------------------------------------------------------


@BOTH
def test_fifos_planted_where_results_once_were_do_not_hold_the_publish(owner, settings, sandbox):
    settings.ORS_SANDBOX = sandbox
    settings.ORS_INSPECT_TIMEOUT_SECONDS = 30
    attack = PLANT + """
import atexit
plant(_os.mkfifo)
atexit.register(lambda: plant(_os.mkfifo))
"""
    with answers_within(90):
        response = publish(owner, "fifo", "fifo.py", env_with(attack))
    assert response.status_code == 201, response.content


@BOTH
def test_a_process_that_escapes_validation_holding_its_pipes_does_not_hold_the_publish(owner, settings, sandbox):
    settings.ORS_SANDBOX = sandbox
    settings.ORS_INSPECT_TIMEOUT_SECONDS = 30
    mark = f"{1000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
    escape = f"""
if os.fork() == 0:
    os.setsid()  # out of validation's process group (without the sandbox, out of its reach too)
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", {mark!r}])  # holds stdout and stderr
    os._exit(0)
"""
    try:
        started = time.monotonic()
        with answers_within(90):
            response = publish(owner, "escaper", "escaper.py", env_with(escape, imports="import os"))
        assert response.status_code == 201, response.content
        assert time.monotonic() - started < 30
        if sandbox == "bwrap":  # its own pid namespace: the escaped process ended with it
            assert wait_until(lambda: not _sleepers(mark), timeout=10)
    finally:
        for pid in _sleepers(mark):  # without the sandbox it lives on: this test started it, this test ends it
            os.kill(pid, signal.SIGKILL)


# --- floods --------------------------------------------------------------------------------------------


def test_writing_600_mib_during_validation_lands_nothing_on_the_host(owner, tmp_path, host_tmp):
    attack = PLANT + "\nraise RuntimeError('wrote ' + json.dumps(fill(600 * 1024 * 1024)))\n"
    with DiskWatch(tmp_path) as watch:
        body = failed(publish(owner, "hostile", "filler.py", env_with(attack, imports="import json")))
    written = json.loads(body["detail"].split("wrote ", 1)[1])
    assert max(written.values()) >= 128 * MiB  # it wrote plenty: into the sandbox's own sized /tmp
    assert watch.peak < 4 * MiB, watch.peak


@BOTH
def test_a_class_listing_600_mib_of_tasks_is_stopped_at_the_result_cap(owner, settings, tmp_path, host_tmp, sandbox):
    settings.ORS_SANDBOX = sandbox
    settings.ORS_INSPECT_RESULT_BYTES = 16 * MiB
    hoarder = env_with("").replace('''    def list_tasks(cls, split):
        return [{"id": f"{split}-{i}", "word": f"{split}word{i}"} for i in range(3)]''', '''    def list_tasks(cls, split):
        return ({"id": i, "word": "w", "blob": "x" * (1 << 20)} for i in range(600))''')
    assert "blob" in hoarder
    started = time.monotonic()
    with DiskWatch(tmp_path) as watch:
        body = failed(publish(owner, "hostile", "hoarder.py", hoarder))
    assert body["check"] == "output" and "more than 16 MiB" in body["detail"], body
    assert watch.peak < 20 * MiB, watch.peak
    assert time.monotonic() - started < 60  # stopped at the cap, not after 600 MiB


@BOTH
def test_printing_600_mib_during_validation_keeps_only_a_tail_in_memory(owner, settings, tmp_path, host_tmp, sandbox):
    settings.ORS_SANDBOX = sandbox
    printer = """
for _ in range(300):
    sys.stdout.write("x" * (1 << 20))
    sys.stderr.write("y" * (1 << 20))
print("the end of a long story", file=sys.stderr, flush=True)
os._exit(3)
"""
    with DiskWatch(tmp_path) as watch:
        body = failed(publish(owner, "hostile", "printer.py", env_with(printer, imports="import os, sys")))
    assert body["check"] == "process" and "the end of a long story" in body["traceback"]
    assert len(body["traceback"]) <= 8000
    assert watch.peak < 4 * MiB, watch.peak


def test_forked_children_of_validation_share_one_memory_limit(owner, settings):
    """rlimits bind each process alone: three children of 160 MiB each under a 384 MiB limit all
    held their memory before validation got a cgroup of its own. Now they are counted together."""
    settings.ORS_INSPECT_MEMORY_BYTES = 384 * MiB
    hog = """
held, pids = 0, []
for _ in range(3):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        block = bytearray(160 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1  # resident, page by page
        os.write(w, b"y")
        time.sleep(5)
        os._exit(0)
    os.close(w)
    pids.append((pid, r))
for pid, r in pids:
    os.read(r, 1)
    held += os.waitpid(pid, 0)[1] == 0
print(f"children held {held}", file=sys.stderr, flush=True)
os._exit(3)
"""
    body = failed(publish(owner, "hostile", "hog.py", env_with(hog, imports="import os, sys, time")))
    # The kernel killed a child (or the parent) at the shared limit: never all three held on.
    assert "children held 3" not in body["traceback"], body


# --- what the child sees -----------------------------------------------------------------------------


def test_the_child_sees_its_package_at_a_neutral_path_and_no_work_folder(owner, settings, tmp_path, host_tmp):
    # Which host folders the mount tables name, by their index in `host` (the platform masks its own
    # paths in what it shows an author, so the tables themselves would not come back as they are).
    host = [str(tmp_path), str(settings.ORS_PACKAGE_DIR), str(settings.BASE_DIR), tempfile.gettempdir(),
            os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)]
    look = f"""
tables = "".join(open(f"/proc/{{p}}").read() for p in ("self/mountinfo", "self/mounts", "1/mountinfo"))
seen = {{"ors": sorted(os.listdir("/ors")), "cwd": os.getcwd(), "argv": sys.argv, "home": os.listdir(os.environ["HOME"]),
        "named": [n for n, folder in enumerate({host!r}) if folder in tables]}}
raise RuntimeError("seen " + json.dumps(seen))
"""
    body = failed(publish(owner, "hostile", "look.py", env_with(look, imports="import json, os, sys")))
    seen = json.loads(body["detail"].split("seen ", 1)[1])
    # The package, the platform's code, and the interpreter and site-packages at their neutral paths
    # (docs/sandbox.md); no work folder of the host's.
    assert set(seen["ors"]) <= {"env", "lib", "python", "venv"} and "env" in seen["ors"], seen
    assert seen["cwd"] == "/ors/env", seen
    assert seen["home"] == []  # a private, empty /tmp
    for host_path in host:
        assert host_path not in body["detail"]
    assert [host[n] for n in seen["named"]] == [], seen
