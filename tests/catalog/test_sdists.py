"""Requirements published only as source distributions: built into a wheel in a sandbox of their
own (a private throwaway cache, the package index as the only network, no host files), and only the
wheel enters the environment. Real builds (uv, bubblewrap), a real local package index serving an
sdist the test writes, real server and worker processes."""

from __future__ import annotations

import os
import secrets
import socket
import textwrap
import threading
from pathlib import Path

import httpx
import pytest
from django.core.management import CommandError, call_command
from ors.client import ORS

from orsplatform.catalog import pyenvs, sdists
from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.sandbox import users
from tests.catalog.local_index import local_index
from tests.catalog.support import wait_until, write_folder, zip_bytes
from tests.executors.test_hostile_tenants import _host_processes

BUILD_SECONDS = 300

TINY_ENV = textwrap.dedent('''
    """Needs ors-tiny-sdist, which its index publishes only as a source distribution."""
    import ors_tiny_sdist
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Answer(BaseModel):
        answer: int


    class Tiny(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            return [{"add": 1}, {"add": 2}]

        def get_prompt(self):
            return [TextBlock(text=f"What is {ors_tiny_sdist.VALUE} + {self.task_spec['add']}?")]

        @tool
        def submit(self, params: Answer) -> ToolOutput:
            right = params.answer == ors_tiny_sdist.VALUE + self.task_spec["add"]
            return ToolOutput(blocks=[TextBlock(text="right" if right else "wrong")],
                              reward=1.0 if right else 0.0, finished=True,
                              metadata={"built_from": ors_tiny_sdist.__file__.rsplit("/", 1)[-1]})
''')


@pytest.fixture
def index():
    with local_index() as served:
        yield served


def _version(slug: str, number: int) -> EnvironmentVersion:
    return EnvironmentVersion.objects.get(environment__slug=slug, number=number)


def _cache_names(cache: Path) -> list[str]:
    """The shared cache's entries, less the markers uv writes into an empty bucket."""
    return [rel for d, dirs, files in os.walk(cache) for n in [*dirs, *files]
            if (rel := str(Path(d, n).relative_to(cache))).count("/") != 1 or n not in (".git", ".gitignore")]


def test_a_requirement_published_only_as_an_sdist_is_built_from_source_and_the_environment_publishes_and_plays(
        servers, owner, outsider, build_dirs, index):
    index.add_sdist("ors-tiny-sdist", "0.1", {"ors_tiny_sdist.py": "VALUE = 40\n"})
    server = servers(**build_dirs, ORS_BUILD_EXTRA_INDEX_URLS=index.url)
    r = httpx.post(f"{server.url}/api/v1/environments/acme/tiny/versions", headers={"X-API-Key": owner.token},
                   files={"package": ("tiny.zip", zip_bytes({"env.py": TINY_ENV,
                                                             "requirements.txt": "ors-tiny-sdist==0.1\n"}))},
                   timeout=60)
    assert r.status_code == 202, r.text
    assert wait_until(lambda: _version("tiny", 1).status != EnvironmentVersion.Status.BUILDING, timeout=BUILD_SECONDS)
    version = _version("tiny", 1)
    assert version.status == EnvironmentVersion.Status.READY, version.error
    state = httpx.get(f"{server.url}{r.headers['Location']}", headers={"X-API-Key": owner.token}).json()
    assert state["status"] == "ready" and state["build_log"].endswith("ready: acme/tiny@1")
    # The build log shows the step: the wheels-only resolve, the source build, the wheel it made.
    log = pyenvs.log_path(version.id).read_text()
    assert "$ uv build ors_tiny_sdist-0.1.tar.gz (ors-tiny-sdist 0.1 has no wheel: building it from its source" in log
    assert "[platform] built ors_tiny_sdist-0.1-py3-none-any.whl" in log
    assert "(and the wheels built from source: ors_tiny_sdist-0.1-py3-none-any.whl)" in log
    assert "/files/ors-tiny-sdist/ors_tiny_sdist-0.1.tar.gz" in index.requests
    assert httpx.get(f"{server.url}{r.headers['Location']}", headers={"X-API-Key": outsider.token}).status_code == 404

    # Only the wheel entered the environment; the shared cache holds nothing of the source build
    # (no build environments, no sdist, no unpacked wheel of it).
    site = next(Path(build_dirs["ORS_PYENV_DIR"], version.pyenv, "lib").glob("python3*/site-packages"))
    assert (site / "ors_tiny_sdist.py").read_text() == "VALUE = 40\n"
    assert (site / "ors_tiny_sdist-0.1.dist-info" / "WHEEL").is_file()
    cached = _cache_names(Path(build_dirs["ORS_UV_CACHE_DIR"]))
    assert not [n for n in cached if "tiny_sdist" in n or n.startswith(("builds-", "sdists-")) and "/" in n], cached

    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("acme/tiny")
        with env.session(task=env.get_task("test", 1)) as session:
            assert session.get_prompt()[0].text == "What is 40 + 2?"
            out = session.call_tool("submit", {"answer": 42})
            assert (out.reward, out.finished, out.metadata) == (1.0, True, {"built_from": "ors_tiny_sdist.py"})


HOSTILE_SETUP = textwrap.dedent('''
    import os, socket, sys, urllib.request

    lines = []
    for what, path in (("shared cache", SHARED_CACHE), ("environments", PYENVS)):
        if not os.path.exists(path):
            lines.append(f"{what}: hidden")
            continue
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "poisoned"), "w") as fh:
                fh.write("x")
            lines.append(f"{what}: written")
        except OSError as exc:
            lines.append(f"{what}: refused ({type(exc).__name__})")
    for what, path in (("secret", SECRET), ("settings", SETTINGS)):
        try:
            lines.append(f"{what}: read " + open(path).read())
        except OSError as exc:
            lines.append(f"{what}: refused ({type(exc).__name__})")
    try:
        socket.create_connection(("127.0.0.1", LISTENER), timeout=3).close()
        lines.append("listener direct: connected")
    except OSError as exc:
        lines.append(f"listener direct: refused ({type(exc).__name__})")
    proxy = os.environ.get("HTTP_PROXY", "")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
    for what, url in (("listener via proxy", f"http://127.0.0.1:{LISTENER}/"),
                      ("listener via proxy tls", f"https://127.0.0.1:{LISTENER}/"),
                      ("index", INDEX + "/ors-hostile-sdist/")):
        try:
            lines.append(f"{what}: {opener.open(url, timeout=10).status}")
        except Exception as exc:
            lines.append(f"{what}: refused ({exc})")
    # Who it runs as, and the host kernel's settings.
    lines.append(f"uid: {os.getuid()}")
    lines.append("uid_map: " + " / ".join(" ".join(l.split()) for l in open("/proc/self/uid_map")))
    for knob in ("kernel/core_pattern", "kernel/printk_ratelimit_burst", "vm/drop_caches"):
        try:
            open("/proc/sys/" + knob, "w").close()
            lines.append(f"sysctl {knob}: writable")
        except OSError as exc:
            lines.append(f"sysctl {knob}: refused ({type(exc).__name__})")
    # A process left behind: a grandchild in a session of its own.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)  # lets the build end: the stray holds none of its pipes
            os.execv("/bin/sleep", ["sleep", STRAY])
        os._exit(0)
    print("\\n".join("PROBE " + line for line in lines), file=sys.stderr, flush=True)
    sys.exit("ORS-HOSTILE refusing to build after probing")
''')


@pytest.fixture
def listener():
    """A TCP server on the host that counts the connections it gets (the build must make none)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[tuple] = []

    def accept() -> None:
        while True:
            try:
                conn, peer = server.accept()
            except OSError:
                return
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    server.close()
    thread.join(timeout=5)


def test_a_hostile_setup_py_reaches_nothing_but_the_index_and_its_failure_names_the_package(
        runtime, owner, settings, index, listener, tmp_path):
    port, accepted = listener
    stray = f"{7000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-CANARY")
    cache, pyenv_dir = Path(settings.ORS_UV_CACHE_DIR), Path(settings.ORS_PYENV_DIR)
    constants = (f"SHARED_CACHE = {str(cache)!r}\nPYENVS = {str(pyenv_dir)!r}\nSECRET = {str(secret)!r}\n"
                 f"SETTINGS = {str(settings.BASE_DIR / 'orsplatform' / 'settings.py')!r}\n"
                 f"LISTENER = {port}\nINDEX = {index.url!r}\nSTRAY = {stray!r}\n")
    index.add_sdist("ors-hostile-sdist", "0.1", {"ors_hostile_sdist.py": "X = 1\n"},
                    setup=constants + HOSTILE_SETUP)
    settings.ORS_BUILD_EXTRA_INDEX_URLS = [index.url]
    folder = write_folder(tmp_path / "hostile", {"env.py": TINY_ENV.replace("ors_tiny_sdist", "ors_hostile_sdist"),
                                                 "requirements.txt": "ors-hostile-sdist\n"})
    with pytest.raises(CommandError) as failure:
        call_command("publish_env", str(folder), team="acme", slug="hostile")
    # The failure names the package and says what its build said.
    message = str(failure.value)
    assert message.startswith("publishing failed (requirements: Installing the requirements failed: Building "
                              "ors-hostile-sdist 0.1 from its source distribution failed: "), message
    version = _version("hostile", 1)
    assert version.status == EnvironmentVersion.Status.FAILED
    assert Environment.objects.get(slug="hostile").current_version is None
    log = pyenvs.log_path(version.id).read_text()
    assert "ORS-HOSTILE refusing to build after probing" in log
    probes = dict(line[len("PROBE "):].split(": ", 1) for line in log.splitlines() if line.startswith("PROBE "))
    # No shared cache write, no environments' folder: neither is even there to write into (the
    # sandbox's /tmp is its own, whatever the host's paths under /tmp).
    assert probes["shared cache"] == "hidden" and probes["environments"] == "hidden"
    assert not (cache / "poisoned").exists() and not (pyenv_dir / "poisoned").exists()
    assert not [n for n in _cache_names(cache) if "hostile" in n and not n.startswith("simple-")]
    # No host files.
    assert probes["secret"].startswith("refused") and probes["settings"].startswith("refused")
    assert "HOST-SECRET-CANARY" not in log
    # No network but the index: the host's listener got no connection, directly or through the proxy.
    assert probes["listener direct"].startswith("refused")
    assert probes["listener via proxy"].startswith("refused") and "403" in probes["listener via proxy"]
    assert probes["listener via proxy tls"].startswith("refused")
    assert probes["index"] == "200"
    assert accepted == []
    assert f"[platform] refused a connection outside the package registry: GET http://127.0.0.1:{port}/" in log
    # Not the host's root, nor any host user that owns a file: an unused uid of the sandbox's own,
    # to which every kernel setting is read-only.
    if runtime == "bwrap":
        uid_map = probes["uid_map"].split(" / ")
        assert probes["uid"] == str(users.SANDBOX_UID) and uid_map[0] == "0 0 1", probes
        host_uid = int(uid_map[1].split()[1])
        assert uid_map[1].split()[0] == str(users.SANDBOX_UID) and host_uid >= users.UID_BASE, probes
    else:  # gVisor's own users: the build code is the host uid its files are written as, of the range
        assert users.UID_BASE <= int(probes["uid"]) < users.UID_BASE + 2**22, probes
    for knob in ("kernel/core_pattern", "kernel/printk_ratelimit_burst", "vm/drop_caches"):
        # /proc/sys is an empty read-only folder there too; the uid alone would refuse the write.
        assert probes[f"sysctl {knob}"] in ("refused (FileNotFoundError)", "refused (PermissionError)"), probes
    # Nothing of the build is left: no work folder, no environment, no process.
    assert not list(pyenv_dir.glob("work-*"))
    assert _host_processes(f"sleep {stray}") == []


def test_uv_s_explanation_names_the_packages_without_a_wheel():
    output = ("  × No solution found when resolving dependencies:\n  ╰─▶ Because gym==0.26.2 has no usable wheels "
              "and you require gym==0.26.2, we can conclude that your requirements are unsatisfiable.\n\n"
              "hint: Wheels are required for `gym` because building from source is disabled for all packages")
    assert sdists.wanted(output) == {"gym": "0.26.2"}
    assert sdists.wanted("Because all versions of Foo_Bar have no usable wheels and you require foo-bar, ...\n"
                         "hint: Wheels are required for `foo-bar` because building from source is disabled") == {
        "foo-bar": None}
    assert sdists.wanted("Because no-such-pkg was not found in the package registry") == {}


def test_with_source_builds_off_an_sdist_only_requirement_fails_with_uvs_message(owner, settings, index, tmp_path):
    # A package no other test builds: an environment built earlier from the same resolution is reused.
    index.add_sdist("ors-off-sdist", "0.1", {"ors_off_sdist.py": "VALUE = 40\n"})
    settings.ORS_BUILD_EXTRA_INDEX_URLS = [index.url]
    settings.ORS_BUILD_SDISTS = False
    folder = write_folder(tmp_path / "tiny", {"env.py": TINY_ENV, "requirements.txt": "ors-off-sdist==0.1\n"})
    with pytest.raises(CommandError, match="Wheels are required for `ors-off-sdist`"):
        call_command("publish_env", str(folder), team="acme", slug="tiny")
    assert not [p for p in index.requests if p.startswith("/files/")]
