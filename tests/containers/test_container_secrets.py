"""A container environment gets the secrets its manifest declares (required_secrets), and only
those: the image's server has each as a variable of its process, a secret it does not declare
never reaches the container, callers with other values of a declared secret get other
containers, and no value is in the container's configuration (`docker inspect`) or in what the
platform stores. Real engine, runsc, build, server."""

from __future__ import annotations

import base64
import json

import httpx
from openenv.core.generic_client import GenericEnvClient

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.containers.images import record_read
from orsplatform.episodes.models import Session, ToolCall
from tests.catalog.support import api, publish, zip_bytes
from tests.containers.conftest import BUILD_SECONDS, package_files, wait_built
from tests.e2e.helpers import wait_for
from tests.fixtures.ors import sse_result

ENV = "acme/echo"
ONE, TWO = "echo-value-one-7f3a91c2", "echo-value-two-2b8e0d4f"
UNDECLARED = "undeclared-value-5c1d"


def _secrets(**values: str) -> dict[str, str]:
    body = {name: {"value": value, "allowed_domains": []} for name, value in values.items()}
    return {"X-Secrets": base64.b64encode(json.dumps(body).encode()).decode()}


def _episode(server, person, secrets: dict[str, str]) -> tuple[str, dict]:
    """A session's one step: (its sid, what the server's process had)."""
    sid = httpx.post(f"{server.url}/create_session", headers=person.headers).json()["sid"]
    headers = {**person.headers, "X-Session-ID": sid}
    r = httpx.post(f"{server.url}/{ENV}/create", headers={**headers, **secrets}, json={"task_spec": {}}, timeout=180)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.url}/{ENV}/call", headers=headers, json={"name": "step", "input": {}}, timeout=180)
    assert r.status_code == 200, r.text
    result = sse_result(r.text)
    assert result.get("ok"), result
    httpx.post(f"{server.url}/delete", headers=headers)
    return sid, json.loads(result["output"]["blocks"][0]["text"])


def test_a_container_gets_its_declared_secrets_only_and_callers_with_other_values_get_other_containers(
        servers, owner, outsider, container_dirs, container_engine):
    server = servers(**container_dirs)
    r = httpx.post(f"{server.url}/api/v1/environments/{ENV}/versions", headers=owner.headers,
                   files={"package": ("echo.zip", zip_bytes(package_files("echo_env")))}, timeout=BUILD_SECONDS)
    assert r.status_code == 202, r.text
    version = wait_built("echo")
    assert version.status == EnvironmentVersion.Status.READY, (version.error, log_path(version.id).read_text()[-3000:])
    assert record_read(version.package_path).secrets == ["ECHO_TOKEN"]

    # Without secrets: the version's spare (started with none) serves it, and the server has none.
    _, plain = _episode(server, owner, {})
    assert plain["environ"] == {"ECHO_TOKEN": None, "UNDECLARED_TOKEN": None}
    # The declared one reaches the server's process; the undeclared one (which the environment's own
    # team may send) stays in the gateway.
    sid_one, first = _episode(server, owner, _secrets(ECHO_TOKEN=ONE, UNDECLARED_TOKEN=UNDECLARED))
    assert first["environ"] == {"ECHO_TOKEN": ONE, "UNDECLARED_TOKEN": None}
    assert first["container"] != plain["container"]
    # The same caller with another value: another container; with the first value again: the first.
    _, second = _episode(server, owner, _secrets(ECHO_TOKEN=TWO))
    assert second["environ"]["ECHO_TOKEN"] == TWO and second["container"] not in (first["container"],
                                                                                   plain["container"])
    _, again = _episode(server, owner, _secrets(ECHO_TOKEN=ONE))
    assert again == first
    # Over OpenEnv, the reset's secrets: the same caller and value, the same container.
    with GenericEnvClient(base_url=f"{server.url}/openenv/{ENV}", headers=owner.headers).sync() as env:
        assert env.reset(secrets={"ECHO_TOKEN": ONE}).observation == first

    # No value in the containers' configuration, nor in anything the platform stored.
    running = container_engine.run("ps", "-q", "--filter", "label=ors.container").stdout.decode().split()
    assert len(running) >= 3, running
    inspected = container_engine.run("inspect", *running).stdout.decode()
    assert all(value not in inspected for value in (ONE, TWO, UNDECLARED))
    wait_for(lambda: Session.objects.filter(version=version, ended_at__isnull=False).count() == 5, timeout=30)
    stored = json.dumps([list(Session.objects.filter(version=version).values()),
                         list(ToolCall.objects.filter(session__version=version).values())], default=str)
    assert all(value not in stored for value in (ONE, TWO, UNDECLARED)) and "[redacted]" in stored
    assert all(value not in server.log() for value in (ONE, TWO, UNDECLARED))
    assert Session.objects.get(sid=sid_one).status == Session.Status.DELETED

    # Another team's key does not reach the environment (private) with or without secrets.
    sid = httpx.post(f"{server.url}/create_session", headers=outsider.headers).json()["sid"]
    r = httpx.post(f"{server.url}/{ENV}/create", headers={**outsider.headers, "X-Session-ID": sid,
                                                          **_secrets(ECHO_TOKEN=ONE)}, json={"task_spec": {}})
    assert r.status_code == 404 and set(r.json()) == {"detail"}, r.text


def test_a_declared_secret_that_is_no_variable_name_fails_the_build_saying_why(owner, member, outsider,
                                                                              container_dirs):
    files = {**package_files("echo_env"), "manifest.toml": 'required_secrets = ["ECHO_TOKEN", "api-key", "PORT"]\n'}
    # Another team cannot publish into acme, whatever the package.
    assert publish(outsider, "echo", "echo.zip", zip_bytes(files), team="acme").status_code == 404
    r = publish(owner, "echo", "echo.zip", zip_bytes(files))  # the build runs in the request (eager Celery)
    assert r.status_code == 202, r.content
    version = wait_built("echo")
    assert version.status == EnvironmentVersion.Status.FAILED and version.error.startswith("manifest: "), version.error
    assert "'api-key', 'PORT'" in version.error and "environment variables" in version.error
    assert record_read(version.package_path) is None  # nothing was built
    page = api(member).get("/api/v1/environments/acme/echo/versions/1")
    assert page.status_code == 200 and page.json()["status"] == "failed"
