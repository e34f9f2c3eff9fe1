"""The environment pages: the catalog, an environment's card, its tasks, versions and diffs, and who
may see them (owner and member of acme see its private environment; an outsider gets 404)."""

from __future__ import annotations

import pytest
from django.test import Client

from orsplatform.catalog.models import EnvironmentVersion
from tests.hub.conftest import login

PRIVATE_PAGES = [
    "/environments/acme/quiz/",
    "/environments/acme/quiz/tasks/",
    "/environments/acme/quiz/tasks/?split=train&page=1",
    "/environments/acme/quiz/tasks/train/0/",
    "/environments/acme/quiz/versions/",
    "/environments/acme/quiz/diff/?a=1&b=2",
]


@pytest.mark.parametrize("url", PRIVATE_PAGES)
def test_the_owner_and_a_member_see_every_page_of_a_private_environment(hub, owner, member, url):
    for person in (owner, member):
        assert login(person).get(url).status_code == 200, (person.username, url)


@pytest.mark.parametrize("url", PRIVATE_PAGES)
def test_an_outsider_and_a_visitor_get_404_for_every_page_of_a_private_environment(hub, outsider, url):
    assert login(outsider).get(url).status_code == 404
    assert Client().get(url).status_code == 404


def test_a_public_environment_is_shown_to_everyone(hub, outsider):
    for client in (Client(), login(outsider)):
        page = client.get("/environments/acme/echo/")
        assert page.status_code == 200 and "A public echo." in page.content.decode()
        assert client.get("/environments/acme/echo/tasks/train/1/").status_code == 200


def test_the_catalog_lists_what_the_viewer_may_see(hub, owner, outsider):
    mine = login(owner).get("/environments/").content.decode()
    theirs = login(outsider).get("/environments/").content.decode()
    anonymous = Client().get("/environments/").content.decode()
    assert "/environments/acme/quiz/" in mine and "/environments/acme/echo/" in mine
    for page in (theirs, anonymous):
        assert "/environments/acme/quiz/" not in page and "/environments/acme/echo/" in page
        assert "/environments/builtin/math/" in page


def test_the_catalog_searches_names_and_descriptions_and_filters(hub, owner):
    client = login(owner)
    found = client.get("/environments/?q=word+(quiz)").content.decode()
    assert "/environments/acme/quiz/" in found and "/environments/acme/echo/" not in found
    assert "/environments/builtin/math/" not in found
    private = client.get("/environments/?visibility=private").content.decode()
    assert "/environments/acme/quiz/" in private and "/environments/acme/echo/" not in private
    by_team = client.get("/environments/?team=builtin&sort=updated").content.decode()
    assert "/environments/builtin/math/" in by_team and "/environments/acme/" not in by_team
    assert client.get("/environments/?page=999&sort=nonsense").status_code == 200


def _elements(html: str) -> list[tuple[str, dict]]:
    from html.parser import HTMLParser

    found: list[tuple[str, dict]] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, dict(attrs)))

    Collect().feed(html)
    return found


def test_a_readme_with_a_script_tag_and_a_javascript_link_renders_inert(hub, owner):
    page = login(owner).get("/environments/acme/quiz/").content.decode()
    readme = page[page.index('id="readme"'):page.index("</article>")]
    assert "<h1>Quiz</h1>" in readme and "<table>" in readme
    elements = _elements(readme)
    assert not [tag for tag, _ in elements if tag in ("script", "img", "iframe", "style")]
    assert not [(tag, a) for tag, a in elements if any(name.startswith("on") for name in a)]
    hrefs = [a["href"] for tag, a in elements if tag == "a"]
    assert hrefs == ["https://example.org/docs"]
    assert "&lt;script&gt;" in readme  # shown as text, never run


def test_the_environment_page_shows_tools_splits_and_a_snippet_per_client(hub, owner):
    page = login(owner).get("/environments/acme/quiz/").content.decode()
    assert "<code>say</code>" in page and "&quot;word&quot;" in page  # the input schema
    assert 'href="/environments/acme/quiz/tasks/?split=train"' in page
    for client in ('id="snippet-ors"', 'id="snippet-openreward"', 'client.environment(&quot;acme/quiz&quot;)',
                   "OPENREWARD_SESSION_URL", 'id="snippet-openenv"', "/openenv/acme/quiz&quot;"):
        assert client in page


def test_the_task_browser_shows_task_text_pass_rates_and_links_to_sessions(hub, owner):
    page = login(owner).get("/environments/acme/quiz/tasks/?split=train").content.decode()
    assert "trainword0" in page and "50%" in page and "0%" in page
    assert "/analytics/acme/sessions/?range=all&amp;environment=acme%2Fquiz&amp;split=train&amp;task=1" in page
    task = login(owner).get("/environments/acme/quiz/tasks/train/2/").content.decode()
    assert "Say trainword2 (two)" in task and "100%" in task and 'id="task-spec"' in task


def test_an_outsider_sees_no_pass_rates_of_another_team_on_a_public_environment(hub, owner, outsider):
    from orsplatform.episodes.models import Session

    Session.objects.filter(environment=hub.private).update(environment=hub.public)
    page = login(outsider).get("/environments/acme/echo/tasks/?split=train").content.decode()
    assert "50%" not in page and "100%" not in page and "/analytics/acme/" not in page
    task = login(outsider).get("/environments/acme/echo/tasks/train/2/").content.decode()
    assert "Say trainword2" not in task


def test_a_missing_split_task_or_version_is_a_404(hub, owner):
    client = login(owner)
    for url in ("/environments/acme/quiz/tasks/?split=nope", "/environments/acme/quiz/tasks/train/99/",
                "/environments/acme/quiz/tasks/nope/0/", "/environments/acme/quiz/diff/?a=1&b=9",
                "/environments/acme/quiz/diff/?a=x&b=2", "/environments/acme/nope/"):
        assert client.get(url).status_code == 404, url


def test_the_version_history_shows_publisher_hash_and_a_file_diff(hub, owner):
    client = login(owner)
    history = client.get("/environments/acme/quiz/versions/").content.decode()
    v1 = EnvironmentVersion.objects.get(environment=hub.private, number=1)
    assert "alice" in history and v1.content_hash[:12] in history and "Serve @1" in history
    diff = client.get("/environments/acme/quiz/diff/?a=1&b=2").content.decode()
    assert "2 files changed" in diff and "<code>env.py</code>" in diff and "<code>README.md</code>" in diff
    assert '<div class="del">-    VERSION = &quot;one&quot;</div>' in diff.replace("-VERSION", "-    VERSION") or \
        "VERSION = &quot;one&quot;" in diff
    assert '<div class="add">+Now with version two.</div>' in diff


def test_a_member_rolls_back_from_the_version_history_and_comes_back_to_it(hub, member):
    client = login(member)
    response = client.post("/console/acme/environments/quiz/rollback",
                           {"version": "1", "next": "/environments/acme/quiz/versions/"})
    assert response.status_code == 302 and response["Location"] == "/environments/acme/quiz/versions/?undo=quiz%402"
    hub.private.refresh_from_db()
    assert hub.private.current_version.number == 1
    evil = client.post("/console/acme/environments/quiz/rollback", {"version": "2", "next": "https://evil.example/"})
    assert evil["Location"] == "/console/acme/environments/?undo=quiz%401"


def test_an_outsider_cannot_roll_back_and_sees_no_rollback_button(hub, outsider):
    client = login(outsider)
    assert client.post("/console/acme/environments/quiz/rollback", {"version": "1"}).status_code == 404
    assert "Serve @" not in client.get("/environments/acme/echo/versions/").content.decode()


def test_the_home_page_uses_the_site_template_and_links_every_environment(hub):
    page = Client().get("/").content.decode()
    assert "/static/hub/site.css" in page and 'href="/environments/acme/echo/"' in page
    assert 'href="/environments/builtin/math/"' in page and "/environments/acme/quiz/" not in page
    assert 'id="home-login"' in page


def test_a_signed_in_viewer_renders_a_tasks_prompt_without_setup_and_it_is_kept(hub, outsider):
    client = login(outsider)
    url = "/environments/acme/echo/tasks/train/1/"
    assert 'id="render-form"' in client.get(url).content.decode()
    response = client.post(url + "prompt")
    assert response.status_code == 302 and response["Location"] == url + "#rendered-prompt"
    page = client.get(url).content.decode()
    assert "Say trainword1 (one)" in page and 'id="task-rendered-prompt"' in page
    assert 'id="render-form"' not in page  # kept: nothing runs again


def test_a_prompt_that_needs_setup_says_so(hub, owner, tmp_path):
    from django.contrib.auth import get_user_model

    from orsplatform.catalog.services import environment_publish
    from tests.hub.conftest import write_package

    pkg = write_package(tmp_path / "needy", version="one", readme="# Needy\n", name="needy", visibility="private")
    source = (pkg / "env.py").read_text()
    needs_setup = ("        return [TextBlock(text=self.loaded)]\n\n"
                   "    def setup(self):\n"
                   "        self.loaded = 'loaded in setup'")
    source = source.replace("        return [TextBlock(text=f\"Say {self.task_spec['word']} ({VERSION})\")]", needs_setup)
    assert "def setup(self)" in source
    (pkg / "env.py").write_text(source)
    environment_publish(team=owner.team, source_dir=pkg, created_by=get_user_model().objects.get(username="alice"))
    client = login(owner)
    client.post("/environments/acme/needy/tasks/train/0/prompt")
    page = client.get("/environments/acme/needy/tasks/train/0/").content.decode()
    assert 'id="render-failed"' in page and "AttributeError" in page and "loaded in setup" not in page


def test_rendering_a_prompt_needs_a_signed_in_viewer_who_may_see_the_environment(hub, outsider):
    assert Client().post("/environments/acme/echo/tasks/train/1/prompt").status_code == 302  # to the login page
    assert login(outsider).post("/environments/acme/quiz/tasks/train/1/prompt").status_code == 404
    assert login(outsider).get("/environments/acme/echo/tasks/train/1/prompt").status_code == 405
