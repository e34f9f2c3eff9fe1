"""Environment data at /orwd_data: a data archive uploaded beside the package (stored once by
content hash) or the package's own data/ folder, mounted read-only in the sandbox for openreward
and ors environments alike, and listed with sizes on the environment page's Files tab. Real server,
real sandbox workers, the official clients."""

from __future__ import annotations

import io
import os
import tarfile
import textwrap
from pathlib import Path

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from openreward import OpenReward
from ors.client import ORS

from orsplatform.catalog.models import Environment, EnvironmentVersion
from tests.catalog.support import api, login, zip_bytes

# Reads its tasks and answers from /orwd_data, as OpenReward environments do (their documented data
# mount), and proves the mount is read-only.
LOOKUP_ENV = textwrap.dedent('''
    import json
    from pathlib import Path

    from openreward.environments import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    DATA = Path("/orwd_data")


    class Answer(BaseModel):
        answer: str


    class Lookup(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            return [json.loads(line) for line in (DATA / "tasks.jsonl").read_text().splitlines()]

        def get_prompt(self):
            return [TextBlock(text=f"Capital of {self.task_spec['country']}?")]

        @tool
        def answer(self, params: Answer) -> ToolOutput:
            capitals = json.loads((DATA / "nested" / "capitals.json").read_text())
            try:
                (DATA / "scribble").write_text("x")
                writable = True
            except OSError:
                writable = False
            right = params.answer == capitals[self.task_spec["country"]]
            return ToolOutput(blocks=[TextBlock(text="right" if right else "wrong")], reward=1.0 if right else 0.0,
                              finished=True, metadata={"writable": writable, "files": sorted(
                                  str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file())})
''')

CAPITALS = '{"France": "Paris", "Peru": "Lima"}'
TASKS = '{"country": "France"}\n{"country": "Peru"}\n'


def data_archive(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.ORS_DATA_DIR = tmp_path / "data"
    return settings.ORS_DATA_DIR


def test_an_openreward_environment_reads_its_data_archive_at_orwd_data(servers, owner, outsider, build_dirs,
                                                                        data_dir, monkeypatch):
    server = servers(**build_dirs, ORS_DATA_DIR=str(data_dir))
    archive = data_archive({"tasks.jsonl": TASKS, "nested/capitals.json": CAPITALS})
    r = httpx.post(f"{server.url}/api/v1/environments/acme/lookup/versions", headers={"X-API-Key": owner.token},
                   files={"package": ("lookup.zip", zip_bytes({"env.py": LOOKUP_ENV})),
                          "data": ("world.tar.gz", archive)}, timeout=120)
    assert r.status_code == 201, r.text
    body = r.json()
    assert len(body["data_sha256"]) == 64 and body["validation"]["class_task_counts"] == {"test": 2}
    assert sorted(p.name for p in data_dir.iterdir()) == [body["data_sha256"]]  # stored once, by its hash

    for name in ("OPENREWARD_SESSION_URL", "OPENREWARD_API_URL"):
        monkeypatch.setenv(name, server.url)
    monkeypatch.setenv("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("acme/lookup")
        with env.session(task=env.get_task("test", 1)) as session:
            assert session.get_prompt()[0].text == "Capital of Peru?"
            out = session.call_tool("answer", {"answer": "Lima"})
            assert (out.reward, out.finished) == (1.0, True)
            assert out.metadata == {"writable": False, "files": ["nested/capitals.json", "tasks.jsonl"]}
    finally:
        client.close()

    # The same archive with another package: another version, the data stored once still.
    r = httpx.post(f"{server.url}/api/v1/environments/acme/lookup/versions", headers={"X-API-Key": owner.token},
                   files={"package": ("lookup.zip", zip_bytes({"env.py": LOOKUP_ENV + "\n# v2\n"})),
                          "data": ("again.tar.gz", archive)}, timeout=120)
    assert r.status_code == 201 and r.json()["number"] == 2 and r.json()["data_sha256"] == body["data_sha256"]
    assert len(list(data_dir.iterdir())) == 1

    # The Files tab lists the package and the data with their sizes, to the team only (private).
    page = login(owner).get("/environments/acme/lookup/files/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "mounted read-only at <code>/orwd_data</code>" in html
    assert f"<code>nested/capitals.json</code></td><td>{len(CAPITALS)}\u00a0bytes</td>" in html
    assert "<code>env.py</code>" in html and "2 files" in html
    assert login(outsider).get("/environments/acme/lookup/files/").status_code == 404
    assert httpx.get(f"{server.url}/environments/acme/lookup/files/").status_code == 404


def test_an_ors_environment_reads_the_packages_data_folder_at_orwd_data(servers, owner, build_dirs, data_dir):
    source = LOOKUP_ENV.replace("from openreward.environments import", "from ors import")
    r = api(owner).post("/api/v1/environments/acme/folded/versions", {"package": SimpleUploadedFile(
        "folded.zip", zip_bytes({"env.py": source, "data/tasks.jsonl": TASKS, "data/nested/capitals.json": CAPITALS}))})
    assert r.status_code == 201, r.json()
    assert r.json()["data_sha256"] == ""
    server = servers(**build_dirs, ORS_DATA_DIR=str(data_dir))
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("acme/folded")
        with env.session(task=env.get_task("test", 0)) as session:
            out = session.call_tool("answer", {"answer": "Paris"})
            assert out.reward == 1.0
            assert out.metadata == {"writable": False, "files": ["nested/capitals.json", "tasks.jsonl"]}
    page = login(owner).get("/environments/acme/folded/files/").content.decode()
    assert "Data (the package&#x27;s data/ folder)" in page and "<code>nested/capitals.json</code>" in page


def test_a_data_archive_over_the_operators_limit_is_413_and_nothing_is_stored(owner, settings, data_dir):
    settings.ORS_MAX_DATA_ARCHIVE_BYTES = 1000
    archive = data_archive({"big.txt": os.urandom(2000).hex()})
    assert len(archive) > 1000
    r = api(owner).post("/api/v1/environments/acme/big/versions", {
        "package": SimpleUploadedFile("big.zip", zip_bytes({"env.py": LOOKUP_ENV})),
        "data": SimpleUploadedFile("big.tar.gz", archive)})
    assert r.status_code == 413
    assert r.json() == {"detail": f"The data archive is {len(archive)} bytes; the limit is 1000 "
                                  "(ORS_MAX_DATA_ARCHIVE_BYTES)."}
    assert not Environment.objects.filter(slug="big").exists() and not Path(data_dir).exists()


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("data.rar", b"Rar!", "Unsupported data archive 'data.rar'"),
    ("escape.tar.gz", None, "data archive: "),
])
def test_a_data_archive_that_cannot_be_used_is_400_naming_why(owner, data_dir, name, content, expected):
    if content is None:  # a member that climbs out of its folder
        content = data_archive({"../../outside.txt": "x"})
    r = api(owner).post("/api/v1/environments/acme/bad/versions", {
        "package": SimpleUploadedFile("bad.zip", zip_bytes({"env.py": LOOKUP_ENV})),
        "data": SimpleUploadedFile(name, content)})
    assert r.status_code == 400, r.json()
    assert r.json()["detail"].startswith(expected) and r.json()["check"] == "data"
    assert not EnvironmentVersion.objects.filter(environment__slug="bad").exists()
    assert not any(Path(data_dir).glob("*/outside.txt"))


def test_a_data_archive_is_stored_only_for_a_caller_who_may_publish(owner, member, outsider, data_dir):
    archive = data_archive({"tasks.jsonl": TASKS, "nested/capitals.json": CAPITALS})

    def post(person):
        return api(person).post("/api/v1/environments/acme/lookup/versions", {
            "package": SimpleUploadedFile("l.zip", zip_bytes({"env.py": LOOKUP_ENV})),
            "data": SimpleUploadedFile("d.tar.gz", archive)})

    assert post(outsider).status_code in (403, 404)
    assert post(member).status_code == 403  # a member's key has no publish scope
    assert not Path(data_dir).exists()
    assert post(owner).status_code == 201 and len(list(Path(data_dir).iterdir())) == 1
