"""What a killed process leaves behind: its staged upload, its unpacked package, an ingest job that
says `running` forever, a build that says `building`. A real server is killed with SIGKILL mid-ingest
and mid-publish; the scheduled task and the start-up command (`make run`) then clean up."""

from __future__ import annotations

import io
import os
import signal
import tempfile
import threading

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import connection

from orsplatform.catalog import publishing, services, tasks
from orsplatform.catalog.models import EnvironmentVersion, IngestJob, Split, Task
from orsplatform.celery import task
from tests.catalog.conftest import leftover_uploads
from tests.catalog.support import api, bare_environment, env_with, jsonl, upload_tasks, wait_until, zip_bytes
from tests.fixtures.server import start_server

QUESTIONS = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]
KILL_TIMEOUT = 120.0  # generous: a loaded 2-CPU machine


@pytest.fixture
def quiz(owner):
    env = bare_environment(owner.team, "quiz")
    assert upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl(QUESTIONS), mode="replace").status_code == 200
    return env


@pytest.fixture
def server_tmp(tmp_path, monkeypatch):
    """The server's temporary folder (its inspection folders), this test's alone: the sweep run
    here never meets another run's."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def server(tmp_path, settings, build_dirs, server_tmp):
    # The embedded default, as `make run` runs it: the filesystem broker (so the start-up command
    # knows that nothing of the killed server's can still be in flight).
    settings.CELERY_BROKER_URL = "filesystem://localhost/"
    proc = start_server(tmp_path, ORS_UPLOAD_DIR=str(settings.ORS_UPLOAD_DIR), CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
                        ORS_BROKER_DIR=str(tmp_path / "broker"), TMPDIR=str(server_tmp), **build_dirs)
    yield proc
    proc.stop()


def post_in_background(url: str, headers: dict, files: dict) -> threading.Thread:
    """The client whose request the server is busy with when it is killed (its error is expected)."""
    def send() -> None:
        try:
            httpx.post(url, headers=headers, files=files, timeout=KILL_TIMEOUT)
        except httpx.HTTPError:
            pass

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def kill_9(server) -> None:
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


def liveness_lock_free(job_id: int) -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                       "AND classid = %s AND objid = %s", [services.INGEST_LOCK_SPACE, services._lock_key(job_id)])
        return cursor.fetchone()[0] == 0


def kill_mid_ingest(server, owner) -> IngestJob:
    rows = jsonl({"question": f"big{i}", "answer": str(i)} for i in range(400_000))
    sender = post_in_background(f"{server.url}/api/v1/environments/acme/quiz/splits/train/tasks?mode=replace",
                                owner.headers, {"file": ("big.jsonl", rows.encode())})
    assert wait_until(lambda: IngestJob.objects.filter(status="running").exists(), timeout=KILL_TIMEOUT)
    kill_9(server)
    sender.join(timeout=KILL_TIMEOUT)
    job = IngestJob.objects.get(status=IngestJob.Status.RUNNING)
    assert job.status == IngestJob.Status.RUNNING and os.path.exists(job.source_path)
    # PostgreSQL ends the killed server's session (and so frees its lock) once it sees the socket close.
    assert wait_until(lambda: liveness_lock_free(job.id), timeout=KILL_TIMEOUT)
    return job


def check_cleaned(job: IngestJob, quiz, settings) -> None:
    job.refresh_from_db()
    assert job.status == IngestJob.Status.FAILED and job.finished_at is not None
    assert job.error_report["detail"] == services.ABANDONED_INGEST
    assert job.source_path == "" and leftover_uploads(settings) == []
    # Nothing of the killed ingest was written: the split is as it was.
    assert list(Task.objects.filter(split__environment=quiz).order_by("index").values_list("spec", flat=True)) \
        == QUESTIONS
    assert Split.objects.get(environment=quiz, name="train").num_tasks == 5


def test_an_ingest_killed_with_its_server_is_failed_and_its_upload_removed_by_the_scheduled_task(
        server, owner, quiz, settings):
    job = kill_mid_ingest(server, owner)
    staged = job.source_path
    settings.ORS_STAGED_MAX_AGE_SECONDS = 0  # on SQLite the age is the only sign of a dead process
    tasks.cleanup_staged.apply()
    check_cleaned(job, quiz, settings)
    assert not os.path.exists(staged)
    r = api(owner).get(f"/api/v1/ingest-jobs/{job.id}")
    assert r.status_code == 200 and r.json()["status"] == "failed"


def test_an_ingest_killed_with_its_server_is_failed_by_the_startup_command(server, owner, quiz, settings):
    job = kill_mid_ingest(server, owner)
    out = io.StringIO()
    call_command("cleanup_staged", "--startup", stdout=out)
    assert "1 ingest jobs" in out.getvalue()
    check_cleaned(job, quiz, settings)


def inspect_dirs(root) -> list:
    return sorted(p.name for p in root.glob(f"{publishing.INSPECT_PREFIX}*"))


def test_a_publish_killed_mid_validation_leaves_nothing_after_the_startup_command(server, owner, settings,
                                                                                server_tmp):
    # Validation of this package takes a minute (its import sleeps): the server is killed meanwhile.
    package = zip_bytes({"env.py": env_with("time.sleep(60)", imports="import time")})
    sender = post_in_background(f"{server.url}/api/v1/environments/acme/slow/versions", owner.headers,
                                {"package": ("slow.zip", package)})
    upload_dir = settings.ORS_UPLOAD_DIR
    assert wait_until(lambda: any(p.name.startswith("orspkg-") for p in upload_dir.glob("*"))
                      and any(p.is_file() for p in upload_dir.glob("*"))
                      and any((server_tmp / name / "pkg").is_dir() for name in inspect_dirs(server_tmp)),
                      timeout=KILL_TIMEOUT)
    kill_9(server)
    sender.join(timeout=KILL_TIMEOUT)
    left = leftover_uploads(settings)
    assert len(left) == 2  # the staged upload and the package unpacked from it
    [killed] = inspect_dirs(server_tmp)  # the copy being inspected
    # Another server process's publish, live meanwhile (its folder held), and a folder too young to
    # judge without a mark (its process may not have locked it yet): both kept.
    young = server_tmp / f"{publishing.INSPECT_PREFIX}young"
    young.mkdir()
    out = io.StringIO()
    with publishing.inspect_workdir() as live:
        call_command("cleanup_staged", "--startup", stdout=out)
        assert live.is_dir()
    assert "2 staged uploads removed" in out.getvalue()
    assert "1 inspection folders of killed publishes removed" in out.getvalue()
    assert leftover_uploads(settings) == []
    assert killed not in inspect_dirs(server_tmp) and inspect_dirs(server_tmp) == [young.name]


def test_the_scheduled_task_keeps_fresh_uploads_and_the_files_of_queued_jobs(owner, quiz, settings, monkeypatch):
    monkeypatch.setattr(tasks.ingest_tasks, "delay", lambda job_id: None)  # a broker that is slow to deliver
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl(QUESTIONS))
    assert r.status_code == 202
    fresh = settings.ORS_UPLOAD_DIR / "fresh.zip"
    fresh.write_bytes(b"PK")
    settings.ORS_STAGED_MAX_AGE_SECONDS = 3600
    tasks.cleanup_staged.apply()
    assert fresh.exists()
    settings.ORS_STAGED_MAX_AGE_SECONDS = 0
    tasks.cleanup_staged.apply()
    assert not fresh.exists()
    job = IngestJob.objects.get(id=r.json()["id"])
    assert job.status == IngestJob.Status.QUEUED and os.path.exists(job.source_path)  # still the job's


def test_a_half_stored_package_is_removed_and_stored_ones_kept(live_db, settings):
    settings.ORS_PACKAGE_DIR.mkdir(parents=True)
    half = settings.ORS_PACKAGE_DIR / f"{services.STAGING_PREFIX}abc123"
    (half / "pkg").mkdir(parents=True)
    stored = settings.ORS_PACKAGE_DIR / ("f" * 64)
    stored.mkdir()
    settings.ORS_STAGED_MAX_AGE_SECONDS = 0
    assert services.uploads_remove_stale(older_than_seconds=0, limit=10) == 1
    assert not half.exists() and stored.exists()


def test_the_startup_command_fails_a_build_the_embedded_worker_was_running(owner, settings, monkeypatch):
    monkeypatch.setattr(tasks.build_version, "delay", lambda version_id: None)  # the build never ended
    package = zip_bytes({"env.py": env_with("", imports=""), "requirements.txt": "easydict==1.13\n"})
    r = api(owner).post("/api/v1/environments/acme/needy/versions",
                        {"package": SimpleUploadedFile("needy.zip", package)})
    assert r.status_code == 202
    # The embedded default: the filesystem broker, whose only worker `make run` starts after this.
    settings.CELERY_BROKER_URL = "filesystem://localhost/"
    call_command("cleanup_staged", "--startup", stdout=io.StringIO())
    version = EnvironmentVersion.objects.get(environment__slug="needy")
    assert version.status == EnvironmentVersion.Status.FAILED and "stopped without finishing" in version.error
    detail = api(owner).get("/api/v1/environments/acme/needy").json()
    assert detail["current_version"] is None and detail["versions"][0]["status"] == "failed"


def test_the_cleanup_runs_on_the_beat_schedule(settings):
    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "catalog.cleanup_staged")
    assert entry["schedule"] > 0 and task(entry["task"]).name == tasks.cleanup_staged.name
