"""Packages with requirements: each gets a Python environment built by uv in the sandbox (reaching
the package registry only), identical sets share one, conflicting versions run side by side, and a
requirement that cannot be met publishes nothing. Real builds (the registry is reachable from this
machine and CI's), real inspector and worker processes."""

from __future__ import annotations

import datetime
import shutil
import socket
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from openenv.core.generic_client import GenericEnvClient
from openreward import OpenReward
from ors.client import ORS

from orsplatform.catalog import pyenvs
from orsplatform.catalog.models import Environment, EnvironmentVersion, Split
from orsplatform.catalog.requirements import RequirementsError, collect
from orsplatform.catalog.services import pyenvs_collect_unused, version_build, versions_fail_stalled_builds
from tests.catalog.support import api, login, publish, wait_until, write_folder, zip_bytes

BUILD_SECONDS = 300  # a cold build downloads the SDKs' dependencies

EDICT_ENV = textwrap.dedent('''
    """Needs a package the platform does not ship (easydict), imported at import time."""
    from importlib.metadata import version

    from easydict import EasyDict
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    TASKS = [EasyDict({"question": f"What is {a} + {b}?", "answer": a + b}) for a, b in [(1, 2), (3, 4), (10, 5)]]
    FLAVOUR = "FLAVOUR_VALUE"


    class Answer(BaseModel):
        answer: int


    class Edict(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            return [dict(t) for t in TASKS]

        def get_prompt(self):
            return [TextBlock(text=f"{EasyDict(self.task_spec).question} ({FLAVOUR})")]

        @tool
        def submit(self, params: Answer) -> ToolOutput:
            right = params.answer == EasyDict(self.task_spec).answer
            return ToolOutput(blocks=[TextBlock(text="right" if right else "wrong")],
                              reward=1.0 if right else 0.0, finished=True,
                              metadata={"easydict": version("easydict")})
''')


def edict(flavour: str = "one", requirement: str = "easydict==1.13", sdk: str = "ors") -> dict[str, str]:
    """The package; ``sdk="openreward"`` writes the same environment against openreward.environments."""
    source = EDICT_ENV.replace("FLAVOUR_VALUE", flavour)
    if sdk == "openreward":
        source = source.replace("from ors import", "from openreward.environments import")
    return {"env.py": source, "requirements.txt": f"{requirement}\n"}


def _version(slug: str, number: int) -> EnvironmentVersion:
    return EnvironmentVersion.objects.get(environment__slug=slug, number=number)


def _wait_built(slug: str, number: int) -> EnvironmentVersion:
    assert wait_until(lambda: _version(slug, number).status != EnvironmentVersion.Status.BUILDING,
                      timeout=BUILD_SECONDS), "the build did not finish in time"
    return _version(slug, number)


# --- what a package asks for ---------------------------------------------------------------------------


def test_requirements_come_from_requirements_txt_pyproject_and_the_manifest(tmp_path):
    root = write_folder(tmp_path / "pkg", {
        "requirements.txt": "# a comment\nnumpy>=1.26  # inline comment\n\neasydict==1.13\n",
        "pyproject.toml": '[project]\nname = "x"\ndependencies = ["six>=1.16", "numpy>=1.26"]\n',
    })
    assert collect(root, {"requirements": ["humanize"]}) == ["easydict==1.13", "humanize", "numpy>=1.26", "six>=1.16"]
    assert collect(write_folder(tmp_path / "bare", {"env.py": "x = 1\n"}), {}) == []


@pytest.mark.parametrize(("line", "expected"), [
    ("-e .", "options are not accepted"),
    ("--index-url https://evil.example/simple", "options are not accepted"),
    ("-r other.txt", "options are not accepted"),
    ("pkg @ https://evil.example/pkg.whl", "names a URL"),
    ("not a requirement!", "is not a requirement"),
    ("openreward==0.1.100", "this platform runs environments with openreward 0.1.167"),
    ("ors-sdk>=0.2", "this platform runs environments with ors-sdk 0.1.0"),
])
def test_requirements_that_could_reach_beyond_the_registry_or_swap_the_sdk_are_refused(tmp_path, line, expected):
    root = write_folder(tmp_path / "pkg", {"requirements.txt": line + "\n"})
    with pytest.raises(RequirementsError, match=expected):
        collect(root, {})


def test_a_requirement_on_another_sdk_version_is_refused_at_once_with_a_clear_message(owner):
    r = publish(owner, "oldsdk", "e.zip", zip_bytes({**edict(), "requirements.txt": "openreward==0.1.100\n"}))
    assert r.status_code == 400
    body = r.json()
    assert body["check"] == "requirements"
    assert body["detail"] == ("requirements.txt line 1: openreward==0.1.100 cannot be met: this platform runs "
                              "environments with openreward 0.1.167 (the SDK its sandbox speaks). Require "
                              "openreward==0.1.167, a range that includes it, or leave the line out.")
    assert not Environment.objects.filter(slug="oldsdk").exists()


# --- builds ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sdk", ["openreward", "ors"])
def test_a_package_needing_a_package_the_platform_lacks_publishes_over_rest_and_serves_episodes(
        servers, embedded_worker, owner, outsider, build_dirs, monkeypatch, sdk):
    with pytest.raises(ImportError):
        __import__("easydict")  # the platform itself does not ship it
    # As `make run` on the embedded default: the build goes to the worker beside the server.
    embedded_worker.start(**build_dirs)
    server = servers(**build_dirs, **embedded_worker.env())
    headers = {"X-API-Key": owner.token}
    r = httpx.post(f"{server.url}/api/v1/environments/acme/edict/versions", headers=headers,
                   files={"package": ("edict.zip", zip_bytes(edict(sdk=sdk)))}, timeout=60)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["status"] == "building" and body["requirements"] == ["easydict==1.13"]
    assert r.headers["Location"] == "/api/v1/environments/acme/edict/versions/1"
    # While it builds, the environment is not in the catalog (no version of it is served).
    listed = [e["name"] for e in httpx.get(f"{server.url}/api/v1/environments", headers=headers).json()]
    assert "acme/edict" not in listed or _version("edict", 1).status != EnvironmentVersion.Status.BUILDING
    # The outsider sees nothing of it, build log included.
    assert httpx.get(f"{server.url}{r.headers['Location']}", headers={"X-API-Key": outsider.token}).status_code == 404

    version = _wait_built("edict", 1)
    assert version.status == EnvironmentVersion.Status.READY, version.error
    state = httpx.get(f"{server.url}{r.headers['Location']}", headers=headers).json()
    assert state["status"] == "ready" and state["current"] is True
    assert state["build_log"].endswith("ready: acme/edict@1")
    assert version.pyenv and (Path(build_dirs["ORS_PYENV_DIR"]) / version.pyenv / ".complete").is_file()

    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("acme/edict")
        assert env.num_tasks("test") == 3
        task = env.get_task("test", 1)
        with env.session(task=task) as session:
            assert session.get_prompt()[0].text == "What is 3 + 4? (one)"
            out = session.call_tool("submit", {"answer": 7})
            assert (out.reward, out.finished, out.metadata) == (1.0, True, {"easydict": "1.13"})
    episodes_with_openreward_and_openenv(server, owner, monkeypatch)


def episodes_with_openreward_and_openenv(server, owner, monkeypatch) -> None:
    """The second official client and an OpenEnv client on the published acme/edict."""
    for name in ("OPENREWARD_SESSION_URL", "OPENREWARD_API_URL"):
        monkeypatch.setenv(name, server.url)
    monkeypatch.setenv("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("acme/edict")
        with env.session(task=env.get_task("test", 2)) as session:
            assert session.get_prompt()[0].text.startswith("What is 10 + 5?")
            out = session.call_tool("submit", {"answer": 15})
            assert (out.reward, out.finished) == (1.0, True)
    finally:
        client.close()
    with GenericEnvClient(base_url=f"{server.url}/openenv/acme/edict", headers=owner.headers).sync() as openenv:
        first = openenv.reset(split="test", index=0)
        assert first.observation["metadata"]["prompt"][0]["text"].startswith("What is 1 + 2?")
        step = openenv.step({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": 4}})
        assert (step.reward, step.done) == (0.0, True)
        assert step.observation["result"]["metadata"] == {"easydict": "1.13"}


def test_a_package_with_requirements_runs_on_runner_nodes_too(cluster, server_factory, owner, tmp_path, build_dirs):
    call_command("publish_env", str(write_folder(tmp_path / "edict", edict("celery"))), team="acme", slug="edict")
    cluster.start_runner()
    gateway = server_factory(**cluster.env(), **build_dirs)
    with ORS(base_url=gateway.url, api_key=owner.token) as client:
        env = client.environment("acme/edict")
        with env.session(task=env.get_task("test", 1)) as session:
            assert session.get_prompt()[0].text == "What is 3 + 4? (celery)"
            out = session.call_tool("submit", {"answer": 7})
            assert (out.reward, out.metadata) == (1.0, {"easydict": "1.13"})


def test_a_second_version_with_the_same_requirements_reuses_the_built_environment(owner, tmp_path, capsys):
    first_dir = write_folder(tmp_path / "v1", edict("one", sdk="openreward"))
    started = time.monotonic()
    call_command("publish_env", str(first_dir), team="acme", slug="edict")
    first_seconds = time.monotonic() - started
    second_dir = write_folder(tmp_path / "v2", edict("two", sdk="openreward"))
    started = time.monotonic()
    call_command("publish_env", str(second_dir), team="acme", slug="edict")
    second_seconds = time.monotonic() - started
    assert capsys.readouterr().out.splitlines() == ["published acme/edict@1", "published acme/edict@2"]

    one, two = _version("edict", 1), _version("edict", 2)
    assert one.status == two.status == EnvironmentVersion.Status.READY
    assert one.pyenv == two.pyenv  # one environment for both
    log = pyenvs.log_path(two.id).read_text()
    # No installer ran for the second: not even a resolution.
    assert "requirements already built: reusing environment" in log and "$ uv" not in log
    print(f"first publish {first_seconds:.1f} s, second {second_seconds:.1f} s")
    assert second_seconds < first_seconds or "reusing" in pyenvs.log_path(one.id).read_text()


def test_two_versions_with_conflicting_requirements_run_side_by_side(servers, owner, build_dirs, tmp_path):
    call_command("publish_env", str(write_folder(tmp_path / "a", edict("old", "easydict==1.13"))),
                 team="acme", slug="edict")
    call_command("publish_env", str(write_folder(tmp_path / "b", edict("new", "easydict==1.14"))),
                 team="acme", slug="edict")
    one, two = _version("edict", 1), _version("edict", 2)
    assert one.pyenv != two.pyenv
    server = servers(**build_dirs)
    with ORS(base_url=server.url, api_key=owner.token) as client:
        old, new = client.environment("acme/edict@1"), client.environment("acme/edict@2")
        # Each session from its own version's task (a task names the version it came from).
        with old.session(task=old.get_task("test", 0)) as s1, new.session(task=new.get_task("test", 0)) as s2:
            assert s1.get_prompt()[0].text.endswith("(old)") and s2.get_prompt()[0].text.endswith("(new)")
            assert s1.call_tool("submit", {"answer": 3}).metadata == {"easydict": "1.13"}
            assert s2.call_tool("submit", {"answer": 3}).metadata == {"easydict": "1.14"}


def test_a_requirement_that_does_not_exist_fails_with_the_installers_message_and_publishes_nothing(owner, settings):
    package = zip_bytes(edict(requirement="no-such-package-ors-xyz==1.0"))
    r = api(owner).post("/api/v1/environments/acme/ghost/versions?wait=1",
                        {"package": SimpleUploadedFile("ghost.zip", package)})
    assert r.status_code == 400, r.json()
    body = r.json()
    assert body["check"] == "requirements"
    assert body["detail"].startswith("Installing the requirements failed: ")
    assert "no-such-package-ors-xyz" in body["detail"] and "not found in the package registry" in body["detail"]
    assert body["version"]["status"] == "failed" and "no-such-package-ors-xyz" in body["version"]["build_log"]
    for host_path in (str(settings.BASE_DIR), str(settings.ORS_PYENV_DIR), "/root/.pyenv"):
        assert host_path not in body["detail"] and host_path not in body["version"]["build_log"]
    environment = Environment.objects.get(slug="ghost")
    assert environment.current_version is None and not Split.objects.filter(environment=environment).exists()
    assert not any(p.is_dir() for p in Path(settings.ORS_PACKAGE_DIR).glob("*"))  # the package went too
    # Not in the catalog, and no session can open on it.
    assert "acme/ghost" not in [e["name"] for e in api(owner).get("/api/v1/environments").json()]


def test_the_cli_prints_one_line_when_a_build_fails(owner, tmp_path):
    folder = write_folder(tmp_path / "ghost", edict(requirement="no-such-package-ors-xyz==1.0"))
    with pytest.raises(CommandError) as failure:
        call_command("publish_env", str(folder), team="acme", slug="ghost")
    message = str(failure.value)
    assert message.startswith("publishing failed (requirements: Installing the requirements failed: ")
    assert "\n" not in message and "Traceback" not in message


def test_the_console_follows_a_build_from_building_to_ready(owner, member, outsider):
    client = login(owner)
    r = client.post("/console/acme/environments/publish",
                    {"package": SimpleUploadedFile("edict.zip", zip_bytes(edict("console", sdk="openreward"))),
                     "slug": "edict"})
    assert r.status_code == 302 and r["Location"] == "/console/acme/environments/edict/versions/1/build"
    page = client.get(r["Location"])
    assert page.status_code == 200
    assert b"easydict==1.13" in page.content and b"Build log" in page.content
    _wait_built("edict", 1)
    state = client.get("/console/acme/environments/edict/versions/1/build.json").json()
    assert state["status"] == "ready" and state["finished"] is True and "ready: acme/edict@1" in state["log"]
    assert login(member).get("/console/acme/environments/edict/versions/1/build").status_code == 200
    assert login(outsider).get("/console/acme/environments/edict/versions/1/build").status_code == 404
    listing = client.get("/console/acme/environments/")
    # The listing links each version's page, which follows its build (and its verification).
    assert b'href="/console/acme/environments/edict/versions/1/"' in listing.content


def test_a_dockerfile_is_noted_on_the_version_not_built(owner):
    r = publish(owner, "docked", "d.zip", zip_bytes({**edict(), "Dockerfile": "FROM python:3.11\nRUN exit 1\n"}))
    assert r.status_code == 202
    version = _wait_built("docked", 1)
    assert version.status == EnvironmentVersion.Status.READY, version.error
    assert "Dockerfile" in version.notes[0] and "not built" in version.notes[0]


# --- the build sandbox -------------------------------------------------------------------------------

PROBE = textwrap.dedent('''
    import os, socket, sys
    try:
        socket.create_connection(("1.1.1.1", 443), timeout=3)
        print("direct: connected")
    except OSError as exc:
        print("direct: refused", type(exc).__name__)
    proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
    s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=5)
    s.sendall(b"CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com\\r\\n\\r\\n")
    print("other host:", s.recv(100).split(b"\\r\\n")[0].decode())
    s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=5)
    s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org\\r\\n\\r\\n")
    print("registry:", s.recv(100).split(b"\\r\\n")[0].decode())
    for path in sys.argv[1:]:
        print(path, "visible" if os.path.exists(path) else "hidden")
''')


@pytest.mark.services  # reaches pypi.org through the registry proxy: not in make test-fast
def test_the_build_sandbox_reaches_the_registry_and_nothing_else(tmp_path, settings):
    root = Path(settings.ORS_PYENV_DIR)
    work = root / f"work-probe-{tmp_path.name}"
    work.mkdir()
    log = pyenvs.BuildLog(tmp_path / "probe.log")
    platform_files = [str(settings.BASE_DIR / "orsplatform" / "settings.py"), str(settings.VAR_DIR),
                      str(settings.ORS_PACKAGE_DIR)]
    try:
        pyenvs._run([[pyenvs._base_python(), "-I", "-c", PROBE, *platform_files]], work=work, log=log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = log.path.read_text()
    assert "direct: refused" in out
    assert "other host: HTTP/1.1 403 Forbidden" in out
    assert "[platform] refused a connection outside the package registry: CONNECT example.com:443" in out
    assert "registry: HTTP/1.1 200 Connection established" in out
    for path in platform_files:
        assert f"{path} hidden" in out


# --- housekeeping ------------------------------------------------------------------------------------


def test_environments_no_version_uses_are_removed_and_used_ones_kept(owner, tmp_path, settings):
    call_command("publish_env", str(write_folder(tmp_path / "a", edict("kept", "easydict==1.13"))),
                 team="acme", slug="edict")
    kept = _version("edict", 1).pyenv
    orphan = Path(settings.ORS_PYENV_DIR) / ("0" * 64)
    orphan.mkdir()
    (orphan / ".complete").write_text("x")
    settings.ORS_PYENV_GRACE_SECONDS = 0
    removed = pyenvs_collect_unused()
    assert orphan.name in removed and kept not in removed
    assert (Path(settings.ORS_PYENV_DIR) / kept / ".complete").is_file() and not orphan.exists()


def test_a_build_whose_process_died_ends_as_failed(owner, acme):
    environment = Environment.objects.create(team=acme, slug="stalled")
    version = EnvironmentVersion.objects.create(environment=environment, number=1, content_hash="c" * 64,
                                                package_path="/nonexistent", entrypoint="", requirements=["six"],
                                                status=EnvironmentVersion.Status.BUILDING)
    EnvironmentVersion.objects.filter(id=version.id).update(
        created_at=version.created_at - datetime.timedelta(hours=2))
    assert versions_fail_stalled_builds(older_than_seconds=600) == 1
    version.refresh_from_db()
    assert version.status == EnvironmentVersion.Status.FAILED and "stopped without finishing" in version.error
    assert version_build(version_id=version.id).status == EnvironmentVersion.Status.FAILED  # runs once only


def test_no_socket_is_left_behind_by_the_registry_proxy(tmp_path):
    from orsplatform.sandbox.registry_proxy import RegistryProxy

    lines: list[str] = []
    with RegistryProxy(tmp_path / "p.sock", {"pypi.org"}, lines.append):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(tmp_path / "p.sock"))
            s.sendall(b"GET http://pypi.org/ HTTP/1.1\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 403")
    assert not (tmp_path / "p.sock").exists() and "refused" in lines[0]


def test_the_environment_pages_render_a_prompt_in_the_versions_own_environment(owner, tmp_path):
    from orsplatform.hub.services import task_prompt_render

    call_command("publish_env", str(write_folder(tmp_path / "edict", edict("page"))), team="acme", slug="edict")
    rendered = task_prompt_render(version=_version("edict", 1), spec={"question": "What is 2 + 2?", "answer": 4})
    assert rendered["ok"] is True, rendered
    assert rendered["blocks"][0]["text"] == "What is 2 + 2? (page)"
