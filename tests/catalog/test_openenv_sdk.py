"""Environments written against OpenEnv's own SDK (an ``MCPEnvironment`` and a plain ``Environment``,
laid out as OpenEnv's examples are: tests/catalog/openenv_packages.py) publish unchanged: their
requirement on ``openenv-core`` is built as the platform's ``openenv`` in a Python environment of
their own, the inspector finds the class and its app's models, and the sandbox worker runs them.
They play with the unmodified ``GenericEnvClient`` and ``MCPToolClient`` in their own terms, the tool
one with ``ors.client`` too, and every episode is in the audit log. Real server, builds, workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.core.management import call_command
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from ors.client import ORS

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.requirements import RequirementsError, collect
from orsplatform.episodes.models import Session, ToolCall
from tests.catalog import openenv_packages
from tests.catalog.support import write_folder, zip_bytes
from tests.catalog.test_requirements import _wait_built
from tests.e2e.helpers import wait_for

BUILT_REQUIREMENTS = ["fastapi>=0.115.0", "openenv==0.10.0", "pydantic>=2.0.0", "requests>=2.31.0",
                      "uvicorn>=0.24.0"]


def published(tmp_path: Path, slug: str, files: dict[str, str]) -> EnvironmentVersion:
    """Publish a package folder with the command (it waits for the build), as an author would."""
    call_command("publish_env", str(write_folder(tmp_path / slug, files)), team="acme", slug=slug)
    return EnvironmentVersion.objects.get(environment__slug=slug, number=1)


def openenv_url(server, env: str) -> str:
    return f"{server.url}/openenv/{env}"


def audit(slug: str) -> list[tuple[str, str, float | None, bool]]:
    return list(ToolCall.objects.filter(session__environment__slug=slug)
                .order_by("started_at").values_list("session__protocol", "name", "reward", "finished"))


# --- requirements ---------------------------------------------------------------------------------


def test_a_requirement_on_openenv_core_or_openenv_is_built_as_the_platforms_openenv(tmp_path):
    root = write_folder(tmp_path / "pkg", {"pyproject.toml": openenv_packages.PYPROJECT.replace("NAME", "x")})
    assert collect(root, {}) == BUILT_REQUIREMENTS
    assert collect(write_folder(tmp_path / "range", {"requirements.txt": "openenv>=0.9\n"}), {}) == ["openenv==0.10.0"]
    with pytest.raises(RequirementsError, match="this platform runs OpenEnv environments with openenv 0.10.0"):
        collect(write_folder(tmp_path / "old", {"requirements.txt": "openenv==0.9.1\n"}), {})


# --- an MCPEnvironment ----------------------------------------------------------------------------


def test_an_openenv_mcp_environment_publishes_unchanged_and_plays_over_openenv_and_ors(
        servers, owner, member, build_dirs):
    server = servers(**build_dirs)
    r = httpx.post(f"{server.url}/api/v1/environments/acme/tally/versions", headers=owner.headers,
                   files={"package": ("tally.zip", zip_bytes(openenv_packages.tally()))}, timeout=60)
    assert r.status_code == 202, r.text
    assert r.json()["requirements"] == BUILT_REQUIREMENTS
    version = _wait_built("tally", 1)
    assert version.status == EnvironmentVersion.Status.READY, version.error
    assert version.entrypoint == "server.tally_environment:TallyEnvironment"
    assert [t["name"] for t in version.tools] == ["add", "peek", "fail"]
    assert (version.openenv["kind"], version.openenv["env_name"]) == ("mcp", "tally_env")
    assert [(s["name"], s["type"]) for s in version.splits] == [("default", "train")]

    # MCPToolClient: an MCP session over /mcp, a socket attached to it for reset.
    async def mcp_episode(person):
        async with MCPToolClient(base_url=openenv_url(server, "acme/tally"), headers=person.headers) as env:
            names = [t.name for t in await env.list_tools()]
            reset = await env.reset(target=5)
            first = await env.call_tool("add", amount=2)
            peek = await env.call_tool("peek")
            with pytest.raises(RuntimeError, match="no luck"):
                await env.call_tool("fail", message="no luck")
            return names, reset, first, peek

    names, reset, first, peek = asyncio.run(mcp_episode(member))
    assert names == ["add", "peek", "fail"]
    assert reset.observation.metadata == {"target": 5, "status": "ready"}
    assert (first, peek) == (2, {"total": 2, "target": 5})

    # GenericEnvClient (what TRL wraps): the environment's own CallToolObservation, reward and done.
    with GenericEnvClient(base_url=openenv_url(server, "acme/tally"), headers=owner.headers).sync() as env:
        assert env.reset(target=3).observation["metadata"]["target"] == 3
        error = env.step({"type": "call_tool", "tool_name": "nope", "arguments": {}})
        assert error.observation["error"]["error_type"] == "tool_not_found" and not error.done
        step = env.step({"type": "call_tool", "tool_name": "add", "arguments": {"amount": 3}})
        assert (step.reward, step.done) == (1.0, True)
        assert step.observation["tool_name"] == "add" and step.observation["result"]["data"] == 3
        assert env.state()["step_count"] == 2
        # Done is done: the platform refuses a step after it, as for every episode.
        late = env.step({"type": "call_tool", "tool_name": "peek", "arguments": {}})
        assert "already finished" in late.observation["error"]["message"]

    # ORS: the same tools, the reset observation as the prompt, the tool's text as the block.
    with ORS(base_url=server.url, api_key=owner.token) as client:
        ors_env = client.environment("acme/tally")
        assert [t.name for t in ors_env.list_tools()] == ["add", "peek", "fail"]
        with ors_env.session(task=ors_env.get_task("default", 0)) as session:
            assert '"target":10' in session.get_prompt()[0].text
            out = session.call_tool("add", {"amount": 10})
            assert (out.blocks[0].text, out.reward, out.finished) == ("10", 1.0, True)

    schema = httpx.get(f"{openenv_url(server, 'acme/tally')}/schema", headers=owner.headers).json()
    assert schema["action"]["title"] == "CallToolAction" and schema["observation"]["title"] == "CallToolObservation"
    assert wait_for(lambda: Session.objects.filter(version=version, ended_at__isnull=False).count() == 3)
    assert sorted(Session.objects.filter(version=version).values_list("protocol", flat=True)) == [
        "openenv", "openenv", "ors"]
    calls = audit("tally")
    assert ("openenv", "add", 1.0, True) in calls and ("ors", "add", 1.0, True) in calls
    assert [name for _, name, _, _ in calls].count("fail") == 1


# --- a plain Environment --------------------------------------------------------------------------


def test_a_plain_openenv_environment_plays_with_its_own_action_observation_and_state(
        servers, owner, tmp_path, build_dirs):
    version = published(tmp_path, "walk", openenv_packages.walk())
    assert version.status == EnvironmentVersion.Status.READY, version.error
    assert version.openenv["kind"] == "step" and [t["name"] for t in version.tools] == ["step"]
    assert version.tools[0]["input_schema"]["title"] == "WalkAction"
    server = servers(**build_dirs)
    url = openenv_url(server, "acme/walk")
    schema = httpx.get(f"{url}/schema", headers=owner.headers).json()
    assert (schema["action"]["title"], schema["observation"]["title"], schema["state"]["title"]) == (
        "WalkAction", "WalkObservation", "WalkState")

    with GenericEnvClient(base_url=url, headers=owner.headers).sync() as env:
        first = env.reset(target=2)
        assert first.observation == {"position": 0, "target": 2, "legal_moves": [-1, 1], "metadata": {"distance": 2}}
        with pytest.raises(RuntimeError, match="move"):
            env.step({"move": 5})  # refused by the environment's own action model
        with pytest.raises(RuntimeError, match="move"):
            env.step({"type": "call_tool", "tool_name": "step", "arguments": {}})
        assert env.step({"move": 1}).reward == 0.0
        last = env.step({"move": 1})
        assert (last.reward, last.done, last.observation["position"]) == (1.0, True, 2)
        state = env.state()
        assert (state["step_count"], state["position"], state["target"]) == (2, 2, 2)
        with pytest.raises(RuntimeError, match="already finished"):
            env.step({"move": 1})

    rpc = httpx.post(f"{url}/mcp", headers=owner.headers, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert rpc.json()["error"]["message"] == "Environment does not support MCP"

    # Over ORS its one tool takes the action.
    with ORS(base_url=server.url, api_key=owner.token) as client:
        ors_env = client.environment("acme/walk")
        with ors_env.session(task=ors_env.get_task("default", 0)) as session:
            out = session.call_tool("step", {"move": -1})
            assert (out.reward, out.finished) == (0.0, False)
            assert out.metadata["openenv"]["observation"]["observation"]["position"] == -1
    assert wait_for(lambda: ("ors", "step", 0.0, False) in audit("walk"))
    assert audit("walk")[:4] == [("openenv", "step", None, False)] * 2 + [("openenv", "step", 0.0, False),
                                                                         ("openenv", "step", 1.0, True)]


# --- tenancy and containment ----------------------------------------------------------------------


def test_an_openenv_environment_of_a_team_is_not_there_for_an_outsider(servers, owner, member, outsider, tmp_path,
                                                                        build_dirs):
    published(tmp_path, "walk", openenv_packages.walk())
    server = servers(**build_dirs)
    url = openenv_url(server, "acme/walk")
    for person, status in ((owner, 200), (member, 200), (outsider, 404)):
        assert httpx.get(f"{url}/schema", headers=person.headers).status_code == status
    with pytest.raises(Exception, match="not found"):
        with GenericEnvClient(base_url=url, headers=outsider.headers).sync() as env:
            env.reset()
    with GenericEnvClient(base_url=url, headers=member.headers).sync() as env:
        assert env.reset(target=1).observation["target"] == 1
    assert not Session.objects.filter(team=outsider.team).exists()


def test_a_hostile_openenv_environment_reaches_no_host_file_port_or_package_file(servers, owner, tmp_path,
                                                                                  build_dirs):
    version = published(tmp_path, "snoop", openenv_packages.snoop())
    assert version.status == EnvironmentVersion.Status.READY, version.error
    server = servers(**build_dirs)
    settings_file = str(Path(settings.BASE_DIR) / "orsplatform" / "settings.py")

    async def snoop():
        async with MCPToolClient(base_url=openenv_url(server, "acme/snoop"), headers=owner.headers) as env:
            await env.reset()
            return await env.call_tool("snoop", path=settings_file, port=int(server.url.rsplit(":", 1)[1]))

    seen = asyncio.run(snoop())
    assert seen["file"].startswith("blocked") and seen["network"].startswith("blocked")
    assert seen["package"].startswith("blocked")
    assert len(seen["processes"]) <= 2  # the sandbox's init and the worker: nothing of the host
    assert not (Path(version.package_path) / "planted.txt").exists()
