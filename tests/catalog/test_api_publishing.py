"""Publishing through the REST API: versions, no-op republish, rollback, splits, tenancy, the schema."""

from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.teams.services import api_key_create
from tests.catalog.conftest import leftover_uploads, stored_packages
from tests.catalog.support import ECHO_ENV, MANIFEST, api, echo_env, publish, tar_bytes, zip_bytes


def test_a_single_py_file_publishes_as_version_one_with_its_tools_and_tasks(owner, settings):
    r = publish(owner, "echo", "echo.py", ECHO_ENV)
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["environment"] == "acme/echo" and body["number"] == 1 and body["created"] is True
    assert body["entrypoint"] == "env:Echo" and body["current"] is True
    assert [t["name"] for t in body["tools"]] == ["say"]
    assert body["validation"]["prompt_checked"] is True
    splits = api(owner).get("/api/v1/environments/acme/echo/splits").json()
    assert [(s["name"], s["num_tasks"]) for s in splits] == [("train", 3), ("test", 3)]
    assert leftover_uploads(settings) == []


def test_re_uploading_identical_content_is_a_no_op_returning_the_existing_version(owner):
    first = publish(owner, "echo", "echo.py", ECHO_ENV).json()
    again = publish(owner, "echo", "echo.py", ECHO_ENV)
    assert again.status_code == 200
    assert again.json()["number"] == first["number"] and again.json()["created"] is False
    assert EnvironmentVersion.objects.filter(environment__slug="echo").count() == 1


def test_new_content_makes_a_new_immutable_version_and_the_old_one_stays(owner):
    publish(owner, "echo", "echo.py", echo_env("one"))
    second = publish(owner, "echo", "echo.py", echo_env("two"))
    assert second.status_code == 201 and second.json()["number"] == 2
    versions = api(owner).get("/api/v1/environments/acme/echo/versions").json()
    assert [(v["number"], v["current"]) for v in versions] == [(2, True), (1, False)]
    assert versions[0]["content_hash"] != versions[1]["content_hash"]
    one = api(owner).get("/api/v1/environments/acme/echo/versions/1")
    assert one.status_code == 200 and one.json()["number"] == 1
    assert api(owner).get("/api/v1/environments/acme/echo/versions/9").status_code == 404


def test_rollback_switches_the_current_version_back_and_forth(owner):
    publish(owner, "echo", "echo.py", echo_env("one"))
    publish(owner, "echo", "echo.py", echo_env("two"))
    r = api(owner).post("/api/v1/environments/acme/echo/rollback", {"version": 1}, content_type="application/json")
    assert r.status_code == 200 and r.json()["number"] == 1 and r.json()["current"] is True
    assert Environment.objects.get(slug="echo").current_version.number == 1
    assert api(owner).get("/api/v1/environments/acme/echo").json()["current_version"] == 1
    r = api(owner).post("/api/v1/environments/acme/echo/rollback", {"version": 2}, content_type="application/json")
    assert r.json()["number"] == 2
    missing = api(owner).post("/api/v1/environments/acme/echo/rollback", {"version": 7},
                              content_type="application/json")
    assert missing.status_code == 404 and "detail" in missing.json()


def test_a_zip_with_a_manifest_and_a_top_level_folder_publishes(owner):
    package = zip_bytes({"pkg/env.py": ECHO_ENV, "pkg/manifest.toml": MANIFEST.format(name="ignored", cls="Echo")
                         + "tool_timeout_seconds = 12\nrequired_secrets = [\"OPENAI_API_KEY\"]\n",
                         "pkg/README.md": "# Echo\n"})
    r = publish(owner, "zipped", "echo.zip", package)
    assert r.status_code == 201, r.json()
    # The URL names the environment; the manifest's other fields are kept.
    assert r.json()["environment"] == "acme/zipped"
    assert r.json()["manifest"]["tool_timeout_seconds"] == 12
    assert r.json()["manifest"]["required_secrets"] == ["OPENAI_API_KEY"]


def test_a_tar_gz_with_the_class_in_another_module_publishes_without_a_manifest(owner):
    r = publish(owner, "tarred", "echo.tar.gz", tar_bytes({"echo_env.py": ECHO_ENV, "helpers/util.py": "X = 1\n"}))
    assert r.status_code == 201, r.json()
    assert r.json()["entrypoint"] == "echo_env:Echo"


def test_two_environment_classes_without_an_entrypoint_are_refused_as_ambiguous(owner):
    two = ECHO_ENV + "\n\nclass Echo2(Echo):\n    pass\n"
    r = publish(owner, "twins", "twins.py", two)
    assert r.status_code == 400
    assert r.json()["check"] == "import" and "Several Environment classes" in r.json()["detail"]


def test_a_failed_validation_answers_400_with_the_check_and_the_tenant_traceback(owner, settings):
    r = publish(owner, "broken", "broken.py", ECHO_ENV.replace("class Echo", "raise RuntimeError('kaboom')\nclass Echo"))
    assert r.status_code == 400
    body = r.json()
    assert body["check"] == "import" and "kaboom" in body["detail"]
    assert "Traceback" in body["traceback"] and "kaboom" in body["traceback"]
    assert not Environment.objects.filter(slug="broken").exists()
    assert stored_packages(settings) == [] and leftover_uploads(settings) == []


def test_a_package_without_tools_or_splits_fails_its_check(owner):
    no_tools = ECHO_ENV.replace("    @tool\n", "")
    r = publish(owner, "notools", "e.py", no_tools)
    assert r.status_code == 400 and r.json()["check"] == "tools"
    no_splits = ECHO_ENV.replace('return [Split(name="train", type="train"), Split(name="test", type="test")]',
                                 "return []")
    r = publish(owner, "nosplits", "e.py", no_splits)
    assert r.status_code == 400 and r.json()["check"] == "splits"


def test_a_prompt_failure_on_the_sample_task_is_reported(owner):
    bad = ECHO_ENV.replace("return [TextBlock(text=f\"Say {self.task_spec['word']} ({VERSION})\")]",
                           "return self.task_spec['nope']")
    r = publish(owner, "noprompt", "e.py", bad)
    assert r.status_code == 400 and r.json()["check"] == "prompt" and "KeyError" in r.json()["detail"]


def test_a_bad_manifest_and_missing_requirements_are_reported(owner):
    bad = zip_bytes({"env.py": ECHO_ENV, "manifest.toml": "entrypoint = 42\n"})
    r = publish(owner, "badmanifest", "e.zip", bad)
    assert r.status_code == 400 and r.json()["check"] == "manifest"
    missing = zip_bytes({"env.py": ECHO_ENV, "manifest.toml": 'requirements = ["pydantic>=2", "no-such-package-xyz"]\n'})
    # Requirements are installed: one that does not exist fails the build with uv's message.
    r = api(owner).post("/api/v1/environments/acme/needs/versions?wait=1",
                        {"package": SimpleUploadedFile("e.zip", missing)})
    assert r.status_code == 400 and r.json()["check"] == "requirements"
    assert "no-such-package-xyz" in r.json()["detail"] and "pydantic" not in r.json()["detail"]


def test_an_environment_listing_tasks_by_num_tasks_and_get_task_is_snapshotted(owner):
    from tests.catalog.support import INDEXED_ENV

    r = publish(owner, "indexed", "indexed.py", INDEXED_ENV)
    assert r.status_code == 201, r.json()
    page = api(owner).get("/api/v1/environments/acme/indexed/splits/train/tasks").json()
    assert page["num_tasks"] == 4 and [t["spec"] for t in page["tasks"]] == [{"n": i} for i in range(4)]


def test_publishing_into_another_team_is_a_404_and_creates_nothing(owner, outsider):
    r = publish(outsider, "echo", "echo.py", ECHO_ENV, team="acme")
    assert r.status_code == 404 and r.json() == {"detail": "Environment not found."}
    publish(owner, "echo", "echo.py", echo_env("one"))
    publish(owner, "echo", "echo.py", echo_env("two"))
    assert publish(outsider, "echo", "echo.py", echo_env("three"), team="acme").status_code == 404
    rollback = api(outsider).post("/api/v1/environments/acme/echo/rollback", {"version": 1},
                                  content_type="application/json")
    assert rollback.status_code == 404
    assert Environment.objects.get(slug="echo").current_version.number == 2
    assert not Environment.objects.filter(team=outsider.team).exists()


def test_a_key_without_the_publish_scope_is_refused_with_403(owner, member):
    r = publish(member, "echo", "echo.py", ECHO_ENV)
    assert r.status_code == 403 and "publish" in r.json()["detail"]
    sessions_only = api_key_create(team=owner.team, name="trainer", scopes=["sessions"]).token
    r = Client(HTTP_X_API_KEY=sessions_only).post("/api/v1/environments/acme/echo/rollback", {"version": 1},
                                                  content_type="application/json")
    assert r.status_code == 403
    assert not Environment.objects.filter(slug="echo").exists()


def test_publishing_without_a_key_is_a_401(live_db):
    r = Client().post("/api/v1/environments/acme/echo/versions", {})
    assert r.status_code == 401 and "detail" in r.json()


def test_private_versions_and_splits_are_hidden_from_other_teams(owner, outsider):
    publish(owner, "echo", "echo.py", ECHO_ENV)
    for path in ("versions", "versions/1", "splits", "splits/train/tasks"):
        assert api(owner).get(f"/api/v1/environments/acme/echo/{path}").status_code == 200, path
        assert api(outsider).get(f"/api/v1/environments/acme/echo/{path}").status_code == 404, path


def test_visibility_can_be_set_at_upload_and_public_environments_are_readable_by_all(owner, outsider):
    r = publish(owner, "echo", "echo.py", ECHO_ENV, visibility="public")
    assert r.status_code == 201
    assert api(outsider).get("/api/v1/environments/acme/echo/versions").status_code == 200
    assert publish(owner, "other", "echo.py", ECHO_ENV, visibility="secret").status_code == 400


def test_the_schema_documents_the_publishing_endpoints(live_db):
    schema = Client().get("/api/schema/").content.decode()
    for path in ("/api/v1/environments/{team}/{slug}/versions", "/api/v1/environments/{team}/{slug}/rollback",
                 "/api/v1/environments/{team}/{slug}/splits/{split}/tasks", "/api/v1/ingest-jobs/{job_id}"):
        assert path in schema, path


def test_modules_of_a_multi_file_package_import_each_other_relatively(owner):
    env = ECHO_ENV.replace('VERSION = "one"', 'from .lib.words import VERSION')
    package = zip_bytes({"env.py": env, "lib/words.py": 'VERSION = "from a sibling module"\n'})
    r = publish(owner, "multi", "multi.zip", package)
    assert r.status_code == 201, r.json()
    assert r.json()["entrypoint"] == "env:Echo"
