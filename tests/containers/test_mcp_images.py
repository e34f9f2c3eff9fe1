"""An MCP environment (OpenEnv's ``MCPEnvironment``) shipped as OpenEnv's own Dockerfile template
builds it: a multi-stage build ``FROM ${BASE_IMAGE}`` (openenv-base), ``uv sync`` under cache mounts,
the virtualenv copied into the runtime stage, ``CMD ["sh", "-c", "cd /app/env && uvicorn
server.app:app …"]``. Its requirement on ``openenv-core`` is installed as declared (the platform's own
Python hosting would build the platform's pinned ``openenv`` instead). Its MCP tools are the ORS tools;
``GenericEnvClient`` calls them as OpenEnv's tool actions. Real engine, runsc, build, server."""

from __future__ import annotations

import httpx
from openenv.core.generic_client import GenericEnvClient
from ors.client import ORS

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.containers.images import record_read
from orsplatform.episodes.models import ToolCall
from tests.catalog import openenv_packages
from tests.catalog.support import zip_bytes
from tests.containers.conftest import BUILD_SECONDS, wait_built
from tests.e2e.helpers import wait_for

TEMPLATE_DOCKERFILE = """\
ARG BASE_IMAGE=ghcr.io/meta-pytorch/openenv-base:latest
FROM ${BASE_IMAGE} AS builder
WORKDIR /app
COPY . /app/env
WORKDIR /app/env
RUN --mount=type=cache,target=/root/.cache/uv \\
    if [ -f uv.lock ]; then uv sync --frozen --no-editable; else uv sync --no-editable; fi

FROM ${BASE_IMAGE}
WORKDIR /app
COPY --from=builder /app/env/.venv /app/.venv
COPY --from=builder /app/env /app/env
ENV PATH="/app/.venv/bin:$PATH"
ENV PYTHONPATH="/app/env:$PYTHONPATH"
CMD ["sh", "-c", "cd /app/env && uvicorn server.app:app --host 0.0.0.0 --port 8000"]
"""


def test_an_mcp_environment_in_openenvs_template_image_plays_its_tools(servers, owner, container_dirs,
                                                                       container_engine):
    server = servers(**container_dirs)
    files = {**openenv_packages.tally(), "server/Dockerfile": TEMPLATE_DOCKERFILE}
    r = httpx.post(f"{server.url}/api/v1/environments/acme/tally/versions", headers=owner.headers,
                   files={"package": ("tally.zip", zip_bytes(files))}, timeout=BUILD_SECONDS)
    assert r.status_code == 202, r.text
    version = wait_built("tally")
    build_log = log_path(version.id).read_text()
    assert version.status == EnvironmentVersion.Status.READY, (version.error, build_log[-3000:])
    # The distribution the package declares, in the image's own virtualenv (not the platform's openenv).
    probe = "import importlib.metadata as m; print(m.version('openenv-core'))"
    image = record_read(version.package_path).image
    declared = container_engine.run("run", "--rm", "--runtime", "ors-runsc", "--entrypoint", "/app/.venv/bin/python",
                                    image, "-c", probe, timeout=300)
    assert declared.stdout.decode().strip() == "0.3.0"
    assert version.entrypoint == "server.app:app" and version.openenv["kind"] == "mcp"
    assert [t["name"] for t in version.tools] == ["add", "peek", "fail"]

    url = f"{server.url}/openenv/acme/tally"
    with GenericEnvClient(base_url=url, headers=owner.headers).sync() as env:
        # openenv-core 0.3.0's own server sends no metadata on the wire; the platform passes on what
        # the author's server answers. The reset's target took effect: 3 ends the episode.
        assert "metadata" not in env.reset(target=3).observation
        step = env.step({"type": "call_tool", "tool_name": "add", "arguments": {"amount": 3}})
        assert (step.reward, step.done) == (1.0, True)

    with ORS(base_url=server.url, api_key=owner.token) as client:
        ors_env = client.environment("acme/tally")
        assert [t.name for t in ors_env.list_tools()] == ["add", "peek", "fail"]
        with ors_env.session(task=ors_env.get_task("default", 0)) as session:
            session.get_prompt()
            out = session.call_tool("add", {"amount": 4})
            assert (out.blocks[0].text, out.reward, out.finished) == ("4", 0.0, False)
            out = session.call_tool("add", {"amount": 6})
            assert (out.blocks[0].text, out.reward, out.finished) == ("10", 1.0, True)
    wait_for(lambda: ToolCall.objects.filter(session__version=version).count() == 3, timeout=30)
