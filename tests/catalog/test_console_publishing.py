"""Publishing through the web console: upload with the validation report, task upload with a progress
page, rollback buttons, and who may do what."""

from __future__ import annotations

import re

from django.core.files.uploadedfile import SimpleUploadedFile

from orsplatform.catalog.models import Environment, IngestJob, Task
from orsplatform.teams.models import Membership
from orsplatform.teams.services import membership_add
from tests.catalog.support import ECHO_ENV, bare_environment, echo_env, jsonl, login, tar_bytes


def upload(client, team: str, filename: str, content: str | bytes, **fields):
    data = content.encode() if isinstance(content, str) else content
    return client.post(f"/console/{team}/environments/publish",
                       {"package": SimpleUploadedFile(filename, data), **fields})


def upload_tasks(client, team: str, env: Environment, split: str, filename: str, content: str, **fields):
    return client.post(f"/console/{team}/environments/tasks", {
        "environment": env.id, "split": split, "mode": "replace",
        "file": SimpleUploadedFile(filename, content.encode()), **fields})


def test_the_nav_link_leads_to_the_teams_environments_page(owner):
    client = login(owner)
    assert 'href="/console/environments"' in client.get("/console/acme/").content.decode()
    response = client.get("/console/environments")
    assert response.status_code == 302 and response["Location"] == "/console/acme/environments/"
    page = client.get("/console/acme/environments/").content.decode()
    assert "Publish a package" in page and "Upload tasks" in page


def test_an_owner_publishes_a_package_and_sees_the_validation_result(owner):
    client = login(owner)
    response = upload(client, "acme", "echo.py", ECHO_ENV, slug="echo", visibility="private")
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert "Published acme/echo@1: validation passed" in page and "a sample prompt rendered" in page
    assert "acme/echo" in page and "current" in page
    version = Environment.objects.get(slug="echo").current_version
    assert version.number == 1 and version.created_by.username == "alice"


def test_the_slug_defaults_to_the_file_name(owner):
    client = login(owner)
    assert upload(client, "acme", "My_Echo.tar.gz", tar_bytes({"env.py": ECHO_ENV})).status_code == 302
    assert Environment.objects.filter(team=owner.team, slug="my-echo").exists()


def test_a_failed_validation_is_shown_with_its_check_and_traceback(owner):
    client = login(owner)
    broken = ECHO_ENV.replace("class Echo", "raise ValueError('tenant bug here')\nclass Echo")
    response = upload(client, "acme", "broken.py", broken, slug="broken")
    assert response.status_code == 400
    page = response.content.decode()
    assert "Validation failed" in page and '<code id="failed-check">import</code>' in page
    traceback = re.search(r'<pre class="traceback">(.*?)</pre>', page, re.S).group(1)
    assert "Traceback" in traceback and "tenant bug here" in traceback
    assert not Environment.objects.filter(slug="broken").exists()


def test_a_hostile_archive_is_reported_in_the_console(owner):
    client = login(owner)
    response = upload(client, "acme", "evil.tar.gz", tar_bytes({"env.py": ECHO_ENV, "../x.py": "1"}), slug="evil")
    assert response.status_code == 400 and "outside the package" in response.content.decode()


def test_an_oversize_package_is_refused_in_the_console(owner, settings):
    settings.ORS_MAX_PACKAGE_BYTES = 100
    response = upload(login(owner), "acme", "echo.py", ECHO_ENV, slug="echo")
    assert response.status_code == 413 and "the limit is 100" in response.content.decode()


def test_the_rollback_button_switches_the_current_version(owner):
    client = login(owner)
    upload(client, "acme", "echo.py", echo_env("one"), slug="echo")
    upload(client, "acme", "echo.py", echo_env("two"), slug="echo")
    page = client.get("/console/acme/environments/").content.decode()
    assert "Serve @1" in page and "Serve @2" not in page
    response = client.post("/console/acme/environments/echo/rollback", {"version": "1"})
    assert response.status_code == 302
    assert Environment.objects.get(slug="echo").current_version.number == 1
    assert "now serves version 1" in client.get(response["Location"]).content.decode()
    assert client.post("/console/acme/environments/echo/rollback", {"version": "9"}).status_code == 404


def test_a_task_upload_shows_a_progress_page_that_polls_a_json_endpoint(owner):
    client = login(owner)
    quiz = bare_environment(owner.team, "quiz")
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(50)]
    response = upload_tasks(client, "acme", quiz, "train", "t.jsonl", jsonl(rows))
    assert response.status_code == 302
    job = IngestJob.objects.get()
    assert response["Location"] == f"/console/acme/ingest/{job.id}/"
    page = client.get(response["Location"]).content.decode()
    assert '<progress id="ingest-progress" max="100" value="100"' in page
    assert f"/console/acme/ingest/{job.id}.json" in page and "fetch(url" in page
    assert not re.search(r'<script src="(?!/static/)', page)  # no CDN: only the site's own script
    progress = client.get(f"/console/acme/ingest/{job.id}.json").json()
    assert progress["status"] == "succeeded" and progress["rows_done"] == 50 and progress["percent"] == 100
    assert Task.objects.filter(split__environment=quiz, split__name="train").count() == 50


def test_a_failed_task_upload_shows_the_bad_lines(owner):
    client = login(owner)
    quiz = bare_environment(owner.team, "quiz")
    response = upload_tasks(client, "acme", quiz, "train", "t.jsonl", '{"question": "a"}\nnot json\n[]\n')
    page = client.get(response["Location"]).content.decode()
    assert "failed" in page and "line 2: Not valid JSON" in page and "line 3: expected a JSON object" in page


def test_a_task_upload_without_a_split_name_is_a_form_error(owner):
    client = login(owner)
    quiz = bare_environment(owner.team, "quiz")
    response = upload_tasks(client, "acme", quiz, "", "t.jsonl", '{"question": "a"}\n')
    assert response.status_code == 400 and "This field is required" in response.content.decode()
    assert not IngestJob.objects.exists()


def test_a_viewer_sees_environments_but_cannot_publish_upload_or_roll_back(owner):
    client = login(owner)
    upload(client, "acme", "echo.py", echo_env("one"), slug="echo")
    upload(client, "acme", "echo.py", echo_env("two"), slug="echo")
    membership_add(team=owner.team, username="vera", role=Membership.Role.VIEWER)
    from types import SimpleNamespace

    viewer = login(SimpleNamespace(username="vera"))
    page = viewer.get("/console/acme/environments/").content.decode()
    assert "acme/echo" in page and "Publish a package" not in page and "Serve @1" not in page
    assert upload(viewer, "acme", "x.py", ECHO_ENV, slug="x").status_code == 403
    assert viewer.post("/console/acme/environments/echo/rollback", {"version": "1"}).status_code == 403
    quiz = Environment.objects.get(slug="echo")
    assert upload_tasks(viewer, "acme", quiz, "train", "t.jsonl", '{"a": 1}\n').status_code == 403
    assert Environment.objects.get(slug="echo").current_version.number == 2


def test_a_member_may_publish(owner, member):
    assert upload(login(member), "acme", "echo.py", ECHO_ENV, slug="echo").status_code == 302


def test_an_outsider_cannot_see_or_publish_into_another_team(owner, outsider):
    client = login(owner)
    quiz = bare_environment(owner.team, "quiz")
    upload_tasks(client, "acme", quiz, "train", "t.jsonl", '{"question": "a"}\n')
    job = IngestJob.objects.get()
    other = login(outsider)
    assert other.get("/console/acme/environments/").status_code == 404
    assert upload(other, "acme", "echo.py", ECHO_ENV, slug="echo").status_code == 404
    assert other.post("/console/acme/environments/quiz/rollback", {"version": "1"}).status_code == 404
    assert other.get(f"/console/acme/ingest/{job.id}/").status_code == 404
    assert other.get(f"/console/acme/ingest/{job.id}.json").status_code == 404
    # Their own team's form does not offer acme's environments either.
    response = upload_tasks(other, "globex", quiz, "train", "t.jsonl", '{"question": "a"}\n')
    assert response.status_code == 400 and IngestJob.objects.count() == 1
    assert not Environment.objects.filter(slug="echo").exists()


def test_the_environments_page_is_paginated(owner):
    from django.contrib.auth import get_user_model
    from django.test import Client

    for i in range(25):
        Environment.objects.create(team=owner.team, slug=f"env-{i:02d}")
    client = Client()
    client.force_login(get_user_model().objects.get(username=owner.username))
    first = client.get("/console/acme/environments/").content.decode()
    second = client.get("/console/acme/environments/?page=2").content.decode()
    assert "Page 1 of 2" in first and 'href="/environments/acme/env-00/"' in first
    assert 'href="/environments/acme/env-19/"' in first and 'href="/environments/acme/env-20/"' not in first
    assert 'href="/environments/acme/env-20/"' in second and 'href="/environments/acme/env-00/"' not in second
