"""A worker that keeps a CPU busy weighs less until it is calm again (ORS_SANDBOX_BUSY_CPU): with real
workers in their own cgroups, and the cgroup v1 and v2 files on fake trees for the version this
machine does not mount."""

from __future__ import annotations

import asyncio
import dataclasses
import textwrap
from pathlib import Path

import pytest

from orsplatform.executors.executor import SessionSpec
from orsplatform.executors.inline import InlineExecutor
from orsplatform.sandbox import cgroups
from orsplatform.sandbox.cgroups import WorkerCgroup
from orsplatform.sandbox.config import SandboxConfig
from orsplatform.sandbox.supervised import CALM_SECONDS, JANITOR_SECONDS, Worker
from tests.ors.support import wait_for

BURNER_ENV = textwrap.dedent('''
    import time

    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Seconds(BaseModel):
        seconds: float


    class Burner(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": 0}]

        def get_prompt(self):
            return [TextBlock(text="burn")]

        @tool
        def burn(self, params: Seconds) -> ToolOutput:
            """Spins a CPU for `seconds`."""
            end = time.monotonic() + params.seconds
            while time.monotonic() < end:
                pass
            return ToolOutput(blocks=[TextBlock(text="burnt")], reward=0.0)

        @tool
        def ping(self, params: Seconds) -> ToolOutput:
            """A quiet call."""
            return ToolOutput(blocks=[TextBlock(text="pong")], reward=1.0)
''')


@pytest.fixture
def package(tmp_path):
    (tmp_path / "burner").mkdir()
    (tmp_path / "burner" / "env.py").write_text(BURNER_ENV)
    return str(tmp_path / "burner")


def spec(sid: str, package: str, team: int) -> SessionSpec:
    return SessionSpec(sid=sid, package_path=package, entrypoint="env:Burner", task_spec={},
                       owner={"team": team, "env": f"team{team}/burner@1"})


def idle_of(group: WorkerCgroup) -> int | None:
    """The worker cgroup's cpu.idle (None where the kernel has none)."""
    try:
        return int(group.read("cpu", "cpu.idle"))
    except FileNotFoundError:
        return None


def weight_of(group: WorkerCgroup) -> int:
    """The worker cgroup's CPU weight on the v2 scale (v1 cpu.shares = weight * 1024 / 100)."""
    if group.version == 2:
        return int(group.read("cpu", "cpu.weight"))
    return int(group.read("cpu", "cpu.shares")) * 100 // 1024


async def test_a_burning_worker_is_demoted_while_another_teams_calm_worker_keeps_its_weight_and_both_are_restored(
        package):
    # As test_sandbox_kernel.py's cgroup tests: the suite runs as root (make test, CI), where cgroups can be made.
    assert cgroups.layout() is not None, "no cgroup can be made here (not root, or nothing delegated)"
    config = dataclasses.replace(SandboxConfig.from_env(threads=4), busy_cpu=0.3, busy_cpu_weight=1)
    executor = InlineExecutor(threads=4, config=config)
    try:
        await executor.start(spec("burner", package, team=1))
        await executor.start(spec("calm", package, team=2))
        for sid in ("burner", "calm"):
            await executor.wait_ready(sid, 60)
        (burner,) = [w for w in executor.pool.workers() if "burner" in w.sessions]
        (calm,) = [w for w in executor.pool.workers() if "calm" in w.sessions]
        assert burner is not calm and burner._cgroup is not None and calm._cgroup is not None
        assert weight_of(burner._cgroup) == weight_of(calm._cgroup) == config.cpu_weight

        burn = asyncio.create_task(executor.call("burner", "burn", {"seconds": 5}, timeout=60))
        await wait_for(lambda: burner.busy, timeout=20, what="the burning worker to be found busy")
        # v1's smallest cpu.shares is 2, i.e. weight 0 on the v2 scale after rounding
        assert weight_of(burner._cgroup) <= config.busy_cpu_weight
        assert idle_of(burner._cgroup) in (1, None) and idle_of(calm._cgroup) in (0, None)
        outcome = await executor.call("calm", "ping", {"seconds": 0}, timeout=10)
        assert outcome.result["output"]["reward"] == 1.0
        assert not calm.busy and weight_of(calm._cgroup) == config.cpu_weight
        assert (await burn).result["output"]["reward"] == 0.0
        await wait_for(lambda: not burner.busy, timeout=20, what="the burner, calm again, to be restored")
        assert weight_of(burner._cgroup) == config.cpu_weight and idle_of(burner._cgroup) in (0, None)
    finally:
        await executor.close()


def fake_group(tmp_path: Path, version: int) -> WorkerCgroup:
    """A worker cgroup on a fake tree of cgroup files (what the kernel would show)."""
    if version == 2:
        path = tmp_path / "ors-sandbox" / "w"
        path.mkdir(parents=True)
        (path / "cpu.weight").write_text("100")
        (path / "cpu.idle").write_text("0")
        (path / "cpu.stat").write_text("usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
        return WorkerCgroup(cgroups._Layout(2, {"unified": path.parent}), {"unified": path})
    paths = {c: tmp_path / c / "ors-sandbox" / "w" for c in ("memory", "pids", "cpu", "cpuacct")}
    for path in paths.values():
        path.mkdir(parents=True)
    (paths["cpu"] / "cpu.shares").write_text("1024")
    (paths["cpu"] / "cpu.idle").write_text("0")
    (paths["cpuacct"] / "cpuacct.usage").write_text("0")
    return WorkerCgroup(cgroups._Layout(1, {c: p.parent for c, p in paths.items()}), paths)


def use(group: WorkerCgroup, seconds: float) -> None:
    if group.version == 2:
        (group.paths["unified"] / "cpu.stat").write_text(f"usage_usec {int(seconds * 1e6)}\nuser_usec 0\n")
    else:
        (group.paths["cpuacct"] / "cpuacct.usage").write_text(str(int(seconds * 1e9)))


@pytest.mark.parametrize("version", [1, 2])
def test_the_cgroup_files_of_each_version_give_cpu_time_and_take_a_weight(tmp_path, version):
    group = fake_group(tmp_path, version)
    use(group, 1.5)
    assert group.cpu_seconds() == pytest.approx(1.5)
    group.set_cpu_weight(1)
    assert weight_of(group) <= 1
    assert (group.read("cpu", "cpu.weight") if version == 2 else group.read("cpu", "cpu.shares")).strip() == (
        "1" if version == 2 else "10")  # v1: weight * 1024 // 100
    group.set_cpu_weight(100)
    assert weight_of(group) == 100
    assert group.set_cpu_idle(True) and idle_of(group) == 1
    assert group.set_cpu_idle(False) and idle_of(group) == 0
    (group.paths["unified" if version == 2 else "cpu"] / "cpu.idle").unlink()
    assert not group.set_cpu_idle(True) and idle_of(group) is None  # a kernel before 5.15


@pytest.mark.parametrize("version", [1, 2])
def test_a_busy_worker_with_idle_off_keeps_a_normal_cgroup_with_a_low_weight(tmp_path, version):
    config = dataclasses.replace(SandboxConfig(), busy_cpu=0.5, busy_cpu_weight=5, busy_cpu_idle=False)
    worker = Worker(("pkg", 1), "acme/burner@1", config)
    worker._cgroup = group = fake_group(tmp_path, version)
    worker.pace(0.0)
    use(group, 1.0)
    worker.pace(1.0)
    assert worker.busy and idle_of(group) == 0 and weight_of(group) == (5 if version == 2 else 4)


def test_v1_without_cpuacct_reads_cpu_time_from_the_processes(tmp_path):
    group = fake_group(tmp_path, 1)
    del group.paths["cpuacct"]
    (group.paths["pids"] / "cgroup.procs").write_text("")  # no process: no time, not an error
    assert group.cpu_seconds() == 0.0


@pytest.mark.parametrize("version", [1, 2])
def test_a_worker_is_busy_after_one_busy_window_and_restored_only_after_a_calm_second(tmp_path, version):
    config = dataclasses.replace(SandboxConfig(), busy_cpu=0.5, busy_cpu_weight=1)
    worker = Worker(("pkg", 1), "acme/burner@1", config)
    worker._cgroup = group = fake_group(tmp_path, version)
    t, used = 100.0, 0.0

    def tick(share: float) -> None:
        nonlocal t, used
        t += JANITOR_SECONDS
        used += share * JANITOR_SECONDS
        use(group, used)
        worker.pace(t)

    worker.pace(t)  # the first reading
    tick(0.2)
    assert not worker.busy and weight_of(group) == 100
    tick(0.9)
    assert worker.busy and weight_of(group) <= 1 and idle_of(group) == 1
    calm_ticks = 0
    while worker.busy:
        tick(0.1)
        calm_ticks += 1
        assert calm_ticks <= CALM_SECONDS / JANITOR_SECONDS + 1
    assert calm_ticks * JANITOR_SECONDS >= CALM_SECONDS and weight_of(group) == 100 and idle_of(group) == 0
    tick(0.6)
    assert worker.busy
    tick(0.1)
    tick(0.7)  # busy again before a calm second had passed: still demoted, the calm time starts over
    assert worker.busy
    tick(0.1)
    assert worker.busy
    tick(0.1)
    assert not worker.busy


def test_pacing_is_off_at_zero(tmp_path):
    worker = Worker(("pkg", 1), "acme/burner@1", dataclasses.replace(SandboxConfig(), busy_cpu=0.0))
    worker._cgroup = group = fake_group(tmp_path, 2)
    worker.pace(0.0)
    use(group, 10.0)
    worker.pace(1.0)
    assert not worker.busy and weight_of(group) == 100
