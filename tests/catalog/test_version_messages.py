"""A message and a publisher on every version: the console's message field, the CLI's --message and
--user, the REST API's ``message`` and the key it came with; the manifest's tags, licence and compute
fields checked at publish; REST rollback answering what it replaced."""

from __future__ import annotations

import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.teams.services import api_key_create
from tests.catalog.support import ECHO_ENV, MANIFEST, api, echo_env, login, publish, tar_bytes, write_folder


def version(slug: str, number: int) -> EnvironmentVersion:
    return EnvironmentVersion.objects.get(environment__slug=slug, number=number)


def console_upload(client, team: str, content: str, **fields):
    return client.post(f"/console/{team}/environments/publish",
                       {"package": SimpleUploadedFile("echo.py", content.encode()), "slug": "echo", **fields})


def test_a_console_publish_stores_its_message_and_the_user(owner):
    client = login(owner)
    assert console_upload(client, "acme", ECHO_ENV, message="  First cut: one tool.  ").status_code == 302
    v1 = version("echo", 1)
    assert v1.message == "First cut: one tool." and v1.published_by == "alice" and v1.created_by.username == "alice"
    history = client.get("/environments/acme/echo/versions/").content.decode()
    assert "First cut: one tool." in history and '<td class="version-by">alice</td>' in history


def test_the_console_form_refuses_an_overlong_message(owner):
    response = console_upload(login(owner), "acme", ECHO_ENV, message="x" * 2001)
    assert response.status_code == 400 and not EnvironmentVersion.objects.filter(environment__team__slug="acme").exists()


def test_a_rest_publish_stores_its_message_and_names_the_key_and_its_maker(owner, outsider):
    key = api_key_create(team=owner.team, name="ci-bot", scopes=["publish"], created_by=login_user("alice"))
    r = publish(key_person(owner, key.token), "echo", "echo.py", ECHO_ENV, message="From CI, build 41")
    assert r.status_code == 201, r.json()
    assert r.json()["message"] == "From CI, build 41" and r.json()["published_by"] == "key ci-bot (alice)"
    v1 = version("echo", 1)
    assert v1.created_by_key_id == key.api_key.id and v1.published_by == "key ci-bot (alice)"
    # The history names the key for the team and for an outsider alike (a public fact of the version),
    # and the REST list carries it to any reader of the environment.
    page = login(owner).get("/environments/acme/echo/versions/").content.decode()
    assert "key ci-bot (alice)" in page and "From CI, build 41" in page
    listed = api(owner).get("/api/v1/environments/acme/echo/versions").json()
    assert listed[0]["published_by"] == "key ci-bot (alice)" and listed[0]["message"] == "From CI, build 41"
    # An outsider's key cannot publish into acme: 404, and nothing is recorded.
    assert publish(outsider, "echo", "echo.py", echo_env("two"), team="acme", message="x").status_code == 404
    assert EnvironmentVersion.objects.filter(environment__team__slug="acme").count() == 1


def test_a_key_without_a_maker_is_named_alone(owner):
    key = api_key_create(team=owner.team, name="robot", scopes=["publish"])
    assert publish(key_person(owner, key.token), "echo", "echo.py", ECHO_ENV).status_code == 201
    assert version("echo", 1).published_by == "key robot" and version("echo", 1).message == ""


def test_a_rest_message_that_is_too_long_is_a_400_and_publishes_nothing(owner):
    r = publish(owner, "echo", "echo.py", ECHO_ENV, message="y" * 2001)
    assert r.status_code == 400 and "message" in r.json()["detail"]
    assert not EnvironmentVersion.objects.filter(environment__team__slug="acme").exists()


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("publish_env", *args, stdout=out)
    return out.getvalue().strip()


def test_the_cli_takes_a_message_and_records_its_account_or_the_user_named(owner, member, outsider, tmp_path):
    path = tmp_path / "echo.py"
    path.write_text(ECHO_ENV)
    assert run(str(path), "--team", "acme", "--message", "Seeded from the CLI") == "published acme/echo@1"
    v1 = version("echo", 1)
    assert v1.message == "Seeded from the CLI" and v1.published_by.startswith("command line (")
    path.write_text(echo_env("two"))
    assert run(str(path), "--team", "acme", "-m", "As bob", "--user", "bob") == "published acme/echo@2"
    v2 = version("echo", 2)
    assert v2.published_by == "bob" and v2.created_by.username == "bob" and v2.message == "As bob"
    path.write_text(echo_env("three"))
    with pytest.raises(CommandError, match="No user 'charlie' who may publish"):
        run(str(path), "--team", "acme", "--user", "charlie")  # the outsider is not of acme
    with pytest.raises(CommandError, match="the limit is 2000"):
        run(str(path), "--team", "acme", "-m", "z" * 2001)
    assert EnvironmentVersion.objects.filter(environment__team__slug="acme").count() == 2


def test_publish_envs_records_who_ran_it(live_db, tmp_path, settings):
    folder = write_folder(tmp_path / "envs" / "quiet", {"env.py": ECHO_ENV, "manifest.toml": MANIFEST.format(
        name="quiet", cls="Echo")})
    call_command("publish_envs", "--dir", str(folder.parent), "-m", "Bundled", stdout=io.StringIO())
    v1 = version("quiet", 1)
    assert v1.message == "Bundled" and v1.published_by.startswith("publish_envs, command line (")


def test_the_manifest_tags_licence_and_compute_are_kept_and_checked(owner):
    manifest = MANIFEST.format(name="echo", cls="Echo") + (
        'tags = ["math", " reasoning ", "math"]\nlicense = "MIT"\n[compute]\ncpus = 2\nmemory = "4 GiB"\ngpu = false\n')
    r = publish(owner, "echo", "echo.tar.gz", tar_bytes({"env.py": ECHO_ENV, "manifest.toml": manifest}))
    assert r.status_code == 201, r.json()
    assert r.json()["tags"] == ["math", "reasoning"] and version("echo", 1).manifest["license"] == "MIT"
    for bad, why in [('tags = "math"', "'tags' must be a list"), ('tags = ["' + "t" * 41 + '"]', "'tags' must be"),
                     ("license = 3", "'license' must be a string"),
                     ('license = "MIT"\nlicence = "MIT"', "not both"),
                     ("[compute]\nnested = { a = 1 }", "'compute' must be a table")]:
        body = MANIFEST.format(name="echo", cls="Echo") + bad + "\n"
        r = publish(owner, "echo", "echo.tar.gz", tar_bytes({"env.py": echo_env("two"), "manifest.toml": body}))
        assert r.status_code == 400 and why in r.json()["detail"], (bad, r.json())
    assert EnvironmentVersion.objects.filter(environment__team__slug="acme").count() == 1


def test_a_rest_rollback_answers_the_version_it_replaced_so_a_script_can_undo(owner, member, outsider):
    publish(owner, "echo", "echo.py", echo_env("one"))
    publish(owner, "echo", "echo.py", echo_env("two"))
    r = api(owner).post("/api/v1/environments/acme/echo/rollback", {"version": 1}, content_type="application/json")
    assert r.status_code == 200 and r.json()["number"] == 1 and r.json()["previous"] == 2
    undo = api(owner).post("/api/v1/environments/acme/echo/rollback", {"version": r.json()["previous"]},
                           content_type="application/json")
    assert undo.json()["number"] == 2 and undo.json()["previous"] == 1
    # A member's key has the sessions scope only: 403; an outsider's: 404.
    assert api(member).post("/api/v1/environments/acme/echo/rollback", {"version": 1},
                            content_type="application/json").status_code == 403
    assert api(outsider).post("/api/v1/environments/acme/echo/rollback", {"version": 1},
                              content_type="application/json").status_code == 404
    assert version("echo", 2).environment.current_version.number == 2


# --- helpers ---------------------------------------------------------------------------------------

def login_user(username: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username=username)


def key_person(person, token: str):
    """``person`` as seen through another of the team's keys."""
    from dataclasses import replace

    return replace(person, token=token)
