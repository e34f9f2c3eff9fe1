"""An environment's lifecycle for its team: a failed first build leaves an environment marked as
never published (its log, a delete button) that only its team sees; owners and admins delete an
environment from the console (after a confirmation page) or over REST, members get 403 and other
teams 404; the sessions and analytics that name it stay (the audit log), open sessions run to their
end, and a build page's banner and log colour follow the build. Real builds, real episodes."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from orsplatform.catalog.models import Environment, EnvironmentVersion, Split
from orsplatform.episodes.models import Session
from orsplatform.teams.models import ApiKey
from orsplatform.teams.services import api_key_create
from tests.catalog.support import api, echo_env, in_thread, login, publish, wait_until, zip_bytes
from tests.catalog.test_requirements import BUILD_SECONDS, edict
from tests.fixtures.ors import sse_result, start_episode

DELETE_PAGE = "/console/acme/environments/{slug}/delete"


def _delete(person, slug: str, team: str = "acme"):
    return api(person).delete(f"/api/v1/environments/{team}/{slug}")


def _wait_finished(slug: str, number: int = 1) -> EnvironmentVersion:
    def done() -> bool:
        return EnvironmentVersion.objects.get(environment__slug=slug, number=number).status not in (
            EnvironmentVersion.Status.BUILDING, EnvironmentVersion.Status.VALIDATING)
    assert wait_until(done, timeout=BUILD_SECONDS), "the build did not finish in time"
    return EnvironmentVersion.objects.get(environment__slug=slug, number=number)


def _banner(page: str) -> tuple[str, str]:
    """The build page's banner: its class and its text."""
    found = re.search(r'<p id="build-banner" class="([^"]*)" role="status">([^<]*)</p>', page)
    assert found, "no banner"
    return found.group(1), found.group(2)


async def _call(client, headers: dict, sid: str, name: str, body: dict) -> dict:
    r = await client.post("/call", headers={**headers, "X-Session-ID": sid}, json={"name": name, "input": body})
    assert r.status_code == 200, r.text
    return sse_result(r.text)


# --- deleting ---------------------------------------------------------------------------------------


async def test_an_owner_deletes_an_environment_after_a_confirmation_page_and_its_sessions_stay(
        client, owner, settings):
    settings.ORS_CATALOG_CACHE_SECONDS = 0
    settings.ORS_SETUP_WAIT_SECONDS = 120  # a worker's start on a loaded machine: waited for, not retried
    r = await in_thread(publish)(owner, "echo", "echo.zip", zip_bytes({"env.py": echo_env("one")}))
    assert r.status_code == 201, r.json()
    sid = await start_episode(client, owner.headers, env="acme/echo", split="train", index=1)
    result = await _call(client, owner.headers, sid, "say", {"word": "trainword1"})
    assert result["output"]["finished"] is True
    assert (await client.post("/delete", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200
    package = (await in_thread(EnvironmentVersion.objects.get)(environment__slug="echo")).package_path

    web = await in_thread(login)(owner)
    page = await in_thread(web.get)(DELETE_PAGE.format(slug="echo"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Delete acme/echo?" in text and "1 session" in text and "survives" in text

    # The name typed wrong: nothing happens.
    wrong = await in_thread(web.post)(DELETE_PAGE.format(slug="echo"), {"confirm": "acme/other"})
    assert wrong.status_code == 302
    assert await in_thread(Environment.objects.filter(slug="echo").exists)()

    done = await in_thread(web.post)(DELETE_PAGE.format(slug="echo"), {"confirm": "acme/echo"})
    assert done.status_code == 302 and done["Location"] == "/console/acme/environments/"
    listing = await in_thread(web.get)(done["Location"])
    assert "Deleted acme/echo" in listing.content.decode() and 'href="/environments/acme/echo/"' not in listing.content.decode()

    # Gone from every face ...
    assert (await client.get("/acme/echo/tools", headers=owner.headers)).status_code == 404
    names = [e["name"] for e in (await in_thread(api(owner).get)("/api/v1/environments")).json()]
    assert "acme/echo" not in names
    assert (await in_thread(web.get)("/environments/acme/echo/")).status_code == 404
    # ... its tasks and package with it, its session and tool calls kept (the audit log).
    session = await in_thread(Session.objects.select_related("environment").get)(sid=sid)
    assert session.environment.deleted_at is not None and session.environment.slug.startswith("echo-deleted-")
    assert await in_thread(session.tool_calls.count)() == 1
    assert not await in_thread(Split.objects.filter(environment_id=session.environment_id).exists)()
    assert not Path(package).exists()
    explorer = await in_thread(web.get)(f"/analytics/acme/sessions/{sid}/")
    assert explorer.status_code == 200 and "acme/echo-deleted-" in explorer.content.decode()

    # The name is free again: a new environment, from version 1.
    again = await in_thread(publish)(owner, "echo", "echo.zip", zip_bytes({"env.py": echo_env("two")}))
    assert again.status_code == 201 and again.json()["number"] == 1


def test_only_owners_and_admins_delete_members_get_403_and_other_teams_404(owner, member, viewer, outsider):
    assert publish(owner, "echo", "echo.py", echo_env("one")).status_code == 201
    page = DELETE_PAGE.format(slug="echo")
    for person in (member, viewer):
        assert login(person).get(page).status_code == 403
        assert login(person).post(page, {"confirm": "acme/echo"}).status_code == 403
    assert login(outsider).get(page).status_code == 404
    assert login(outsider).post(page, {"confirm": "acme/echo"}).status_code == 404
    # The listing offers the button to those who may press it only.
    assert b"Delete\xe2\x80\xa6" in login(owner).get("/console/acme/environments/").content
    assert b"Delete\xe2\x80\xa6" not in login(member).get("/console/acme/environments/").content

    # REST: a sessions key of the team 403, another team's key 404 (nothing revealed), the owner's 200.
    assert _delete(member, "echo").status_code == 403
    assert _delete(outsider, "echo").status_code == 404
    assert _delete(outsider, "echo", team="globex").status_code == 404
    assert _delete(None, "echo").status_code in (401, 403)
    r = _delete(owner, "echo")
    assert r.status_code == 200, r.json()
    assert r.json() == {"deleted": "acme/echo", "sessions_kept": 0, "open_sessions": 0, "keys_revoked": 0}
    assert _delete(owner, "echo").status_code == 404


def test_a_manage_key_whose_creator_is_a_member_may_not_delete(owner, member):
    assert publish(owner, "echo", "echo.py", echo_env("one")).status_code == 201
    bob = get_user_model().objects.get(username=member.username)
    key = api_key_create(team=member.team, name="bobs", scopes=["sessions", "publish", "manage"], created_by=bob)
    r = api().delete("/api/v1/environments/acme/echo", HTTP_X_API_KEY=key.token)
    assert r.status_code == 403 and "owner or admin" in r.json()["detail"]
    assert Environment.objects.filter(slug="echo", deleted_at__isnull=True).exists()


def test_keys_bound_to_a_deleted_environment_are_revoked(owner):
    assert publish(owner, "echo", "echo.py", echo_env("one")).status_code == 201
    environment = Environment.objects.get(slug="echo")
    bound = api_key_create(team=owner.team, name="bound", scopes=["sessions"], environment=environment)
    r = _delete(owner, "echo")
    assert r.status_code == 200 and r.json()["keys_revoked"] == 1
    assert ApiKey.objects.get(prefix=bound.api_key.prefix).revoked_at is not None


async def test_an_open_session_runs_to_its_end_after_its_environment_is_deleted(client, owner, settings):
    settings.ORS_CATALOG_CACHE_SECONDS = 0
    settings.ORS_SETUP_WAIT_SECONDS = 120  # a worker's start on a loaded machine: waited for, not retried
    assert (await in_thread(publish)(owner, "echo", "echo.py", echo_env("one"))).status_code == 201
    sid = await start_episode(client, owner.headers, env="acme/echo", split="test", index=0)
    r = await in_thread(_delete)(owner, "echo")
    assert r.status_code == 200 and r.json()["open_sessions"] == 1
    # No new episode ...
    created = await client.post("/create_session", headers=owner.headers)
    refused = await client.post("/acme/echo/create", headers={**owner.headers, "X-Session-ID": created.json()["sid"]},
                                json={"split": "test", "index": 0})
    assert refused.status_code == 404
    # ... but the open one finishes on the worker that holds it, its package still on disk.
    result = await _call(client, owner.headers, sid, "say", {"word": "testword0"})
    assert result["ok"] is True and result["output"]["reward"] == 1.0


# --- a failed first build, and the build page -----------------------------------------------------


def test_a_failed_first_build_is_marked_for_its_team_hidden_from_others_and_deletable(owner, member, outsider):
    web = login(owner)
    package = zip_bytes(edict(requirement="no-such-package-ors-xyz==1.0"))
    r = web.post("/console/acme/environments/publish",
                 {"package": SimpleUploadedFile("ghost.zip", package), "slug": "ghost", "visibility": "public"})
    assert r.status_code == 302 and r["Location"] == "/console/acme/environments/ghost/versions/1/build"
    version = _wait_finished("ghost")
    assert version.status == EnvironmentVersion.Status.FAILED

    build = web.get(r["Location"]).content.decode()
    # The banner says what happened, in red; nothing green says it is installing.
    assert _banner(build) == ("banner bad", "The build failed: nothing was published.")
    assert '<ul class="messages">' not in build and ">Installing its requirements" not in build
    assert '<pre id="build-log" class="traceback"' in build and "no-such-package-ors-xyz" in build

    listing = web.get("/console/acme/environments/").content.decode()
    assert "Not published" in listing and 'href="/console/acme/environments/ghost/versions/1/build"' in listing
    assert 'href="/console/acme/environments/ghost/delete"' in listing

    # Its team sees it marked, with its log and (owners) a delete button; no snippets that would fail.
    hub = web.get("/environments/acme/ghost/").content.decode()
    assert "Not published: the build of version 1 failed." in hub and 'id="unpublished-delete"' in hub
    assert "snippet" not in hub
    member_view = login(member).get("/environments/acme/ghost/").content.decode()
    assert "Not published" in member_view and 'id="unpublished-delete"' not in member_view
    # Anyone else: nothing, though it asked to be public; not in the catalog either.
    assert login(outsider).get("/environments/acme/ghost/").status_code == 404
    assert api(outsider).get("/api/v1/environments/acme/ghost").status_code == 404
    assert b"acme/ghost" not in login(outsider).get("/environments/").content

    assert web.post("/console/acme/environments/ghost/delete", {"confirm": "acme/ghost"}).status_code == 302
    # The listing first: the next page rendered shows (and spends) the flash message, 404 pages included.
    listing = web.get("/console/acme/environments/").content.decode()
    assert "Deleted acme/ghost" in listing and 'href="/environments/acme/ghost/"' not in listing
    assert web.get("/environments/acme/ghost/").status_code == 404


def test_a_successful_build_shows_a_green_banner_and_its_log_not_as_an_error(owner):
    web = login(owner)
    r = web.post("/console/acme/environments/publish",
                 {"package": SimpleUploadedFile("edict.zip", zip_bytes(edict("lifecycle"))), "slug": "edict"})
    assert r.status_code == 302
    first = web.get(r["Location"]).content.decode()
    # Whatever the build's state when the page is first drawn, banner and status agree.
    status = EnvironmentVersion.objects.get(environment__slug="edict", number=1).status
    if status == EnvironmentVersion.Status.BUILDING:
        assert _banner(first) == ("banner ", "Installing its requirements: it is published when they are in and "
                                             "it passes validation.")
    version = _wait_finished("edict")
    assert version.status == EnvironmentVersion.Status.READY, version.error
    page = web.get(r["Location"]).content.decode()
    assert _banner(page) == ("banner ok", "Built and validated.")
    assert '<pre id="build-log" class="log"' in page and 'class="traceback"' not in page
    assert "ready: acme/edict@1" in page


def test_a_build_still_running_when_its_environment_is_deleted_publishes_nothing(
        servers, embedded_worker, owner, build_dirs):
    # As `make run` runs it: the build goes to the worker beside the server, so the delete lands
    # while it installs requirements no earlier test built (seconds; the delete takes milliseconds).
    embedded_worker.start(**build_dirs)
    server = servers(**build_dirs, **embedded_worker.env())
    r = httpx.post(f"{server.url}/api/v1/environments/acme/late/versions", headers={"X-API-Key": owner.token},
                   files={"package": ("late.zip", zip_bytes(edict("late", requirement="easydict==1.12")))},
                   timeout=60)
    assert r.status_code == 202, r.text
    assert _delete(owner, "late").status_code == 200
    version = EnvironmentVersion.objects.get(environment__slug__startswith="late-deleted-", number=1)

    # Failed at once (the delete says so); the build runs to its end on the worker, publishes nothing
    # and then removes the package it was reading.
    assert version.status == EnvironmentVersion.Status.FAILED and version.error.startswith("deleted: "), version.error
    assert wait_until(lambda: not Path(version.package_path).exists(), timeout=BUILD_SECONDS)
    version.refresh_from_db()
    assert version.status == EnvironmentVersion.Status.FAILED and version.error.startswith("deleted: "), version.error
    assert Environment.objects.get(id=version.environment_id).current_version is None
