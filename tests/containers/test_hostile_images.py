"""A hostile tenant's image (its own server speaking OpenEnv's wire, tests/containers/packages/
hostile_env) tries to leave its container under gVisor: it reads host paths, opens sockets, forks,
fills its writable layer and makes syscalls meant for the host's kernel. It reaches nothing, the
platform keeps serving, and a container killed mid-call answers 410 with the reason. A build that
reaches for anything but the package registries is refused. Real engine, runsc, builds, servers."""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import subprocess
from pathlib import Path

import httpx
import pytest

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.catalog.services import environment_delete
from orsplatform.containers import services as container_services
from orsplatform.containers.images import archive_path, record_read
from orsplatform.containers.runtime import NETWORK_STACKS
from orsplatform.containers.services import images_collect_unused
from tests.catalog.support import zip_bytes
from tests.containers.conftest import BUILD_SECONDS, package_files, wait_built
from tests.e2e.helpers import wait_for
from tests.fixtures.ors import parse_sse, sse_result

ENV = "acme/hostile"
# What a build may not reach: anything directly, and a site that is no registry (through the proxy).
REFUSED_BUILD = """\
FROM python:3.11-slim
RUN echo RUN-TOKEN && (curl --noproxy '*' -sS -m 5 http://1.1.1.1/ && echo "reached-$((40 + 1))") \
    || echo "unreachable-$((40 + 2))"
RUN echo RUN-TOKEN && curl -fsS -m 20 https://example.com/ && echo "reached-$((40 + 3))"
CMD ["python3", "-m", "http.server"]
"""


def _session(server, person) -> str:
    r = httpx.post(f"{server.url}/create_session", headers=person.headers)
    sid = r.json()["sid"]
    r = httpx.post(f"{server.url}/{ENV}/create", headers={**person.headers, "X-Session-ID": sid},
                   json={"task_spec": {}}, timeout=180)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{server.url}/{ENV}/prompt", headers={**person.headers, "X-Session-ID": sid}, timeout=180)
    assert r.status_code == 200, r.text
    return sid


def _call(server, person, sid: str, probe: str, arg: str = "", n: int = 0) -> httpx.Response:
    return httpx.post(f"{server.url}/{ENV}/call", headers={**person.headers, "X-Session-ID": sid},
                      json={"name": "step", "input": {"probe": probe, "arg": arg, "n": n}}, timeout=180)


def _probe(server, person, sid: str, probe: str, arg: str = "", n: int = 0) -> dict:
    r = _call(server, person, sid, probe, arg, n)
    assert r.status_code == 200, r.text
    result = sse_result(r.text)
    assert result.get("ok"), result
    return json.loads(result["output"]["blocks"][0]["text"])["result"]


@pytest.fixture
def network_stack() -> str:
    """What serves the container's loopback (ORS_CONTAINER_NETWORK_STACK); a test may parametrize it."""
    return "gvisor"


@pytest.fixture
def own_image() -> bool:
    """Whether the test's package gets an image of its own. A test that kills the image's containers
    or removes the image must not reach another test's (the same content is one image, shared by the
    suite's parallel processes): it parametrizes this to True."""
    return False


@pytest.fixture
def hostile(servers, owner, container_dirs, network_stack, own_image):
    # No spares (containers/warm.py): these tests count, kill and unload the version's containers.
    server = servers(**container_dirs, ORS_SANDBOX_IDLE_SECONDS="600", ORS_CONTAINER_WARM_VERSIONS="0",
                     ORS_CONTAINER_NETWORK_STACK=network_stack)
    files = package_files("hostile_env")
    if own_image:  # copied in the image's last layers: the rest comes from the build cache
        files["server/own-image.txt"] = secrets.token_hex(8).encode()
    r = httpx.post(f"{server.url}/api/v1/environments/{ENV}/versions", headers=owner.headers,
                   files={"package": ("hostile.zip", zip_bytes(files))}, timeout=BUILD_SECONDS)
    assert r.status_code == 202, r.text
    version = wait_built("hostile")
    assert version.status == EnvironmentVersion.Status.READY, (version.error, log_path(version.id).read_text()[-3000:])
    return server, version


# Under either loopback stack: the host kernel's (an operator's choice, docs/containers.md) must
# leave the container as unreachable and as contained as gVisor's own.
@pytest.mark.parametrize("network_stack", ["gvisor", "host"])
def test_a_hostile_image_reaches_nothing_outside_its_container(hostile, owner, outsider, container_engine,
                                                               network_stack):
    server, version = hostile
    sid = _session(server, outsider)  # a public environment, played by another team
    image = record_read(version.package_path).image
    ids = container_engine.run("ps", "-q", "--filter", "label=ors.container", "--filter", f"ancestor={image}").stdout
    runtimes = {container_engine.run("inspect", "--format", "{{.HostConfig.Runtime}}", i).stdout.decode().strip()
                for i in ids.decode().split()}
    assert NETWORK_STACKS[network_stack][0] in runtimes, runtimes  # the stack asked for is the one serving
    host_files = f"{os.getcwd()}/orsplatform/settings.py,{version.package_path}/manifest.toml,/var/run/docker.sock"
    read = _probe(server, outsider, sid, "read", host_files + ",/proc/1/cmdline")
    for path in host_files.split(","):
        assert read["files"][path].startswith("error:"), (path, read["files"][path])
    assert os.getcwd() not in read["mounts"] and str(container_engine.state) not in read["mounts"]
    leaked = {k for k in read["environ"] if k.startswith(("ORS_", "DATABASE", "REDIS", "SECRET", "DJANGO", "DOCKER"))}
    assert not leaked, leaked

    reached = _probe(server, outsider, sid, "connect", "127.0.0.1:5432,127.0.0.1:6379,1.1.1.1:443,8.8.8.8:53,"
                                                        "169.254.169.254:80")
    assert reached.pop("interfaces") == ["lo"]
    assert all(v.startswith("error:") for v in reached.values()), reached

    forked = _probe(server, outsider, sid, "fork", n=300)
    assert forked["stopped"] is not None and forked["forked"] < 64, forked  # the manifest's 64 processes

    calls = _probe(server, outsider, sid, "syscalls")
    # gVisor's own kernel answers: the host's (a newer one) never sees these.
    assert calls["kernel"] != os.uname().release, calls
    for name in ("kexec_load", "init_module", "open_by_handle_at", "bpf", "perf_event_open", "iopl", "ioperm",
                 "swapon", "reboot"):
        assert calls[name] != "ok", (name, calls)

    # Filling the writable layer (2 GiB against 512 MiB of memory) ends inside the container: the
    # write fails, or the container is killed and its sessions told why.
    r = _call(server, outsider, sid, "fill", n=2048)
    if sse_result(r.text).get("ok"):
        filled = json.loads(sse_result(r.text)["output"]["blocks"][0]["text"])["result"]
        assert filled["stopped"] is not None and filled["written_mb"] < 600, filled
    else:
        gone = httpx.get(f"{server.url}/{ENV}/prompt", headers={**outsider.headers, "X-Session-ID": sid})
        assert gone.status_code == 410 and ENV in gone.json()["detail"], gone.text
    # The platform serves on: a session of another team (its own container) plays.
    other = _session(server, owner)
    assert _probe(server, owner, other, "sleep", n=0) == {"slept": 0}


@pytest.mark.parametrize("own_image", [True], ids=["own-image"])
def test_a_container_killed_mid_call_answers_410_with_the_reason(hostile, owner, container_engine, own_image):
    server, version = hostile
    sid = _session(server, owner)
    image = record_read(version.package_path).image

    def running() -> list[str]:
        out = container_engine.run("ps", "-q", "--filter", "label=ors.container", "--filter", f"ancestor={image}")
        return out.stdout.decode().split()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(_call, server, owner, sid, "sleep", "", 60)
        containers = wait_for(running, timeout=30, what="the session's container")
        subprocess.run(container_engine.argv("kill", *containers), env=container_engine.env(), check=True,
                       capture_output=True)
        r = call.result(timeout=60)
    errors = [d for e, d in parse_sse(r.text) if e == "error"]
    assert errors and ENV in errors[0], r.text
    r = httpx.get(f"{server.url}/{ENV}/prompt", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 410, r.text
    assert f"{ENV}@1" in r.json()["detail"] and "killed" in r.json()["detail"], r.json()
    # The next session gets a fresh container.
    fresh = _session(server, owner)
    assert _probe(server, owner, fresh, "sleep", n=0) == {"slept": 0}

    # Deleted, the environment's image goes with the next collection.
    tag = record_read(version.package_path).tag
    environment_delete(environment=version.environment)
    assert tag in images_collect_unused()
    assert container_engine.run("image", "inspect", tag, check=False).returncode != 0


def test_a_build_that_reaches_past_the_registries_is_refused(servers, owner, container_dirs):
    server = servers(**container_dirs)
    # A token of this run in each step: BuildKit's cache must not answer for them.
    dockerfile = REFUSED_BUILD.replace("RUN-TOKEN", secrets.token_hex(8))
    files = {"server/Dockerfile": dockerfile, "openenv.yaml": "name: reach\nport: 8000\n"}
    r = httpx.post(f"{server.url}/api/v1/environments/acme/reach/versions", headers=owner.headers,
                   files={"package": ("reach.zip", zip_bytes(files))}, timeout=BUILD_SECONDS)
    assert r.status_code == 202, r.text
    version = wait_built("reach")
    assert version.status == EnvironmentVersion.Status.FAILED
    assert version.error.startswith("image:"), version.error
    build_log = log_path(version.id).read_text()
    # The markers are computed when a step runs (BuildKit's log also shows each step's command).
    assert "unreachable-42" in build_log and "reached-41" not in build_log
    assert "refused a connection outside the package registry: CONNECT example.com:443" in build_log
    assert "reached-43" not in build_log


@pytest.mark.parametrize("own_image", [True], ids=["own-image"])
def test_a_node_without_the_image_loads_it_from_the_archive_the_build_kept(hostile, owner, container_engine,
                                                                          own_image):
    server, version = hostile
    record = record_read(version.package_path)
    # As a build with the celery executor (ORS_CONTAINER_ARCHIVES) leaves it for runner nodes.
    container_services._archive(container_engine, record, Path(version.package_path), lambda line: None)
    assert archive_path(version.package_path).is_file()
    container_engine.run("rmi", "--force", record.tag)  # a node whose engine never saw the image
    assert container_engine.run("image", "inspect", record.image, check=False).returncode != 0
    sid = _session(server, owner)  # the server's pool loads the image from the archive, then starts it
    assert _probe(server, owner, sid, "sleep", n=0) == {"slept": 0}
    assert container_engine.run("image", "inspect", record.image, check=False).returncode == 0
