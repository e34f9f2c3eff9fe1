"""The layouts environment authors use publish as they are, and their sessions run in the sandbox
worker: a single .py; a folder or archive with server.py (whose ``__main__`` block never runs),
env.py or a package; a src/ layout with pyproject.toml; modules importing each other absolutely
(``from utils import x``, as ``python server.py`` allows) and relatively; a Dockerfile beside them.
Discovery finds the one Environment class, whichever SDK, wherever it is defined."""

from __future__ import annotations

import textwrap

import pytest

from orsplatform.catalog.models import Task
from tests.catalog.support import ADDER_OPENREWARD, ADDER_ORS, in_thread, publish, tar_bytes, zip_bytes
from tests.fixtures.ors import sse_result, start_episode

LIST_TASKS = '''        base = 0 if split == "train" else 100
        return [{"id": f"{split}-{i}", "a": base + i, "b": 2 * i} for i in range(8)]'''
TASKS_MODULE = textwrap.dedent('''
    def make_tasks(split):
        base = 0 if split == "train" else 100
        return [{"id": f"{split}-{i}", "a": base + i, "b": 2 * i} for i in range(8)]
''')
# Data read by a path relative to the repository's root, at import time (so in the inspector and in
# every sandbox worker), as works when `python server.py` is run from there.
TASKS_FROM_FILE = textwrap.dedent('''
    import json

    with open("data/bases.json") as fh:
        BASES = json.load(fh)


    def make_tasks(split):
        return [{"id": f"{split}-{i}", "a": BASES[split] + i, "b": 2 * i} for i in range(8)]
''')
# The __main__ block of a real server.py, made loud: if it ever ran, the process would end.
MAIN_BLOCK = textwrap.dedent('''
    if __name__ == "__main__":
        import os

        open("/tmp/main-ran", "w").write("the __main__ block ran")
        os._exit(3)
''')


def adder_importing(imports: str, source: str = ADDER_OPENREWARD) -> str:
    """The adder with its tasks from another module of the package (``imports`` brings make_tasks)."""
    assert LIST_TASKS in source
    body = source.replace(LIST_TASKS, "        return make_tasks(split)")
    body = body.replace("from pydantic import BaseModel\n", f"from pydantic import BaseModel\n{imports}\n", 1)
    return body.split('\n\nif __name__ == "__main__":')[0] + "\n" + MAIN_BLOCK


async def play(client, owner, env: str) -> dict:
    """One episode on test task 3 (103 + 6) answered right; the tool's result."""
    sid = await start_episode(client, owner.headers, env=env, split="test", index=3)
    headers = {**owner.headers, "X-Session-ID": sid}
    prompt = (await client.get("/prompt", headers=headers)).json()
    assert prompt[0]["text"] == "What is 103 + 6?", prompt
    r = await client.post("/call", headers=headers, json={"name": "answer", "input": {"answer": "109"}})
    await client.post("/delete", headers=headers)
    return sse_result(r.text)


LAYOUTS = {
    # A single file of either SDK (stored as env.py).
    "single-openreward": ("adder.py", ADDER_OPENREWARD, "env:Adder"),
    "single-ors": ("adder.py", ADDER_ORS, "env:Adder"),
    # server.py holding the class next to Server([...]).run(), its tasks in a sibling module imported
    # absolutely, a Dockerfile and a README beside them.
    "server-py": ("adder.zip", zip_bytes({
        "server.py": adder_importing("from utils import make_tasks"),
        "utils.py": TASKS_MODULE,
        "Dockerfile": "FROM python:3.11-slim\nCOPY . /app\nCMD [\"python\", \"/app/server.py\"]\n",
        "README.md": "# Adder\n",
    }), "server:Adder"),
    # server.py importing the class from a package whose modules import each other absolutely
    # (by the package's name) and relatively.
    "package-with-server": ("adder.tar.gz", tar_bytes({
        "adder/server.py": textwrap.dedent('''
            from openreward.environments import Server

            from mathpkg.env import Adder
        ''') + MAIN_BLOCK,
        "adder/mathpkg/__init__.py": "",
        "adder/mathpkg/env.py": adder_importing("from mathpkg.tasks import make_tasks\nfrom . import tasks"),
        "adder/mathpkg/tasks.py": TASKS_MODULE,
        "adder/Dockerfile": "FROM python:3.11\n",
    }), "mathpkg.env:Adder"),
    # A package alone in the archive: it stays a package, so `from adderpkg.x import y` works.
    "lone-package": ("adder.zip", zip_bytes({
        "adderpkg/__init__.py": "from .env import Adder\n",
        "adderpkg/env.py": adder_importing("from adderpkg.tasks import make_tasks"),
        "adderpkg/tasks.py": TASKS_MODULE,
    }), "adderpkg.env:Adder"),
    # Data files opened by relative paths.
    "relative-data": ("adder.zip", zip_bytes({
        "server.py": adder_importing("from utils import make_tasks"),
        "utils.py": TASKS_FROM_FILE,
        "data/bases.json": '{"train": 0, "test": 100}',
    }), "server:Adder"),
    # The src/ layout of a pyproject.toml project.
    "src-layout": ("adder.zip", zip_bytes({
        "pyproject.toml": '[project]\nname = "adder-env"\nversion = "0.1.0"\n',
        "src/adder_env/__init__.py": "",
        "src/adder_env/env.py": adder_importing("from adder_env.tasks import make_tasks", ADDER_ORS),
        "src/adder_env/tasks.py": TASKS_MODULE,
        "tests/test_env.py": "raise RuntimeError('tests are not imported')\n",
        "setup.py": "raise RuntimeError('setup.py is not imported')\n",
    }), "adder_env.env:Adder"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_each_layout_publishes_with_its_class_found_and_plays_an_episode(client, owner, layout):
    filename, content, entrypoint = LAYOUTS[layout]
    r = await in_thread(publish)(owner, "adder", filename, content)
    assert r.status_code == 201, r.json()
    assert r.json()["entrypoint"] == entrypoint
    assert [t["name"] for t in r.json()["tools"]] == ["answer", "hint"]
    result = await play(client, owner, "acme/adder")
    assert result["ok"] is True and result["output"]["reward"] == 1.0 and result["output"]["finished"] is True


async def test_a_main_block_that_would_exit_runs_neither_at_publishing_nor_in_a_session(client, owner):
    source = ADDER_OPENREWARD.split('\n\nif __name__ == "__main__":')[0] + "\n" + MAIN_BLOCK
    r = await in_thread(publish)(owner, "adder", "server.py", source)
    assert r.status_code == 201, r.json()
    result = await play(client, owner, "acme/adder")
    assert result["output"]["reward"] == 1.0


async def test_tasks_built_at_import_time_are_snapshotted_and_served_to_sessions(client, owner):
    source = ADDER_OPENREWARD.replace(LIST_TASKS, "        return TASKS[split]").replace(
        "\n\nclass Answer", textwrap.dedent('''

            import random

            _rng = random.Random(7)
            TASKS = {s: [{"id": f"{s}-{i}", "a": _rng.randrange(1000), "b": _rng.randrange(1000)} for i in range(5)]
                     for s in ("train", "test")}


            class Answer'''), 1)
    r = await in_thread(publish)(owner, "seeded", "seeded.py", source)
    assert r.status_code == 201, r.json()
    specs = await in_thread(lambda: list(Task.objects.filter(split__environment__slug="seeded", split__name="test")
                                         .order_by("index").values_list("spec", flat=True)))()
    assert len(specs) == 5
    sid = await start_episode(client, owner.headers, env="acme/seeded", split="test", index=2)
    headers = {**owner.headers, "X-Session-ID": sid}
    total = str(specs[2]["a"] + specs[2]["b"])
    r = await client.post("/call", headers=headers, json={"name": "answer", "input": {"answer": total}})
    assert sse_result(r.text)["output"]["reward"] == 1.0


def test_several_classes_are_refused_naming_how_to_choose_and_the_manifest_chooses(owner):
    two = ADDER_OPENREWARD.replace("\n\nif __name__", "\n\nclass HardAdder(Adder):\n    pass\n\n\nif __name__")
    r = publish(owner, "twins", "twins.py", two)
    assert r.status_code == 400 and r.json()["check"] == "import"
    detail = r.json()["detail"]
    assert "env:Adder" in detail and "env:HardAdder" in detail and "entrypoint = 'module:Class'" in detail
    chosen = publish(owner, "twins", "twins.zip", zip_bytes({
        "env.py": two, "manifest.toml": 'entrypoint = "env:HardAdder"\n'}))
    assert chosen.status_code == 201, chosen.json()
    assert chosen.json()["entrypoint"] == "env:HardAdder"


def test_classes_imported_from_the_sdk_or_abstract_bases_are_not_candidates(owner):
    # An abstract helper base (no list_tasks) of the package, and the SDK's own classes imported:
    # the one concrete class is found.
    source = ADDER_OPENREWARD.replace("class Adder(Environment):", textwrap.dedent('''\
        class Base(Environment):
            def get_prompt(self):
                return []


        class Adder(Base):'''))
    r = publish(owner, "based", "based.py", source)
    assert r.status_code == 201, r.json()
    assert r.json()["entrypoint"] == "env:Adder"
    nothing = publish(owner, "nothing", "nothing.py", "from ors import Environment\n"
                                                       "from openreward.environments import Environment as E\n")
    assert nothing.status_code == 400 and nothing.json()["check"] == "import"
    assert "No Environment subclass" in nothing.json()["detail"]
    assert "entrypoint = 'module:Class'" in nothing.json()["detail"]
