"""An OpenEnv-layout environment published unchanged runs as its author ships it: its
``server/Dockerfile`` is built into an image by the platform (a Debian package installed with
apt-get, the package installed into its own virtualenv with its own ``openenv`` and the web
interface the platform's own Python hosting refuses), the image's own server runs under gVisor,
imports itself as a package (``from ledger_env.models import …``) and writes ``/workspace``; the
unmodified ``GenericEnvClient`` and ``ors.client`` play it, and every call is in the audit log.
Real engine, runsc, builds and server processes."""

from __future__ import annotations

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from ors.client import ORS

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.containers.images import record_read
from orsplatform.episodes.models import Session, ToolCall
from tests.catalog.support import login, zip_bytes
from tests.containers.conftest import BUILD_SECONDS, package_files, wait_built
from tests.e2e.helpers import wait_for


def test_an_openenv_layout_image_publishes_unchanged_and_plays_over_openenv_and_ors(
        servers, owner, member, outsider, container_dirs, container_engine):
    server = servers(**container_dirs)
    r = httpx.post(f"{server.url}/api/v1/environments/acme/ledger/versions", headers=owner.headers,
                   files={"package": ("ledger.zip", zip_bytes(package_files("ledger_env")))}, timeout=BUILD_SECONDS)
    assert r.status_code == 202, r.text
    version = wait_built("ledger")
    build_log = log_path(version.id).read_text()
    assert version.status == EnvironmentVersion.Status.READY, (version.error, build_log[-3000:])
    assert "ignoring '# syntax=docker/dockerfile:1'" in build_log and "[platform] ready: acme/ledger@1" in build_log
    assert "jq" in build_log  # apt-get's own lines, streamed
    record = record_read(version.package_path)
    assert record is not None and record.image.startswith("sha256:") and record.port == 8000
    assert record.command == ["uvicorn", "ledger_env.server.app:app", "--host", "0.0.0.0", "--port", "8000"]
    assert version.entrypoint == "ledger_env.server.app:app"
    assert version.openenv["kind"] == "step" and [t["name"] for t in version.tools] == ["step"]
    assert version.tools[0]["input_schema"]["title"] == "LedgerAction"
    # The version page lists the image's layers and sizes, for its team only.
    page = login(member).get("/console/acme/environments/ledger/versions/1/build")
    assert page.status_code == 200 and b'id="image-layers"' in page.content, page.content[-2000:]
    assert b"apt-get install -y --no-install-recommends jq" in page.content and b"MB" in page.content
    assert login(outsider).get("/console/acme/environments/ledger/versions/1/build").status_code == 404

    url = f"{server.url}/openenv/acme/ledger"
    # Tenancy: a private environment is not there for another team, over either face.
    assert httpx.get(f"{url}/schema", headers=outsider.headers).status_code == 404
    schema = httpx.get(f"{url}/schema", headers=member.headers).json()
    assert (schema["action"]["title"], schema["observation"]["title"]) == ("LedgerAction", "LedgerObservation")

    def running() -> list[str]:
        return container_engine.run("ps", "-q", "--filter", "label=ors.container", "--filter",
                                    f"ancestor={record.image}").stdout.decode().split()

    # The built version has a started container before its first session (containers/warm.py)...
    [spare] = wait_for(running, timeout=120, what="the version's spare container")
    with GenericEnvClient(base_url=url, headers=owner.headers).sync() as env:
        first = env.reset(start=3, run="ledger-run")
        observation = first.observation
        # ...which the first session takes (below), and the next spare starts behind it.
        # (Its server imports OpenEnv with Gradio under gVisor: half a minute alone, more beside the suite.)
        wait_for(lambda: len(running()) == 2, timeout=300, what="the next spare")
        assert (observation["balance"], observation["lines"]) == (3, 1)
        # The image's own Python and openenv (with its web interface), and the Debian package.
        assert observation["runtime"] == {"python": "/app/.venv", "openenv": "0.10.0", "web_interface": True}
        assert observation["jq"].startswith("jq-1.")
        assert observation["path"].startswith("/workspace/")
        step = env.step({"amount": 4, "note": "rent"})
        assert (step.observation["balance"], step.observation["lines"], step.reward, step.done) == (7, 2, 7.0, False)
        assert env.state()["step_count"] == 1  # the server's, asked when a client asks
        last = env.step({"amount": 5})
        assert (last.reward, last.done) == (12.0, True)
        # The session's container is the spare: stopped, the session ends, and the state (asked
        # again after a step) says why.
        container_engine.run("kill", spare)
        wait_for(lambda: spare not in running(), timeout=60, what="the spare's end")
        with pytest.raises(RuntimeError, match="acme/ledger@1 stopped"):
            env.state()

    with ORS(base_url=server.url, api_key=member.token) as client:
        ors_env = client.environment("acme/ledger")
        assert [t.name for t in ors_env.list_tools()] == ["step"]
        with ors_env.session(task=ors_env.get_task("default", 0)) as session:
            assert '"balance":0' in session.get_prompt()[0].text
            out = session.call_tool("step", {"amount": 10})
            assert (out.reward, out.finished) == (10.0, True)
            assert '"balance":10' in out.blocks[0].text

    wait_for(lambda: Session.objects.filter(version=version, ended_at__isnull=False).count() == 2, timeout=30)
    calls = list(ToolCall.objects.filter(session__version=version).order_by("started_at")
                 .values_list("session__protocol", "name", "reward", "finished"))
    assert calls == [("openenv", "step", 7.0, False), ("openenv", "step", 12.0, True), ("ors", "step", 10.0, True)]
    # The reset's own arguments are the task; the run it names is the platform's, not the server's.
    assert list(Session.objects.filter(version=version, protocol="openenv").values_list("task_spec", "run_name")) == [
        ({"start": 3}, "ledger-run")]


def test_a_container_environments_hidden_task_fields_reach_its_server_and_no_trainer(
        servers, owner, member, container_dirs):
    server = servers(**container_dirs)
    files = {**package_files("ledger_env"), "manifest.toml": 'hidden_task_fields = ["start"]\n',
             "tasks/train.jsonl": '{"start": 7, "label": "seven"}\n{"start": 2, "label": "two"}\n'}
    r = httpx.post(f"{server.url}/api/v1/environments/acme/quiet/versions", headers=owner.headers,
                   files={"package": ("quiet.zip", zip_bytes(files))}, timeout=BUILD_SECONDS)
    assert r.status_code == 202, r.text
    version = wait_built("quiet")
    assert version.status == EnvironmentVersion.Status.READY, (version.error, log_path(version.id).read_text()[-3000:])
    assert [(s["name"], s["type"]) for s in version.splits] == [("train", "train")]

    with ORS(base_url=server.url, api_key=member.token) as client:
        task = client.environment("acme/quiet").get_task("train", 0)
        assert task.task_spec == {"label": "seven"}
    # An episode by split and index: the image's server is reset with the whole task.
    sid = httpx.post(f"{server.url}/create_session", headers=member.headers).json()["sid"]
    headers = {**member.headers, "X-Session-ID": sid}
    r = httpx.post(f"{server.url}/acme/quiet/create", headers=headers, json={"split": "train", "index": 0}, timeout=180)
    assert r.status_code == 200, r.text
    prompt = httpx.get(f"{server.url}/acme/quiet/prompt", headers=headers, timeout=180)
    assert prompt.status_code == 200 and '\\"balance\\":7' in prompt.text, prompt.text[:500]
    httpx.post(f"{server.url}/delete", headers=headers)
    rows = list(Session.objects.filter(version=version).values_list("task_spec", flat=True))
    assert rows and all("start" not in (spec or {}) for spec in rows), rows
