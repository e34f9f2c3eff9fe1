"""Fixtures of the sandbox tests (test_hostile_tenants.py, test_sandbox_kernel.py,
test_sandbox_user.py): a gateway whose inline executor runs real bubblewrap workers, a client on it,
the kernel-probing environment (kernel_env.py, published by globex) and team A's probe environment."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from django.conf import settings

from orsplatform.asgi import build_application
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.executors.inline import InlineExecutor
from orsplatform.ors.app import OrsApp
from orsplatform.sandbox.config import SandboxConfig
from tests.executors.kernel_env import write_kernel_env
from tests.ors.support import in_db, publish_probe_sync


@pytest.fixture
async def sandbox_app(live_db, runtime):
    # Short idle and grace periods so retired and killed workers are seen within a test.
    config = dataclasses.replace(SandboxConfig.from_settings(settings, threads=8), idle_seconds=1.0, grace_seconds=1.0)
    assert config.mode == runtime, (config.mode, runtime)
    app = OrsApp(gateway=EpisodeGateway(executor=InlineExecutor(threads=8, config=config)))
    yield app
    await app.shutdown()


@pytest.fixture
async def sbx(sandbox_app):
    transport = httpx.ASGITransport(app=build_application(sandbox_app))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as c:
        yield c


@pytest.fixture
async def probe_a(owner, tmp_path):
    return await in_db(publish_probe_sync, owner.team, tmp_path / "a")


@pytest.fixture
async def kernel_env(outsider, tmp_path):
    from orsplatform.catalog.services import environment_publish

    write_kernel_env(tmp_path / "kernel")
    version = await in_db(lambda: environment_publish(team=outsider.team, source_dir=tmp_path / "kernel").version)
    return version.package_path
