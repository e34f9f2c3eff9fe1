"""Versions that say something: a files view of every version (a file's text, size-capped, binary
refused, links never followed), rollback through a confirmation with an undo on the page it came
from, catalog cards with tags, a week's sessions and pass rate, and the licence and compute fields on
the environment page. Owner, member and outsider are checked on every new page."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.catalog.services import environment_publish
from orsplatform.episodes.models import Session
from tests.hub.conftest import login, write_package

FILE_PAGES = [
    "/environments/acme/quiz/versions/1/files/",
    "/environments/acme/quiz/versions/2/files/",
    "/environments/acme/quiz/versions/1/files/env.py",
    "/environments/acme/quiz/versions/2/files/README.md",
]


def test_only_the_team_sees_a_private_environments_files(hub, owner, member, outsider):
    # One test for every page (each hub fixture publishes three packages through the sandbox).
    for url in FILE_PAGES:
        for person in (owner, member):
            assert login(person).get(url).status_code == 200, (person.username, url)
        assert login(outsider).get(url).status_code == 404, url
        assert Client().get(url).status_code == 404, url


def test_a_public_environments_files_are_readable_by_everyone(hub, outsider):
    for client in (Client(), login(outsider)):
        listing = client.get("/environments/acme/echo/versions/1/files/").content.decode()
        assert 'href="/environments/acme/echo/versions/1/files/README.md"' in listing
        page = client.get("/environments/acme/echo/versions/1/files/README.md").content.decode()
        assert "A public echo." in page


def test_each_version_shows_its_own_files_and_text(hub, owner):
    client = login(owner)
    one = client.get("/environments/acme/quiz/versions/1/files/env.py").content.decode()
    two = client.get("/environments/acme/quiz/versions/2/files/env.py").content.decode()
    assert "VERSION = &quot;one&quot;" in one and "VERSION = &quot;two&quot;" in two
    listing = client.get("/environments/acme/quiz/versions/1/files/").content.decode()
    assert "Files of @1" in listing and 'href="/environments/acme/quiz/versions/2/files/"' in listing
    # The files tab without a number is the current version's.
    assert "Files of @2" in client.get("/environments/acme/quiz/files/").content.decode()
    assert client.get("/environments/acme/quiz/versions/9/files/").status_code == 404
    assert client.get("/environments/acme/quiz/versions/9/files/env.py").status_code == 404
    assert client.get("/environments/acme/quiz/versions/99999999999999999999/files/").status_code == 404


def _add_files(version: EnvironmentVersion, files: dict[str, bytes]) -> Path:
    # Written into the stored package after publishing, as a bug or an intruder could: the view
    # must stay inside the package and never follow what it finds.
    root = Path(version.package_path)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_a_binary_file_is_named_not_shown_and_a_large_one_is_cut(hub, owner):
    version = hub.private.current_version
    _add_files(version, {"weights.bin": b"\x00\x01\x02" * 100, "big.txt": b"line\n" * 60_000,
                         "latin.txt": "café".encode("latin-1")})
    client = login(owner)
    binary = client.get("/environments/acme/quiz/versions/2/files/weights.bin").content.decode()
    assert 'id="file-binary"' in binary and 'id="file-text"' not in binary
    assert 'id="file-binary"' in client.get("/environments/acme/quiz/versions/2/files/latin.txt").content.decode()
    big = client.get("/environments/acme/quiz/versions/2/files/big.txt").content.decode()
    shown = re.search(r'<pre class="block-text" id="file-text">(.*?)</pre>', big, re.S).group(1)
    assert 'id="file-truncated"' in big and len(shown) == 256 * 1024 and shown.endswith("line")


def test_links_and_escaping_paths_are_never_followed(hub, owner, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST SECRET")
    root = _add_files(hub.private.current_version, {"sub/ok.txt": b"fine"})
    os.symlink(secret, root / "link.txt")
    os.symlink(tmp_path, root / "linkdir")
    os.mkfifo(root / "pipe")
    client = login(owner)
    assert "fine" in client.get("/environments/acme/quiz/versions/2/files/sub/ok.txt").content.decode()
    for path in ("link.txt", "linkdir/host-secret.txt", "../../host-secret.txt", "sub/../../host-secret.txt",
                 "pipe", "sub", "%2e%2e/host-secret.txt", "sub//ok.txt", "./sub/ok.txt", "x" * 300):
        response = client.get(f"/environments/acme/quiz/versions/2/files/{path}")
        assert response.status_code == 404, path
        assert "HOST SECRET" not in response.content.decode()


def test_the_versions_list_shows_messages_publishers_and_file_links(hub, owner):
    EnvironmentVersion.objects.filter(environment=hub.private, number=2).update(message="Adds version two.")
    page = login(owner).get("/environments/acme/quiz/versions/").content.decode()
    assert "Adds version two." in page and '<td class="version-by">alice</td>' in page
    assert 'href="/environments/acme/quiz/versions/1/files/"' in page


# --- rollback: a confirmation, then an undo --------------------------------------------------------

def test_serve_asks_first_and_the_page_then_offers_the_undo(hub, member):
    client = login(member)
    history = client.get("/environments/acme/quiz/versions/").content.decode()
    assert 'method="get" action="/console/acme/environments/quiz/rollback"' in history
    confirm = client.get("/console/acme/environments/quiz/rollback?version=1&next=/environments/acme/quiz/versions/")
    assert confirm.status_code == 200 and "Serve acme/quiz@1?" in confirm.content.decode()
    hub.private.refresh_from_db()
    assert hub.private.current_version.number == 2  # asking changed nothing
    done = client.post("/console/acme/environments/quiz/rollback",
                       {"version": "1", "next": "/environments/acme/quiz/versions/"})
    assert done.status_code == 302 and done["Location"] == "/environments/acme/quiz/versions/?undo=quiz%402"
    page = client.get(done["Location"]).content.decode()
    assert "now serves version 1" in page and "Undo: serve @2 again" in page
    undone = client.post("/console/acme/environments/quiz/rollback",
                         {"version": "2", "next": "/environments/acme/quiz/versions/"})
    hub.private.refresh_from_db()
    assert hub.private.current_version.number == 2
    # The undo's page offers the way back again (to @1), never a stale "serve @2".
    again = client.get(undone["Location"]).content.decode()
    assert "Undo: serve @1 again" in again and "Undo: serve @2 again" not in again
    # An undo link naming the current version, or nonsense, offers nothing.
    for ref in ("quiz@2", "quiz@x", "nope@1", "quiz@99999999999"):
        assert "Undo:" not in client.get(f"/environments/acme/quiz/versions/?undo={ref}").content.decode()


def test_the_console_list_confirms_and_offers_the_undo_too(hub, owner):
    client = login(owner)
    page = client.get("/console/acme/environments/").content.decode()
    assert 'method="get" action="/console/acme/environments/quiz/rollback"' in page
    done = client.post("/console/acme/environments/quiz/rollback", {"version": "1"})
    assert done["Location"] == "/console/acme/environments/?undo=quiz%402"
    assert "Undo: serve @2 again" in client.get(done["Location"]).content.decode()


def test_the_confirmation_and_the_undo_are_for_the_teams_publishers_only(hub, owner, outsider, viewer):
    url = "/console/acme/environments/quiz/rollback?version=1"
    assert login(outsider).get(url).status_code == 404
    assert login(viewer).get(url).status_code == 403
    assert Client().get(url).status_code == 302  # to the login page
    assert login(owner).get("/console/acme/environments/quiz/rollback?version=9").status_code == 404
    assert login(owner).get("/console/acme/environments/quiz/rollback?version=abc").status_code == 404
    for bad in ("abc", "99999999999999999999", "-1", ""):
        assert login(owner).post("/console/acme/environments/quiz/rollback", {"version": bad}).status_code == 404
    # Nobody but a publisher of acme sees an undo, whatever the link says.
    assert "Undo: serve @1 again" in login(owner).get("/environments/acme/quiz/versions/?undo=quiz@1").content.decode()
    for client in (login(viewer), Client(), login(outsider)):
        assert "Undo:" not in client.get("/environments/acme/quiz/versions/?undo=quiz@1").content.decode()
    hub.private.refresh_from_db()
    assert hub.private.current_version.number == 2


def test_the_confirmation_goes_back_only_to_this_site(hub, owner):
    page = login(owner).get("/console/acme/environments/quiz/rollback?version=1&next=https://evil.example/").content
    assert b"evil.example" not in page and b'value="/console/acme/environments/"' in page


# --- catalog cards and the environment page -----------------------------------------------------

def _sessions(environment: Environment, version: EnvironmentVersion, rewards: list, *, days_ago: float = 0,
              team=None) -> None:
    now = timezone.now()
    for i, reward in enumerate(rewards):
        Session.objects.create(
            sid=f"{environment.slug}-{(team or environment.team).slug}-{days_ago}-{i}", team=team or environment.team, environment=environment,
            version=version, task_spec={}, split="train", task_index=0, created_at=now - timedelta(days=days_ago),
            last_activity_at=now, status=Session.Status.DELETED if reward is not None else Session.Status.READY,
            total_reward=reward, finished=reward is not None)


def test_catalog_cards_show_tags_a_weeks_sessions_and_the_pass_rate(hub, owner, outsider):
    v = hub.public.current_version
    EnvironmentVersion.objects.filter(id=v.id).update(tags=["math", "short"])
    _sessions(hub.public, v, [1.0, 0.0, 1.0, 1.0, None])
    _sessions(hub.public, v, [0.0, 0.0], team=outsider.team)  # everyone's sessions count
    _sessions(hub.public, v, [1.0] * 5, days_ago=8)  # older than a week: not counted
    cache.clear()
    for client in (Client(), login(outsider), login(owner)):
        page = client.get("/environments/?q=echo").content.decode()
        card = page[page.index("/environments/acme/echo/"):]
        assert '<span class="badge tag">math</span>' in card and '<span class="badge tag">short</span>' in card
        assert "7 sessions in 7 days · pass rate 50%" in card, card[:800]


def test_a_private_environments_card_and_usage_are_its_teams_only(hub, owner, outsider):
    _sessions(hub.private, hub.private.current_version, [1.0])
    cache.clear()
    assert "sessions in 7 days" in login(owner).get("/environments/?q=quiz").content.decode()
    assert "/environments/acme/quiz/" not in login(outsider).get("/environments/?q=quiz").content.decode()


def test_the_environment_page_shows_the_licence_compute_and_tags(hub, owner, outsider, tmp_path):
    pkg = write_package(tmp_path / "card", version="one", readme="# Card\n", name="card", visibility="public")
    with (pkg / "manifest.toml").open("a") as fh:
        fh.write('tags = ["games"]\nlicense = "Apache-2.0"\n[compute]\ncpus = 2\nmemory = "4 GiB"\n')
    environment_publish(team=owner.team, source_dir=pkg)
    for client in (Client(), login(outsider), login(owner)):
        page = client.get("/environments/acme/card/").content.decode()
        assert '<dd id="env-license">Apache-2.0</dd>' in page and "cpus: <strong>2</strong>" in page
        assert "memory: <strong>4 GiB</strong>" in page and '<span class="badge tag">games</span>' in page
    # Without those fields the section is not there at all.
    assert 'id="env-facts"' not in login(owner).get("/environments/acme/quiz/").content.decode()
