"""Packages and upload helpers for the publishing tests: small environments as source text, archives
built in memory (including hostile ones), and thin wrappers over the REST API and the console."""

from __future__ import annotations

import io
import stat
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

# An environment written for the reference server: it uploads unchanged (the __main__ block never runs).
ECHO_ENV = textwrap.dedent('''
    """Say the word of the task."""

    from ors import Environment, Server, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    VERSION = "one"


    class SayParams(BaseModel):
        word: str


    class Echo(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train"), Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": f"{split}-{i}", "word": f"{split}word{i}"} for i in range(3)]

        def get_prompt(self):
            return [TextBlock(text=f"Say {self.task_spec['word']} ({VERSION})")]

        @tool
        def say(self, params: SayParams) -> ToolOutput:
            """Say a word; reward 1 when it is the task's word."""
            ok = params.word == self.task_spec["word"]
            return ToolOutput(blocks=[TextBlock(text=VERSION)], reward=1.0 if ok else 0.0, finished=True)


    if __name__ == "__main__":
        Server([Echo]).run()
''')


def echo_env(version: str = "one", extra_tool: str | None = None) -> str:
    """ECHO_ENV with a different VERSION marker (different content) and, optionally, one more tool."""
    source = ECHO_ENV.replace('VERSION = "one"', f'VERSION = "{version}"')
    if extra_tool:
        source = source.replace('\n\nif __name__', textwrap.indent(textwrap.dedent(f'''
            @tool
            def {extra_tool}(self) -> ToolOutput:
                """An extra tool."""
                return ToolOutput(blocks=[TextBlock(text="extra")], reward=0.0, finished=False)
        '''), "    ") + '\n\nif __name__', 1)
    return source


# Tasks come from the package's (or an upload's) task files, not from the class.
FILE_TASKS_ENV = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Answer(BaseModel):
        answer: str


    class Quiz(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train"), Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            raise NotImplementedError

        def get_prompt(self):
            return [TextBlock(text=str(self.task_spec["question"]))]

        @tool
        def submit(self, params: Answer) -> ToolOutput:
            """Answer the question."""
            ok = params.answer == str(self.task_spec.get("answer"))
            return ToolOutput(blocks=[TextBlock(text="ok" if ok else "no")], reward=float(ok), finished=True)
''')

# num_tasks + get_task instead of list_tasks.
INDEXED_ENV = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool


    class Indexed(Environment):
        @classmethod
        def list_splits(cls):
            return ["train"]

        @classmethod
        def list_tasks(cls, split):
            raise NotImplementedError

        @classmethod
        async def num_tasks(cls, split):
            return 4

        @classmethod
        async def get_task(cls, split, index):
            return {"n": index}

        def get_prompt(self):
            return [TextBlock(text=f"n={self.task_spec['n']}")]

        @tool
        def done(self) -> ToolOutput:
            """Finish."""
            return ToolOutput(blocks=[TextBlock(text="bye")], reward=1.0, finished=True)
''')


def env_with(body: str, *, imports: str = "") -> str:
    """A valid environment whose module runs ``body`` at import time (for hostile validation tests)."""
    return imports + "\n" + body + "\n" + ECHO_ENV


MANIFEST = 'name = "{name}"\ndescription = "A test environment."\nentrypoint = "env:{cls}"\n'


def zip_bytes(files: dict[str, str | bytes], *, symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in files.items():
            zf.writestr(name, content)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def tar_bytes(files: dict[str, str | bytes], *, links: dict[str, tuple[bytes, str]] | None = None) -> bytes:
    """``links`` maps member name to (tar type, link target), e.g. {"x": (tarfile.SYMTYPE, "/etc/passwd")}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, (kind, target) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def write_folder(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def in_thread(fn):
    """sync_to_async for test code: the worker thread's database connection is closed after each call,
    so it never outlives the test (PostgreSQL refuses to drop a test database still in use)."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(run)


def bare_environment(team, slug: str):
    """An environment row without a published version: enough to upload tasks into, and no
    validation subprocess to wait for."""
    from orsplatform.catalog.models import Environment

    return Environment.objects.create(team=team, slug=slug, visibility="private")


def api(person=None) -> Client:
    return Client(HTTP_X_API_KEY=person.token) if person is not None else Client()


def publish(person, slug: str, filename: str, content: bytes | str, *, team: str | None = None, **fields):
    """POST a package to the REST API as ``person`` (into their own team unless ``team`` says otherwise)."""
    data = content.encode() if isinstance(content, str) else content
    team = team or person.team.slug
    return api(person).post(f"/api/v1/environments/{team}/{slug}/versions",
                            {"package": SimpleUploadedFile(filename, data), **fields})


def upload_tasks(person, slug: str, split: str, filename: str, content: bytes | str, *, mode: str = "append",
                 team: str | None = None, **query):
    data = content.encode() if isinstance(content, str) else content
    team = team or person.team.slug
    params = "&".join(f"{k}={v}" for k, v in {"mode": mode, **query}.items())
    return api(person).post(f"/api/v1/environments/{team}/{slug}/splits/{split}/tasks?{params}",
                            {"file": SimpleUploadedFile(filename, data)})


def login(person) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=person.username))
    return client


def jsonl(rows) -> str:
    import json

    return "".join(json.dumps(r) + "\n" for r in rows)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)  # polling interval while waiting on the condition
    return bool(predicate())


# The same environment written against each SDK (the README's worked example): add two numbers.
# `hint` is async and answers a text and an image block; `answer` is sync and ends the episode.
ADDER_OPENREWARD = textwrap.dedent('''
    """Add two numbers: written for the openreward SDK's own server (`python server.py`)."""

    from openreward.environments import Environment, ImageBlock, Server, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


    class Answer(BaseModel):
        answer: str


    class Adder(Environment):
        def __init__(self, task_spec={}, secrets={}):
            super().__init__(task_spec, secrets)
            self.key = secrets.get("ADDER_KEY", "")

        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train"), Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            base = 0 if split == "train" else 100
            return [{"id": f"{split}-{i}", "a": base + i, "b": 2 * i} for i in range(8)]

        def get_prompt(self):
            return [TextBlock(text=f"What is {self.task_spec['a']} + {self.task_spec['b']}?")]

        @tool
        async def hint(self) -> ToolOutput:
            """A hint: the first digit of the sum."""
            first = str(self.task_spec["a"] + self.task_spec["b"])[0]
            return ToolOutput(blocks=[TextBlock(text=f"It starts with {first}."),
                                      ImageBlock(data=PIXEL, mimeType="image/png")],
                              metadata={"keyed": bool(self.key)}, reward=0.0)

        @tool
        def answer(self, params: Answer) -> ToolOutput:
            """Answer with the sum."""
            correct = params.answer.strip() == str(self.task_spec["a"] + self.task_spec["b"])
            return ToolOutput(blocks=[TextBlock(text="Correct." if correct else "Wrong.")],
                              metadata={"correct": correct}, reward=1.0 if correct else 0.0, finished=True)


    if __name__ == "__main__":
        Server([Adder]).run()
''')

# The same, against ors-sdk: only the import line differs.
ADDER_ORS = ADDER_OPENREWARD.replace("from openreward.environments import", "from ors import").replace(
    "the openreward SDK's own server", "the ors-sdk reference server")


def adder_solution(spec: dict) -> str:
    return str(spec["a"] + spec["b"])
