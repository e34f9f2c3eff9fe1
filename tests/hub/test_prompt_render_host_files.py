"""Rendering a task's prompt on the environment pages runs the environment's code in a child that
reaches no host file, and the platform follows nothing it left: links planted where the answer once
was never lead to the platform's environment or a host file, a FIFO there never holds the page, and
a flood of files or an oversized prompt lands nothing on the host. Real hostile packages published
through the REST API, rendered through the page's button."""

from __future__ import annotations

import json
import tempfile

import pytest
from django.core.cache import cache

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.hub.services import task_prompt_cached
from tests.catalog.hostile_children import PLANT, DiskWatch, answers_within, leaked, platform_environment
from tests.catalog.support import login, publish

MiB = 1024 * 1024
# Each sandbox runtime, and none (the inspector's own limits hold without one too).
BOTH = pytest.mark.parametrize("sandbox", ["bwrap", "gvisor", "none"])

# `attack()` runs only when the page renders the prompt: validation calls setup() first, the page never.
PAGE_ENV = PLANT + '''
import atexit
import json
import sys

from ors import Environment, Split, TextBlock, ToolOutput, tool

ATTACK


class Page(Environment):
    @classmethod
    def list_splits(cls):
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split):
        return [{"id": i, "word": f"word{i}"} for i in range(2)]

    def setup(self):
        self.validating = True

    def get_prompt(self):
        suffix = "" if getattr(self, "validating", False) else attack()
        return [TextBlock(text="Say " + self.task_spec["word"] + suffix)]

    @tool
    def say(self) -> ToolOutput:
        """Say the word."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=1.0, finished=True)
'''


@pytest.fixture(autouse=True)
def places(settings, tmp_path, monkeypatch):
    settings.ORS_PACKAGE_DIR = tmp_path / "packages"
    settings.ORS_UPLOAD_DIR = tmp_path / "uploads"
    (tmp_path / "host-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "host-tmp"))
    cache.clear()  # rendered prompts are cached by content hash


def rendered(owner, slug: str, attack: str) -> tuple[dict, str]:
    """Publish the page environment with `attack`, press the page's render button for task 0;
    (what was rendered, the task's page)."""
    response = publish(owner, slug, "page.py", PAGE_ENV.replace("ATTACK", attack))
    assert response.status_code == 201, response.content
    client = login(owner)
    url = f"/environments/acme/{slug}/tasks/train/0/"
    assert client.post(url + "prompt").status_code == 302
    version = EnvironmentVersion.objects.get(environment__slug=slug)
    result = task_prompt_cached(version=version, spec={"id": 0, "word": "word0"})
    assert result is not None
    return result, client.get(url).content.decode()


@BOTH
@pytest.mark.parametrize("ending", ["returns", "exits"])
def test_a_render_linking_its_answer_to_the_platforms_environment_gets_none_of_it_back(owner, settings, sandbox,
                                                                                      ending):
    settings.ORS_SANDBOX = sandbox
    environment = platform_environment()
    assert environment
    attack = '''
def attack():
    link = lambda p: _os.symlink("/proc/self/environ", p)
    planted = plant(link)
    atexit.register(lambda: plant(link))  # again, once the answer has been written
    print("planted", len(planted), file=sys.stderr, flush=True)
    if ENDING == "exits":
        _os._exit(3)
    return ""
'''.replace("ENDING", repr(ending))
    result, page = rendered(owner, "linker", attack)
    if ending == "returns":
        assert result["ok"] is True and result["blocks"][0]["text"] == "Say word0", result
    else:
        assert result["ok"] is False and "ended without one" in result["error"], result
    assert leaked(json.dumps(result), environment) == [] and leaked(page, environment) == []


@BOTH
def test_an_answer_linked_to_a_host_file_is_never_read(owner, settings, tmp_path, sandbox):
    settings.ORS_SANDBOX = sandbox
    secret = tmp_path / "host-answer.json"
    secret.write_text(json.dumps({"ok": True, "blocks": [{"type": "text", "text": "HOST-SECRET"}]}))
    attack = f'''
def attack():
    atexit.register(lambda: plant(lambda p: _os.symlink({str(secret)!r}, p)))
    return ""
'''
    result, page = rendered(owner, "linker", attack)
    assert result["ok"] is True and result["blocks"][0]["text"] == "Say word0", result
    assert "HOST-SECRET" not in page


@BOTH
def test_a_fifo_where_the_answer_once_was_does_not_hold_the_page(owner, settings, sandbox):
    settings.ORS_SANDBOX = sandbox
    attack = '''
def attack():
    plant(_os.mkfifo)
    atexit.register(lambda: plant(_os.mkfifo))
    return ""
'''
    with answers_within(60):
        result, _ = rendered(owner, "fifo", attack)
    assert result["ok"] is True and result["blocks"][0]["text"] == "Say word0", result


def test_a_render_writing_600_mib_lands_nothing_on_the_host_and_its_oversized_prompt_is_refused(owner, tmp_path):
    attack = '''
def attack():
    written = fill(600 * 1024 * 1024)
    print("wrote", json.dumps(written), file=sys.stderr, flush=True)
    return "x" * (3 * 1024 * 1024)
'''
    with DiskWatch(tmp_path) as watch:
        result, page = rendered(owner, "filler", attack)
    assert result["ok"] is False and "larger than 2 MiB" in result["error"], result
    assert 'id="render-failed"' in page
    assert watch.peak < 4 * MiB, watch.peak
