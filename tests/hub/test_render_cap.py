"""The hub's "Render prompt" runs tenant code, so a signed-in user (and each team of that user) may
run only so many renders at once: past the cap 429 with {"detail"} (a browser gets the task page
back with the reason), nothing is rendered, and the cap frees up as renders end."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache

from orsplatform.catalog.services import environment_publish
from orsplatform.hub.render_limits import render_slot, renders_running
from orsplatform.hub.services import task_prompt_cached
from tests.catalog.support import echo_env
from tests.e2e.helpers import wait_for
from tests.hub.conftest import login

URL = "/environments/acme/echo/tasks/train/1/"
JSON = {"HTTP_ACCEPT": "application/json"}


def user_of(person):
    return get_user_model().objects.get(username=person.username)


def rendered(hub) -> dict | None:
    from orsplatform.catalog.models import Task

    spec = Task.objects.get(split__environment=hub.public, split__name="train", index=1).spec
    return task_prompt_cached(version=hub.public.current_version, spec=spec)


def test_a_user_at_the_render_cap_gets_429_and_nothing_is_rendered(hub, outsider, settings):
    settings.ORS_PROMPT_RENDERS_PER_USER = 1
    client = login(outsider)
    with render_slot(user_id=user_of(outsider).id, team_ids=[]):  # a render of theirs still running
        r = client.post(URL + "prompt", **JSON)
        assert r.status_code == 429 and r["Retry-After"] == "5"
        assert "Too many prompt renders at once: you may run 1 at a time" in r.json()["detail"]
        page = client.post(URL + "prompt", HTTP_ACCEPT="text/html", follow=True)
        assert page.redirect_chain == [(URL, 302)]
        assert "Too many prompt renders at once" in page.content.decode()
        assert rendered(hub) is None
    r = client.post(URL + "prompt", **JSON)
    assert r.status_code == 302 and r["Location"] == URL + "#rendered-prompt"
    assert rendered(hub)["ok"] is True
    assert renders_running(user_id=user_of(outsider).id) == 0


def test_a_teams_renders_together_are_capped_but_another_teams_are_not(hub, owner, member, outsider, settings):
    settings.ORS_PROMPT_RENDERS_PER_USER, settings.ORS_PROMPT_RENDERS_PER_TEAM = 5, 1
    with render_slot(user_id=user_of(owner).id, team_ids=[owner.team.id]):  # the owner's render runs
        r = login(member).post(URL + "prompt", **JSON)
        assert r.status_code == 429 and "your team may run 1 at a time" in r.json()["detail"]
        assert rendered(hub) is None
        assert login(outsider).post(URL + "prompt", **JSON).status_code == 302
    assert rendered(hub)["ok"] is True


def test_a_cached_prompt_is_served_even_at_the_cap(hub, outsider, settings):
    settings.ORS_PROMPT_RENDERS_PER_USER = 1
    client = login(outsider)
    assert client.post(URL + "prompt", **JSON).status_code == 302
    with render_slot(user_id=user_of(outsider).id, team_ids=[]):
        assert client.post(URL + "prompt", **JSON).status_code == 302  # nothing runs: no slot needed


@pytest.fixture
def slow_echo(hub, owner, tmp_path):
    """A public environment whose prompt for train task 2 takes seconds to render."""
    root = tmp_path / "slow"
    root.mkdir()
    source = echo_env("slow").replace(
        "        def get_prompt(self):\n",
        "        def get_prompt(self):\n"
        "            if self.task_spec['word'] == 'trainword2':\n"
        "                import time\n"
        "                time.sleep(6)  # a slow get_prompt(), so two renders overlap\n")
    (root / "env.py").write_text(source)
    (root / "manifest.toml").write_text('name = "slow"\nentrypoint = "env:Echo"\nvisibility = "public"\n')
    environment_publish(team=owner.team, source_dir=root)
    cache.clear()
    return "/environments/acme/slow/tasks/train/2/"


def test_two_renders_at_once_by_one_user_past_a_cap_of_one_the_second_is_refused(slow_echo, outsider, settings):
    settings.ORS_PROMPT_RENDERS_PER_USER = 1
    user_id = user_of(outsider).id
    first: dict = {}

    def render() -> None:
        first["status"] = login(outsider).post(slow_echo + "prompt", **JSON).status_code

    thread = threading.Thread(target=render)
    thread.start()
    try:
        wait_for(lambda: renders_running(user_id=user_id) == 1, timeout=30, what="the first render to start")
        second = login(outsider).post(slow_echo + "prompt", **JSON)
        assert second.status_code == 429
    finally:
        thread.join(timeout=60)
    assert first["status"] == 302
    assert renders_running(user_id=user_id) == 0
