"""An image build's memory, processes and disk, on the platform's own engine.

Docker's built-in BuildKit (the engine of Debian 12, 20.10) ignores ``docker build --cgroup-parent``
and runs every ``RUN`` step in a cgroup of its own under ``<the daemon's cgroup parent>/buildkit``.
The platform starts its engine with a cgroup parent named after the engine (engine.py), so that
``buildkit`` cgroup holds this engine's build steps and nothing else: its memory and process limits
are the limits of the steps running under it. Builds on one engine therefore take turns (a lock
beside the engine's data, ``turn``): the limits are then one build's, and one tenant's build can
never use up the memory another's is running in.

Disk is watched from outside: the free space of the file system holding the engine's data, read
twice a second while the build runs; a build that has taken more than its share since it began is
stopped (BuildKit cancels it when the client goes). Builds take turns, so what is measured is this
build's steps, layers and cache mounts (and whatever else writes to that disk at the time, which
only stops a build earlier, never later).

An operator's engine (``ORS_DOCKER_HOST``) is left alone: its limits are the operator's
(docs/containers.md says which daemon settings give them).

No Django here: runner nodes read the same variables from their environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orsplatform.containers.engine import Engine

MiB = 1024 * 1024
CGROUPS = Path("/sys/fs/cgroup")
# How shells and Python say a fork was refused (dash, busybox, bash, Python's BlockingIOError).
FORK_REFUSED = re.compile(r"Cannot fork|can't fork|fork: retry|fork: Resource temporarily unavailable|"
                          r"BlockingIOError: \[Errno 11\]")
DEFAULTS = {"ORS_IMAGE_BUILD_MEMORY_MB": 4096, "ORS_IMAGE_BUILD_PROCESSES": 2048, "ORS_IMAGE_BUILD_DISK_MB": 20480}


def setting(name: str) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else DEFAULTS[name]
    except ValueError:
        value = DEFAULTS[name]
    return max(1, value)


@dataclass(frozen=True)
class BuildLimits:
    memory_mb: int
    processes: int
    disk_mb: int

    @classmethod
    def from_environment(cls) -> BuildLimits:
        return cls(memory_mb=setting("ORS_IMAGE_BUILD_MEMORY_MB"), processes=setting("ORS_IMAGE_BUILD_PROCESSES"),
                   disk_mb=setting("ORS_IMAGE_BUILD_DISK_MB"))


def _unified() -> bool:
    return (CGROUPS / "cgroup.controllers").exists()


def build_cgroups(engine: Engine) -> dict[str, Path]:
    """Where this engine's build steps run, per controller (empty: not the platform's own engine)."""
    if engine.cgroup_parent is None:
        return {}
    relative = engine.cgroup_parent.strip("/") + "/buildkit"
    if _unified():
        return {"unified": CGROUPS / relative}
    return {"memory": CGROUPS / "memory" / relative, "pids": CGROUPS / "pids" / relative}


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _apply(engine: Engine, limits: BuildLimits) -> None:
    groups = build_cgroups(engine)
    memory, processes = str(limits.memory_mb * MiB), str(limits.processes)
    if "unified" in groups:
        group = groups["unified"]
        for parent in (group.parent, group):
            parent.mkdir(exist_ok=True)
            if parent is group.parent:  # the children get these controllers
                with contextlib.suppress(OSError):
                    _write(parent / "cgroup.subtree_control", "+memory +pids")
        _write(group / "memory.max", memory)
        if (group / "memory.swap.max").exists():
            _write(group / "memory.swap.max", "0")
        _write(group / "pids.max", processes)
        return
    if groups:
        groups["memory"].mkdir(parents=True, exist_ok=True)
        groups["pids"].mkdir(parents=True, exist_ok=True)
        _write_v1_memory(groups["memory"], memory)
        _write(groups["memory"] / "memory.max_usage_in_bytes", "0")  # this turn's peak
        _write(groups["pids"] / "pids.max", processes)


def _write_v1_memory(group: Path, memory: str) -> None:
    """memory + swap must stay at least memory: lowering writes memory first, raising swap first. The
    swap file exists only with swap accounting on; without it there is no swap to escape to."""
    names = ["memory.limit_in_bytes"]
    if (group / "memory.memsw.limit_in_bytes").exists():
        names.append("memory.memsw.limit_in_bytes")
    try:
        for name in names:
            _write(group / name, memory)
    except OSError:
        for name in reversed(names):
            _write(group / name, memory)


def _counter(path: Path, name: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return 0


def _memory_hits(engine: Engine) -> int:
    """How often this engine's build steps met the memory limit. A kill is counted in the step's own
    cgroup, gone by now; under cgroup v1 the limit being met shows as the group's peak (reset each
    turn): 1 once it reached the limit."""
    groups = build_cgroups(engine)
    if "unified" in groups:
        return _counter(groups["unified"] / "memory.events", "max")
    if groups:
        with contextlib.suppress(OSError, ValueError):
            peak = int((groups["memory"] / "memory.max_usage_in_bytes").read_text())
            limit = int((groups["memory"] / "memory.limit_in_bytes").read_text())
            return int(peak >= limit - MiB)
    return 0


def free_bytes(engine: Engine) -> int:
    stat = os.statvfs(engine.state)
    return stat.f_bavail * stat.f_frsize


@dataclass
class Turn:
    """One build's turn on the engine: what its limits are and what it has used."""

    engine: Engine
    limits: BuildLimits
    free_at_start: int
    memory_hits_at_start: int

    def disk_used_mb(self) -> float:
        return max(0, self.free_at_start - free_bytes(self.engine)) / MiB

    def over_disk(self) -> bool:
        return self.disk_used_mb() > self.limits.disk_mb

    def why_failed(self, output: str) -> str | None:
        """What a failed build ran into, when it was one of its limits: a step killed (BuildKit's
        ``exit code: 137``) while the steps had met the memory limit, or a fork refused."""
        if _memory_hits(self.engine) > self.memory_hits_at_start and "exit code: 137" in output:
            return (f"A build step ran out of memory: image builds are limited to {self.limits.memory_mb} MB "
                    "(ORS_IMAGE_BUILD_MEMORY_MB).")
        # A refused fork is counted in the step's own cgroup too (gone); the step's shell says it.
        if FORK_REFUSED.search(output):
            return (f"A build step could not start a process: image builds are limited to "
                    f"{self.limits.processes} processes (ORS_IMAGE_BUILD_PROCESSES).")
        return None


@contextlib.contextmanager
def turn(engine: Engine, limits: BuildLimits, log) -> Iterator[Turn]:
    """Wait for this engine's other build to end, then hold the engine's build cgroups at ``limits``
    (an operator's engine: no turns, its own limits; the disk is watched all the same)."""
    if not build_cgroups(engine):
        yield Turn(engine=engine, limits=limits, free_at_start=free_bytes(engine), memory_hits_at_start=0)
        return
    with open(engine.state / "build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("[platform] another image build is running on this engine; this one starts when it ends")
            started = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)
            log(f"[platform] waited {time.monotonic() - started:.0f} s for the other build")
        _apply(engine, limits)
        yield Turn(engine=engine, limits=limits, free_at_start=free_bytes(engine), memory_hits_at_start=_memory_hits(engine))
