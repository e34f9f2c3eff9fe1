"""The sandbox pool on its own (no gateway): workers per (package, team), more of them under load,
idle ones retired, limits from the manifest within the operator's maxima, and sealed secrets."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from orsplatform.executors.executor import SessionSpec
from orsplatform.executors.inline import InlineExecutor
from orsplatform.executors.sealing import NodeKey, SealError, seal
from orsplatform.sandbox.config import MiB, SandboxConfig
from tests.executors.hostile import write_hostile
from tests.ors.support import PROBE_ENV

# Under each runtime (tests/executors/conftest.py): bubblewrap and gVisor.
pytestmark = pytest.mark.usefixtures("runtime")


@pytest.fixture
def package(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "env.py").write_text(PROBE_ENV)
    return str(tmp_path / "pkg")


def spec(sid: str, package: str, team: int) -> SessionSpec:
    return SessionSpec(sid=sid, package_path=package, entrypoint="env:Probe", task_spec={},
                       owner={"team": team, "env": "acme/probe@1"})


async def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)  # polling interval while waiting on the condition


async def test_a_pair_gets_more_workers_under_load_and_idle_ones_are_retired(package):
    config = dataclasses.replace(SandboxConfig.from_env(threads=4), sessions_per_worker=2, idle_seconds=0.5)
    executor = InlineExecutor(threads=4, config=config)
    try:
        for i in range(5):
            await executor.start(spec(f"a{i}", package, team=1))
        await executor.start(spec("b0", package, team=2))
        for sid in ("a0", "a1", "a2", "a3", "a4", "b0"):
            await executor.wait_ready(sid, 60)
        workers = executor.pool.workers()
        assert sorted(len(w.sessions) for w in workers if w.key[1] == 1) == [1, 2, 2]
        assert [len(w.sessions) for w in workers if w.key[1] == 2] == [1]  # another team: its own worker
        outcome = await executor.call("a0", "count", {"n": 4}, timeout=10)
        assert outcome.result["output"]["blocks"][0]["text"] == "8"
        for sid in ("a0", "a1", "a2", "a3", "a4", "b0"):
            await executor.stop(sid)
        await wait_until(lambda: not any(w.alive for w in executor.pool.workers()))
    finally:
        await executor.close()


async def test_a_busy_pair_gets_a_warm_spare_before_its_worker_is_full(package):
    config = dataclasses.replace(SandboxConfig.from_env(threads=4), sessions_per_worker=4, idle_seconds=600)
    executor = InlineExecutor(threads=4, config=config)
    try:
        # A version kept warm (containers/warm.py) has a started worker before its first session,
        # which takes it (no start to wait for); the next one starts behind it.
        executor.keep_warm({package: "acme/probe@1"})
        await wait_until(lambda: package in executor.pool.spares(), timeout=120)
        spare = executor.pool.spares()[package]
        assert spare.alive and not executor.pool.workers()
        # Three quarters of the cap in use: the next worker starts then, so the session that fills
        # the first one and the one after it wait for no start.
        for i in range(2):
            await executor.start(spec(f"s{i}", package, team=1))
            await executor.wait_ready(f"s{i}", 120)
        assert executor.pool.workers() == [spare] and spare.key[1] == 1  # half full: no spare yet
        await wait_until(lambda: package in executor.pool.spares(), timeout=120)
        assert executor.pool.spares()[package] is not spare
        await executor.start(spec("s2", package, team=1))
        await executor.wait_ready("s2", 120)
        await wait_until(lambda: len([w for w in executor.pool.workers() if w.alive]) == 2, timeout=120)
        assert sorted(len(w.sessions) for w in executor.pool.workers()) == [0, 3]
        await executor.start(spec("s3", package, team=1))
        await executor.start(spec("s4", package, team=1))
        for sid in ("s3", "s4"):
            await executor.wait_ready(sid, 120)
        # The spare takes its share at once (sessions go to the least loaded worker); no third starts.
        assert sorted(len(w.sessions) for w in executor.pool.workers()) == [2, 3]
        second = executor.pool.spares()[package]
        executor.keep_warm({})  # no longer wanted: its spare is stopped, the pair's workers stay
        assert not executor.pool.spares() and second.kill_reason == "its version is no longer kept warm"
        await wait_until(lambda: not second.alive)
        assert spare.alive
    finally:
        await executor.close()


def test_manifest_limits_are_capped_by_the_operators_maxima(tmp_path):
    write_hostile(tmp_path / "big", extra="network = true\ncpu_seconds = 999999")
    config = SandboxConfig.from_env(threads=1)
    with pytest.raises(PermissionError, match="network access"):
        config.limits_for(str(tmp_path / "big"))
    limits = dataclasses.replace(config, allow_network=True).limits_for(str(tmp_path / "big"))
    assert limits.network is True and limits.memory_bytes == 512 * MiB and limits.processes == 64
    assert limits.cpu_seconds == config.maxima.cpu_seconds


def test_sealed_secrets_open_only_on_their_node_and_for_their_session():
    node, other = NodeKey(), NodeKey()
    sealed = seal(node.public, {"api_key": "s3cret-value"}, "sid-1")
    assert "s3cret-value" not in str(sealed)
    assert node.open(sealed, "sid-1") == {"api_key": "s3cret-value"}
    with pytest.raises(SealError):
        other.open(sealed, "sid-1")
    with pytest.raises(SealError):
        node.open(sealed, "sid-2")  # replayed into another session
    with pytest.raises(SealError):
        node.open({"api_key": "in clear"}, "sid-1")
    assert seal(node.public, {}, "sid-1") == {} and node.open({}, "sid-1") == {}


async def test_with_ors_sandbox_none_sessions_still_run_in_worker_processes(package):
    config = SandboxConfig.from_env(threads=2).with_mode("none")
    executor = InlineExecutor(threads=2, config=config)
    try:
        await executor.start(spec("n0", package, team=1))
        await executor.wait_ready("n0", 60)
        outcome = await executor.call("n0", "count", {"n": 5}, timeout=10)
        assert outcome.result["output"]["blocks"][0]["text"] == "10"
        [worker] = executor.pool.workers()
        assert worker.proc is not None and worker.proc.pid != __import__("os").getpid()
    finally:
        await executor.close()
